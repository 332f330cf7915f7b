"""Message validation: typed errors that name the message index."""

from __future__ import annotations

import pytest

import tmpl
from tmpl.messages import validate_messages, validate_tool_messages

CALL = {"id": "abcdefghi", "type": "function", "function": {"name": "f", "arguments": {}}}


def test_a_valid_tool_conversation_passes():
    validate_messages(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [CALL, CALL]},
            {"role": "tool", "content": "1"},
            {"role": "tool", "content": "2"},
            {"role": "assistant", "content": "done"},
        ]
    )


@pytest.mark.parametrize(
    "messages, error, index",
    [
        ([{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}], tmpl.errors.UnknownRoleError, 1),
        ([{"content": "a"}], tmpl.errors.UnknownRoleError, 0),
        ([{"role": "user", "content": "a"}, {"role": "tool"}], tmpl.errors.MissingContentError, 1),
        ([{"role": "user", "content": None}], tmpl.errors.MissingContentError, 0),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "tool_calls": [CALL, CALL]},
                {"role": "tool", "content": "1"},
                {"role": "user", "content": "b"},
            ],
            tmpl.errors.ToolMessageCountError,
            1,
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "tool_calls": [CALL]},
                {"role": "tool", "content": "1"},
                {"role": "tool", "content": "2"},
            ],
            tmpl.errors.ToolMessageCountError,
            1,
        ),
        ([{"role": "user", "content": "a"}, "not a dict"], tmpl.errors.MessageError, 1),
        ([{"role": "user", "content": "a", "tool_calls": [CALL]}], tmpl.errors.MessageError, 0),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}], tmpl.errors.MessageError, 0),
    ],
)
def test_errors_name_the_message(messages, error, index):
    with pytest.raises(error) as info:
        validate_messages(messages)
    assert info.value.index == index
    assert f"messages[{index}]" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_pending_tool_calls_at_the_end_are_allowed():
    validate_messages([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [CALL, CALL]}])


def test_tool_messages_must_be_tool_results():
    with pytest.raises(tmpl.errors.MessageError, match=r"tool_messages\[1\].*role 'user'"):
        validate_tool_messages([{"role": "tool", "content": "x"}, {"role": "user", "content": "y"}])
    with pytest.raises(tmpl.errors.MessageError, match="at least one"):
        validate_tool_messages([])

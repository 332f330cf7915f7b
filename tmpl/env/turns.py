"""The exact suffix of any turns appended after an assistant turn: tool results, user, system, developer.

Tool results alone go through the suffix engine (:meth:`tmpl.ChatTemplate.suffix_ids`: cached,
verified frames). Turns that are not tool results (a simulated user, a system or developer message,
possibly after tool results) are not shapes the engine's frames hold; their suffix comes from the
template's own render of the conversation:

- ``before``: the render of the conversation up to and including the assistant turn, as the last
  message; the assistant turn's close is the last occurrence of the completion's stop token in it;
- ``after``: the render with the new turns and the generation prompt;
- ``after`` must repeat ``before`` up to that close (a template that re-renders the assistant turn
  once a user turn follows it, e.g. Qwen3 dropping its reasoning, cannot be continued in append
  mode: :class:`~tmpl.errors.UnsupportedTemplateError` says so, ``history="template"`` renders it);
- the suffix is the tokenization of ``after``'s text from the close on, with the close as its anchor
  (the stop token is an added token: the text on each side of it tokenizes on its own).

``prompt + completion + suffix`` then equals the tokenization of ``after`` whenever
``prompt + completion`` equals the tokenization of the conversation so far (the rollout's invariant;
``verify_every`` and tests/test_env.py check it against full renders).

>>> ids = turn_suffix(tpl, history, assistant, completion_ids, [{"role": "user", "content": "And Rome?"}])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..chat_template import ChatTemplate
from ..errors import UnsupportedTemplateError
from ..messages import TOOL_ROLES


def turn_suffix(
    tpl: ChatTemplate,
    history: Sequence[Mapping[str, Any]],
    assistant: Mapping[str, Any],
    completion_ids: Sequence[int],
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    prompt_text: str | None = None,
) -> list[int]:
    """The IDs to append after ``completion_ids`` (the assistant turn ``assistant``, after ``history``) for
    ``messages``, ending with the next generation prompt. ``tools``: the schemas the prompt rendered;
    ``prompt_text``: the render of ``history`` with the generation prompt, where the caller has it."""
    return turn_suffix_text(tpl, history, assistant, completion_ids, messages, tools, prompt_text)[0]


def turn_suffix_text(
    tpl: ChatTemplate,
    history: Sequence[Mapping[str, Any]],
    assistant: Mapping[str, Any],
    completion_ids: Sequence[int],
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    prompt_text: str | None = None,
) -> tuple[list[int], str | None]:
    """:func:`turn_suffix` and the render of the conversation it ends (the next prompt's text; None where
    the suffix engine answered without a render)."""
    if all(m.get("role") in TOOL_ROLES for m in messages):
        return tpl.suffix_ids(messages, completion_ids=completion_ids, tools=tools, history=history), None
    return _render_suffix(tpl, history, assistant, completion_ids, messages, tools, prompt_text)


def render_suffix(
    tpl: ChatTemplate,
    history: Sequence[Mapping[str, Any]],
    assistant: Mapping[str, Any],
    completion_ids: Sequence[int],
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    prompt_text: str | None = None,
) -> list[int]:
    """:func:`turn_suffix` by the template's render (any roles); see the module's docstring.

    ``prompt_text``: the render of ``history`` with the generation prompt (rendered when not given).
    """
    return _render_suffix(tpl, history, assistant, completion_ids, messages, tools, prompt_text)[0]


def _render_suffix(
    tpl: ChatTemplate,
    history: Sequence[Mapping[str, Any]],
    assistant: Mapping[str, Any],
    completion_ids: Sequence[int],
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None,
    prompt_text: str | None,
) -> tuple[list[int], str]:
    roles = "/".join(sorted({str(m.get("role")) for m in messages if m.get("role") not in TOOL_ROLES}))
    if not completion_ids or completion_ids[-1] not in tpl.stop_token_ids:
        raise UnsupportedTemplateError(
            tpl.name, f"a {roles} turn follows a completion that did not end with a stop token"
        )
    stop = completion_ids[-1]
    stop_text = tpl.codec.decode([stop])
    convo = [*history, dict(assistant)]
    prompt = (
        prompt_text if prompt_text is not None else tpl.renderer.text(history, tools=tools, add_generation_prompt=True)
    )
    after = tpl.renderer.text([*convo, *messages], tools=tools, add_generation_prompt=True)
    if not after.startswith(prompt):
        raise _differs(tpl, roles, "the conversation before the assistant turn", prompt, after)
    sampled = tpl.codec.decode(list(completion_ids))
    if stop_text and sampled.endswith(stop_text) and after.startswith(sampled, len(prompt)):
        close = len(prompt) + len(sampled)  # the sampled turn's text, as the render shows it
    else:  # a tokenizer whose decode is not the text (or a re-rendered turn): the turn as the template renders it
        before = tpl.renderer.text(convo, tools=tools, add_generation_prompt=False)
        found = before.rfind(stop_text) if stop_text else -1
        if found < len(prompt):
            raise UnsupportedTemplateError(
                tpl.name, f"the render of the assistant turn does not hold its stop token {stop_text!r}"
            )
        close = found + len(stop_text)
        if after[:close] != before[:close]:
            raise _differs(tpl, roles, "the assistant turn", before[:close], after)
    ids = tpl.codec.encode(stop_text + after[close:])
    if ids[:1] != [stop]:
        raise UnsupportedTemplateError(
            tpl.name, f"the text after the stop token {stop_text!r} does not tokenize apart from it"
        )
    return ids[1:], after


def _differs(tpl: ChatTemplate, roles: str, what: str, was: str, now: str) -> UnsupportedTemplateError:
    at = next((k for k in range(min(len(was), len(now))) if was[k] != now[k]), min(len(was), len(now)))
    lo = max(0, at - 20)  # shown with the text just before it
    return UnsupportedTemplateError(
        tpl.name,
        f"the template renders {what} differently once a {roles} turn follows it (from character {at}: "
        f"{was[lo : at + 40]!r} becomes {now[lo : at + 40]!r}); append mode cannot continue the sampled IDs "
        "exactly (history='template' renders each prompt)",
    )

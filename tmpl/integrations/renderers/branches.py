"""What a bridge says of a render that does not extend the previous prompt: the branch, the edit, in words;
and messages as templates read them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...chat_template import ChatTemplate
from ...episode import Branch, BranchKind, first_difference
from ...rollout.history import REASONING_FIELDS


def _branch(
    prior: list[int], ids: list[int], before: list[dict[str, Any]], after: list[dict[str, Any]], edit: str | None
) -> Branch:
    """The branch where the render ``ids`` leaves ``prior``, as tmpl's episode names it."""
    common = next((k for k, (a, b) in enumerate(zip(prior, ids)) if a != b), min(len(prior), len(ids)))
    kind = BranchKind.REWOUND if common == len(ids) else BranchKind.DIVERGED
    found = first_difference(before, after)
    message, field = found if found is not None else (None, None)
    return Branch(
        kind,
        token=common,
        expected=prior[common] if common < len(prior) else None,
        got=ids[common] if common < len(ids) else None,
        message=message,
        field=field,
        edit=edit,
    )


def _reasoning_gone(message: Mapping[str, Any], text: str) -> bool:
    """Whether ``message`` has reasoning and the render ``text`` holds none of it."""
    reasoning = next((v.strip() for k in REASONING_FIELDS if isinstance(v := message.get(k), str) and v.strip()), "")
    return bool(reasoning) and reasoning not in text


def _edit(dropped: Sequence[int], rewritten: int) -> str:
    """The edit label of a splice (``Spliced.edit``'s words), ``dropped`` and ``rewritten`` counted anew."""
    parts = ["template dropped reasoning"] if dropped else []
    if rewritten:
        parts.append("template rewrote sampled text")
    return "; ".join(parts)


def _describe(branch: Branch) -> str:
    """``branch`` in words, against the previous prompt and completion (a renderer has no sequence index)."""
    got = "render ends" if branch.got is None else f"render has {branch.got}"
    text = f"{branch.kind} from the previous prompt + completion at token {branch.token} ({got}, previous has {branch.expected})"
    if branch.message is not None:
        text += f"; message {branch.message}" + ("" if branch.field is None else f", field {branch.field!r}")
    if branch.edit is not None:
        text += f"; edit: {branch.edit}"
    return text


def _ends_open(tpl: ChatTemplate, completion: Sequence[int]) -> bool:
    """Whether ``completion`` stops before the template's turn close (a truncated completion)."""
    return not completion or int(completion[-1]) not in tpl.stop_token_ids


def _normalized(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates read them: tool-call ``arguments`` given as JSON text (OpenAI's wire
    format, what verifiers sends) become dicts, as every template tmpl checks renders them."""
    out: list[dict[str, Any]] = []
    for m in messages:
        msg = dict(m)
        calls = msg.get("tool_calls")
        if calls:
            fixed = []
            for call in calls:
                call = dict(call)
                fn = call.get("function")
                if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                    fn = dict(fn)
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
                    call["function"] = fn
                fixed.append(call)
            msg["tool_calls"] = fixed
        out.append(msg)
    return out

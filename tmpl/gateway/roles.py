"""System and developer turns as a template can render them: every dialect's requests go through :func:`place_roles`.

APIs let a client put instructions where a chat template may have no place for them: a ``developer``
turn (OpenAI Chat Completions and Responses), a ``system`` turn in the middle of the conversation
(Claude Code sends one at ``messages[1]``; environments append them), several leading system turns.
:func:`place_roles` rewrites canonical messages into turns the template renders, by these rules:

1. **developer**: rendered as the template's own developer turn when it has one (a probe render shows
   the turn's text in place, and a made-up role's text not: gpt-oss's harmony format), else as a
   ``system`` turn (Qwen2.5, Qwen3 and Llama drop or mislabel a ``developer`` role).
2. **Leading system turns** (before the first user or assistant turn) are joined, a blank line
   between, into one system turn: it comes first, so a template's default system prompt (Qwen2.5's
   "You are Qwen, created by Alibaba Cloud.") never precedes the client's own instructions. A template
   that refuses a leading system turn (it raises, or drops its text: Gemma 2) has the text put before
   the first user turn's, a blank line between.
3. **Later system turns** stay where they are when the template renders a system turn after a user
   turn and after an assistant turn (Qwen2.5, Qwen3, Llama 3.2). A template that refuses them (its render
   raises or drops the text: Mistral Nemo, Gemma 2, gpt-oss; the test ``env_turns``'s UNSUPPORTED
   verdict makes of a ``system`` turn) gets the **fallback**: a system turn right after a user turn
   (other system turns aside) is appended to that user turn, a blank line between (Claude Code's
   ``messages[1]``); one after an assistant turn or tool results becomes a user turn of its own,
   prepended to the user turn that follows it, if one does. Each rule keeps the render of earlier
   turns as it was when the conversation grows, so a session's next call continues its last.

What was done is said in :attr:`Placed.notes` (the replies' ``tmpl`` object carries it as ``roles``):
``{"developer": "developer" | "system", "leading_system": "system" | "folded", "system_turns":
"rendered" | "folded"}``, each key present only where the request had such turns.

The probes are rendered once per template (by its fingerprint) and kept.

>>> placed = place_roles(tpl, [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi"}])  # doctest: +SKIP
>>> placed.messages[0], placed.notes  # doctest: +SKIP
({'role': 'system', 'content': 'Be terse.'}, {'developer': 'system', 'leading_system': 'system'})
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate

__all__ = ["Placed", "RoleSupport", "place_roles", "role_support"]

#: the text a probe turn carries, and the text around it
PROBE = "TmPlRoLeProBe"
#: what joins folded texts
JOIN = "\n\n"


@dataclass(frozen=True)
class RoleSupport:
    """Which instruction turns a template renders in place (found by probe renders)."""

    #: a ``developer`` turn of its own (its text rendered; a made-up role's text not)
    developer: bool
    #: a system turn as the first message
    leading_system: bool
    #: a system turn after a user turn and after an assistant turn
    later_system: bool


@dataclass
class Placed:
    """Messages the template can render, and what :func:`place_roles` did (see the module docstring)."""

    messages: list[dict[str, Any]]
    notes: dict[str, str] = field(default_factory=dict)


_known: dict[str, RoleSupport] = {}
_lock = threading.Lock()


def _shows(tpl: ChatTemplate, messages: list[dict[str, Any]]) -> bool:
    """Whether the template renders ``messages`` with the probe's text (False where it raises)."""
    try:
        return PROBE in tpl.render(messages, None, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that raises on the shape refuses it
        return False


def role_support(tpl: ChatTemplate) -> RoleSupport:
    """The template's :class:`RoleSupport`, probed once per template fingerprint.

    >>> role_support(qwen25)  # doctest: +SKIP
    RoleSupport(developer=False, leading_system=True, later_system=True)
    """
    key = tpl.fingerprint  # the template and tokenizer as they are: a changed one is probed anew
    found = _known.get(key)
    if found is not None:
        return found
    user = {"role": "user", "content": "Hello."}
    again = {"role": "user", "content": "And then?"}
    answer = {"role": "assistant", "content": "Hi."}
    probe = {"role": "system", "content": PROBE}
    developer = _shows(tpl, [{"role": "developer", "content": PROBE}, user]) and not _shows(
        tpl, [{"role": "tmpl_probe_role", "content": PROBE}, user]
    )
    found = RoleSupport(
        developer=developer,
        leading_system=_shows(tpl, [probe, user]),
        later_system=_shows(tpl, [user, probe, again]) and _shows(tpl, [user, answer, probe, again]),
    )
    with _lock:
        _known[key] = found
    return found


def _joined(*texts: Any) -> Any:
    """Texts joined, a blank line between; where one is a content with images (a list of parts), the parts
    in order, the texts as text parts around it.

    >>> _joined("Be brief.", [{"type": "image", "image": "data:..."}])
    [{'type': 'text', 'text': 'Be brief.'}, {'type': 'text', 'text': '\\n\\n'}, {'type': 'image', 'image': 'data:...'}]
    """
    if not any(isinstance(t, list) for t in texts):
        return JOIN.join(t for t in texts if t)
    out: list[Any] = []
    for t in texts:
        if t:
            if out:
                out.append({"type": "text", "text": JOIN})
            out += t if isinstance(t, list) else [{"type": "text", "text": t}]
    return out


def place_roles(tpl: ChatTemplate, messages: Sequence[Mapping[str, Any]]) -> Placed:
    """``messages`` (canonical) with their developer and system turns placed where ``tpl`` renders them
    (the rules of the module docstring); messages without such turns come back as they are.

    >>> place_roles(qwen25, [{"role": "user", "content": "Hi"}]).notes  # doctest: +SKIP
    {}
    """
    roles = {m.get("role") for m in messages}
    if not roles & {"system", "developer"}:
        return Placed([dict(m) for m in messages])
    support = role_support(tpl)
    notes: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    if "developer" in roles:
        notes["developer"] = "developer" if support.developer else "system"
    instruction = ("system",) if support.developer else ("system", "developer")
    # 1 and 2: the leading run of instruction turns, joined (a template's own developer turns kept as sent)
    k = 0
    leading: list[str] = []
    while k < len(messages) and messages[k].get("role") in ("system", "developer"):
        m = messages[k]
        if m["role"] in instruction:
            leading.append(m.get("content") or "")
        else:
            out.append(dict(m))
        k += 1
    pending = ""  # leading text a template without a leading system turn puts before the first user turn
    if k:
        text = _joined(*leading)
        if support.leading_system or not leading:
            if leading:
                out.insert(0, {"role": "system", "content": text})
                notes["leading_system"] = "system"
        else:
            notes["leading_system"] = "folded"
            pending = text
    # 3: later instruction turns
    later = any(m.get("role") in instruction for m in messages[k:])
    if later:
        notes["system_turns"] = "rendered" if support.later_system else "folded"
    carry = ""  # a folded system turn's text waiting for the user turn that follows it
    for m in messages[k:]:
        m = dict(m)
        role = m.get("role")
        if role in instruction:
            if support.later_system:
                out.append({**m, "role": "system"})
                continue
            text = m.get("content") or ""
            before = next((x for x in reversed(out) if x["role"] != "system"), None)
            if before is not None and before["role"] == "user" and not carry:
                before["content"] = _joined(before.get("content") or "", text)
            else:
                carry = _joined(carry, text)
            continue
        if role == "user":
            if pending or carry:
                m["content"] = _joined(pending, carry, m.get("content") or "")
            pending = carry = ""
        elif carry:
            out.append({"role": "user", "content": carry})
            carry = ""
        out.append(m)
    if carry:
        out.append({"role": "user", "content": carry})
    if pending:  # no user turn at all: the text is the only user turn
        out.append({"role": "user", "content": pending})
    return Placed(out, notes)

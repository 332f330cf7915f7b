"""The proof that a rewrite is training-safe: each step a :class:`~tmpl.report.fix.types.ProofStep`.

:func:`prove` runs them all on the fixed template: the report's prefix stability, the newest turn
rendered as in the original (:func:`same_last_turn`), suffixes equal to full renders
(:func:`suffix_contract`), the date pinned by its kwarg (:func:`date_step`) and the assistant mask
(:func:`assistant_mask_step`, run before, when markers are added). The conversations come from
:mod:`.probes` (:func:`~.probes.proof_chains`, :func:`~.probes.proof_tool_rounds`,
:func:`~.probes.renders_on`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...chat_template import ChatTemplate
from ...errors import TmplError
from ..report import SAFE, TemplateReport, build_report
from ..search import BPE_MERGE, PREFILL, USES, space_for
from ..space import SPACE_TOOLS, generate, messages_of
from ..stability import PROBE_TOOLSET
from .probes import DAYS, Chain, proof_chains, proof_tool_rounds, renders_on, units
from .types import ProofStep


def prove(
    original: ChatTemplate, fixed: ChatTemplate, max_calls: int, date_kwarg: str | None, mask: ProofStep | None
) -> tuple[list[ProofStep], TemplateReport]:
    """Every proof step on ``fixed`` (the date step when ``date_kwarg`` pins one, ``mask`` when given),
    and ``fixed``'s own report (its verdicts, and the counterexample a refusal carries)."""
    proof = [ProofStep("valid Jinja", True, "the rewritten source parses")]
    after = build_report(fixed, shipped=False)
    after_labels = {use: v.label for use, v in after.verdicts.items()}
    proof.append(_prefix_stability(after, after_labels))
    proof.append(same_last_turn(original, fixed, max_calls))
    proof.append(suffix_contract(fixed, max_calls))
    if date_kwarg is not None:
        proof.append(date_step(original, fixed, date_kwarg))
    if mask is not None:
        proof.append(mask)
    return proof, after


def _prefix_stability(after: TemplateReport, after_labels: dict[str, str]) -> ProofStep:
    """The fixed template's own report: its tool loop must be ``SAFE``."""
    safe = after.verdicts["tool_loop"].level == SAFE
    return ProofStep(
        "prefix stability (report)",
        safe,
        f"tool loop {after_labels['tool_loop']}; "
        + ", ".join(f"{n} {'stable' if c.ok else 'NOT stable'} ({c.cases} cases)" for n, c in after.stability.items())
        + ("" if safe else f"; {where(after)}"),
    )


def tool_loop_counterexample(report: TemplateReport) -> tuple[str, dict[str, Any]] | None:
    """The failed tool-loop check of a report and its counterexample (None when the tool loop holds)."""
    for name in USES["tool_loop"]:
        c = report.stability[name]
        if not c.ok and c.counterexample:
            return name, c.counterexample
    return None


def where(report: TemplateReport) -> str:
    """The first tool-loop counterexample of a report, in words (the messages are in the refusal's
    ``counterexample``)."""
    found = tool_loop_counterexample(report)
    if found is None:
        return report.verdicts["tool_loop"].label
    name, ce = found
    renders = f"token-in/token-out reads {ce['stream_render']!r} where the template renders {ce['longer_render']!r}"
    if ce["reason"] == BPE_MERGE:
        return f"{name}: {ce['reason']}, which no rewrite of the template's branches changes; {renders}"
    if ce["reason"] == PREFILL:
        return f"{name}: {ce['reason']}, which no if-test on position decides; {renders}"
    return f"{name}: {ce['reason']}; {renders}"


# -- the newest turn as the original renders it ----------------------------------------------------


def _anchors(message: dict[str, Any]) -> list[str]:
    """Strings of a message that its render shows verbatim (content, call argument values)."""
    out = [message["content"]] if isinstance(message.get("content"), str) and message["content"].strip() else []
    for call in message.get("tool_calls") or []:
        out += [str(v) for v in call["function"]["arguments"].values()]
    return out


def _last_unit_tail(text: str, messages: Sequence[dict[str, Any]]) -> str | None:
    """The render of the last unit of ``messages`` (and the generation prompt): ``text`` after the last
    verbatim string of the messages before that unit that the render shows (all of ``text`` when
    there are none; None when none of them is found, e.g. a template that escapes them)."""
    grown = units(messages)
    earlier = [a for m in messages[: len(messages) - len(grown[-1])] for a in _anchors(m)] if grown else []
    if not earlier:
        return text
    for anchor in reversed(earlier):
        at = text.rfind(anchor)
        if at >= 0:
            return text[at + len(anchor) :]
    return None


def newest_differs(chain: Chain, mine: Sequence[str | None], theirs: Sequence[str | None]) -> list[str | None]:
    """For each render of a growing conversation: how the newest unit (and the generation prompt) renders
    differently from the original's (None: identical, or nothing to compare).

    After the last verbatim string before the newest unit, the fixed render must read: the previous
    render's text from there (the previous message as it rendered when it was last), then a text
    that ends the original's render too (the newest unit, identically).
    """
    out: list[str | None] = []
    for j, (messages, _) in enumerate(chain):
        a, b = theirs[j], mine[j]
        if a is None:
            out.append(None)
            continue
        if b is None:
            out.append("the fixed template raises")
            continue
        if j == 0:
            out.append(None if a == b else f"renders {b[:160]!r}, the original {a[:160]!r}")
            continue
        want, got = _last_unit_tail(a, messages), _last_unit_tail(b, messages)
        prev = mine[j - 1]
        before = _last_unit_tail(prev, messages) if prev is not None else None
        if want is None or got is None or before is None:
            out.append(None)
            continue
        newest = got[len(before) :] if got.startswith(before) else got
        out.append(None if want.endswith(newest) else f"renders {newest[:160]!r}, the original {want[:160]!r}")
    return out


def _texts(tpl: ChatTemplate, chain: Chain) -> list[str | None]:
    """Each render of a growing conversation (None where the template raises)."""
    out: list[str | None] = []
    for messages, gen in chain:
        try:
            out.append(tpl.renderer.text(messages, tools=PROBE_TOOLSET, add_generation_prompt=gen))
        except TmplError:
            out.append(None)
    return out


def same_last_turn(original: ChatTemplate, fixed: ChatTemplate, max_calls: int) -> ProofStep:
    """Each newest message (and the generation prompt) renders as in the original, on the growing
    probe conversations (full renders through transformers, compared as text)."""
    compared = 0
    for chain, _ in proof_chains(max_calls):
        theirs = _texts(original, chain)
        diffs = newest_differs(chain, _texts(fixed, chain), theirs)
        for (messages, _), diff in zip(chain, diffs):
            if diff is not None:
                return ProofStep(
                    "last turn as the original", False, f"the newest {messages[-1]['role']} message {diff}"
                )
        compared += sum(1 for t in theirs if t is not None)
    if not compared:
        return ProofStep("last turn as the original", False, "the original renders none of the probe conversations")
    return ProofStep(
        "last turn as the original", True, f"{compared} renders: the newest message and generation prompt identical"
    )


# -- suffixes, the date, the assistant mask --------------------------------------------------------


def suffix_contract(fixed: ChatTemplate, max_calls: int) -> ProofStep:
    """``prompt + completion + suffix`` equals the full render's tokens on every probe tool round."""
    checked = 0
    for case in proof_tool_rounds(max_calls):
        history, a, results = case["history"], case["assistant"], case["results"]
        try:
            text = fixed.renderer.text(history + [a] + results, tools=PROBE_TOOLSET, add_generation_prompt=True)
            prompt = fixed.prompt_ids(history, tools=PROBE_TOOLSET)
        except TmplError:
            continue
        full, offsets = fixed.codec.encode_with_offsets(text)
        if full[: len(prompt)] != prompt:
            return ProofStep("suffix contract", False, "the prompt is not a prefix of the full render")
        last_arg = max(
            text.rfind(str(v)) + len(str(v)) for c in a["tool_calls"] for v in c["function"]["arguments"].values()
        )
        j = next(
            (t for t in range(len(prompt), len(full)) if offsets[t][0] >= last_arg and full[t] in fixed.stop_token_ids),
            None,
        )
        if j is None:
            return ProofStep("suffix contract", False, "no stop token closes the assistant turn in the full render")
        try:
            suffix = fixed.suffix_ids(
                results, completion_ids=full[len(prompt) : j + 1], tools=PROBE_TOOLSET, history=history
            )
        except TmplError as exc:
            return ProofStep("suffix contract", False, str(exc))
        if suffix != full[j + 1 :]:
            return ProofStep(
                "suffix contract",
                False,
                f"suffix {fixed.codec.decode(suffix)!r} != {fixed.codec.decode(full[j + 1 :])!r}",
            )
        checked += 1
    if not checked:
        return ProofStep("suffix contract", False, "no probe tool round renders")
    return ProofStep("suffix contract", True, f"{checked} tool rounds: prompt + completion + suffix == full render")


def date_step(original: ChatTemplate, fixed: ChatTemplate, kwarg: str) -> ProofStep:
    """``kwarg`` makes renders on two days identical; without it the fixed template renders as the original."""
    pinned = [renders_on(fixed, d, **{kwarg: "TmPlDaTe"}) for d in DAYS]
    if pinned[0] is None or pinned[0] != pinned[1]:
        return ProofStep("date pinned", False, f"renders on two dates still differ with {kwarg}= given")
    same = all(renders_on(fixed, d) == renders_on(original, d) for d in DAYS)
    if not same:
        return ProofStep("date pinned", False, f"without {kwarg}= the render differs from the original's")
    return ProofStep(
        "date pinned", True, f"{kwarg}= makes renders on different days identical; without it, as the original"
    )


#: the search's conversations the assistant mask is decided and proven on (seeded: always the same)
MASK_SEED, MASK_CASES = 0, 24


@dataclass(frozen=True)
class Generated:
    """A conversation's full render and what the model generated in it: for each assistant turn, the
    tokens after the generation prompt through the first stop token (the trajectory's mask 1)."""

    messages: list[dict[str, Any]]
    kwargs: dict[str, Any]
    text: str
    ids: list[int]
    mask: list[int]
    #: the character span of each assistant turn's generated tokens in ``text``
    spans: list[tuple[int, int]]


def mask_conversations(
    tpl: ChatTemplate, seed: int = MASK_SEED, n: int = MASK_CASES
) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """The search's conversations for ``tpl`` (:func:`~tmpl.report.search.space_for`), with their kwargs."""
    space = space_for(tpl).space
    return [(messages_of(spec, space), dict(spec.kwargs)) for spec in generate(space, seed=seed, n=n)]


def generated(tpl: ChatTemplate, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> Generated | None:
    """What the model generated in ``messages`` as a token-in/token-out rollout builds it (None when the
    template refuses the conversation, or a prompt is not a prefix of the full render, or a turn has no
    stop token: a conversation that says nothing about the mask)."""
    try:
        text = tpl.renderer.text(messages, tools=SPACE_TOOLS, add_generation_prompt=False, **kwargs)
        ids, offsets = tpl.codec.encode_with_offsets(text)
        mask = [0] * len(ids)
        spans = []
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            prompt = tpl.codec.encode_reference(
                tpl.renderer.text(messages[:i], tools=SPACE_TOOLS, add_generation_prompt=True, **kwargs)
            )
            stop = next((t for t in range(len(prompt), len(ids)) if ids[t] in tpl.stop_token_ids), None)
            if ids[: len(prompt)] != prompt or stop is None:
                return None
            mask[len(prompt) : stop + 1] = [1] * (stop + 1 - len(prompt))
            spans.append((offsets[len(prompt)][0], offsets[stop][1]))
    except TmplError:
        return None
    return Generated(messages, kwargs, text, list(ids), mask, spans)


def mask_of(tpl: ChatTemplate, g: Generated) -> tuple[list[int], list[int]]:
    """The ids and ``assistant_masks`` transformers gives for ``g``'s conversation on ``tpl``."""
    out = tpl.tokenizer.apply_chat_template(
        g.messages,
        tools=SPACE_TOOLS,
        chat_template=tpl.template,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        **{**tpl.template_kwargs, **g.kwargs},
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


def mask_difference(tpl: ChatTemplate, g: Generated) -> str | None:
    """How the assistant mask of ``tpl`` differs from the generated tokens of ``g`` (None: equal)."""
    try:
        ids, mask = mask_of(tpl, g)
    except Exception as exc:  # noqa: BLE001 - any failure means no usable mask
        return f"rendering with the mask fails: {type(exc).__name__}: {exc}"
    if ids != g.ids:
        return "the render with markers differs from the render without"
    if mask == g.mask:
        return None
    at = next(t for t in range(len(mask)) if mask[t] != g.mask[t])
    run = at
    while run < len(mask) and mask[run] != g.mask[run]:
        run += 1
    what = "marks" if mask[at] else "leaves out"
    return (
        f"it {what} {tpl.codec.decode(ids[at:run])!r} (after {tpl.codec.decode(ids[max(0, at - 6) : at])!r}), "
        f"which the model {'did not generate' if mask[at] else 'generated'}"
    )


def assistant_mask_step(fixed: ChatTemplate) -> ProofStep:
    """``return_assistant_tokens_mask=True`` on the fixed template marks exactly the tokens the model
    generated (after each generation prompt, through the turn's stop token), on the search's
    conversations: nothing of the turn header the generation prompt holds, nothing after the stop token."""
    checked = turns = 0
    for messages, kwargs in mask_conversations(fixed):
        g = generated(fixed, messages, kwargs)
        if g is None:
            continue
        diff = mask_difference(fixed, g)
        if diff is not None:
            return ProofStep("assistant mask", False, f"{diff} ({_shape(messages, kwargs)})")
        checked += 1
        turns += len(g.spans)
    if not checked:
        return ProofStep("assistant mask", False, "no conversation of the search renders with its generated tokens")
    return ProofStep(
        "assistant mask",
        True,
        f"marks exactly the generated tokens (after the generation prompt, through the stop token) of {turns} "
        f"assistant turns in {checked} conversations",
    )


def _shape(messages: Sequence[dict[str, Any]], kwargs: dict[str, Any]) -> str:
    roles = " ".join(str(m.get("role")) for m in messages)
    return f"messages: {roles}" + (f"; kwargs {kwargs}" if kwargs else "")

"""``TemplateReport``: is a chat template safe for token-in/token-out multi-turn training?

>>> report = tmpl.report.check(tpl)      # doctest: +SKIP
>>> report.verdicts["tool_loop"].label    # doctest: +SKIP
'SAFE'
>>> print(report.to_markdown())           # doctest: +SKIP

The report is computed by probing (see :mod:`tmpl.suffix.probe`, :mod:`tmpl.report.stability`) and
kept in the template's per-fingerprint state. Verdicts, per use:

- ``tool_loop``: rounds of tool calls within one user turn, token-in/token-out;
- ``multi_user``: conversations that go on with new user turns;
- ``env_turns``: user and system turns after an assistant turn (after its answer or its tool results),
  as an environment or a simulated user appends them (:mod:`tmpl.report.turns`).

Each is ``SAFE``, ``SAFE WITH tmpl TEMPLATE <name>`` (a template tmpl ships renders the same
last turn and is safe), ``UNSAFE (reason)`` or ``UNSUPPORTED (reason)``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import templates as shipped
from ..chat_template import ChatTemplate
from ..errors import SpliceError, TmplError, UnsupportedTemplateError
from ..sentinels import USER_SENTINEL, arg_sentinel, call_id, content_sentinel, dummy_tool_turn
from ..suffix.probe import count_anchors
from ..toolcalls.api import parser_for
from .search import USES, SearchResult, counterexample_text, search, space_for
from .space import Space
from .stability import PROBE_TOOLSET, Check, conversations, date_injected, frozen_date
from .turns import counterexample_lines, search_turns, verdict_of
from .verdict import SAFE as SAFE
from .verdict import SAFE_WITH as SAFE_WITH
from .verdict import UNPROVEN as UNPROVEN
from .verdict import UNSAFE as UNSAFE
from .verdict import UNSUPPORTED as UNSUPPORTED
from .verdict import Verdict as Verdict

#: conversations generated per report (at least one per shape of the template's space), and their seed
CASES = 32
SEED = 0


@dataclass
class TemplateReport:
    """Everything tmpl found out about one template with one tokenizer."""

    name: str
    fingerprint: str
    tokenizer: str
    plain_renders: bool | None
    plain_error: str | None
    tool_renders: bool | None
    tool_error: str | None
    calls_visible: bool | None
    results_visible: bool | None
    max_parallel_calls: int
    parser: str | None
    plain_close: str | None
    tool_close: str | None
    close_is_eos: bool | None
    after_close: str | None
    generation_prompt: str | None
    generation_prompt_ids: list[int]
    stop_tokens: list[str]
    stability: dict[str, Check]
    date_injected: bool | None
    reasoning_rendered: bool | None
    fast_path: dict[str, str]
    per_call_classes: list[str]
    history_dependence: str | None
    splice_safe: bool | None
    splice_detail: str | None
    assistant_mask: bool | None
    verdicts: dict[str, Verdict]
    notes: list[str] = field(default_factory=list)
    probe_ms: float = 0.0
    #: the call syntax in words when ``parser == "learned"`` (learned from the template's renders)
    parser_syntax: str | None = None
    #: conversations the search generated, and how many of them the template rendered and were checked
    cases: int = 0
    checked_cases: int = 0
    #: the tool-call turn shapes among the checked conversations
    shapes: list[str] = field(default_factory=list)
    #: shapes the template refuses (raises on, or renders without the calls): error, shape, messages
    refused_shapes: list[dict[str, Any]] = field(default_factory=list)
    #: which ``content`` tool-call turns must carry for their calls to render
    call_content: str | None = None
    #: the reasoning fields and kwargs (with the values tried) the search varied
    reasoning_fields: list[str] = field(default_factory=list)
    kwargs_tried: dict[str, list[Any]] = field(default_factory=dict)
    #: checks that could not run, and why (any makes the verdict UNPROVEN)
    unproven: list[str] = field(default_factory=list)
    #: templates that render image parts: the images check (:mod:`tmpl.report.multimodal`); else None
    images: Any = None
    #: turns that are not tool results after an assistant turn: per role (user, system, developer) the
    #: level, reason and cases, the counterexamples and the places checked (:mod:`tmpl.report.turns`)
    env_turns: dict[str, Any] = field(default_factory=dict)

    def history_mode(self) -> tuple[str, str]:
        """Which ``Rollout(history=...)`` trains this template on the contexts it sees when deployed,
        and why: ``"append"`` where appending exact suffixes is proven to give the deployed render
        (tool loop and several user turns both SAFE: one sequence per sample, the cheapest);
        ``"template"`` where the template rewrites the history (it drops reasoning, moves content) or
        that is not proven: each prompt rendered as deployed, the sampled IDs it keeps spliced back
        (docs/rollouts.md, "History modes"); ``"-"`` where a plain conversation does not render as a
        turn tmpl can close (no stop token to end it, no place to splice IDs): neither mode runs it.

        >>> tmpl.report.check(tpl).history_mode()   # doctest: +SKIP
        ('template', 'several user turns UNSAFE: ...')
        """
        if self.plain_renders is False:  # no turn tmpl can close and splice: neither mode runs it
            return "-", f"no rollout runs it: {self.plain_error or 'a plain conversation does not render'}"
        levels = {use: self.verdicts[use] for use in ("tool_loop", "multi_user")}
        if all(v.level == SAFE for v in levels.values()):
            return "append", "append-only is the deployed render: tool loop and several user turns SAFE"
        names = {"tool_loop": "tool loop", "multi_user": "several user turns"}
        why = ", ".join(f"{names[use]} {v.label}" for use, v in levels.items() if v.level != SAFE)
        return "template", f"{why}: append-only would train on contexts the deployed template never renders"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (checks and verdicts included)."""
        out = asdict(self)
        out["history_mode"] = list(self.history_mode())
        out["stability"] = {k: v.to_dict() for k, v in self.stability.items()}
        out["verdicts"] = {k: {**asdict(v), "label": v.label} for k, v in self.verdicts.items()}
        if self.images is not None:
            out["images"]["label"] = self.images.label
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kwargs)

    def to_markdown(self) -> str:
        """A human-readable report (no timings or dates, so it is reproducible)."""

        def yn(v: bool | None) -> str:
            return "n/a" if v is None else ("yes" if v else "no")

        lines = [
            f"# `{self.name}`",
            "",
            f"- tokenizer: `{self.tokenizer}`; fingerprint `{self.fingerprint[:16]}`",
            f"- **tool loop (token-in/token-out): {self.verdicts['tool_loop'].label}**{self._proven('tool_loop')}",
            f"- **several user turns: {self.verdicts['multi_user'].label}**{self._proven('multi_user')}",
            f"- **user and system turns after an assistant turn (environments): {self._env_label()}**"
            + self._env_roles(),
            "- **history mode that trains it as deployed: {}** ({})".format(*self.history_mode()),
            "",
            "## Tool support",
            f"- plain conversation renders: {yn(self.plain_renders)}"
            + (f" ({self.plain_error})" if self.plain_error else ""),
            f"- tool conversation renders: {yn(self.tool_renders)}"
            + (f" ({self.tool_error})" if self.tool_error else ""),
            f"- tool calls visible: {yn(self.calls_visible)}; tool results visible: {yn(self.results_visible)}",
            f"- parallel calls rendered: up to {self.max_parallel_calls}",
            f"- tool-call parser: {self.parser or 'none detected'}"
            + (
                f" (no hand-written parser reads the calls; learned from the template's renders: {self.parser_syntax})"
                if self.parser_syntax
                else ""
            ),
            "",
            "## Turn close",
            f"- plain turn closes with `{self.plain_close}`; tool-call turn with `{self.tool_close}`"
            f" (EOS: {yn(self.close_is_eos)})",
            f"- text after the close (start of the suffix): `{json.dumps(self.after_close)}`",
            f"- generation prompt: `{json.dumps(self.generation_prompt)}`",
            f"- stop tokens: {', '.join(f'`{t}`' for t in self.stop_tokens) or 'none'}",
            "",
            "## Prefix stability",
        ]
        for name, check in self.stability.items():
            lines.append(f"- {name}: {'stable' if check.ok else 'NOT stable: ' + check.reason} ({check.cases} cases)")
        lines += [
            f"- date injected (`strftime_now`): {yn(self.date_injected)}",
            f"- reasoning of the assistant rendered: {yn(self.reasoning_rendered)}",
            "",
            "## Suffix",
            "- fast path (no render per call): "
            + (", ".join(f"{k} contents via {v}" for k, v in self.fast_path.items()) or "none"),
            f"- per-call render for: {', '.join(self.per_call_classes) or 'nothing'}",
            f"- depends on earlier messages: {self.history_dependence or 'no'}",
            f"- splice-safe: {yn(self.splice_safe)}" + (f" ({self.splice_detail})" if self.splice_detail else ""),
            f"- assistant mask (`{{% generation %}}`): {yn(self.assistant_mask)}",
        ]
        lines += self._search_lines()
        lines += self._env_lines()
        if self.images is not None:
            im = self.images
            lines += [
                "",
                "## Images",
                f"- image placeholder: `{json.dumps(im.placeholder)[1:-1][:120]}`",
                f"- processor: {im.processor or 'none buildable here'}",
                f"- placeholders expanded as the processor's full render: {im.placeholders.label}",
                f"- suffix of a tool result with an image: {im.suffix.label}",
            ] + [f"- {n}" for n in im.notes]
        if self.notes:
            lines += ["", "## Notes"] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def _env_label(self) -> str:
        v = self.verdicts.get("env_turns")
        return v.label if v is not None else "not checked"

    def _env_roles(self) -> str:
        roles = self.env_turns.get("roles", {})
        if not roles:
            return ""
        places = ", ".join(self.env_turns.get("places", []))
        per_role = "; ".join(f"{r} {d['level']}" for r, d in roles.items())
        return f" (per role: {per_role}; checked: {places})"

    def _proven(self, use: str) -> str:
        v = self.verdicts[use]
        if v.level != SAFE or not self.cases:
            return ""
        return f" (proven: {v.cases} appends checked on {self.checked_cases} of {self.cases} generated conversations)"

    def counterexamples(self) -> dict[str, dict[str, Any]]:
        """The counterexample of each failed check (JSON-able), by check name."""
        return {n: c.counterexample for n, c in self.stability.items() if not c.ok and c.counterexample}

    def _search_lines(self) -> list[str]:
        """The searched space, what the template refuses, and each counterexample (messages and renders)."""
        if not self.cases:
            return []
        lines = ["", "## Searched conversations"]
        lines.append(
            f"- {self.cases} generated, {self.checked_cases} rendered and checked (seeded; see docs/concepts.md)"
        )
        if self.call_content:
            lines.append(f"- {self.call_content}")
        lines.append(
            f"- reasoning sent under: {', '.join(self.reasoning_fields) or 'nothing (the template reads none)'}"
        )
        if self.kwargs_tried:
            lines.append(
                "- template kwargs tried: " + ", ".join(f"`{k}` in {v!r}" for k, v in self.kwargs_tried.items())
            )
        if self.shapes:
            lines.append(f"- tool-call turn shapes checked: {len(self.shapes)} (`--json` lists them)")
        for r in self.refused_shapes:
            lines.append(f"- refused: {', '.join(r['shape'])}: {r['error']}")
        for u in self.unproven:
            lines.append(f"- could not check: {u}")
        for name, ce in self.counterexamples().items():
            lines += ["", f"## Counterexample: {name}", "", "```", counterexample_text(ce), "```"]
        return lines

    def _env_lines(self) -> list[str]:
        """The counterexample of each role that cannot follow an assistant turn (with or without tools)."""
        lines = []
        for role, ce in self.env_turns.get("counterexamples", {}).items():
            lines += ["", f"## Counterexample: a {role} turn after an assistant turn", "", "```"]
            lines += counterexample_lines(ce) + ["```"]
        return lines


def _tool_shapes(k: int) -> list[dict[str, Any]]:
    names = [t["function"]["name"] for t in PROBE_TOOLSET]
    return [{"role": "tool", "name": names[i % len(names)], "tool_call_id": call_id(0, i)} for i in range(k)]


def _parallel_calls(tpl, max_k: int = 3) -> int:
    """How many calls of one assistant turn the template renders, with all their results."""
    best = 0
    for k in range(1, max_k + 1):
        shapes = _tool_shapes(k)
        history, assistant, results = dummy_tool_turn(
            shapes, [content_sentinel(i) for i in range(k)], [call_id(0, i) for i in range(k)]
        )
        try:
            text = tpl.renderer.text(history + [assistant] + results, tools=PROBE_TOOLSET, add_generation_prompt=True)
        except TmplError:
            break
        visible = count_anchors(text, USER_SENTINEL, [arg_sentinel(i) for i in range(k)])
        if visible not in (0, k) or not all(content_sentinel(i) in text for i in range(k)):
            break
        best = k
    return best


_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _assistant_mask(tpl) -> bool:
    """Whether ``return_assistant_tokens_mask`` works: the template marks generated text."""
    if not _GENERATION_TAG.search(tpl.template):
        return False
    try:
        out = tpl.tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "TmPlMaSkEd"}],
            chat_template=tpl.template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            **tpl.template_kwargs,
        )
    except Exception:  # noqa: BLE001 - any failure to render with a mask means no mask support
        return False
    ids, mask = out["input_ids"], out["assistant_masks"]
    picked = [i for i, m in zip(ids, mask) if m]
    return "TmPlMaSkEd" in tpl.codec.decode(picked)


def _parser_syntax(tpl) -> str | None:
    """The learned call syntax in words, when the template's parser was learned (else None)."""
    try:
        parser = parser_for(tpl)
    except TmplError:
        return None
    syntax = getattr(parser, "syntax", None)
    return syntax.describe() if syntax is not None else None


def _parser_name(tpl) -> str | None:
    """The detected tool-call parser's name (None when no parser reads this template's calls)."""
    try:
        parser = parser_for(tpl)
    except TmplError:
        return None
    return getattr(parser, "name", None) or str(parser)


def build_report(tpl, *, shipped: bool = True) -> TemplateReport:
    """Probe ``tpl`` (a :class:`tmpl.ChatTemplate`) and judge it. ``shipped=False`` skips
    trying tmpl's training-safe templates for a ``SAFE WITH`` verdict."""
    start = time.perf_counter()
    turns = tpl.engine.turns
    codec = tpl.codec
    tok_name = str(getattr(tpl.tokenizer, "name_or_path", "") or type(tpl.tokenizer).__name__)
    notes: list[str] = []
    eos = getattr(tpl.tokenizer, "eos_token_id", None)

    gen_prompt, gen_ids = None, []
    try:
        with_gen = tpl.renderer.text([{"role": "user", "content": USER_SENTINEL}], add_generation_prompt=True)
        without = tpl.renderer.text([{"role": "user", "content": USER_SENTINEL}], add_generation_prompt=False)
        if with_gen.startswith(without):
            gen_prompt = with_gen[len(without) :]
            gen_ids = codec.encode(with_gen)[len(codec.encode(without)) :]
    except TmplError:
        pass

    tool_error = turns.tool_error
    frame = None
    if turns.tool is not None:
        try:
            frame = tpl.engine.frame(_tool_shapes(1), PROBE_TOOLSET)
        except TmplError as exc:
            tool_error = exc
    max_k = _parallel_calls(tpl) if turns.tool is not None else 0
    splice_safe = not isinstance(tool_error, SpliceError) and turns.tool is not None
    found: SearchResult | None = None
    probed = None
    if frame is not None:
        with frozen_date(2024, 1, 2):  # templates that print today's date render alike in every case
            probed = space_for(tpl)
            found = search(tpl, probed, n=CASES, seed=SEED)
    checks = _checks(found)
    env_turns: dict[str, Any] = {}
    if turns.plain is not None:  # a turn tmpl can close: can an environment's turn follow it?
        with frozen_date(2024, 1, 2):
            space = probed.space if probed is not None else Space(call_contents=("text",))
            env_turns = search_turns(tpl, space, calls=probed is not None).to_dict()
    after_close = None
    if turns.tool is not None:  # the text right after the close, from a one-call render
        shapes = _tool_shapes(1)
        history, assistant, results = dummy_tool_turn(shapes, [content_sentinel(0)], [call_id(0, 0)])
        try:
            text = tpl.renderer.text(history + [assistant] + results, tools=PROBE_TOOLSET, add_generation_prompt=True)
            close_end = text.find(turns.tool.close.text, text.find(arg_sentinel(0)))
            if close_end >= 0:
                after = text[close_end + len(turns.tool.close.text) :]
                after_close = after[: after.find(content_sentinel(0))] if content_sentinel(0) in after else after
        except TmplError:
            pass

    report = TemplateReport(
        name=tpl.name,
        fingerprint=tpl.fingerprint,
        tokenizer=tok_name,
        plain_renders=turns.plain is not None,
        plain_error=str(turns.plain_error) if turns.plain_error else None,
        tool_renders=turns.tool is not None and not isinstance(tool_error, UnsupportedTemplateError),
        tool_error=str(tool_error) if tool_error else None,
        calls_visible=frame.calls_visible if frame else None,
        results_visible=True if frame else (False if tool_error and "not rendered" in str(tool_error) else None),
        max_parallel_calls=max_k,
        parser=_parser_name(tpl) if frame else None,
        parser_syntax=_parser_syntax(tpl) if frame else None,
        plain_close=turns.plain.close.text if turns.plain else None,
        tool_close=turns.tool.close.text if turns.tool else None,
        close_is_eos=(turns.tool.close.ids[0] == eos) if turns.tool else None,
        after_close=after_close,
        generation_prompt=gen_prompt,
        generation_prompt_ids=list(gen_ids),
        stop_tokens=sorted(codec.token_text(t) for t in tpl.stop_token_ids),
        stability=checks,
        date_injected=date_injected(tpl),
        reasoning_rendered=found is not None and found.reasoning_rendered,
        fast_path=dict(frame.transforms) if frame else {},
        per_call_classes=[c for c in ("plain", "padded", "empty") if frame and c not in frame.transforms],
        history_dependence=frame.history_dependence if frame else None,
        splice_safe=splice_safe,
        splice_detail=tool_error.boundary if isinstance(tool_error, SpliceError) else None,
        assistant_mask=_assistant_mask(tpl),
        verdicts={},
        notes=notes,
        env_turns=env_turns,
    )
    if found is not None and probed is not None:
        report.cases, report.checked_cases, report.shapes = found.cases, found.checked_cases, found.shapes
        report.refused_shapes = [r.to_dict() for r in found.refusals]
        report.call_content = probed.call_content_note
        report.reasoning_fields = list(probed.space.reasoning_fields)
        report.kwargs_tried = {k: list(v) for k, v in probed.space.kwargs.items()}
        report.unproven = list(found.unproven)
    if report.date_injected:
        notes.append(
            "the template renders today's date: prompts rendered on different days differ "
            "(pass date_string= or a fixed template kwarg to pin it)"
        )
    if turns.plain is not None and turns.plain.tools_needed:
        notes.append("the template renders a plain conversation only when given a tools list")
    if frame is not None and not frame.calls_visible:
        notes.append("the assistant's tool calls are not rendered: history does not show what was called")
    report.verdicts = judge(report)
    report.images = _images(tpl)
    if shipped and any(v.level in (UNSAFE, UNSUPPORTED) for v in report.verdicts.values()):
        _try_shipped(tpl, report)
    report.probe_ms = (time.perf_counter() - start) * 1000
    return report


def _images(tpl: Any) -> Any:
    """The images check of a template that renders image parts (None otherwise)."""
    from .multimodal import check_images

    return check_images(tpl)


def judge(r: TemplateReport) -> dict[str, Verdict]:
    """Verdicts from the findings (pure function of the report)."""

    def base() -> Verdict | None:
        if r.splice_detail is not None:
            return Verdict(UNSAFE, f"the turn close is not a single token of this tokenizer, {r.splice_detail}")
        if not r.tool_renders:
            reason = (r.tool_error or "no tool conversation").split("': ", 1)[-1]
            return Verdict(UNSUPPORTED, reason.removeprefix("cannot render a tool conversation: rendering failed: "))
        if r.calls_visible is False:
            return Verdict(UNSUPPORTED, "tool calls are not rendered")
        return None

    out = {}
    problem = base()
    for use, needed in (("tool_loop", ("tool_append", "assistant_kept")), ("multi_user", ("user_append",))):
        if problem is not None:
            out[use] = problem
            continue
        failed = [r.stability[n] for n in needed if not r.stability[n].ok]
        steps = sum(r.stability[n].cases for n in needed)
        if failed:
            out[use] = Verdict(UNSAFE, failed[0].reason)
        elif r.unproven:
            out[use] = Verdict(UNPROVEN, r.unproven[0])
        elif not steps:
            refused = "; ".join(sorted({f["error"] for f in r.refused_shapes}))
            out[use] = Verdict(
                UNPROVEN, "no probe conversation could be checked" + (f" ({refused})" if refused else "")
            )
        else:
            out[use] = Verdict(SAFE, cases=steps)
    if r.env_turns:
        out["env_turns"] = verdict_of(r.env_turns)
    elif r.plain_renders is False:
        out["env_turns"] = Verdict(UNSUPPORTED, r.plain_error or "a plain conversation does not render")
    else:
        out["env_turns"] = Verdict(UNPROVEN, "not checked")
    return out


def _checks(found: SearchResult | None) -> dict[str, Check]:
    """The report's per-check view of a search (each check failed by at most one counterexample)."""
    checks: dict[str, Check] = {}
    for use, names in USES.items():
        failure = found.failures.get(use) if found is not None else None
        for name in names:
            if found is None:
                checks[name] = Check(ok=False, reason="not checked")
                continue
            check = Check(ok=True, cases=found.steps[name])
            if failure is not None and failure.check == name:
                check.ok, check.reason, check.counterexample = False, failure.reason, failure.counterexample
            checks[name] = check
    return checks


def _try_shipped(tpl, report: TemplateReport) -> None:
    """Upgrade UNSAFE verdicts to SAFE WITH tmpl TEMPLATE X where a shipped template fits."""
    for info in shipped.available():
        if not all(len(tpl.codec.encode(t)) == 1 for t in info.special_tokens):
            continue
        candidate = ChatTemplate(tpl.tokenizer, shipped.load(info.name), name=info.name, **tpl.template_kwargs)
        if not renders_same_last_turn(tpl, candidate, max_calls=report.max_parallel_calls):
            continue
        # kept per fingerprint: every template on this tokenizer that it fits asks the same question
        verdicts = candidate.engine.state.memo(
            "report:own", lambda c=candidate: build_report(c, shipped=False)
        ).verdicts
        for use, verdict in report.verdicts.items():
            if verdict.level in (UNSAFE, UNSUPPORTED) and verdicts[use].level == SAFE:
                report.verdicts[use] = Verdict(SAFE_WITH, verdict.label, info.name)


def _tail_after(text: str, marker: str) -> str | None:
    at = text.rfind(marker)
    return text[at + len(marker) :] if at >= 0 else None


def renders_same_last_turn(original, candidate, max_calls: int = 2) -> bool:
    """Whether ``candidate`` renders the last turn as ``original`` does.

    Checked: the generation prompt after the last user message and after tool results, and
    the final assistant message (plain, and with ``max_calls`` calls) as the last message.
    Reasoning is left out of the final message: keeping the reasoning the model generated is
    exactly what training-safe variants change, so there the variant may show more.
    """
    compared = [0, 0, 0, 0]
    for case in conversations(max_calls=max(max_calls, 1), n=4):
        history, results = case["history"], case["results"]
        assistant = {k: v for k, v in case["assistant"].items() if k != "reasoning_content"}
        reply = {"role": "assistant", "content": "Here is the answer."}
        marker = history[-1]["content"]
        checks = (
            (history, True, marker),
            (history + [reply], False, marker),
            (history + [assistant], False, marker),
            (history + [case["assistant"]] + results, True, results[-1]["content"]),
        )
        for n, (messages, gen, anchor) in enumerate(checks):
            try:
                a = original.renderer.text(messages, tools=PROBE_TOOLSET, add_generation_prompt=gen)
            except TmplError:
                continue
            try:
                b = candidate.renderer.text(messages, tools=PROBE_TOOLSET, add_generation_prompt=gen)
            except TmplError:
                return False
            if _tail_after(a, anchor) != _tail_after(b, anchor):
                return False
            compared[n] += 1
    return all(compared)  # nothing proven where the original could not render a case

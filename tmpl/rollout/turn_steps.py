"""The steps around one turn of a sample: its tool round, its model call recorded in the episode, a history edit\n(edit_history), the next prompt (a suffix, or template mode's render), a sample's trajectory made."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..backends.base import GenerationResult
from ..episode import Call
from ..errors import HistorySpliceError, TmplError
from ..messages import validate_messages
from ..trajectory import _twin
from . import images as _images
from .checks import RolloutChecks
from .codes import EndCode
from .envs import schemas_of
from .history import HistoryContext, SampledTurn, splice, view
from .sample import SampleRun
from .scheduler import Scheduler
from .toolround import ToolRounds
from .versions import APPENDED

if TYPE_CHECKING:
    from ..toolcalls.types import ParsedCompletion
    from ..trajectory import Trajectory
    from .subagent import SubAgent


class TurnSteps(RolloutChecks):
    """Rollout's methods of this module (a mixin: its attributes are Rollout's, declared here for the checker)."""

    routes: bool
    edit_history: Callable[[list[dict[str, Any]], HistoryContext], Any] | None
    max_length: int
    max_completion_length: int | None
    _subagents: Mapping[str, SubAgent]

    async def _tool_round(
        self,
        run: SampleRun,
        parsed: ParsedCompletion,
        assistant: dict[str, Any],
        completion: list[int],
        scheduler: Scheduler,
        rounds: ToolRounds | None,
    ) -> bool:
        """Run the calls of one completion and append their exact suffix. False once the sample ended."""
        assert rounds is not None
        before = run.history[:-1]  # the messages before the assistant turn
        with scheduler.working():  # tools and suffix batched with the other samples of this pass
            done = await rounds.run(parsed, completion, before, run.traj.remaining)  # results cut to it
        run.times.tools += done.tool_seconds
        run.times.suffix += done.suffix_seconds
        tool_messages = done.messages
        run.calls += done.calls
        if self._subagents:
            self._take_subagents(run, parsed, run.turns - 1)
        run.failures += done.failed
        run.count_failures(done.failures)
        if self._rendered and done.error is None:  # the next prompt is rendered from the messages
            run.history += tool_messages
            if done.stop:
                return run.end(EndCode.TOOL_STOP, "a tool failed and on_error='stop'")
            return await self._edit(run, run.turns - 1, answered=False) is not False
        if done.error is not None:
            if not isinstance(done.error, TmplError):
                raise done.error
            run.history += tool_messages
            return run.end(EndCode.SUFFIX_FAILED, f"cannot build the tool suffix: {done.error}")
        suffix = done.suffix
        assert suffix is not None
        with run.clock("suffix"):
            verified = not self.verify_every or self._verify(before, assistant, tool_messages, suffix)
        if verified is None:  # the check could not run: appended, and counted as unverified
            run.unverified += 1
        elif not verified:
            run.history += tool_messages
            return run.end(EndCode.VERIFY_FAILED, "suffix verification against a full render failed")
        message_index = len(run.history)
        run.history += tool_messages
        with run.clock("bookkeeping"):
            if self.vision is None:
                appended = run.traj.add_suffix(suffix, message=message_index)
            else:  # with the images of its placeholders
                appended = _images.add_suffix(run, suffix, message_index)
            run.sequence += suffix if appended == len(suffix) else suffix[:appended]
            run.versions += APPENDED * appended
        if done.stop:
            return run.end(EndCode.TOOL_STOP, "a tool failed and on_error='stop'")
        if not run.traj.running:
            return run.end(EndCode.BUDGET_CUT)
        return True

    # -- history modes (rollout/history.py) ------------------------------------------------------
    def _take_subagents(self, run: SampleRun, parsed: ParsedCompletion, turn: int) -> None:
        """The sub-agent runs this turn's tool calls made: into the sample's episode under the turn's call
        (template mode: it holds that call now), or kept for the result's episode (append mode)."""
        for call in parsed.tool_calls:
            agent = self._subagents.get(call.name)
            done = agent.take(call) if agent is not None else None
            if done is None:
                continue
            if run.episode is not None and f"turn-{turn}" in run.episode._index:
                done.add_to(run.episode, f"turn-{turn}")
            else:
                run.subagents.append((turn, done))

    def _call(self, run: SampleRun, turn: int, sent: int, kept: int, result: GenerationResult) -> Call:
        """The episode call of this turn's generation (its kept tokens), remembered for later splices."""
        ids = run.sequence[sent:]
        assert result.logprobs is not None and len(ids) == kept
        call = Call(
            run.sequence[:sent],
            ids,
            result.logprobs[:kept],
            versions=run.versions[len(run.versions) - kept :].tolist(),
            id=f"turn-{turn}",
            turn=turn,
        )
        turn_record = SampledTurn.of(self.tpl.codec, f"turn-{turn}", len(run.history), ids)
        before = _last_text(run.history[-1].get("content")) if run.history else None
        if isinstance(before, str) and before.strip():  # searched first: the turn comes after it
            turn_record = dataclasses.replace(turn_record, after=before.strip().encode("utf-8"))
        run.sampled.append(turn_record)
        return call

    def _add_call(self, run: SampleRun, call: Call, assistant: dict[str, Any] | None) -> None:
        """Add ``call`` to the sample's episode: it merges or branches (labelled with what changed)."""
        assert run.episode is not None and run.view is not None
        messages = run.view + ([assistant] if assistant is not None else [])
        index = run.episode.add_call(call, edit=run.edit, messages=messages, apart=run.apart)
        if self.routes:  # the routes of the sequence it went to: its trajectory's (the same positions)
            held = run.traj.routes
            if held is not None:
                run.seq_routes[index] = (held.copy(), run.traj.routes_known.copy())
        if self.vision is not None:  # the images its prompt was sent: the sequence's (a merge sends the same)
            run.seq_images[index] = run.images
            run.current, run.apart = index, {}
        run.edit = None
        if assistant is not None:
            run.view = messages

    async def _edit(self, run: SampleRun, turn: int, *, answered: bool) -> bool | None:
        """Call the ``edit_history`` hook between turns. True: go on; False: the sample ended (a code);
        None: the model answered and the hook did not go on (the caller ends the sample FINISHED)."""
        hook = self.edit_history
        if hook is None:
            return None if answered else True
        ctx = HistoryContext(run.index, run.sample, turn, answered)
        try:
            out = hook(copy.deepcopy(run.history), ctx)
            if inspect.isawaitable(out):
                out = await out
        except Exception as exc:  # noqa: BLE001 - the user's hook: its sample ends, named
            self._recorded(run, ctx)
            return run.end(EndCode.EDIT_FAILED, f"edit_history raised {type(exc).__name__} after turn {turn}: {exc}")
        self._recorded(run, ctx)
        if out is None:
            return None if answered else True
        try:
            if isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Sequence):
                raise TypeError(f"it returned {type(out).__name__}, not a list of messages")
            messages = [dict(m) if isinstance(m, Mapping) else m for m in out]
            validate_messages(messages, where="edit_history")
        except (TmplError, TypeError, ValueError) as exc:
            return run.end(EndCode.EDIT_REJECTED, f"edit_history after turn {turn}: {exc}")
        if answered and messages[-1].get("role") != "user":
            run.history = messages
            return None
        if messages[: len(run.history)] != run.history:  # an edit, not only messages added after
            run.sampled = _follow(run.sampled, run.history, messages)
            run.edit = "edit_history" + (f": {ctx.label}" if ctx.label else "")
        run.history = messages
        return True

    @staticmethod
    def _recorded(run: SampleRun, ctx: HistoryContext) -> None:
        """The model calls the hook recorded (``ctx.record_call``): untrained calls of the episode."""
        assert run.episode is not None
        for call in ctx.calls:
            run.episode.add_call(call)

    def _next_prompt(self, run: SampleRun, turn: int) -> bool:
        """Render the history, splice the sampled IDs back in, and continue the sample's sequence or
        start a new one (a branch). False once the sample ended."""
        sample = f"{run.index}/{run.sample}"
        rendered = None
        with run.clock("suffix"):
            try:
                if self.vision is None:
                    tools = schemas_of(self, run.env)  # an episode's own tools
                    text = self.tpl.renderer.text(run.history, tools=tools, add_generation_prompt=True)
                else:  # through the processor: the sampled IDs go into the render with its images expanded
                    rendered = _images.render_history(self.vision, run.history, self.tool_schemas)
                    text = rendered.text
                spliced = splice(self.tpl, text, run.sampled, run.gaps, sample=sample, turn=turn, messages=run.history)
                prompt = spliced.ids
                if rendered is not None:
                    prompt = _images.placed(rendered, prompt, template=self.tpl.name, sample=sample, turn=turn)
            except HistorySpliceError as exc:
                return run.end(EndCode.RENDER_FAILED, str(exc))
            except TmplError as exc:
                code = EndCode.EDIT_REJECTED if run.edit is not None else EndCode.RENDER_FAILED
                return run.end(code, f"turn {turn}: the template cannot render the history: {exc}")
            if rendered is not None:  # sequences whose IDs it extends but whose images differ: a branch
                run.apart = _images.image_clashes(run, prompt)
        run.kept.append(spliced.kept)
        run.view = view(run.history, spliced.dropped)
        pixels = (
            "; ".join(f"{why} than in sequence {k}" for k, why in run.apart.items()) if rendered is not None else ""
        )
        run.edit = "; ".join(e for e in (run.edit, spliced.edit, pixels) if e) or None
        with run.clock("bookkeeping"):
            n = len(run.sequence)
            goes_on = rendered is None or run.current not in run.apart
            if goes_on and len(prompt) >= n and prompt[:n] == run.sequence:  # nothing rewritten: it goes on
                delta = prompt[n:]
                if rendered is None:
                    appended = run.traj.add_suffix(delta) if delta else 0
                else:  # with the images of its placeholders
                    appended = _images.add_prompt_delta(run, prompt)
                    run.image_sources = rendered.sources[: run.images.count]
                run.sequence += delta if appended == len(delta) else delta[:appended]
                run.versions += APPENDED * appended
                return run.traj.running or run.end(EndCode.BUDGET_CUT)
            if len(prompt) >= self.max_length:
                return run.end(
                    EndCode.NO_BUDGET,
                    f"turn {turn}: the rendered prompt starts a new sequence of {len(prompt)} tokens, "
                    f"max_length={self.max_length} leaves none to generate",
                )
            run.traj = self._trajectory(run.index, run.sample, prompt)
            run.sequence = list(prompt)
            run.versions = array("i")
            run.routed = 0  # a new sequence: routed from its first position
            if rendered is not None:  # a branch holds the images of its own prompt
                run.images = _images.images_of(run.traj)
                run.image_sources = rendered.sources[: run.images.count]
        return True

    def _trajectory(self, i: int, s: int, prompt: list[int]) -> Trajectory:
        if self.vision is not None:
            traj = _images.trajectory(self.vision, self.max_length, self.max_completion_length, f"{i}/{s}", prompt)
            return traj  # type: ignore[no-any-return]
        return _twin.builder.Trajectory(
            prompt,
            self.max_length,
            self.max_completion_length,
            vocab_size=self.tpl.codec.vocab_size,
            sample_id=f"{i}/{s}",
        )


def _last_text(content: Any) -> Any:
    """A message's content as the splice searches for it before the next turn: a string as it is; of
    content parts (an image and its caption), the text of the last text part.

    >>> _last_text([{"type": "image"}, {"type": "text", "text": "Reply OK."}])
    'Reply OK.'
    """
    if isinstance(content, (list, tuple)):
        texts = [p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        return texts[-1] if texts else None
    return content


def _follow(turns: list[SampledTurn], before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[SampledTurn]:
    """The sampled turns with their message indices moved to where an edit put their messages (-1: the
    edit removed or changed the message, so its text is searched no more)."""
    out = []
    k = 0
    for t in turns:
        index = -1
        if 0 <= t.message < len(before):
            old = before[t.message]
            for j in range(k, len(after)):
                if after[j] == old:
                    index, k = j, j + 1
                    break
        out.append(dataclasses.replace(t, message=index))
    return out

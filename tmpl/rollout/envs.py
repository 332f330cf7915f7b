"""One sample's environment in the loop (``Rollout(env_factory=...)``): made, reset, stepped, closed.

:func:`run_episode` makes the environment, resets it on the task, renders the opening conversation
with this episode's tools into the prompt, runs the sample's turns (the loop's own) and closes the
environment on every end: done, truncated, max_turns, a budget, a failed generation, a crash, a
cancel. :func:`env_turn` is one step: the parsed assistant message goes to ``step``; the messages it
returns are appended with their exact suffix (:func:`tmpl.env.turns.turn_suffix`).

>>> rollout = tmpl.Rollout(tpl, backend, env_factory=ShopEnv, max_turns=8)      # doctest: +SKIP
>>> [r.env_reward for r in rollout.run(tasks)]                                 # doctest: +SKIP
[1.0, 0.0]
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..env.checks import check_reset, check_step
from ..env.protocol import call_env
from ..env.turns import turn_suffix_text
from ..episode import Call, Episode
from ..errors import EnvError, TmplError
from ..toolcalls.api import parser_for
from ..toolcalls.schema import tool_schema
from ..tools.toolbox import Toolbox
from .codes import EndCode
from .result import RolloutResult
from .versions import APPENDED

if TYPE_CHECKING:
    from .sample import SampleRun
    from .scheduler import Scheduler

#: the loop's Rollout (typed loosely: the loop imports this module, never the reverse)
Rollout = Any

logger = logging.getLogger("tmpl.rollout")


class EpisodeEnv:
    """A sample's environment and what it gave: tools, state, summed reward, info, calls, error.

    ``closed`` turns True once ``close`` was called (whatever it did); until then the sample's end is
    held (:meth:`tmpl.rollout.sample.SampleRun.end`) so that a ``close`` that raises still names it.
    """

    __slots__ = (
        "env",
        "name",
        "sample",
        "schemas",
        "state",
        "reward",
        "info",
        "error",
        "closed",
        "pending",
        "text",
        "_seen",
    )

    def __init__(self, sample: str) -> None:
        self.env: Any = None
        self.name = "env"
        self.sample = sample
        self.schemas: list[dict[str, Any]] | None = None  # this episode's tools as rendered (None: the rollout's)
        self.state: Any = None
        self.reward: float | None = None
        self.info: dict[str, Any] = {}
        self.error: str | None = None
        self.closed = False
        self.pending: str | None = None  # the reason of the end held until close
        self.text: str | None = None  # the render of the conversation so far, where known (saves a render)
        self._seen = 0  # simulator calls taken so far

    async def close(self) -> EnvError | None:
        """Close the environment once; the error its ``close`` raised (None: it closed)."""
        if self.closed or self.env is None:
            self.closed = True
            return None
        self.closed = True
        try:
            await call_env(self.env, "close")
        except Exception as exc:  # noqa: BLE001 - the environment's own code: named on the sample
            err = EnvError(self.sample, f"raised {type(exc).__name__}: {exc}", env=self.name, phase="close")
            self.error = self.error or f"{type(err).__name__}: {err}"
            return err
        return None

    def new_calls(self) -> list[Call]:
        """Model calls the environment recorded since the last look (``env.model_calls``: a simulated user's)."""
        calls = getattr(self.env, "model_calls", None)
        if not isinstance(calls, Sequence) or len(calls) <= self._seen:
            return []
        out = [c for c in calls[self._seen :] if isinstance(c, Call)]
        self._seen = len(calls)
        return out


class RecordedCalls:
    """Model calls of an environment (a simulated user), added to the sample's episode as they were made:
    untrained (mask 0), in their own lineage (their ``agent``), never merged with the policy's turns."""

    def __init__(self, calls: list[Call]) -> None:
        self.calls = calls

    def add_to(self, episode: Episode, parent: str) -> None:  # noqa: ARG002 - the sub-agent interface
        for call in self.calls:
            episode.add_call(call)


def episode_schemas(tools: Any, cache: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]] | None:
    """The schemas of an episode's tools (a Toolbox, callables or schemas), the same list object for equal
    schemas (the parser memoizes per object)."""
    if tools is None:
        return None
    if isinstance(tools, Toolbox):
        schemas = tools.schemas
    elif isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError(f"EnvReset.tools must be a Toolbox, callables or schemas, not {type(tools).__name__}")
    else:
        schemas = [tool_schema(t) for t in tools]
    if not schemas:
        return None
    import json

    key = json.dumps(schemas, sort_keys=True, default=str)
    return cache.setdefault(key, schemas)


async def run_episode(rollout: Rollout, i: int, s: int, task: Any, scheduler: Scheduler, attempt: int) -> RolloutResult:
    """One sample with its own environment, closed on every end (see the module's docstring)."""
    ep = EpisodeEnv(f"{i}/{s}")
    messages: list[dict[str, Any]] = []
    prompt: list[int] = []
    try:
        factory = rollout.env_factory
        assert factory is not None
        try:
            ep.env = factory()
            ep.name = type(ep.env).__name__
        except Exception as exc:  # noqa: BLE001 - the user's factory: its sample ends, named
            name = getattr(factory, "__name__", type(factory).__name__)
            err = EnvError(ep.sample, f"raised {type(exc).__name__}: {exc}", env=name, phase="factory")
            return _ended(rollout, i, s, ep, messages, prompt, EndCode.ENV_FAILED, err)
        try:
            out = await call_env(ep.env, "reset", task)
        except Exception as exc:  # noqa: BLE001
            err = EnvError(ep.sample, f"raised {type(exc).__name__}: {exc}", env=ep.name, phase="reset")
            return await _closed_after(rollout, i, s, ep, messages, prompt, EndCode.ENV_FAILED, err)
        try:
            reset = check_reset(out, sample=ep.sample, env=ep.name)
            messages = reset.messages
            ep.state = reset.state
            ep.schemas = episode_schemas(reset.tools, rollout._env_schemas)
            if ep.schemas is not None:
                parser_for(rollout.tpl)  # NoToolParserError: the template cannot read calls of these tools
        except (EnvError, TypeError, TmplError) as exc:
            err = (
                exc
                if isinstance(exc, EnvError)
                else EnvError(ep.sample, f"{type(exc).__name__}: {exc}", env=ep.name, phase="reset")
            )
            return await _closed_after(rollout, i, s, ep, messages, prompt, EndCode.ENV_REJECTED, err)
        try:
            text = rollout.tpl.render(messages, tools=schemas_of(rollout, ep), add_generation_prompt=True)
        except TmplError as exc:
            err = EnvError(
                ep.sample, f"the template cannot render its opening conversation: {exc}", env=ep.name, phase="reset"
            )
            return await _closed_after(rollout, i, s, ep, messages, prompt, EndCode.ENV_REJECTED, err)
        prompt = rollout.tpl.codec.encode(text)
        ep.text = text
        if len(prompt) >= rollout.max_length:
            err = EnvError(
                ep.sample,
                f"its opening conversation is {len(prompt)} tokens, max_length={rollout.max_length} leaves none to generate",
                env=ep.name,
                phase="reset",
            )
            return await _closed_after(rollout, i, s, ep, messages, [], EndCode.ENV_REJECTED, err)
        try:
            result: RolloutResult = await rollout._sample_run(
                i, s, messages, prompt, scheduler, None, attempt, None, env=ep
            )
            return result
        except Exception as exc:  # noqa: BLE001 - one sample's failure must not take the batch down
            await ep.close()
            traj = rollout._trajectory(i, s, prompt)
            traj.abort(f"unexpected error in the rollout: {type(exc).__name__}: {exc}")
            return with_env(RolloutResult.crashed(i, s, traj, messages), ep)
    finally:
        if not ep.closed:  # cancelled or crashed: close it now (a cancel waits for the close)
            failed = await _close_shielded(ep)
            if failed is not None:
                logger.warning("%s", failed)


async def _close_shielded(ep: EpisodeEnv) -> EnvError | None:
    """Close ``ep`` even while its task is being cancelled (a second cancel does not stop the close)."""
    task = asyncio.ensure_future(ep.close())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        return await task


async def _closed_after(
    rollout: Rollout,
    i: int,
    s: int,
    ep: EpisodeEnv,
    messages: list[dict[str, Any]],
    prompt: list[int],
    code: EndCode,
    err: EnvError,
) -> RolloutResult:
    await ep.close()
    return _ended(rollout, i, s, ep, messages, prompt, code, err)


def _ended(
    rollout: Rollout,
    i: int,
    s: int,
    ep: EpisodeEnv,
    messages: list[dict[str, Any]],
    prompt: list[int],
    code: EndCode,
    err: EnvError,
) -> RolloutResult:
    """A sample that ended before its first turn (its environment failed or was refused)."""
    ep.error = f"{type(err).__name__}: {err}"
    traj = rollout._trajectory(i, s, prompt)
    traj.abort(ep.error)
    result = RolloutResult.crashed(i, s, traj, messages)
    result.code = code
    return with_env(result, ep)


def with_env(result: RolloutResult, ep: EpisodeEnv) -> RolloutResult:
    """``result`` with what its environment gave: summed reward, state, info, error."""
    result.env_reward = ep.reward
    result.env_state = ep.state
    result.env_info = ep.info
    result.env_error = ep.error
    if result._episode is not None and ep.reward is not None and not result._built:
        result._episode.reward = ep.reward  # template mode: the episode of its calls carries it
    return result


def schemas_of(rollout: Rollout, ep: EpisodeEnv | None) -> list[dict[str, Any]] | None:
    """The tool schemas a sample's prompt renders: its episode's, else the rollout's."""
    if ep is not None and ep.schemas is not None:
        return ep.schemas
    schemas: list[dict[str, Any]] | None = rollout.tool_schemas
    return schemas


async def env_turn(
    rollout: Rollout, run: SampleRun, turn: int, assistant: dict[str, Any], completion: list[int]
) -> bool:
    """Step the environment with the assistant turn and append what it returned. False once the sample ended."""
    ep = run.env
    assert ep is not None
    calls = len(assistant.get("tool_calls") or [])
    run.calls += calls
    try:
        with run.clock("tools"):
            out = await call_env(ep.env, "step", copy.deepcopy(assistant))
    except Exception as exc:  # noqa: BLE001 - the environment's own code: its sample ends, named
        _take_calls(run, ep, turn)
        err = EnvError(ep.sample, f"raised {type(exc).__name__}: {exc}", env=ep.name, phase="step")
        ep.error = f"{type(err).__name__}: {err}"
        return run.end(EndCode.ENV_FAILED, ep.error)
    _take_calls(run, ep, turn)
    try:
        step = check_step(out, sample=ep.sample, env=ep.name, calls=calls)
    except EnvError as err:
        ep.error = f"{type(err).__name__}: {err}"
        return run.end(EndCode.ENV_REJECTED, ep.error)
    if step.reward is not None:
        ep.reward = (ep.reward or 0.0) + float(step.reward)
    ep.info.update(step.info)
    if step.done or step.truncated:  # its last messages are kept for rewards and logs, not tokenized
        run.history += step.messages
        code = EndCode.ENV_TRUNCATED if step.truncated else EndCode.ENV_DONE
        return run.end(
            code, f"the environment ended the episode after turn {turn}" + (" (truncated)" if step.truncated else "")
        )
    if not step.messages:  # the model answered and the environment has nothing to add
        return run.end(EndCode.FINISHED)
    if turn == rollout.max_turns - 1:
        run.history += step.messages
        return run.end(
            EndCode.MAX_TURNS, f"reached max_turns={rollout.max_turns} before the environment ended the episode"
        )
    before = run.history[:-1]
    if rollout._rendered:  # template mode: the next prompt renders the messages
        run.history += step.messages
        return True
    schemas = schemas_of(rollout, ep)
    try:
        with run.clock("suffix"):
            suffix, ep.text = turn_suffix_text(
                rollout.tpl, before, assistant, completion, step.messages, schemas, ep.text
            )
    except TmplError as exc:
        run.history += step.messages
        return run.end(EndCode.SUFFIX_FAILED, f"cannot build the suffix of the environment's turns: {exc}")
    if rollout.verify_every:
        with run.clock("suffix"):
            verified = _verify(rollout, before + [assistant] + step.messages, suffix, schemas)
        if verified is None:
            run.unverified += 1
        elif not verified:
            run.history += step.messages
            return run.end(EndCode.VERIFY_FAILED, "suffix verification against a full render failed")
    message_index = len(run.history)
    run.history += step.messages
    with run.clock("bookkeeping"):
        appended = run.traj.add_suffix(suffix, message=message_index)
        run.sequence += suffix if appended == len(suffix) else suffix[:appended]
        run.versions += APPENDED * appended
    if not run.traj.running:
        return run.end(EndCode.BUDGET_CUT)
    return True


def _take_calls(run: SampleRun, ep: EpisodeEnv, turn: int) -> None:
    """The environment's model calls of this step into the sample's episode (template mode) or result."""
    calls = ep.new_calls()
    if not calls:
        return
    if run.episode is not None:
        for call in calls:
            run.episode.add_call(call)
    else:
        run.subagents.append((turn, RecordedCalls(calls)))  # type: ignore[arg-type]  # added as sub-agents are


def _verify(rollout: Rollout, messages: list[dict[str, Any]], suffix: list[int], schemas: Any) -> bool | None:
    """``verify_every``: is ``suffix`` the tail of the full render of ``messages`` (None: it cannot render)?"""
    rollout._suffix_count += 1
    if rollout._suffix_count % rollout.verify_every:
        return True
    tpl = rollout.tpl
    try:
        text = tpl.renderer.text(messages, tools=schemas, add_generation_prompt=True)
    except TmplError:
        return None
    full = tpl.codec.encode_reference(text)
    n = len(suffix)
    return full[len(full) - n :] == suffix and n < len(full) and full[len(full) - n - 1] in tpl.stop_token_ids


async def finish_episode(run: SampleRun) -> None:
    """Close the sample's environment at its end, then end its trajectory with the held code (or
    ``ENV_FAILED`` when ``close`` raised)."""
    ep = run.env
    assert ep is not None
    err = await ep.close()
    code, reason = run.code, ep.pending
    if err is not None:
        code, reason = EndCode.ENV_FAILED, f"{type(err).__name__}: {err}"
    assert code is not None
    run.end(code, reason)


def check_factory(factory: Any) -> Callable[[], Any] | None:
    """``env_factory`` as given, checked to be callable."""
    if factory is not None and not callable(factory):
        raise TypeError(
            f"env_factory must be callable (a class or a function with no arguments), not {type(factory).__name__}"
        )
    return factory  # type: ignore[no-any-return]

"""verifiers (0.4.0, ``verifiers.v1``; what prime-rl trains) environments whose rollouts are tmpl harness runs.

:class:`HarnessEnv` is a verifiers ``SingleAgentEnv`` whose episode is one :class:`tmpl.harness.HarnessRollout`
run of its task: the task's prompt text is the :class:`~tmpl.harness.HarnessTask`, the harness (any
catalog spec, a real CLI or a script) calls the model through the tmpl gateway, and the episode's trace
is the run's episode, token for token (:func:`harness_trace`). verifiers' own agent, harness and
interception server are not used: the tmpl gateway records the calls, so the trace's training samples are
exactly tmpl's training sequences.

How a tmpl episode is a verifiers trace (``verifiers.v1.Trace``: a graph of ``MessageNode`` whose
root-to-leaf paths are its ``branches``, each branch one training sample):

- each training sequence of the episode (the root's, a sub-agent's, a branch after compaction) is one
  root-to-leaf path of its own; its nodes alternate the context before each call (``mask`` False: the
  prompt, the tool results and template scaffold, a ``user`` message of their text) and the call's
  sampled tokens (an ``assistant`` node, ``sampled``; ``mask`` is tmpl's: True on trained tokens, with
  their logprobs);
- so ``branch.token_ids``, ``branch.sampled_mask`` and ``branch.logprobs`` are the sequence's ``ids``,
  ``mask`` and ``logprobs`` (an untrained lineage's tokens, ``mask`` 0, are in no branch's mask);
- the run's reward (the tmpl verifier's) is the trace's reward ``harness``; ``ok``: the run is
  ``HARNESS_DONE``; its status, exit code, seconds and stdout/stderr tails are in ``trace.info["tmpl"]``.

>>> env = HarnessEnv(SingleAgentEnvConfig(taskset=vf.TasksetConfig(id="my_tasks")), harness=spec, gateway=gw)  # doctest: +SKIP
>>> episode = await env.run_episode(task, ctx)                                              # doctest: +SKIP
>>> episode.traces[0].branches()[0].token_ids[:4]                                           # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from verifiers.v1.envs.single_agent import SingleAgentEnv
from verifiers.v1.episode import EnvInfo, Episode
from verifiers.v1.graph import MessageNode
from verifiers.v1.trace import AgentInfo, Reward, Trace, TraceTask
from verifiers.v1.types import AssistantMessage, UserMessage

from ..harness import Harness, HarnessResult, HarnessTask
from ..harness.rollout import HarnessRollout

__all__ = ["HarnessEnv", "harness_trace"]


def harness_trace(
    result: HarnessResult,
    task: TraceTask,
    agent: AgentInfo,
    decode: Callable[[Sequence[int]], str] | None = None,
) -> Trace:
    """The verifiers ``Trace`` of one harness run (see the module docstring); ``decode``: token IDs to
    the text the nodes' messages carry (default: none, empty text)."""
    text = decode or (lambda _ids: "")
    trace: Trace = Trace(task=task, agent=agent)
    episode = result.episode
    for seq in [] if episode is None else episode.sequences:
        ids, mask, logprobs = seq.ids.tolist(), seq.mask.tolist(), seq.logprobs.tolist()
        parent: int | None = None
        at = 0
        pieces = [(s.start, s.end) for s in seq.spans] + [(len(ids), len(ids))]
        for start, end in pieces:
            for lo, hi, sampled in ((at, start, False), (start, end, True)):
                if hi <= lo:
                    continue
                node_mask = [bool(m) for m in mask[lo:hi]] if sampled else [False] * (hi - lo)
                message = (AssistantMessage if sampled else UserMessage)(content=text(ids[lo:hi]))
                trace.nodes.append(
                    MessageNode(
                        parent=parent,
                        message=message,
                        sampled=sampled,
                        token_ids=ids[lo:hi],
                        mask=node_mask,
                        logprobs=[lp for lp, m in zip(logprobs[lo:hi], node_mask) if m],
                    )
                )
                parent = len(trace.nodes) - 1
            at = max(at, end)
    trace.rewards["harness"] = None if result.reward is None else Reward(score=float(result.reward))
    trace.info["tmpl"] = {
        "harness": result.harness,
        "status": result.status,
        "reason": result.reason,
        "exit_code": result.exit_code,
        "seconds": result.seconds,
        "calls": result.calls,
        "session": result.session,
        "stdout_tail": result.stdout_tail,
        "stderr_tail": result.stderr_tail,
    }
    trace.is_completed = True
    trace.ok = result.ok
    trace.stop_condition = result.status
    trace.is_timeout = result.status == "HARNESS_TIMEOUT"
    return trace


class HarnessEnv(SingleAgentEnv):
    """A verifiers environment (``SingleAgentEnv``'s config: its taskset) whose episode is one tmpl
    harness run of the task's prompt text: ``harness`` a :class:`tmpl.harness.Harness` spec,
    ``gateway`` a tmpl ``Gateway`` (its backend the policy's server: e.g. ``tmpl.backends.VLLM`` on the
    inference server prime-rl runs) or a gateway's URL; ``verifier``: every task's
    (:class:`~tmpl.harness.HarnessTask`'s ``verifier``: a command or a callable; its reward is the trace's); ``rollout``: further
    :class:`~tmpl.harness.rollout.HarnessRollout` options (``isolation``, ``env``, ...); ``decode``:
    token IDs to text for the trace's messages (default: the gateway's tokenizer, when it has one).
    The agent config's harness is verifiers' and is not run (set it to ``null``)."""

    def __init__(
        self,
        config: Any,
        *,
        harness: Harness,
        gateway: Any,
        verifier: Any = None,
        decode: Callable[[Sequence[int]], str] | None = None,
        **rollout: Any,
    ) -> None:
        super().__init__(config)
        self.verifier = verifier
        self.rollout = HarnessRollout(harness, gateway, n=1, progress=False, **rollout)
        tokenizer = getattr(getattr(gateway, "template", None), "tokenizer", None)
        if decode is None and tokenizer is not None:
            decode = tokenizer.decode
        self.decode = decode

    async def run_episode(self, task: Any, ctx: Any, *, on_trace: Any = None, on_discard: Any = None) -> Episode:
        """One harness run of ``task`` (its ``data.prompt``, text or messages whose last user text is
        the task): the episode holds its one trace (:func:`harness_trace`); ``ok`` when the run is
        ``HARNESS_DONE``. ``ctx`` (verifiers' ``ModelContext``) is not read: the gateway serves the model;
        nothing is ever discarded (``on_discard``: no per-agent retry)."""
        del ctx, on_discard
        prompt = task.data.prompt
        if not isinstance(prompt, str):  # messages: the last user message's text
            prompt = next(str(m.content) for m in reversed(prompt) if getattr(m, "role", "") == "user")
        [result] = await self.rollout.arun([HarnessTask(prompt, id=str(task.key or "task"), verifier=self.verifier)])
        seen = TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash)
        agent = AgentInfo(config=self.config.agent, name="agent")
        trace = harness_trace(result, seen, agent, self.decode)
        if on_trace is not None:
            on_trace(trace)
        episode = Episode(env=EnvInfo(id=self.config.env_id), task=seen)
        episode.traces.append(trace)
        episode.ok = trace.ok
        return episode

"""``make_generate(harness=...)``: slime's ``generate(args, sample, sampling_params)`` as one run of an agent harness.

Each sample is one :class:`tmpl.harness.HarnessRollout` run: ``tasks_from(sample)`` makes its
:class:`~tmpl.harness.HarnessTask` (default: the prompt's last user text), the harness's model calls go to a
:class:`tmpl.gateway.Gateway` on the template and the engine (default :class:`tmpl.backends.SGLang` at slime's
router, as ``make_generate`` without a harness; or ``backend=``; or ``gateway=``, a Gateway or a ``tmpl
serve`` URL), sampled with slime's settings, ``max_new_tokens`` a call.

A harness's episode may have several training sequences (its agent rewrote its history, a sub-agent), so
the function always answers with a ``list[Sample]``, one per sequence that trains a token (the first is
``sample`` itself), every one with the sample's ``rollout_id`` (else its ``index``): the shape
``make_generate``'s several-sequence mode gives slime (see :mod:`tmpl.integrations.slime`). Each Sample's
``tokens`` are the sequence's IDs, ``response_length`` from its first sampled token, ``loss_mask`` and
``rollout_log_probs`` over that response, ``reward`` the verifier's (slime then calls no reward model for
it; None where the run had no verifier), ``status`` COMPLETED (``HARNESS_DONE``, ``VERIFIER_FAILED``...),
TRUNCATED (``HARNESS_TIMEOUT``, or the sequence cut by the gateway's budget) or ABORTED (a run that
recorded no call: one Sample with the prompt alone and an empty response, which slime leaves out of
its reward model and may run again). ``metadata`` holds ``harness_status``, ``harness_reason``,
``harness_calls``, ``harness_seconds``, ``harness_session`` and the sequence keys of
:func:`tmpl.integrations.slime.episode_samples` (``tmpl_sequence``, ``tmpl_sequences``, ``tmpl_branch``,
``tmpl_agent``).

>>> generate = make_generate(harness=catalog.npm.HARNESSES["codex"],
...                          tasks_from=lambda s: HarnessTask(s.prompt[-1]["content"], files=s.metadata["repo"]))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from ...backends.base import Backend
from ...chat_template import ChatTemplate
from ...errors import TrainerConfigError
from ...trajectory.types import Status
from . import write_sequence

__all__ = ["harness_samples", "make_harness_generate", "task_from_sample"]


def task_from_sample(sample: Any) -> Any:
    """The default task of a slime Sample: its prompt's last user text (a string prompt as it is).

    >>> from types import SimpleNamespace
    >>> task_from_sample(SimpleNamespace(prompt=[{"role": "user", "content": "Make hello.txt"}])).prompt
    'Make hello.txt'
    """
    from ...harness import HarnessTask

    prompt = sample.prompt
    if isinstance(prompt, str):
        return HarnessTask(prompt)
    users = [m for m in prompt or () if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        raise TrainerConfigError("slime", "prompt", "the sample's prompt has no user message for the harness")
    content = users[-1].get("content")
    if not isinstance(content, str):
        content = "".join(p.get("text", "") for p in content or () if isinstance(p, Mapping))
    return HarnessTask(content)


def make_harness_generate(
    harness: Any,
    *,
    tasks_from: Callable[[Any], Any] | None = None,
    template: ChatTemplate | None = None,
    backend: Callable[[Any], Backend] | Backend | None = None,
    gateway: Any = None,
    gateway_options: Mapping[str, Any] | None = None,
    **harness_options: Any,
) -> Callable[[Any, Any, Mapping[str, Any]], Awaitable[list[Any]]]:
    """slime's generate function running ``harness`` once per sample (see the module docstring);
    ``harness_options`` go to :class:`tmpl.harness.HarnessRollout` (``isolation``, ``env``...)."""
    from ...harness import Harness, HarnessRollout

    if not isinstance(harness, Harness):
        raise TypeError(f"make_generate: harness must be a tmpl.harness.Harness, not {type(harness).__name__}")
    if gateway is not None and backend is not None:
        raise TypeError("make_generate: pass gateway (it has its engine) or backend, not both")
    options = {"progress": False, **harness_options}
    HarnessRollout(harness, gateway or "http://127.0.0.1:1", **options)  # its options checked now

    @contextlib.asynccontextmanager
    async def serving(args: Any, tpl: ChatTemplate, sampling_params: Mapping[str, Any]) -> AsyncIterator[Any]:
        if gateway is not None:
            yield gateway
            return
        from ...gateway import Gateway
        from . import _sglang, replay_routes

        if isinstance(backend, Backend):
            engine = backend
        elif backend is not None:
            engine = backend(args)
        else:
            engine = _sglang(f"http://{args.sglang_router_ip}:{args.sglang_router_port}", replay_routes(args))
        max_response = int(
            getattr(args, "rollout_max_response_len", None) or sampling_params.get("max_new_tokens", 1024)
        )
        settings = {
            "max_tokens": int(sampling_params.get("max_new_tokens", max_response)),
            "max_context": int(getattr(args, "rollout_max_context_len", None) or 32_768),
            "temperature": float(sampling_params.get("temperature", 1.0)),
            "top_p": float(sampling_params.get("top_p", 1.0)),
            **(gateway_options or {}),
        }
        served = Gateway(tpl, engine, **settings)
        try:
            yield served
        finally:
            served.close()

    async def generate(args: Any, sample: Any, sampling_params: Mapping[str, Any]) -> list[Any]:
        from . import _template

        tpl = template or _template(str(args.hf_checkpoint))
        task = (tasks_from or task_from_sample)(sample)
        if task.id is None:
            name = getattr(sample, "index", None)
            task = type(task)(task.prompt, task.files, task.verifier, id=f"slime-{name}", timeout=task.timeout)
        async with serving(args, tpl, sampling_params) as gw:
            [result] = await HarnessRollout(harness, gw, n=1, concurrency=1, **options).arun([task])
        return harness_samples(tpl, sample, result)

    return generate


def harness_samples(tpl: ChatTemplate, sample: Any, result: Any) -> list[Any]:
    """slime Samples for one harness run ``result`` (``sample`` itself first): see the module docstring.

    >>> from tmpl.harness import HarnessResult
    >>> from types import SimpleNamespace
    >>> from enum import Enum
    >>> class S(SimpleNamespace):
    ...     Status = Enum("Status", "COMPLETED TRUNCATED ABORTED")
    >>> [s] = harness_samples(None, S(prompt=[], index=3, metadata={}), HarnessResult(status="NO_CALLS"))
    >>> s.status.name, s.response_length, s.loss_mask, s.rollout_id
    ('ABORTED', 0, [], 3)
    """
    rollout_id = getattr(sample, "rollout_id", None)
    if rollout_id is None:
        rollout_id = getattr(sample, "index", None)
    status_type = type(sample).Status
    base = {
        **(getattr(sample, "metadata", None) or {}),
        "harness_status": result.status,
        "harness_reason": result.reason,
        "harness_calls": result.calls,
        "harness_seconds": result.seconds,
        "harness_session": result.session,
    }
    episode = result.episode
    sequences = [s for s in episode.sequences if s.mask.any()] if episode is not None else []
    if not sequences:  # nothing the policy sampled was recorded: the prompt alone, ABORTED
        sample.tokens = list(tpl.prompt_ids(list(sample.prompt))) if tpl is not None and sample.prompt else []
        sample.response_length = 0
        sample.loss_mask, sample.rollout_log_probs = [], []
        sample.rollout_routed_experts = None
        sample.response = ""
        sample.reward = result.reward
        sample.status = status_type.ABORTED
        sample.rollout_id = rollout_id
        sample.metadata = {**base, "tmpl_sequence": None, "tmpl_sequences": 0}
        return [sample]
    if len(sequences) > 1 and rollout_id is None:
        raise TrainerConfigError(
            "slime",
            "sample.index",
            f"harness run {result.session} has {len(sequences)} training sequences and its sample neither a "
            "rollout_id nor an index: slime needs one rollout_id on all of them",
        )
    main = [s for s in sequences if s.agent is None and s.parent is None] or sequences
    last = main[-1]
    response = tpl.tokenizer.decode(last.ids[last.prompt_length :].tolist()) if tpl is not None else ""
    siblings = [copy.deepcopy(sample) for _ in sequences[1:]]
    out = []
    for seq, target in zip(sequences, [sample, *siblings]):
        write_sequence(target, seq)
        target.rollout_routed_experts = None
        target.response = response
        target.reward = result.reward
        truncated = seq.status is Status.TRUNCATED or (seq is last and result.status == "HARNESS_TIMEOUT")
        target.status = status_type.TRUNCATED if truncated else status_type.COMPLETED
        target.rollout_id = rollout_id
        target.metadata = {
            **base,
            "tmpl_sequence": seq.index,
            "tmpl_sequences": len(sequences),
            "tmpl_branch": str(seq.branch),
            "tmpl_agent": seq.agent,
        }
        out.append(target)
    return out

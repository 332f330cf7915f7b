"""``make_rollout_func(harness=...)``: each TRL completion is one run of an agent harness through the gateway.

>>> from tmpl.harness import HarnessTask
>>> from tmpl.integrations.trl import harness_reward, make_rollout_func
>>> func = make_rollout_func(harness=spec, tasks_from=lambda row: HarnessTask(row["prompt"][-1]["content"],
...                          verifier=CommandVerifier("pytest -q")))                          # doctest: +SKIP
>>> GRPOTrainer(model, reward_funcs=harness_reward, args=args, train_dataset=ds, rollout_func=func).train()  # doctest: +SKIP

For each prompt TRL passes (the sampler already repeats each dataset prompt ``num_generations`` times), the
function makes a :class:`tmpl.harness.HarnessTask` (``tasks_from(row)``; default: the prompt's last user
text, no verifier) and runs the harness once on it with :class:`tmpl.harness.HarnessRollout`, every run of
the batch at once (at most ``concurrency``). The harness's model calls go to a gateway:

- by default a :class:`tmpl.gateway.Gateway` made for the call on the trainer's template (its tokenizer,
  chat template and ``chat_template_kwargs``) and the trainer's own engine (its vLLM server or colocated
  engine, else its model), or ``backend=``; sampled at the trainer's temperature and top-p, at most
  ``max_completion_length`` tokens a call; served in this process on 127.0.0.1 while the runs go;
- or ``gateway=``, a Gateway of your own or the URL of a ``tmpl serve`` (its engine is then yours to keep
  in step with the trainer's weights).

The rows are the episodes' training sequences (:meth:`tmpl.harness.HarnessResult.rows`): the prompt up to
the first sampled token, the completion with every later turn, ``env_mask`` the sequence's loss mask (1 on
sampled tokens, 0 on what the harness added between calls), the sampling logprobs. ``GRPOTrainer`` trains
one row per prompt: a run whose episode has several sequences (its agent edited its history, a sub-agent)
raises :class:`tmpl.errors.TrainerConfigError` naming it; :class:`ToolRLOOTrainer` (``takes_sequence_rows``)
takes one row per sequence with ``sample_index``. A run without a recorded call (``NO_CALLS``,
``SETUP_FAILED``...) keeps its place with one stand-in token whose ``env_mask`` is 0; with
``mask_failed=True`` every run that is not ``HARNESS_DONE`` is masked out so.

The reward functions get, one value per completion: ``harness_reward`` (the verifier's, None where it gave
none), ``harness_status``, ``reason``, ``harness_calls``, ``harness_seconds`` and ``harness_results`` (the
:class:`~tmpl.harness.HarnessResult` itself, episode included). :func:`harness_reward` is a reward function
returning the first (0.0 where the verifier gave none: a run that failed earns nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...backends import Backend
from ...chat_template import ChatTemplate
from ...errors import TrainerConfigError
from .backends import trainer_backend, trainer_name
from .trainer import check_trainer, default_max_length, fill_id, sampling_of, template_for

__all__ = ["HARNESS_KEYS", "HarnessRolloutFunc", "harness_reward", "harness_rows", "task_from_prompt"]

#: keys added for the reward functions, one value per completion
HARNESS_KEYS: tuple[str, ...] = (
    "harness_reward",
    "harness_status",
    "reason",
    "harness_calls",
    "harness_seconds",
    "harness_results",
)


def task_from_prompt(row: Mapping[str, Any]) -> Any:
    """The default task of a dataset row: its prompt's last user text (a string prompt as it is), no verifier.

    >>> task_from_prompt({"prompt": [{"role": "user", "content": "Make hello.txt"}]}).prompt
    'Make hello.txt'
    """
    from ...harness import HarnessTask

    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return HarnessTask(prompt)
    users = [m for m in prompt or () if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        raise TrainerConfigError("rollout_func", "train_dataset", f"the prompt {prompt!r:.120} has no user message")
    content = users[-1].get("content")
    if not isinstance(content, str):
        content = "".join(p.get("text", "") for p in content or () if isinstance(p, Mapping))
    return HarnessTask(content)


def harness_reward(harness_reward: Sequence[float | None], **kwargs: Any) -> list[float]:  # noqa: ARG001 - TRL passes every column
    """A TRL reward function: each completion's verifier reward (0.0 where the run gave none).

    >>> harness_reward([1.0, None, 0.5], completions=["a", "b", "c"])
    [1.0, 0.0, 0.5]
    """
    return [0.0 if r is None else float(r) for r in harness_reward]


class HarnessRolloutFunc:
    """A TRL ``rollout_func(prompts, trainer)`` whose completions are harness runs (see the module docstring).

    After each call ``last_results`` holds the :class:`~tmpl.harness.HarnessResult` of every completion, in
    order. Build it with ``make_rollout_func(harness=...)``.
    """

    def __init__(
        self,
        harness: Any,
        *,
        tasks_from: Callable[[Mapping[str, Any]], Any] | None = None,
        gateway: Any = None,
        backend: Backend | None = None,
        template: ChatTemplate | str | None = None,
        concurrency: int = 8,
        isolation: str = "process",
        mask_failed: bool = False,
        on_results: Callable[[list[Any]], None] | None = None,
        gateway_options: Mapping[str, Any] | None = None,
        **rollout_options: Any,
    ) -> None:
        from ...harness import Harness, HarnessRollout

        if not isinstance(harness, Harness):
            raise TypeError(f"make_rollout_func: harness must be a tmpl.harness.Harness, not {type(harness).__name__}")
        if tasks_from is not None and not callable(tasks_from):
            raise TypeError(f"make_rollout_func: tasks_from must be callable (row) -> HarnessTask, not {tasks_from!r}")
        if gateway is not None and backend is not None:
            raise TypeError("make_rollout_func: pass gateway (it has its engine) or backend, not both")
        # checked now, not at the first step: the options HarnessRollout takes
        HarnessRollout(harness, gateway or "http://127.0.0.1:1", concurrency=concurrency, isolation=isolation,
                       progress=False, **rollout_options)  # fmt: skip
        self.harness = harness
        self.tasks_from = tasks_from or task_from_prompt
        self.gateway = gateway
        self.backend = backend
        self.template = template
        self.concurrency = concurrency
        self.isolation = isolation
        self.mask_failed = mask_failed
        self.on_results = on_results
        self.gateway_options = dict(gateway_options or {})
        self.rollout_options = {"progress": False, **rollout_options}
        self.last_results: list[Any] = []
        self._tpl: ChatTemplate | None = None
        self._tpl_trainer: Any = None

    def chat_template(self, trainer: Any) -> ChatTemplate:
        """The trainer's :class:`tmpl.ChatTemplate` (built once per trainer)."""
        if self._tpl is None or self._tpl_trainer is not trainer:
            self._tpl, self._tpl_trainer = template_for(trainer, self.template), trainer
        return self._tpl

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, Any]:
        from ...harness import HarnessRollout

        check_trainer(trainer)
        tpl = self.chat_template(trainer)
        rows = _rows_of(prompts, trainer)
        tasks = []
        for i, row in enumerate(rows):
            task = self.tasks_from(row)
            if isinstance(task, str):
                from ...harness import HarnessTask

                task = HarnessTask(task)
            if task.id is None:  # each completion its own id: sessions and results say which
                task = type(task)(task.prompt, task.files, task.verifier, id=f"sample{i}", timeout=task.timeout)
            tasks.append(task)
        with self._gateway(trainer, tpl) as gateway:
            rollout = HarnessRollout(
                self.harness, gateway, n=1, concurrency=self.concurrency, isolation=self.isolation,
                **self.rollout_options,
            )  # fmt: skip
            results = _run(rollout, tasks)
        self.last_results = results
        if self.on_results is not None:
            self.on_results(results)
        return harness_rows(
            results,
            [tpl.prompt_ids(_messages(row)) for row in rows],
            fill_id=fill_id(tpl),
            rows=bool(getattr(trainer, "takes_sequence_rows", False)),
            mask_failed=self.mask_failed,
            trainer=trainer_name(trainer),
        )

    @contextlib.contextmanager
    def _gateway(self, trainer: Any, tpl: ChatTemplate) -> Iterator[Any]:
        """The given gateway, or one made on the trainer's template and engine for this call."""
        if self.gateway is not None:
            yield self.gateway
            return
        from ...gateway import Gateway

        sampling = sampling_of(trainer)
        options = {
            "max_tokens": int(trainer.max_completion_length),
            "max_context": default_max_length(trainer),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            **self.gateway_options,
        }
        with contextlib.ExitStack() as stack:
            backend = self.backend if self.backend is not None else stack.enter_context(trainer_backend(trainer))
            gateway = Gateway(tpl, backend, **options)
            try:
                yield gateway
            finally:
                gateway.close()


def harness_rows(
    results: Sequence[Any],
    prompts: Sequence[list[int]],
    *,
    fill_id: int,
    rows: bool = False,
    mask_failed: bool = False,
    trainer: str = "GRPOTrainer",
) -> dict[str, Any]:
    """TRL's ``rollout_func`` output for harness results (one per prompt, in order; ``prompts``: each
    prompt's IDs, the stand-in row's prompt for a run without calls). See the module docstring.

    >>> from tmpl.harness import HarnessResult
    >>> out = harness_rows([HarnessResult(status="NO_CALLS")], [[1, 2]], fill_id=9)
    >>> out["prompt_ids"], out["completion_ids"], out["env_mask"], out["harness_status"]
    ([[1, 2]], [[9]], [[0]], ['NO_CALLS'])
    """
    out: dict[str, Any] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    sample_index: list[int] = []
    for i, (result, prompt) in enumerate(zip(results, prompts, strict=True)):
        sequences = result.rows()
        if len(sequences) > 1 and not rows:
            kinds = ", ".join(f"{row.sequence.index}: {row.sequence.branch}" for row in sequences)
            raise TrainerConfigError(
                trainer,
                "rollout_func",
                f"completion {i} (harness run {result.session}) has {len(sequences)} training sequences ({kinds}); "
                f"{trainer} trains one completion per prompt and would lose all but one. Use "
                "tmpl.integrations.trl.ToolRLOOTrainer, which trains one row per sequence",
            )
        off = mask_failed and not result.ok
        if not sequences:
            out["prompt_ids"].append(list(prompt))
            out["completion_ids"].append([fill_id])
            out["logprobs"].append([0.0])
            out["env_mask"].append([0])
            sample_index.append(i)
            continue
        for row in sequences:
            mask = row.loss_mask.astype(int).tolist()
            out["prompt_ids"].append(row.trajectory.prompt_ids.tolist())
            out["completion_ids"].append(row.trajectory.completion_ids.tolist())
            out["logprobs"].append([float(x) for x in row.trajectory.logprobs.tolist()])
            out["env_mask"].append([0] * len(mask) if off else mask)
            sample_index.append(i)
    if rows:
        out["sample_index"] = sample_index
    out["harness_reward"] = [r.reward for r in results]
    out["harness_status"] = [r.status for r in results]
    out["reason"] = [r.reason for r in results]
    out["harness_calls"] = [r.calls for r in results]
    out["harness_seconds"] = [r.seconds for r in results]
    out["harness_results"] = list(results)
    return out


def _rows_of(prompts: Sequence[Any], trainer: Any) -> list[dict[str, Any]]:
    """Each completion's dataset row: the trainer's rows where it keeps them (ToolRLOOTrainer), else the prompt."""
    kept = getattr(trainer, "_tmpl_inputs", None)
    if isinstance(kept, list) and len(kept) == len(prompts):
        return [{**row, "prompt": prompt} for row, prompt in zip(kept, prompts)]
    return [{"prompt": prompt} for prompt in prompts]


def _messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


def _run(rollout: Any, tasks: list[Any]) -> list[Any]:
    """``rollout.run``, also from a thread that already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return rollout.run(tasks)  # type: ignore[no-any-return]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tmpl-harness") as pool:
        return pool.submit(rollout.run, tasks).result()  # type: ignore[no-any-return]

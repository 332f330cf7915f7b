"""``make_rollout_func``: tmpl's multi-turn tool rollout as TRL's ``rollout_func``.

>>> from tmpl.integrations.trl import make_rollout_func
>>> trainer = GRPOTrainer(model=model, args=GRPOConfig(...), reward_funcs=reward, train_dataset=ds,
...                       rollout_func=make_rollout_func(tools=[get_weather], max_turns=8))  # doctest: +SKIP

TRL's contract (checked in TRL 1.11 to 1.16; see :mod:`.version`): ``GRPOTrainer._generate``
calls ``rollout_func(prompts, trainer)`` with the prompts of the current process's generation
batch (``per_device_train_batch_size * steps_per_generation`` of them), in which the sampler
already repeats every dataset prompt ``num_generations`` times in a row. The function returns
one completion per prompt received, as lists of lists:

- ``prompt_ids``, ``completion_ids``: token IDs (the completion holds every turn: model
  tokens and the tool results and generation prompts appended between them);
- ``logprobs``: the sampling logprobs, one per completion token (0.0 on appended tokens);
  TRL uses them for its vLLM importance-sampling correction;
- ``env_mask``: 1 on model tokens, 0 on appended tokens; TRL turns it into its ``tool_mask``,
  which removes appended tokens from the loss, the KL term and the importance ratios;
- every other key is added to the batch's inputs and reaches the reward functions as a keyword
  argument (a list, one value per completion): ``messages``, ``tool_results``, ``status``,
  ``reason``, ``turns``, ``tool_calls``, ``tool_failures``, and ``rollout_metrics`` (the same
  dict for every completion). They replace dataset columns of the same name.

A sample whose episode has several training sequences (``history="template"``, ``edit_history``,
sub-agents): for a trainer with ``takes_sequence_rows = True`` (:class:`ToolRLOOTrainer`) the rows are one
per sequence, with ``sample_index`` (each row's prompt slot) and the reward keys still one per sample; for
any other (``GRPOTrainer``, whose rewards, groups and slices count one row per prompt) such a sample raises
:class:`tmpl.errors.TrainerConfigError` naming it, rather than training one sequence and losing the rest.

Environments (``make_rollout_func(env_factory=...)`` for tmpl environments, ``environment_factory=...`` for
objects written for TRL's own ``environment_factory``, wrapped by :func:`tmpl.env.trl.from_trl_environment`):
one environment per completion, reset with the completion's dataset row (``ToolRLOOTrainer`` passes the
whole row; ``GRPOTrainer`` gives a ``rollout_func`` only the prompts, so the row is ``{"prompt": ...}``),
its turns appended with tmpl's exact suffix. Two more keys reach the reward functions: ``environments``
(each completion's ``RolloutResult.env_state``: for a TRL environment the instance itself, as TRL passes
``environments``) and ``env_reward`` (the sum of the environment's step rewards: TRL ``get_reward`` is
the last one; :func:`env_reward` is a reward function that returns it).

Prompts with images (a VLM; checked in TRL 1.16): TRL keeps only the three lists above and rebuilds the
loss pass's image inputs itself, from the dataset's ``images``/``image`` column and
``processing_class(images=..., text=apply_chat_template(prompt, tools=trainer.tools,
**chat_template_kwargs))``. So with a processor as ``processing_class``, image prompts are rendered
through its :class:`tmpl.vision.VisionTemplate` without tools, and each ``prompt_ids`` is checked to
equal that rebuild (:func:`check_trl_rebuild`); image prompts with tools, images outside the dataset's
column, a processor padding on the right with prompts of different lengths, and tools that return
images (TRL takes none from a ``rollout_func``) raise :class:`tmpl.errors.TrainerConfigError`.

>>> ds = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is it?"}], "images": [img]}])  # doctest: +SKIP
>>> processor.tokenizer.padding_side = "left"                                                          # doctest: +SKIP
>>> GRPOTrainer(model=vlm, processing_class=processor, train_dataset=ds, reward_funcs=reward,
...             rollout_func=make_rollout_func(max_turns=1), args=GRPOConfig(...)).train()             # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from ...backends import Backend, Sampling
from ...chat_template import ChatTemplate
from ...errors import TrainerConfigError
from ...rollout.loop import Rollout, RolloutResult
from ...rollout.metrics import RolloutMetrics
from ...tools.toolbox import as_toolbox
from ...vision.parts import is_image_part, is_pil_image
from ...vision.template import VisionTemplate
from .backends import trainer_backend, trainer_name
from .environments import _first_assistant, env_tasks
from .output import ENV_KEYS as ENV_KEYS
from .output import REWARD_KEYS as REWARD_KEYS
from .output import _log, to_trl_output
from .trainer import check_trainer, default_max_length, sampling_of, template_for
from .trainer import fill_id as _fill_id
from .version import require_trl
from .vision import (
    _TRL_IMAGES_CHECKED,
    check_no_tool_images,
    check_trl_rebuild,
    check_vision_trainer,
    vision_processor,
    vision_template_for,
)

#: Rollout options that come from the trainer and cannot be overridden here.
_FROM_TRAINER = {"max_completion_length": "GRPOConfig(max_completion_length=...)"}


class TmplRolloutFunc:
    """A ``rollout_func(prompts, trainer) -> dict`` for TRL trainers. Build it with :func:`make_rollout_func`.

    After each call, ``last_results`` holds the :class:`tmpl.RolloutResult` of every completion
    returned (same order), ``last_metrics`` the :class:`tmpl.RolloutMetrics`, and ``last_backend``
    the backend that generated them.

    >>> rollout_func = make_rollout_func(tools=[get_weather])            # doctest: +SKIP
    >>> out = rollout_func([[{"role": "user", "content": "Weather in Paris?"}]] * 2, trainer)  # doctest: +SKIP
    >>> sorted(out)[:4], out["status"]                                    # doctest: +SKIP
    (['completion_ids', 'env_mask', 'logprobs', 'messages'], ['DONE', 'DONE'])
    """

    def __init__(
        self,
        *,
        tools: Any = None,
        max_turns: int = 8,
        backend: Backend | None = None,
        sampling: Sampling | None = None,
        template: ChatTemplate | str | None = None,
        mask_aborted: bool = True,
        mask_truncated: bool = False,
        log_metrics: bool = True,
        on_results: Callable[[list[RolloutResult], RolloutMetrics], None] | None = None,
        env_factory: Callable[[], Any] | None = None,
        environment_factory: Callable[[], Any] | None = None,
        **rollout_kwargs: Any,
    ) -> None:
        require_trl()
        allowed = set(inspect.signature(Rollout.__init__).parameters) - {
            "self",
            "template",
            "backend",
            "tools",
            "max_turns",
            "sampling",
            "env_factory",
        }
        for key in rollout_kwargs:
            if key in _FROM_TRAINER:
                raise TypeError(f"make_rollout_func: {key} comes from the trainer; set {_FROM_TRAINER[key]} instead")
            if key not in allowed:
                raise TypeError(
                    f"make_rollout_func got an unexpected keyword argument {key!r}; "
                    f"Rollout options are: {', '.join(sorted(allowed - set(_FROM_TRAINER)))}"
                )
        if sampling is not None and sampling.n != 1:
            raise TrainerConfigError(
                "make_rollout_func",
                "sampling",
                f"n={sampling.n}: TRL already repeats each prompt num_generations times and expects one "
                "completion per prompt it passes; use Sampling(n=1) and set GRPOConfig(num_generations=...)",
            )
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if env_factory is not None and environment_factory is not None:
            raise TypeError(
                "make_rollout_func: pass env_factory (tmpl environments) or environment_factory (TRL's), not both"
            )
        if environment_factory is not None:
            from ...env.trl import from_trl_environment

            env_factory = from_trl_environment(environment_factory)
        if env_factory is not None and not callable(env_factory):
            raise TypeError(f"make_rollout_func: env_factory must be callable, not {type(env_factory).__name__}")
        self.env_factory = env_factory
        self.toolbox = as_toolbox(tools)
        self.max_turns = max_turns
        self.backend = backend
        self.sampling = sampling
        self.template = template
        self.mask_aborted = mask_aborted
        self.mask_truncated = mask_truncated
        self.log_metrics = log_metrics
        self.on_results = on_results
        self.rollout_kwargs = {"progress": False, **rollout_kwargs}
        self.last_results: list[RolloutResult] = []
        self.last_metrics: RolloutMetrics | None = None
        self.last_backend: Backend | None = None
        self._tpl: ChatTemplate | None = None
        self._tpl_trainer: Any = None
        self._vt: VisionTemplate | None = None
        self._vt_trainer: Any = None

    # -- the contract -----------------------------------------------------------------------
    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, Any]:
        check_trainer(trainer)
        processor = vision_processor(trainer)
        conversations, with_images = _conversations(prompts, trainer, processor=processor)
        tpl: ChatTemplate | VisionTemplate
        if with_images:
            check_vision_trainer(trainer, self.toolbox, forced_backend=self.backend is not None)
        if processor is not None and (with_images or not isinstance(self.template, ChatTemplate)):
            # a VLM's processor: render through it, so tool results that are images become image parts
            # (refused below: TRL has no channel for them) rather than text
            tpl = self.vision_template(trainer)
        else:
            tpl = self.chat_template(trainer)
        sampling = self.sampling or sampling_of(trainer)
        if self.env_factory is not None and with_images:
            raise TrainerConfigError(
                trainer_name(trainer),
                "rollout_func",
                "environments append text turns: prompts with images are not supported",
            )
        env = self.env_factory is not None
        with _backend(self.backend, trainer) as backend:
            rollout = Rollout(
                tpl,
                backend,
                tools=self.toolbox,
                max_turns=self.max_turns,
                max_completion_length=int(trainer.max_completion_length),
                sampling=sampling,
                env_factory=self.env_factory,
                **self._length_kwargs(trainer),
            )
            results = _run(rollout, env_tasks(conversations, trainer) if env else conversations)
        if env:  # each sample's opening conversation is its environment's
            conversations = [r.messages[: _first_assistant(r.messages)] for r in results]
        metrics = rollout.metrics
        assert metrics is not None
        check_no_tool_images(results, conversations, trainer)
        if with_images:
            check_trl_rebuild(results, conversations, trainer)
        self.last_results, self.last_metrics, self.last_backend = results, metrics, backend
        if self.log_metrics:
            _log(trainer, metrics)
        if self.on_results is not None:
            self.on_results(results, metrics)
        out = to_trl_output(
            results,
            metrics,
            conversations,
            fill_id=_fill_id(tpl),
            mask_aborted=self.mask_aborted,
            mask_truncated=self.mask_truncated,
            rows=bool(getattr(trainer, "takes_sequence_rows", False)),
            trainer=trainer_name(trainer),
        )
        if env:
            out["environments"] = [r.env_state for r in results]
            out["env_reward"] = [r.env_reward for r in results]
        return out

    def chat_template(self, trainer: Any) -> ChatTemplate:
        """The :class:`tmpl.ChatTemplate` used with ``trainer`` (built once per trainer)."""
        if self._tpl is None or self._tpl_trainer is not trainer:
            self._tpl = template_for(trainer, self.template)
            self._tpl_trainer = trainer
        return self._tpl

    def vision_template(self, trainer: Any) -> VisionTemplate:
        """The :class:`tmpl.vision.VisionTemplate` of the trainer's processor (built once per trainer):
        the processor's own chat template (or ``template``'s text) with the trainer's ``chat_template_kwargs``,
        the template TRL's loss pass renders the prompts with."""
        if self._vt is None or self._vt_trainer is not trainer:
            self._vt = vision_template_for(trainer, self.template)
            self._vt_trainer = trainer
        return self._vt

    def _length_kwargs(self, trainer: Any) -> dict[str, Any]:
        kwargs = dict(self.rollout_kwargs)
        if "max_length" not in kwargs:
            kwargs["max_length"] = default_max_length(trainer)
        return kwargs


def make_rollout_func(
    tools: Any = None,
    max_turns: int = 8,
    backend: Backend | None = None,
    sampling: Sampling | None = None,
    template: ChatTemplate | str | None = None,
    env_factory: Callable[[], Any] | None = None,
    environment_factory: Callable[[], Any] | None = None,
    *,
    harness: Any = None,
    **rollout_kwargs: Any,
) -> Any:
    """A drop-in ``rollout_func`` for TRL's ``GRPOTrainer`` (and :class:`ToolRLOOTrainer`).

    ``tools``: callables or a :class:`tmpl.Toolbox` (give them here, never to the trainer).
    ``max_turns``: generations per completion. ``backend``: force a backend (default: the
    trainer's vLLM engine or server, else its model). ``sampling``: override the trainer's
    temperature/top_p/top_k (``n`` must be 1). ``template``: a :class:`tmpl.ChatTemplate`, the
    name of a template tmpl ships (``"qwen3"``), template text, or None for the trainer's own
    (with its ``chat_template_kwargs``). Other keywords: ``mask_aborted`` (default True: an
    ABORTED completion gets an all-zero ``env_mask``, so it takes no part in the loss),
    ``mask_truncated`` (default False: the same for TRUNCATED completions, e.g. still calling
    tools after ``max_turns``; TRL's ``mask_truncated_completions`` only sees a missing EOS),
    ``log_metrics`` (add tmpl's rollout metrics to the trainer's logs as ``tmpl/...``),
    ``on_results(results, metrics)`` (called after each rollout, e.g. to export it), and
    :class:`tmpl.Rollout` options (``max_length``, ``max_tokens_per_turn``, ``verify_every``,
    ``measure_drift``, ...). ``max_completion_length`` comes from the trainer's config.
    ``env_factory``: a tmpl environment per completion (:mod:`tmpl.env`); ``environment_factory``: the same
    from an object written for TRL's ``environment_factory`` (give it here, never to the trainer); the
    reward functions then also get ``environments`` and ``env_reward`` (see the module docstring).

    >>> rollout_func = make_rollout_func(tools=[get_weather, get_time], max_turns=4)  # doctest: +SKIP
    >>> GRPOTrainer(model, reward_funcs=reward, args=args, train_dataset=ds,
    ...             rollout_func=rollout_func).train()                                # doctest: +SKIP
    >>> GRPOTrainer(model, reward_funcs=env_reward, args=args, train_dataset=ds,
    ...             rollout_func=make_rollout_func(environment_factory=WordleEnv)).train()  # doctest: +SKIP

    ``harness``: a :class:`tmpl.harness.Harness`: each completion is then one run of that agent program
    through a gateway instead of tmpl's own loop (:mod:`.harness`: ``tasks_from``, ``gateway``,
    ``concurrency``, ``isolation``, ``mask_failed``, ``gateway_options`` and :class:`tmpl.harness.HarnessRollout`
    options; reward functions get ``harness_reward`` and the run's status).

    >>> make_rollout_func(harness=spec, tasks_from=lambda row: HarnessTask(...))      # doctest: +SKIP
    """
    if harness is not None:
        from .harness import HarnessRolloutFunc

        if tools is not None or env_factory is not None or environment_factory is not None:
            raise TypeError(
                "make_rollout_func: a harness runs its own tools; tools, env_factory and environment_factory "
                "do not apply with harness="
            )
        require_trl()
        return HarnessRolloutFunc(harness, backend=backend, template=template, **rollout_kwargs)
    return TmplRolloutFunc(
        tools=tools,
        max_turns=max_turns,
        backend=backend,
        sampling=sampling,
        template=template,
        env_factory=env_factory,
        environment_factory=environment_factory,
        **rollout_kwargs,
    )


def _conversations(
    prompts: Sequence[Any], trainer: Any, *, processor: Any = None
) -> tuple[list[list[dict[str, Any]]], bool]:
    """The prompts as conversations, and whether any holds an image part.

    Image parts are accepted only when the trainer's ``processing_class`` is a processor with an image
    processor (``processor``) and only in TRL's own shape, ``{"type": "image", "image": <PIL image>}``
    (what TRL puts into the prompts from the dataset's ``images``/``image`` column).
    """
    out = []
    with_images = False
    for i, prompt in enumerate(prompts):
        if (
            isinstance(prompt, str)
            or not isinstance(prompt, Sequence)
            or not all(isinstance(m, Mapping) for m in prompt)
        ):
            raise TrainerConfigError(
                trainer_name(trainer),
                "train_dataset",
                f"prompt {i} is {type(prompt).__name__}, not a conversation: tmpl's rollout renders prompts with the "
                "chat template, so the dataset's 'prompt' column must hold lists of messages",
            )
        for j, message in enumerate(prompt):
            content = message.get("content")
            if not (isinstance(content, Sequence) and not isinstance(content, str)):
                continue
            for part in content:
                if not is_image_part(part):
                    continue
                if processor is None:
                    raise TrainerConfigError(
                        trainer_name(trainer),
                        "processing_class",
                        f"prompt {i}, message {j} holds an image, and the trainer's processing_class is a text "
                        "tokenizer: pass the model's processor (with its image processor) as processing_class and "
                        "the images in the dataset's 'images' column",
                    )
                if not (isinstance(part, Mapping) and part.get("type") == "image" and is_pil_image(part.get("image"))):
                    raise TrainerConfigError(
                        trainer_name(trainer),
                        "train_dataset",
                        f"prompt {i}, message {j} holds an image part that is not TRL's "
                        "{'type': 'image', 'image': <PIL image>}: TRL "
                        f"{_TRL_IMAGES_CHECKED}'s loss pass takes a prompt's images only from the dataset's "
                        "'images'/'image' column (put them there, with a {'type': 'image'} part where each goes)",
                    )
                with_images = True
        out.append([dict(m) for m in prompt])
    return out, with_images


@contextmanager
def _backend(forced: Backend | None, trainer: Any) -> Iterator[Backend]:
    """The forced backend, or the trainer's own for the duration of the rollout."""
    if forced is not None:
        yield forced
        return
    with trainer_backend(trainer) as backend:
        yield backend


def _run(rollout: Rollout, conversations: Sequence[Any]) -> list[RolloutResult]:
    """``rollout.run``, also from a thread that already runs an event loop (notebooks)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return rollout.run(conversations)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tmpl-rollout") as pool:
        return pool.submit(rollout.run, conversations).result()

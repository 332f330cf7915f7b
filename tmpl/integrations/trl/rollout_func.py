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
from .trainer import check_trainer, default_max_length, sampling_of, template_for
from .trainer import fill_id as _fill_id
from .version import require_trl

#: Keys this function adds for the reward functions (besides TRL's required ones and env_mask).
REWARD_KEYS: tuple[str, ...] = (
    "messages",
    "tool_results",
    "status",
    "reason",
    "turns",
    "tool_calls",
    "tool_failures",
    "rollout_metrics",
)
#: Keys added with environments (``env_factory`` / ``environment_factory``), one value per sample.
ENV_KEYS: tuple[str, ...] = ("environments", "env_reward")
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


def env_reward(env_reward: Sequence[float | None], **kwargs: Any) -> list[float | None]:  # noqa: ARG001 - TRL passes every column
    """A TRL reward function: each completion's environment reward (None where its environment gave none,
    which TRL leaves out of that completion's reward). Use with ``make_rollout_func(env_factory=...)`` or
    ``environment_factory=...``.

    >>> env_reward([1.0, None], completions=["a", "b"])
    [1.0, None]
    """
    return [None if r is None else float(r) for r in env_reward]


def env_tasks(conversations: Sequence[Sequence[Mapping[str, Any]]], trainer: Any) -> list[dict[str, Any]]:
    """Each completion's environment task: its dataset row where the trainer gives it (ToolRLOOTrainer keeps
    the batch's rows), else ``{"prompt": conversation}`` (GRPOTrainer hands a rollout_func the prompts only)."""
    rows = getattr(trainer, "_tmpl_inputs", None)
    if isinstance(rows, list) and len(rows) == len(conversations):
        return [{**row, "prompt": list(conv)} for row, conv in zip(rows, conversations)]
    return [{"prompt": list(conv)} for conv in conversations]


def _first_assistant(messages: Sequence[Mapping[str, Any]]) -> int:
    return next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))


# -- what comes from the trainer -----------------------------------------------------------------


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


def vision_processor(trainer: Any) -> Any:
    """The trainer's ``processing_class`` when it is a processor with an image processor, else None."""
    processing_class = getattr(trainer, "processing_class", None)
    if getattr(processing_class, "image_processor", None) is None:
        return None
    if getattr(processing_class, "tokenizer", None) is None:
        return None
    return processing_class


def vision_template_for(trainer: Any, template: ChatTemplate | str | None) -> VisionTemplate:
    """The :class:`VisionTemplate` of the trainer's processor: its chat template (or ``template``'s
    text, or the template tmpl ships under that name) with the trainer's ``chat_template_kwargs``."""
    processor = vision_processor(trainer)
    if processor is None:
        raise TrainerConfigError(
            trainer_name(trainer), "processing_class", "prompts with images need a processor with an image processor"
        )
    kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
    if isinstance(template, ChatTemplate):
        raise TrainerConfigError(
            trainer_name(trainer),
            "processing_class",
            f"template {template.name!r} is a text ChatTemplate: prompts with images render through the processor "
            "(make_rollout_func(template=None) uses the processor's own chat template, as TRL's loss pass does)",
        )
    text = template
    if isinstance(template, str):
        from ... import templates

        if template in {t.name for t in templates.available()}:
            text = templates.load(template)
    return VisionTemplate(processor, text, **kwargs)


def check_vision_trainer(trainer: Any, toolbox: Any, *, forced_backend: bool = False) -> None:
    """Refuse, before any rollout, image prompts whose images TRL's loss pass would not rebuild.

    TRL (1.16) rebuilds a VLM's loss-pass inputs in ``_generate_and_score_completions`` from the dataset's
    ``images``/``image`` column and its own render of the prompts, ``apply_chat_template(prompt,
    processing_class, tools=trainer.tools, **chat_template_kwargs)``; ``trainer.tools`` must be None
    with tmpl's rollout_func (else TRL runs its own tool loop and its tool mask replaces ``env_mask``),
    so tmpl's rollout must render the prompts without tools too.
    """
    if toolbox is not None and len(toolbox):
        names = ", ".join(toolbox.names)
        raise TrainerConfigError(
            trainer_name(trainer),
            "tools",
            f"prompts with images and tools ({names}) cannot go through TRL's rollout_func: TRL "
            f"{_TRL_IMAGES_CHECKED} rebuilds the loss pass's image inputs (pixel_values, image_grid_thw, "
            "mm_token_type_ids) from its own render of the prompts with trainer.tools, which must be None with "
            "tmpl's rollout_func (TRL's own tool loop would run and replace env_mask), so its prompts would "
            "lack the tool schemas tmpl renders; use make_rollout_func() without tools for image prompts",
        )
    generation = getattr(trainer, "vllm_generation", None)
    if not forced_backend and getattr(trainer, "use_vllm", False) and getattr(generation, "mode", None) == "server":
        raise TrainerConfigError(
            trainer_name(trainer),
            "vllm_mode",
            "'server' with prompts holding images is not wired: TRL's VLLMClient takes a prompt's images as "
            "`features` from its image_features() call, which tmpl's client backend does not send (it would "
            "generate from the placeholders alone); use vllm_mode='colocate', or pass backend=VLLMServer(..., "
            "api='generate') to make_rollout_func",
        )
    training = getattr(getattr(trainer, "model", None), "training", True)
    dataset = getattr(trainer, "train_dataset" if training else "eval_dataset", None)
    found = list(dataset.values()) if isinstance(dataset, Mapping) else [dataset]
    for d in found:
        columns = getattr(d, "column_names", None)
        if columns is None or not {"images", "image"} & set(columns):
            raise TrainerConfigError(
                trainer_name(trainer),
                "train_dataset" if training else "eval_dataset",
                f"prompts hold images but the dataset's columns are {columns}: TRL {_TRL_IMAGES_CHECKED}'s loss "
                "pass takes a prompt's images only from an 'images' (or 'image') column; images written into "
                "the prompts alone would reach its forward pass as placeholders without pixel_values",
            )


def check_no_tool_images(
    results: Sequence[RolloutResult], conversations: Sequence[Sequence[Mapping[str, Any]]], trainer: Any
) -> None:
    """Refuse completions in which a tool returned an image: TRL has no channel for them from a rollout_func.

    TRL (1.16) keeps only ``prompt_ids``/``completion_ids``/``logprobs`` from a ``rollout_func``; its loss
    pass gets images returned by tools only from its own tool loop (``tool_images``), so a tool image in
    tmpl's completion would reach the model as placeholders without ``pixel_values``.
    """
    for i, (r, conversation) in enumerate(zip(results, conversations)):
        for j, message in enumerate(r.messages[len(conversation) :], start=len(conversation)):
            content = message.get("content")
            if message.get("role") != "tool" or isinstance(content, str) or not isinstance(content, Sequence):
                continue
            if any(map(is_image_part, content)):
                raise TrainerConfigError(
                    trainer_name(trainer),
                    "rollout_func",
                    f"sample {i}, message {j}: the tool {message.get('name')!r} returned an image. TRL "
                    f"{_TRL_IMAGES_CHECKED} takes no images from a rollout_func (only prompt_ids, completion_ids, "
                    "logprobs); its loss pass gets images returned by tools only from its own tool loop "
                    "(tool_images), so this one would reach the model as placeholders without pixel_values",
                )


def check_trl_rebuild(
    results: Sequence[RolloutResult], conversations: Sequence[Sequence[Mapping[str, Any]]], trainer: Any
) -> None:
    """Check that each prompt_ids equals what TRL's loss pass rebuilds, and that its rows line up.

    TRL renders each prompt with ``trl.data_utils.apply_chat_template(..., tools=trainer.tools,
    **chat_template_kwargs)`` and calls the processor on that text and the prompt's images
    (``padding=True``); its ``mm_token_type_ids`` (and ``pixel_values``/``image_grid_thw``, in order)
    go with tmpl's ``prompt_ids`` left-padded. This does the same per prompt and compares the IDs;
    a processor padding on the right is refused when the batch's prompts differ in length.
    """
    from trl.data_utils import apply_chat_template as trl_render

    processor = vision_processor(trainer)
    kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
    tools = getattr(trainer, "tools", None)
    done: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for i, (r, conversation) in enumerate(zip(results, conversations)):
        images = [
            part["image"]
            for m in conversation
            if isinstance(m.get("content"), list)
            for part in m["content"]
            if is_image_part(part)
        ]
        text = trl_render({"prompt": list(conversation)}, processor, tools=tools, **kwargs)["prompt"]
        key = (text, tuple(id(im) for im in images))
        if key not in done:
            rebuilt = processor(images=images or None, text=[text])["input_ids"][0]
            done[key] = [int(t) for t in rebuilt]
        ours = r.prompt_ids.tolist()
        if ours != done[key]:
            at = next((k for k, (a, b) in enumerate(zip(ours, done[key])) if a != b), min(len(ours), len(done[key])))
            raise TrainerConfigError(
                trainer_name(trainer),
                "train_dataset",
                f"prompt {i}: tmpl's prompt_ids ({len(ours)} tokens) differ from what TRL {_TRL_IMAGES_CHECKED}'s "
                f"loss pass rebuilds with the processor ({len(done[key])} tokens), first at token {at}: its "
                "pixel_values/mm_token_type_ids would not line up with the IDs",
            )
    side = getattr(processor.tokenizer, "padding_side", "right")
    lengths = {len(r.prompt_ids) for r in results}
    if side != "left" and len(lengths) > 1:
        raise TrainerConfigError(
            trainer_name(trainer),
            "processing_class",
            f"the processor's tokenizer pads on the {side} and the batch's prompts differ in length "
            f"({min(lengths)}-{max(lengths)} tokens): TRL pads prompt_ids on the left but its mm_token_type_ids "
            "with the processor, so they would be shifted; set processing_class.tokenizer.padding_side = 'left'",
        )


#: the TRL version whose GRPOTrainer._generate / _generate_and_score_completions were read for images
_TRL_IMAGES_CHECKED = "1.16"


# -- running and converting ------------------------------------------------------------------------


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


def to_trl_output(
    results: Sequence[RolloutResult],
    metrics: RolloutMetrics,
    conversations: Sequence[Sequence[Mapping[str, Any]]],
    *,
    fill_id: int,
    mask_aborted: bool = True,
    mask_truncated: bool = False,
    rows: bool = False,
    trainer: str = "GRPOTrainer",
) -> dict[str, Any]:
    """TRL's ``rollout_func`` output for finished rollouts (one row per result, in order).

    A completion that holds no token (a sample aborted before its first token) becomes one
    ``fill_id`` token with ``env_mask`` 0, because TRL reads every completion's last token.
    With ``mask_aborted`` (``mask_truncated``), an ABORTED (TRUNCATED) completion's ``env_mask``
    is all 0: it keeps its place in its group but adds nothing to the loss.

    ``rows=True`` (a trainer that takes several rows per sample, :class:`ToolRLOOTrainer`): one row per
    training sequence (``result.rows()``: the sequence's prompt up to its first sampled token, its
    completion, its loss mask as ``env_mask``) and ``sample_index``, the sample of each row; the reward
    keys stay one per sample. ``rows=False`` (GRPOTrainer): a sample with several sequences (template
    mode, ``edit_history``, sub-agents) raises TrainerConfigError rather than losing all but one.

    >>> out = to_trl_output(results, metrics, conversations, fill_id=0, rows=True)   # doctest: +SKIP
    >>> out["sample_index"], len(out["status"])                                      # doctest: +SKIP
    ([0, 0, 1], 2)
    """
    out: dict[str, Any] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    sample_index: list[int] = []
    extras: dict[str, list[Any]] = {k: [] for k in REWARD_KEYS if k != "rollout_metrics"}
    for i, (r, conversation) in enumerate(zip(results, conversations)):
        off = (mask_aborted and r.status.name == "ABORTED") or (mask_truncated and r.status.name == "TRUNCATED")
        for prompt, ids, mask, logprobs in _sample_rows(r, i, fill_id, rows=rows, trainer=trainer):
            out["prompt_ids"].append(prompt)
            out["completion_ids"].append(ids)
            out["logprobs"].append(logprobs)
            out["env_mask"].append([0] * len(mask) if off else mask)
            sample_index.append(i)
        extras["messages"].append(r.messages)
        extras["tool_results"].append([m for m in r.messages[len(conversation) :] if m.get("role") == "tool"])
        extras["status"].append(r.status.name)
        extras["reason"].append(r.reason)
        extras["turns"].append(r.turns)
        extras["tool_calls"].append(r.tool_calls)
        extras["tool_failures"].append(r.tool_failures)
    if rows:
        out["sample_index"] = sample_index
    out.update(extras)
    out["rollout_metrics"] = metrics.to_dict()
    return out


def _sample_rows(
    r: RolloutResult, i: int, fill_id: int, *, rows: bool, trainer: str
) -> list[tuple[list[int], list[int], list[int], list[float]]]:
    """A sample's rows: ``(prompt_ids, completion_ids, env_mask, logprobs)``, one per training sequence."""
    if r.from_calls:
        sequences = r.rows()
        if len(sequences) > 1 and not rows:
            kinds = ", ".join(f"{row.sequence.index}: {row.sequence.branch}" for row in sequences)
            raise TrainerConfigError(
                trainer,
                "rollout_func",
                f"sample {i} (conversation {r.index}, sample {r.sample}) has {len(sequences)} training sequences "
                f"({kinds}); {trainer} trains one completion per prompt and would lose all but one. Use "
                "tmpl.integrations.trl.ToolRLOOTrainer, which trains one row per sequence with the sample's "
                "advantage, or Rollout(history='append') without edit_history or sub-agents",
            )
        if sequences:
            return [
                (
                    row.trajectory.prompt_ids.tolist(),
                    row.trajectory.completion_ids.tolist(),
                    row.loss_mask.astype(int).tolist(),
                    row.trajectory.logprobs.tolist(),
                )
                for row in sequences
            ]
    ids, mask, logprobs = r.completion_ids.tolist(), r.mask.tolist(), r.logprobs.tolist()
    if not ids:
        ids, mask, logprobs = [fill_id], [0], [0.0]
    return [(r.prompt_ids.tolist(), ids, mask, logprobs)]


def _log(trainer: Any, metrics: RolloutMetrics) -> None:
    """Add the rollout's metrics to the trainer's logged metrics (TRL averages them per logging step)."""
    store = getattr(trainer, "_metrics", None)
    if not isinstance(store, dict):
        return
    model = getattr(trainer, "model", None)
    mode = "train" if getattr(model, "training", True) else "eval"
    bucket = store.get(mode)
    if bucket is None:
        return
    for key, value in metrics.to_dict(prefix="tmpl/").items():
        bucket.setdefault(key, []).append(value)

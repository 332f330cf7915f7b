"""``tmpl_tool_agent``: a verl agent loop that runs tmpl's multi-turn tool rollout.

Each sample is one :class:`tmpl.Rollout` (tool-call parsing from token IDs, the
:class:`tmpl.Toolbox`, exact suffixes, budgets, drift) generating through verl's
``server_manager`` (:class:`~tmpl.integrations.verl.VerlServerBackend`). The result is verl's
``AgentLoopOutput``: ``response_ids`` are every turn (model tokens and appended tool results),
``response_mask`` 1 on model tokens and 0 on appended ones, ``response_logprobs`` the sampling
logprobs (0.0 on appended tokens). ``extra_fields`` (verl's field for additions; each key becomes a
``non_tensor_batch`` column) carries tmpl's status and reason, tool counts, the messages, and the
policy versions: ``tmpl_versions`` (one per response token, -1 on appended tokens), ``tmpl_version``
(the version the sample ended under) and ``tmpl_staleness``. verl's own ``min_global_steps`` /
``max_global_steps`` are not set: verl fills them from its server's ``global_steps``, which
``VerlServerBackend`` does not read (tmpl's versions are those of ``Rollout.update_weights``).

Vision-language models: when verl gives the loop a processor with an image processor, the loop
renders through a :class:`tmpl.vision.VisionTemplate` of that processor. The prompt's images are
those verl's own loops use (``process_multi_modal_info``: the dataset class's extraction, e.g.
``qwen_vl_utils``' resizing), put back into the prompt's image parts in order; tools may return
images. The server manager gets the expanded IDs with ``image_data`` (every image of the sequence so
far, in placeholder order), and ``AgentLoopOutput.multi_modal_data`` is ``{"images": [...]}``, the
images of the whole sequence in placeholder order, from which verl recomputes the model inputs.

Routing replay (R3, verl's ``actor_rollout_ref.rollout.enable_rollout_routing_replay=True``): the loop's
rollout asks every turn for the routes of its new positions (``Rollout(routes=True)``, through
:class:`~tmpl.integrations.verl.VerlServerBackend`) and each ``AgentLoopOutput`` carries
``routed_experts``, verl's own field: ``[len(prompt_ids) + len(response_ids), layers, top_k]``, one row
per token of the output, aligned with its IDs (verl 0.9.1's ``_agent_loop_postprocess`` pads it with the
prompt into the batch's ``routed_experts``, int16). A position whose route is not known (the last
sampled token, which no forward pass routed) is a row of zeros, as verl's own loops leave the rows they
did not record. A sequence of a template-mode episode carries its own sequence's routes.

Episodes of several training sequences (``Rollout(history="template")``, an ``edit_history`` hook,
sub-agents: ``RolloutResult.sequences``): ``run`` returns one ``AgentLoopOutput`` per sequence that
trains a token, the sample's main sequence (its last answer) last, as verl 0.9.1's V1 trainer takes
them (``trainer.use_v1=true``, its default, with ``agent_loop_manager_class`` set to
:class:`~tmpl.integrations.verl.TmplAgentLoopManager`): its worker stores each output as a row
``{uid}_{session}_{i}`` carrying the sample's ``uid``, its reward manager scores the last output and
copies the score to the others, and its GRPO takes the group baseline over each session's last row
and broadcasts the advantage to every row of the session (``verl/trainer/ppo/v1/utils.py``). verl's
legacy trainer takes one output per sample, so there a sample with several sequences raises
:class:`tmpl.errors.TrainerConfigError` naming it and its branches (see :func:`training_rows`), as it
does under an estimator other than GRPO or GAE and under verl's own manager, whose reward batch misreads
outputs of different lengths (:mod:`tmpl.integrations.verl.manager`).

>>> from tmpl.integrations.verl import register_tool_agent          # doctest: +SKIP
>>> register_tool_agent(tools=[get_weather, get_time], max_turns=8)  # then agent_name: tmpl_tool_agent  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    _agent_loop_registry,
    register,
)

from ...chat_template import ChatTemplate
from ...errors import ImageInputError, TrainerConfigError
from ...rollout import Rollout
from ...vision import VisionTemplate
from ...vision.parts import is_image_part, split_images
from .backend import VerlServerBackend

if TYPE_CHECKING:
    from ...episode import TrainingSequence
    from ...rollout import RolloutResult

__all__ = ["ROW_ESTIMATORS", "TmplToolAgentLoop", "register_tool_agent", "training_rows", "with_images"]

#: advantage estimators under which verl 0.9.1's V1 trainer keeps a sample's several rows one sample:
#: GRPO (``compute_advantage_for_multi_trajectories``: the group baseline over each session's last row,
#: the advantage broadcast to its other rows) and GAE (a per-token critic, no baseline over a group).
#: Every other estimator groups the rows by ``uid``, where a sample of three sequences would count three times.
ROW_ESTIMATORS = frozenset({"grpo", "gae"})

_TEMPLATES: dict[tuple[int, str], ChatTemplate | VisionTemplate] = {}


def with_images(messages: Sequence[Mapping[str, Any]], images: Sequence[Any]) -> list[dict[str, Any]]:
    """``messages`` with their image parts' sources replaced, in order, by ``images``.

    verl's agent loops render and send the images their dataset class extracted
    (``process_multi_modal_info``, which may resize them); the loop renders those same images.
    Raises :class:`tmpl.errors.ImageInputError` when the counts differ.

    >>> from PIL import Image
    >>> img = Image.new("RGB", (28, 28))
    >>> msgs = [{"role": "user", "content": [{"type": "image", "path": "a.png"}, {"type": "text", "text": "?"}]}]
    >>> with_images(msgs, [img])[0]["content"][0]["image"] is img
    True
    """
    out: list[dict[str, Any]] = []
    k = 0
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, (str, bytes)) or not isinstance(content, Sequence):
            out.append(dict(message))
            continue
        parts: list[Any] = []
        for j, part in enumerate(content):
            if not is_image_part(part):
                parts.append(part)
                continue
            if k >= len(images):
                raise ImageInputError(
                    i,
                    f"raw_prompt[{i}].content[{j}]",
                    f"verl's multi_modal_data holds {len(images)} image(s) only",
                    where="raw_prompt",
                )
            parts.append({"type": "image", "image": images[k]})
            k += 1
        out.append({**message, "content": parts})
    if k != len(images):
        raise ImageInputError(
            0,
            "raw_prompt",
            f"{k} image part(s) but verl's multi_modal_data holds {len(images)} image(s)",
            where="raw_prompt",
        )
    return out


@register("tmpl_tool_agent")
class TmplToolAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """verl agent loop around :class:`tmpl.Rollout` (one sample per ``run``).

    Configure with :func:`register_tool_agent` (tools and ``tmpl.Rollout`` options); the token
    budgets come from verl's ``rollout.prompt_length`` and ``rollout.response_length``.
    """

    tools: Sequence[Any] = ()
    rollout_options: dict[str, Any] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("tools", None)  # verl's own tool objects: tmpl runs its Toolbox instead
        super().__init__(*args, **kwargs)
        opts = dict(self.apply_chat_template_kwargs or {})
        #: a VLM: verl's processor has an image processor; the loop renders through it
        self.vision = getattr(self.processor, "image_processor", None) is not None
        owner = self.processor if self.vision else self.tokenizer
        key = (id(owner), repr(sorted(opts.items())))
        if key not in _TEMPLATES:  # one template (and its proven frames) per tokenizer/processor, settings and process
            source = opts.pop("chat_template", None)
            if self.vision:
                _TEMPLATES[key] = VisionTemplate(self.processor, source, **opts)
            else:
                _TEMPLATES[key] = ChatTemplate(self.tokenizer, source, **opts)
        self.template = _TEMPLATES[key]

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Roll out ``kwargs["raw_prompt"]`` (a message list) with tools.

        One ``AgentLoopOutput`` per training sequence (:func:`training_rows`): one in append mode, or
        where the history never branched; else a list, the main sequence last (verl's V1 trainer).
        """
        config = self.rollout_config
        options = {"max_turns": 8, **self.rollout_options}
        messages = list(kwargs["raw_prompt"])
        if self.vision:
            messages = await self._prompt_images(messages)
        if bool(_setting(config, "enable_rollout_routing_replay", False)):
            options.setdefault("routes", True)  # R3: verl's servers return routed experts
        rollout = Rollout(
            self.template,
            VerlServerBackend(self.server_manager, sampling_params, routes=bool(options.get("routes", False))),
            tools=self.tools or None,
            max_length=int(config.prompt_length) + int(config.response_length),
            max_completion_length=int(config.response_length),
            progress=False,
            **options,
        )
        [result] = await rollout.run_async([messages])
        rows = training_rows(result) if result.from_calls else []
        if len(rows) <= 1:  # one row: the sample's trajectory (its main sequence), as in append mode
            return self._output(result, main=rows[0] if rows else None)
        self._check_rows(result, rows, kwargs)
        return [self._sequence_output(result, seq, i, len(rows)) for i, seq in enumerate(rows)]

    def _extra_fields(self, result: RolloutResult, versions: list[int]) -> dict[str, Any]:
        """tmpl's ``extra_fields`` of one output (the sample's, with the row's versions)."""
        return {
            "tmpl_status": result.status.name,
            "tmpl_reason": result.reason,
            "tool_calls": result.tool_calls,
            "tool_failures": result.tool_failures,
            "messages": result.messages,
            # tmpl's policy versions: one per response token (-1 on appended tokens), the version
            # the sample ended under and its staleness (versions between its oldest token and that)
            "tmpl_versions": versions,
            "tmpl_version": result.version,
            "tmpl_staleness": result.staleness,
        }

    def _output(self, result: RolloutResult, *, main: TrainingSequence | None = None) -> AgentLoopOutput:
        """The sample's one ``AgentLoopOutput``: its trajectory (``main``: its sequence, where the episode
        comes from the sample's calls; the others train nothing)."""
        multi_modal: dict[str, Any] = {}
        if self.vision and result.images is not None and result.images.count:
            # the images of the whole sequence, in placeholder order (prompt's, then tool results')
            images = split_images(result.messages, where=f"sample {result.index}")[1][: result.images.count]
            multi_modal["images"] = images
        extra = self._extra_fields(result, result.versions.tolist())
        extra |= {
            "tmpl_sequence": 0 if main is None else main.index,
            "tmpl_sequences": 1 if main is None else len(result.sequences),
            "tmpl_branch": "first" if main is None else str(main.branch),
        }
        extra |= {"tmpl_agent": None, "tmpl_row": 0, "tmpl_rows": 1}
        return AgentLoopOutput(
            prompt_ids=result.prompt_ids.tolist(),
            response_ids=result.completion_ids.tolist(),
            response_mask=result.mask.tolist(),
            response_logprobs=result.logprobs.tolist(),
            num_turns=len(result.messages),
            metrics=AgentLoopMetrics(),
            # as verl's own loops return it ({} without images); verl recomputes the model inputs from it
            multi_modal_data=multi_modal if self.vision else None,
            mm_processor_kwargs={} if self.vision else None,
            extra_fields=extra,
            **_routes_field(result.trajectory.routes),  # the output is the trajectory's IDs
        )

    def _sequence_output(self, result: RolloutResult, seq: TrainingSequence, row: int, rows: int) -> AgentLoopOutput:
        """One training sequence as an ``AgentLoopOutput``: the prompt up to its first sampled token, the
        rest the response, ``response_mask`` its loss mask (the rollout's staleness policy applied)."""
        p = seq.prompt_length
        extra = self._extra_fields(result, seq.versions[p:].tolist())
        # which sequence of the sample's episode this row is, of how many, and why it started
        extra |= {"tmpl_sequence": seq.index, "tmpl_sequences": len(result.sequences), "tmpl_branch": str(seq.branch)}
        extra |= {"tmpl_agent": seq.agent, "tmpl_row": row, "tmpl_rows": rows}
        return AgentLoopOutput(
            prompt_ids=seq.ids[:p].tolist(),
            response_ids=seq.ids[p:].tolist(),
            response_mask=seq.mask[p:].tolist(),
            response_logprobs=seq.logprobs[p:].tolist(),
            num_turns=len(result.messages),
            metrics=AgentLoopMetrics(),
            multi_modal_data={} if self.vision else None,
            mm_processor_kwargs={} if self.vision else None,
            extra_fields=extra,
            **_routes_field(_sequence_routes(seq, result)),
        )

    def _check_rows(self, result: RolloutResult, rows: list[TrainingSequence], kwargs: Mapping[str, Any]) -> None:
        """Refuse several rows where verl would not keep them one sample (named: the sample and its branches)."""
        sample = _sample_name(result, kwargs)
        branches = "; ".join(f"sequence {s.index}: {s.branch}" for s in rows[1:3]) + ("; ..." if len(rows) > 3 else "")
        if self.vision and result.images is not None and result.images.count:
            raise TrainerConfigError(
                "verl",
                "history",
                f"{sample} has {len(rows)} training sequences ({branches}) and images: rows of their own images "
                "are not built yet (one row, the trajectory, is)",
            )
        if not _setting(self.config, "trainer.use_v1", False):
            raise TrainerConfigError(
                "verl",
                "trainer.use_v1",
                f"{sample} has {len(rows)} training sequences ({branches}) but verl's legacy trainer takes one "
                "AgentLoopOutput per sample (AgentLoopWorker._agent_loop_postprocess and RayPPOTrainer's "
                "batch.union); set trainer.use_v1=true (verl 0.9.1's default), whose AgentLoopWorkerTQ keeps "
                "each as a row of the sample's uid",
            )
        estimator = _setting(self.config, "algorithm.adv_estimator", None)
        name = None if estimator is None else str(getattr(estimator, "value", estimator)).lower()
        if name is not None and name not in ROW_ESTIMATORS:
            raise TrainerConfigError(
                "verl",
                "algorithm.adv_estimator",
                f"{sample} has {len(rows)} training sequences ({branches}); verl's {name!r} would group every "
                f"row by uid, counting the sample {len(rows)} times in its baseline: use one of "
                f"{sorted(ROW_ESTIMATORS)} (GRPO's baseline is over each session's last row)",
            )
        setting = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
        if not _is_tmpl_manager(_setting(self.config, setting, None)):
            raise TrainerConfigError(
                "verl",
                setting,
                f"{sample} has {len(rows)} training sequences ({branches}); verl 0.9.1's own V1 worker scores "
                "them in one batch padded on the right, where its reward managers (attention_mask[-response_length:]) "
                "read the last response with pad tokens after it or cut short: set it to "
                "tmpl.integrations.verl.TmplAgentLoopManager",
            )

    async def _prompt_images(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The prompt with the images verl's own loops would use for it (its dataset class's extraction)."""
        if self.mm_processor_kwargs:
            raise TrainerConfigError(
                "verl",
                "data.mm_processor_kwargs",
                "tmpl renders images with the processor's own settings; set them on the processor instead "
                f"(given: {sorted(self.mm_processor_kwargs)})",
            )
        if not any(is_image_part(p) for m in messages if isinstance(m.get("content"), list) for p in m["content"]):
            return messages
        data = await self.process_multi_modal_info(messages)
        if data.get("videos") or data.get("audios"):
            raise ImageInputError(
                0, "raw_prompt", "videos and audio are not supported (images only)", where="raw_prompt"
            )
        return with_images(messages, list(data.get("images") or []))


def training_rows(result: RolloutResult) -> list[TrainingSequence]:
    """The sequences of ``result`` that become verl rows: every one with a token on its loss mask, in
    the episode's order, and the sample's main sequence last, trained or not (the last sequence of the
    policy's own lineage, holding its last answer: the output verl's reward manager scores).

    Sequences that train nothing (a summarizer's untrained call, an all-withheld branch) are left out;
    the rows name their sequence (``extra_fields["tmpl_sequence"]``) and the episode's count
    (``"tmpl_sequences"``), so a gap is visible.

    >>> [s.index for s in training_rows(result)]   # Qwen3, three user turns, template mode  # doctest: +SKIP
    [0, 1, 2]
    """
    seqs = result.sequences
    own = [s for s in seqs if s.agent is None and s.parent is None] or seqs
    main = max(own, key=lambda s: (max(s.turns, default=-1), s.index))
    return [s for s in seqs if s is not main and int(s.mask.sum())] + [main]


def _routes_field(routes: Any) -> dict[str, Any]:
    """``{"routed_experts": routes}`` for an ``AgentLoopOutput`` (a copy: verl writes into what it gets),
    or nothing when the rollout has no routes."""
    return {} if routes is None else {"routed_experts": routes.copy()}


def _sequence_routes(seq: TrainingSequence, result: RolloutResult) -> Any:
    """The routes of one training sequence of ``result`` (aligned with its IDs), None without routes."""
    at = next(i for i, s in enumerate(result.sequences) if s.index == seq.index)
    held = result.sequence_routes[at]
    return None if held is None else held[0]


def _setting(config: Any, path: str, default: Any) -> Any:
    """``config``'s value at the dotted ``path`` (verl's OmegaConf config), or ``default`` where absent."""
    node = config
    for key in path.split("."):
        try:
            node = node.get(key) if hasattr(node, "get") else getattr(node, key, None)
        except Exception:  # noqa: BLE001 - a struct config without the key: absent
            return default
        if node is None:
            return default
    return node


def _is_tmpl_manager(fqn: Any) -> bool:
    """Whether ``fqn`` (verl's ``agent_loop_manager_class``) names :class:`TmplAgentLoopManager` or a subclass."""
    module, _, name = str(fqn or "").rpartition(".")
    if not module:
        return False
    try:
        cls = getattr(importlib.import_module(module), name)
        from .manager import TmplAgentLoopManager
    except Exception:  # noqa: BLE001 - not importable here (or no TransferQueue): not tmpl's manager
        return False
    return isinstance(cls, type) and issubclass(cls, TmplAgentLoopManager)


def _sample_name(result: RolloutResult, kwargs: Mapping[str, Any]) -> str:
    """The sample in verl's words: its ``uid`` and dataset ``index`` where verl gave them."""
    parts = [f"{key}={kwargs[key]}" for key in ("uid", "index") if kwargs.get(key) is not None]
    return "sample " + (" ".join(parts) if parts else str(result.index))


def register_tool_agent(
    tools: Sequence[Any], *, name: str = "tmpl_tool_agent", **rollout_options: Any
) -> type[TmplToolAgentLoop]:
    """Register a ``TmplToolAgentLoop`` with ``tools`` (callables or a :class:`tmpl.Toolbox`) under ``name``.

    ``rollout_options`` go to :class:`tmpl.Rollout` (``max_turns``, ``max_tokens_per_turn``,
    ``verify_every``, ...). Returns the registered class; set the dataset's ``agent_name`` (or
    ``rollout.agent.default_agent_loop``) to ``name``.
    """
    cls = type(
        f"TmplToolAgentLoop_{name}",
        (TmplToolAgentLoop,),
        {"tools": tools, "rollout_options": dict(rollout_options), "__module__": __name__},
    )
    globals()[cls.__name__] = cls  # verl instantiates agent loops by their import path
    _agent_loop_registry[name] = {"_target_": f"{__name__}.{cls.__name__}"}
    return cls

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

>>> from tmpl.integrations.verl import register_tool_agent          # doctest: +SKIP
>>> register_tool_agent(tools=[get_weather, get_time], max_turns=8)  # then agent_name: tmpl_tool_agent  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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

__all__ = ["TmplToolAgentLoop", "register_tool_agent", "with_images"]

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

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Roll out ``kwargs["raw_prompt"]`` (a message list) with tools; one ``AgentLoopOutput``."""
        config = self.rollout_config
        options = {"max_turns": 8, **self.rollout_options}
        messages = list(kwargs["raw_prompt"])
        if self.vision:
            messages = await self._prompt_images(messages)
        rollout = Rollout(
            self.template,
            VerlServerBackend(self.server_manager, sampling_params),
            tools=self.tools or None,
            max_length=int(config.prompt_length) + int(config.response_length),
            max_completion_length=int(config.response_length),
            progress=False,
            **options,
        )
        [result] = await rollout.run_async([messages])
        multi_modal: dict[str, Any] = {}
        if self.vision and result.images is not None and result.images.count:
            # the images of the whole sequence, in placeholder order (prompt's, then tool results')
            images = split_images(result.messages, where=f"sample {result.index}")[1][: result.images.count]
            multi_modal["images"] = images
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
            extra_fields={
                "tmpl_status": result.status.name,
                "tmpl_reason": result.reason,
                "tool_calls": result.tool_calls,
                "tool_failures": result.tool_failures,
                "messages": result.messages,
                # tmpl's policy versions: one per response token (-1 on appended tokens), the version
                # the sample ended under and its staleness (versions between its oldest token and that)
                "tmpl_versions": result.versions.tolist(),
                "tmpl_version": result.version,
                "tmpl_staleness": result.staleness,
            },
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

"""What tmpl's TRL rollout functions read from a trainer: its checks, sampling, chat template and budgets.

Shared by :mod:`.rollout_func` (tmpl's own tool loop) and :mod:`.harness` (harness runs), so neither imports
the other for them.

>>> sampling_of(type("T", (), {"temperature": 0.7, "top_p": None, "top_k": 0})()).temperature
0.7
"""

from __future__ import annotations

from typing import Any

from ...backends import Sampling
from ...chat_template import ChatTemplate
from ...errors import TmplError, TrainerConfigError
from ...vision.template import VisionTemplate
from .backends import trainer_name

__all__ = ["check_trainer", "default_max_length", "fill_id", "sampling_of", "template_for"]


def check_trainer(trainer: Any) -> None:
    """Refuse trainers that would run their own tool loop on top of tmpl's."""
    if getattr(trainer, "tools", None):
        names = ", ".join(getattr(t, "__name__", repr(t)) for t in trainer.tools)
        raise TrainerConfigError(
            trainer_name(trainer),
            "tools",
            f"the trainer was given tools ({names}) together with tmpl's rollout_func; it would run its own tool "
            "loop on the completions tmpl returns (re-tokenizing tool results). Give the tools to "
            "make_rollout_func(tools=...) only",
        )
    if getattr(trainer, "environment_factories", None):
        raise TrainerConfigError(
            trainer_name(trainer),
            "environment_factory",
            "environments run TRL's own tool loop; with tmpl's rollout_func pass the factory as "
            "make_rollout_func(environment_factory=...) instead (tmpl runs it with exact suffixes)",
        )
    for setting, default in (("repetition_penalty", 1.0), ("min_p", 0.0)):
        value = getattr(trainer, setting, None)
        if value not in (None, default):
            raise TrainerConfigError(
                trainer_name(trainer),
                setting,
                f"{value} is not supported by tmpl's rollout (temperature, top_p, top_k only)",
            )
    kwargs = getattr(getattr(trainer, "args", None), "generation_kwargs", None)
    if kwargs:
        raise TrainerConfigError(
            trainer_name(trainer),
            "generation_kwargs",
            f"{sorted(kwargs)} are not supported by tmpl's rollout (temperature, top_p, top_k only)",
        )


def sampling_of(trainer: Any) -> Sampling:
    """The trainer's sampling settings; logprobs after temperature/top-k/top-p, as TRL's vLLM reports them."""
    top_p = getattr(trainer, "top_p", None)
    return Sampling(
        temperature=float(getattr(trainer, "temperature", 1.0)),
        top_p=1.0 if top_p is None else float(top_p),
        top_k=int(getattr(trainer, "top_k", 0) or 0),
        n=1,
        logprobs="processed",
    )


def template_for(trainer: Any, template: ChatTemplate | str | None) -> ChatTemplate:
    """The chat template of a trainer: its tokenizer, its template (or ``template``), its kwargs."""
    tokenizer = getattr(trainer, "_tokenizer", None) or getattr(trainer, "processing_class", None)
    if tokenizer is None or not hasattr(tokenizer, "convert_tokens_to_ids"):
        raise TrainerConfigError(
            trainer_name(trainer),
            "processing_class",
            "tmpl's rollout needs a text tokenizer (multimodal processors are not supported)",
        )
    kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
    if isinstance(template, ChatTemplate):
        from ...tokenize import codec_for

        if template.codec.content_hash != codec_for(tokenizer).content_hash:
            raise TrainerConfigError(
                trainer_name(trainer),
                "processing_class",
                f"template {template.name!r} was built on a different tokenizer than the trainer's",
            )
        return template
    if isinstance(template, str):
        from ... import templates

        if template in {t.name for t in templates.available()}:
            return ChatTemplate(tokenizer, templates.load(template), name=template, **kwargs)
        return ChatTemplate(tokenizer, template, **kwargs)
    if template is not None:
        raise TypeError(
            f"template must be a ChatTemplate, a template name or text, or None, not {type(template).__name__}"
        )
    return ChatTemplate(tokenizer, getattr(trainer, "chat_template", None), **kwargs)


def default_max_length(trainer: Any) -> int:
    """A sample's total budget: vLLM's ``max_model_len`` when set, else the model's context size."""
    args = getattr(trainer, "args", None)
    if getattr(trainer, "use_vllm", False) and getattr(args, "vllm_max_model_length", None):
        return int(args.vllm_max_model_length)
    config = getattr(getattr(trainer, "model", None), "config", None)
    size = getattr(config, "max_position_embeddings", None) if config is not None else None
    return int(size) if isinstance(size, int) and size > 0 else 32768


def fill_id(tpl: ChatTemplate | VisionTemplate) -> int:
    """The token that stands in for an empty completion (the turn close, else EOS)."""
    if isinstance(tpl, VisionTemplate):
        tpl = tpl.chat
    try:
        return int(tpl.tool_close_ids[-1])
    except TmplError:  # a template that cannot render tool turns: EOS stands in
        eos = getattr(tpl.tokenizer, "eos_token_id", None)
        return int(eos if eos is not None else min(tpl.stop_token_ids))

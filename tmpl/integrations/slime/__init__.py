"""tmpl in slime: a custom generate function (``--custom-generate-function-path``).

slime calls ``async def generate(args, sample, sampling_params) -> Sample`` once per sample and trains
on ``sample.tokens`` (prompt + response), ``response_length``, ``loss_mask`` and
``rollout_log_probs`` (response only: 1 / the sampling logprob on model tokens, 0 on appended
tool results), with ``status``. The function below runs one :class:`tmpl.Rollout` per sample on
SGLang's ``/generate`` (:class:`tmpl.backends.SGLang`, at ``args.sglang_router_ip:port``) or any
tmpl backend, and keeps the invariants of slime's retool fixes (slime PR 1861): a retried sample
starts from its prompt (stale fields are overwritten), each turn's ``max_new_tokens`` is clamped to
the budget left, a generation without logprobs aborts the sample (never re-tokenized), and a tool
result that overflows the budget is cut together with its mask and logprobs and marks TRUNCATED.

In your module (then ``--custom-generate-function-path my_module.generate``)::

    from tmpl.integrations.slime import make_generate
    generate = make_generate(tools=[get_weather, get_time], max_turns=8)

The ``Sample`` fields used are those of slime's ``slime/utils/types.py`` (THUDM/slime commit
0d234f3e); slime itself is not on the package index, so the tests use a stand-in with those fields.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ...backends.base import Backend, Sampling
from ...chat_template import ChatTemplate
from ...errors import TrainerConfigError
from ...rollout import Rollout

__all__ = ["make_generate", "sampling_from_slime"]

STATUS = {"DONE": "COMPLETED", "TRUNCATED": "TRUNCATED", "ABORTED": "ABORTED"}


def sampling_from_slime(sampling_params: Mapping[str, Any]) -> Sampling:
    """tmpl's :class:`~tmpl.backends.Sampling` from slime's SGLang sampling dict.

    >>> sampling_from_slime({"temperature": 0.8, "top_p": 0.9, "top_k": -1, "max_new_tokens": 64})
    Sampling(temperature=0.8, top_p=0.9, top_k=0, n=1, seed=None, logprobs='raw')
    """
    top_k = int(sampling_params.get("top_k", 0) or 0)
    return Sampling(
        temperature=float(sampling_params.get("temperature", 1.0)),
        top_p=float(sampling_params.get("top_p", 1.0)),
        top_k=max(top_k, 0),
    )


@functools.lru_cache(maxsize=8)
def _template(path: str) -> ChatTemplate:
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(path, trust_remote_code=True))


@functools.lru_cache(maxsize=8)
def _sglang(url: str) -> Backend:
    """One SGLang client (and its connection pools) per router URL and process, shared by every sample."""
    from ...backends.sglang import SGLang

    return SGLang(url)


def make_generate(
    tools: Any = None,
    *,
    template: ChatTemplate | None = None,
    backend: Callable[[Any], Backend] | Backend | None = None,
    max_turns: int = 8,
    **rollout_options: Any,
) -> Callable[[Any, Any, Mapping[str, Any]], Awaitable[Any]]:
    """slime's ``generate(args, sample, sampling_params)`` running tmpl's tool rollout.

    ``template``: default the tokenizer of ``args.hf_checkpoint`` with its own chat template.
    ``backend``: a tmpl backend, or ``backend(args)`` making one; default :class:`tmpl.backends.SGLang`
    on ``http://{args.sglang_router_ip}:{args.sglang_router_port}``. Budgets: ``max_length`` is
    ``args.rollout_max_context_len`` (when set), ``max_completion_length`` is
    ``args.rollout_max_response_len``; ``rollout_options`` go to :class:`tmpl.Rollout`.
    """

    async def generate(args: Any, sample: Any, sampling_params: Mapping[str, Any]) -> Any:
        tpl = template or _template(str(args.hf_checkpoint))
        prompt = sample.prompt
        if isinstance(prompt, str):
            raise TrainerConfigError(
                "slime", "prompt", "tmpl needs the prompt as a message list (run slime without --apply-chat-template)"
            )
        if isinstance(backend, Backend):
            engine = backend
        elif backend is not None:
            engine = backend(args)
        else:
            engine = _sglang(f"http://{args.sglang_router_ip}:{args.sglang_router_port}")
        max_response = int(
            getattr(args, "rollout_max_response_len", None) or sampling_params.get("max_new_tokens", 1024)
        )
        max_context = getattr(args, "rollout_max_context_len", None)
        rollout = Rollout(
            tpl,
            engine,
            tools=tools,
            max_turns=max_turns,
            max_length=int(max_context) if max_context else max_response,  # set below when not given
            max_completion_length=max_response,
            max_tokens_per_turn=int(sampling_params.get("max_new_tokens", max_response)),
            sampling=sampling_from_slime(sampling_params),
            progress=False,
            **rollout_options,
        )
        if not max_context:  # the prompt (with the tools' schemas) plus the response budget
            rollout.max_length = len(tpl.prompt_ids(list(prompt), tools=rollout.tool_schemas)) + max_response
        [result] = await rollout.run_async([list(prompt)])
        # every field is written fresh: nothing of an earlier (aborted, retried) attempt stays
        response = result.completion_ids.tolist()
        sample.tokens = result.prompt_ids.tolist() + response
        sample.response_length = len(response)
        sample.loss_mask = [int(m) for m in result.mask.tolist()]
        sample.rollout_log_probs = [float(x) for x in result.logprobs.tolist()]
        sample.response = tpl.tokenizer.decode(response)  # text for rewards and logs only
        sample.status = getattr(type(sample).Status, STATUS[result.status.name])
        metadata = dict(getattr(sample, "metadata", None) or {})
        metadata.update(
            tmpl_reason=result.reason,
            messages=result.messages,
            tool_calls=result.tool_calls,
            tool_failures=result.tool_failures,
            turns=result.turns,
        )
        sample.metadata = metadata
        return sample

    return generate

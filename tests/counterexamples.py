"""Replaying a report's counterexample with transformers' own tokenized renders.

A counterexample (``tmpl.report.search``) names a token-in/token-out stream (the generation
prompt after some messages, plus the next assistant turn as it renders when last, through its
first stop token) and a longer render the stream should be a prefix of. :func:`reproduces`
rebuilds both with ``apply_chat_template(tokenize=True)``, independently of tmpl's renderer and
codec, and says whether the stream really is not a prefix.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import tmpl
from tmpl.report.space import SPACE_TOOLS

#: fields models and trainers put an assistant turn's reasoning under
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def reproduces(tpl: tmpl.ChatTemplate, ce: dict[str, Any], template: str | None = None) -> bool:
    """Whether ``ce`` breaks ``template`` (default: ``tpl``'s) on ``tpl``'s tokenizer."""
    messages, kwargs = ce["messages"], ce["kwargs"]

    def ids(upto: int, gen: bool) -> list[int]:
        out = tpl.tokenizer.apply_chat_template(
            messages[:upto],
            tools=SPACE_TOOLS,
            chat_template=template or tpl.template,
            tokenize=True,
            return_dict=True,
            add_generation_prompt=gen,
            **{**tpl.template_kwargs, **kwargs},
        )
        return list(out["input_ids"])

    k = ce["stream"]["prompt_messages"]
    stream = ids(k, True)
    if ce["stream"]["completion_of"] is not None:
        own = ids(k + 1, False)
        assert own[: len(stream)] == stream, "the generation prompt is a prefix of the turn's own render"
        stream = own[: next(t for t in range(len(stream), len(own)) if own[t] in tpl.stop_token_ids) + 1]
    longer = ids(ce["longer"]["messages"], ce["longer"]["add_generation_prompt"])
    return longer[: len(stream)] != stream


class Renders:
    """Tokenized renders of one conversation through transformers."""

    def __init__(
        self, tpl: tmpl.ChatTemplate, msgs: list[dict[str, Any]], kwargs: dict[str, Any], tools: Sequence[Any]
    ) -> None:
        self.tpl, self.msgs, self.kwargs, self.tools = tpl, msgs, kwargs, list(tools)

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one instance per example
    def ids(self, upto: int, gen: bool) -> list[int]:
        out = self.tpl.tokenizer.apply_chat_template(
            self.msgs[:upto],
            tools=self.tools,
            chat_template=self.tpl.template,
            tokenize=True,
            add_generation_prompt=gen,
            **{**self.tpl.template_kwargs, **self.kwargs},
        )
        return list(out["input_ids"])


def kwargs_refused(tpl: tmpl.ChatTemplate, kwargs: dict[str, Any]) -> bool:
    """Whether the template raises on a one-message conversation under ``kwargs``."""
    try:
        tpl.tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}],
            chat_template=tpl.template,
            tokenize=False,
            add_generation_prompt=True,
            **{**tpl.template_kwargs, **kwargs},
        )
    except Exception:  # noqa: BLE001 - any refusal
        return True
    return False


def as_generated(tpl: tmpl.ChatTemplate, msgs: list[dict[str, Any]], kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """What a model can generate under ``kwargs``: no reasoning where the generation prompt closes an
    empty thinking block (where it opens one, the model may write reasoning or close it empty)."""
    prompt = tpl.tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}],
        chat_template=tpl.template,
        tokenize=False,
        add_generation_prompt=True,
        **{**tpl.template_kwargs, **kwargs},
    ).rstrip()
    if not prompt.endswith("</think>"):
        return msgs
    return [{k: v for k, v in m.items() if k not in REASONING_FIELDS} for m in msgs]


def first_failure(
    tpl: tmpl.ChatTemplate, msgs: list[dict[str, Any]], kwargs: dict[str, Any], tools: Sequence[Any] = SPACE_TOOLS
) -> str | None:
    """The use ("tool_loop"/"multi_user") whose token-in/token-out step fails first, or None: every
    append must leave the stream built so far a prefix of the longer render, and each turn's generation
    prompt must be a prefix of the turn's own render (renders through transformers, tokenized)."""
    r = Renders(tpl, msgs, kwargs, tools)
    stream: list[int] | None = None
    prev = -1
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        between = msgs[prev + 1 : i]
        use = "multi_user" if any(x["role"] == "user" for x in between) else "tool_loop"
        prompt = r.ids(i, True)
        if stream is not None and prompt[: len(stream)] != stream:
            return use
        own = r.ids(i + 1, False)
        if own[: len(prompt)] != prompt:
            return "tool_loop" if m.get("tool_calls") or msgs[i - 1]["role"] == "tool" else use
        stop = next((t for t in range(len(prompt), len(own)) if own[t] in tpl.stop_token_ids), None)
        assert stop is not None, f"assistant message {i} renders no stop token"
        stream, prev = own[: stop + 1], i
    if stream is not None and prev < len(msgs) - 1:
        longer = r.ids(len(msgs), True)
        if longer[: len(stream)] != stream:
            return "multi_user" if any(x["role"] == "user" for x in msgs[prev + 1 :]) else "tool_loop"
    return None

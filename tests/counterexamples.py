"""Replaying a report's counterexample with transformers' own tokenized renders.

A counterexample (``tmpl.report.search``) names a token-in/token-out stream (the generation
prompt after some messages, plus the next assistant turn as it renders when last, through its
first stop token) and a longer render the stream should be a prefix of. :func:`reproduces`
rebuilds both with ``apply_chat_template(tokenize=True)``, independently of tmpl's renderer and
codec, and says whether the stream really is not a prefix.
"""

from __future__ import annotations

from typing import Any

import tmpl
from tmpl.report.space import SPACE_TOOLS


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

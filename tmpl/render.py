"""Renders conversations with one chat template through transformers, counting renders.

Rendering is the slow path of tmpl: the probe renders dummy conversations once per
template fingerprint, and the per-call path renders only for templates that
transform tool content in ways the probe cannot reproduce by concatenation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import TemplateRenderError


class Renderer:
    """Render ``messages`` with a fixed template text and template kwargs.

    ``count`` is the number of renders so far (tests use it to prove caching).

    >>> r = Renderer(tokenizer, "{% for m in messages %}{{ m.content }}{% endfor %}", name="toy")  # doctest: +SKIP
    >>> r.text([{"role": "user", "content": "hi"}])  # doctest: +SKIP
    'hi'
    """

    def __init__(self, tokenizer: Any, template: str, *, name: str, template_kwargs: Mapping[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.template = template
        self.name = name
        self.template_kwargs = dict(template_kwargs or {})
        self.count = 0

    def text(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = False,
        **extra: Any,
    ) -> str:
        """The template's text for ``messages``; template errors become :class:`TemplateRenderError`."""
        self.count += 1
        try:
            out = self._apply(list(messages), tools, add_generation_prompt, extra)
        except Exception as exc:  # jinja2 errors, raise_exception(), KeyError in a template...
            raise TemplateRenderError(self.name, f"rendering failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(out, str):
            raise TemplateRenderError(self.name, f"rendering returned {type(out).__name__}, not text")
        return out

    def texts(
        self,
        conversations: Sequence[Sequence[Mapping[str, Any]]],
        *,
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = False,
        **extra: Any,
    ) -> list[str]:
        """:meth:`text` of each conversation, in one ``apply_chat_template`` call (the tools and the
        template's kwargs converted once, not once per conversation: a rollout's prompts).

        The texts are those of :meth:`text`, each; where the batch fails, each conversation is
        rendered alone, so the error is the one its own render raises.

        >>> r.texts([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]])  # doctest: +SKIP
        ['hi', 'yo']
        """
        if len(conversations) < 2:
            return [
                self.text(c, tools=tools, add_generation_prompt=add_generation_prompt, **extra) for c in conversations
            ]
        try:
            out = self._apply([list(c) for c in conversations], tools, add_generation_prompt, extra)
        except Exception:  # noqa: BLE001 - rendered alone below, each raising its own error
            out = None
        if not isinstance(out, list) or len(out) != len(conversations) or not all(isinstance(t, str) for t in out):
            return [
                self.text(c, tools=tools, add_generation_prompt=add_generation_prompt, **extra) for c in conversations
            ]
        self.count += len(out)
        return out

    def _apply(self, conversation: Any, tools: Sequence[Any] | None, generation: bool, extra: Mapping[str, Any]) -> Any:
        """``apply_chat_template`` of one conversation or a batch, as text, with this renderer's kwargs."""
        return self.tokenizer.apply_chat_template(
            conversation,
            tools=list(tools) if tools is not None else None,
            chat_template=self.template,
            add_generation_prompt=generation,
            tokenize=False,
            **{**self.template_kwargs, **extra},
        )

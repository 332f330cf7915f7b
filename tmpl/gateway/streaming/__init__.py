"""Live streams: a call's text sent as the engine samples it, in each dialect's own event stream.

A streamed call (``"stream": true``, one choice) runs :meth:`Gateway.complete_streamed`: the same plan and
the same recording as a call answered whole, with the engine's tokens (:meth:`Backend.astream`) handed to
a :class:`LiveText` as they come. :class:`LiveText` decodes them incrementally (never re-tokenized; a
character whose bytes span tokens is sent once it is complete) and passes on the text that is surely
the reply's *content*: anything that could be the start of a tool-call or reasoning marker of the
template's parser, or of a stop string, is held back until it is decided, and from the first marker on
nothing more is sent live. When the engine has finished and the call is recorded, the rest comes from
the parsed reply: the content not sent yet, the reasoning, the tool calls, the finish reason and usage.

While nothing is sent for ``keepalive`` seconds (a long prefill, a long held-back tool call) a keep-alive
goes out in the dialect's own form: an SSE comment (``: ping``) for OpenAI's two APIs, Anthropic's
``ping`` event, a blank line for Gemini (its Python SDK fails on a comment line). Templates whose calls need no marker (bare JSON calls, Llama 3's) or whose reasoning the
prompt opens send their whole reply at the end (keep-alives until then).

>>> live = LiveText(tpl)                                            # doctest: +SKIP
>>> task = asyncio.ensure_future(gateway.complete_streamed(live, "s1", messages, None, CallParams()))  # doctest: +SKIP
>>> async for line in chat_sse(live, follow(live, task, 5.0), body_of, model="m", include_usage=False):  # doctest: +SKIP
...     print(line, end="")

:mod:`.live` holds a call's live text, :mod:`.encoders` each dialect's events.
"""

from __future__ import annotations

from .encoders import anthropic_sse, chat_sse, gemini_stream, responses_sse
from .live import LiveText, follow, live_markers

__all__ = ["LiveText", "anthropic_sse", "chat_sse", "follow", "gemini_stream", "live_markers", "responses_sse"]

"""What crosses the wire to vLLM's servers: the prefix-cache counters of ``/metrics``, a streamed answer's events
merged, a token entry's ID, an image as a data URL, and the hint a server without the RL endpoints gets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: samples whose server is remembered for sticky routing (the oldest are forgotten first)
_MAX_HOMES = 65536
#: characters of image data URLs a client keeps, the least recently sent dropped first (a sample sends
#: every image of its sequence on each turn)
_MAX_IMAGE_URL_CHARS = 64 << 20


def prometheus_counters(text: str) -> tuple[float, float]:
    """``(vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total)`` summed over their series.

    >>> prometheus_counters('vllm:prefix_cache_queries_total{engine="0"} 512.0\\nvllm:prefix_cache_hits_total{engine="0"} 256.0')
    (512.0, 256.0)
    """
    sums = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    for line in text.splitlines():
        head = line.split(" ")[0].split("{")[0]
        if head in sums:
            try:
                sums[head] += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return sums["vllm:prefix_cache_queries_total"], sums["vllm:prefix_cache_hits_total"]


def merge_stream(events: Sequence[Any]) -> dict[str, Any]:
    """One ``/inference/v1/generate`` answer from the events of its stream (``"stream": true``).

    Each chunk's choice carries the new ``token_ids`` and their ``logprobs.content``; the last one the
    ``finish_reason``, ``weight_versions`` and, when the server returns routes, ``routed_experts``
    (vLLM fills them when the request finishes). An ``error`` event raises ValueError (a malformed
    answer, failed by the caller).

    >>> merge_stream([{"request_id": "r", "choices": [{"index": 0, "token_ids": [5]}]},
    ...               {"request_id": "r", "choices": [{"index": 0, "token_ids": [6], "finish_reason": "stop"}]}])
    {'request_id': 'r', 'choices': [{'index': 0, 'token_ids': [5, 6], 'finish_reason': 'stop'}]}
    """
    merged: dict[str, Any] = {"index": 0, "token_ids": []}
    content: list[Any] = []
    out: dict[str, Any] = {"request_id": None}
    for event in events:
        if not isinstance(event, dict) or "error" in event:
            raise ValueError(f"the stream sent an error: {str(event)[:200]}")
        out["request_id"] = event.get("request_id", out["request_id"])
        if event.get("prompt_token_ids") is not None:  # the first chunk's (return_token_ids)
            out["prompt_token_ids"] = event["prompt_token_ids"]
        for choice in event.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            merged["token_ids"] += choice.get("token_ids") or []
            logprobs = choice.get("logprobs")
            if logprobs:
                content += logprobs.get("content") or []
            for key in ("finish_reason", "routed_experts", "weight_versions"):
                if choice.get(key) is not None:
                    merged[key] = choice[key]
    if content:
        merged["logprobs"] = {"content": content}
    return {**out, "choices": [merged]}


def _stream_piece(event: Any) -> tuple[list[int], list[float] | None]:
    """The new token IDs of one event of vLLM's stream (choice 0) and their logprobs (None when it sent none
    for every one of them). An error event yields nothing here: :func:`merge_stream` fails it at the end."""
    if not isinstance(event, dict) or "error" in event:
        return [], None
    for choice in event.get("choices") or []:
        if choice.get("index", 0) != 0:
            continue
        lp = choice.get("logprobs") or {}
        content = lp.get("content") or []
        ids = choice.get("token_ids")
        if ids is None:
            ids = [entry_token_id(c) for c in content]
        ids = [int(t) for t in ids]
        logprobs = [float(c["logprob"]) for c in content] if len(content) == len(ids) else None
        return ids, logprobs
    return [], None


def entry_token_id(entry: dict[str, Any]) -> int:
    """The token ID of one ``logprobs.content`` entry, in either shape vLLM has answered with.

    vLLM 0.33 gives ``{"token_id": 42, "logprob": ...}``; 0.30 gave chat-style entries whose
    ``token`` is the string ``"token_id:42"``.

    >>> entry_token_id({"token_id": 42, "logprob": -0.1}), entry_token_id({"token": "token_id:42", "logprob": -0.1})
    (42, 42)
    """
    if "token_id" in entry:
        return int(entry["token_id"])
    token = str(entry.get("token", ""))
    if token.startswith("token_id:"):
        return int(token[len("token_id:") :])
    raise ValueError(f"a logprobs entry without a token id: {str(entry)[:80]}")


def image_data_url(source: Any) -> str:
    """A lossless ``data:image/png;base64,...`` URL of an image (a PIL image or any source
    :func:`tmpl.vision.load_image` reads), for vLLM's ``content_parts``.

    >>> from PIL import Image
    >>> image_data_url(Image.new("RGB", (2, 2)))[:30]
    'data:image/png;base64,iVBORw0K'
    """
    import base64
    import io

    from ..vision import load_image

    buf = io.BytesIO()
    load_image(source, part="image_sources").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def scale_out_hint(url: str, body: Any) -> str:
    """The error for a stock server refusing the tokens endpoint (no ``--enable-scale-out``)."""
    return (
        f"{url}: HTTP 403 from /inference/v1/generate ({str(body)[:120]}): this server was started without "
        "--enable-scale-out. Restart it with `python -m vllm.entrypoints.openai.api_server --model PATH "
        "--enable-scale-out`, or use VLLMServer(..., api='completions'), which a stock server accepts."
    )

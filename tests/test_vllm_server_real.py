"""Real vLLM servers (the CPU build) as subprocesses on 127.0.0.1, driven by ``tmpl.backends.VLLMServer``.

Two servers per module, started in parallel and always killed at teardown: a stock one and one
with ``--enable-scale-out`` (the tokens endpoint ``/inference/v1/generate``). Skips with the reason
when vllm or the fixture model is absent.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import tmpl
from tmpl.backends import GenerationRequest, Sampling, VLLMServer
from tmpl.rollout.codes import EndCode

from .test_vllm_real import QUESTIONS, QWEN, get_time, get_weather

httpx = pytest.importorskip("httpx")

STARTUP_LIMIT = 300.0  # seconds; ~30 s on an idle 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(QWEN),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "1024",
        "--enforce-eager",
        "--seed",
        "0",
        *extra,
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def wait_ready(proc: subprocess.Popen, url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"vLLM server {url} exited with {proc.returncode}: "
                f"{proc.stderr.read().decode(errors='replace')[-2000:]}"
            )
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"vLLM server {url} not ready after {STARTUP_LIMIT:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def servers():
    ports = free_port(), free_port()
    procs = [start_server(ports[0]), start_server(ports[1], "--enable-scale-out")]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        deadline = time.monotonic() + STARTUP_LIMIT
        for proc, url in zip(procs, urls):
            wait_ready(proc, url, deadline)
        yield {"stock": urls[0], "scale_out": urls[1], "procs": procs}
    finally:
        for proc in procs:
            stop(proc)


@pytest.fixture(scope="module")
def tpl():
    return tmpl.ChatTemplate.from_pretrained(str(QWEN))


def run(tpl, backend, n=2):
    # the budget fits the servers' --max-model-len 1024: a larger max_tokens is refused with HTTP 400
    return tmpl.Rollout(
        tpl,
        backend,
        tools=[get_time, get_weather],
        max_turns=4,
        verify_every=1,
        max_length=1024,
        max_completion_length=512,
        sampling=Sampling(temperature=1.0, n=n, seed=5),
        progress=False,
    ).run(QUESTIONS)


@pytest.mark.parametrize(
    "api, which", [("completions", "stock"), ("generate", "scale_out"), ("completions", "scale_out")]
)
def test_real_server_tool_rollouts_equal_full_renders(tpl, servers, api, which):
    results = run(tpl, VLLMServer(servers[which], api=api, timeout=120))
    assert all(r.code in (EndCode.FINISHED, EndCode.MAX_TURNS) for r in results), [(r.code, r.reason) for r in results]
    assert sum(r.tool_calls for r in results) >= 4
    for r in results:
        assert r.finish_reason == "stop" and int(r.completion_ids[-1]) in tpl.stop_token_ids
        assert len(r.logprobs) == len(r.mask)


def test_generate_on_a_stock_server_says_how_to_start_it(tpl, servers):
    client = VLLMServer(servers["stock"], api="generate", timeout=60)
    req = GenerationRequest("r1", tpl.prompt_ids(QUESTIONS[0]), 8, frozenset(tpl.stop_token_ids))
    out = client.generate_batch([req])[0]
    assert out.finish_reason == "error"
    assert "--enable-scale-out" in out.error and "api='completions'" in out.error


def test_two_servers_share_the_load(tpl, servers):
    client = VLLMServer([servers["stock"], servers["scale_out"]], api="completions", timeout=120)
    results = run(tpl, client, n=3)
    assert all(r.code in (EndCode.FINISHED, EndCode.MAX_TURNS) for r in results)
    assert all(s["completed"] > 0 for s in client.stats), client.stats

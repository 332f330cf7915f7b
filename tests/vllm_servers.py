"""Real vLLM CPU servers for tests and benchmarks: started as subprocesses on 127.0.0.1, waited for,
always stopped. One place for the command line, the environment and the lifecycle that the
real-server test modules (and benchmarks/) share.

>>> with running(tmp_path, "--enable-scale-out", env={"VLLM_SERVER_DEV_MODE": "1"}) as [server]:  # doctest: +SKIP
...     httpx.get(server.url + "/health")
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tmpl.backends import VLLMServer

from .conftest import ONE_THREAD, PRISTINE_ENV
from .engine_ledger import record_start
from .fixture_models import QWEN

STARTUP_LIMIT = 300.0  # seconds; ~30 s on an idle 2-core machine
# VLLM_ENABLE_V1_MULTIPROCESSING=0: vLLM's CPU platform keeps its worker inside the engine core process
# (else a third process, spawned, imports vLLM again: 66 s instead of 88 s to ready on an idle machine,
# the same IDs); the API server still runs its engine core in a process of its own.
# ONE_THREAD (conftest.py): one unbound OpenMP thread; vLLM binds one per core, 13 times slower beside
# the suite's other worker.
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "PYTHONUNBUFFERED": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    **ONE_THREAD,
}
REAPER = Path(__file__).with_name("reaper.py")  # ends a server with the test process that started it

# out of the fixture model's training distribution: it writes on without a stop token for hundreds of tokens
RAMBLE = [{"role": "user", "content": "zq xv lorem ipsum " * 20}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    port: int,
    log: IO[bytes] | int,
    *extra: str,
    env: Mapping[str, str | None] | None = None,
    python: str | None = None,
    model: Path = QWEN,
) -> subprocess.Popen:
    """Start one server of ``model`` on ``port``; its output goes to ``log`` (a pipe nobody reads
    would block a chatty server once full). ``env`` adds to (None: removes from) a stock environment
    (not what vLLM's in-process engine of other tests left in os.environ); ``python``: another
    interpreter's vLLM."""
    environment = {**PRISTINE_ENV, **SERVER_ENV}
    for key, value in (env or {}).items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    # through the reaper: the server (and what it starts) ends with this process, however it ends
    cmd = [sys.executable, str(REAPER), python or sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    cmd += ["--model", str(model)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024", "--enforce-eager", "--seed", "0"]
    cmd += ["--enable-log-requests", *extra]  # the log then says which requests ran and were aborted
    proc = subprocess.Popen(cmd, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.started_at = time.monotonic()  # type: ignore[attr-defined]  # for the ledger (wait_ready)
    return proc


@contextlib.contextmanager
def engine_start(what: str) -> Iterator[None]:
    """Time an offline engine's start (``vllm.LLM(...)``) into the ledger."""
    t0 = time.monotonic()
    yield
    record_start("offline", what, time.monotonic() - t0)


def wait_ready(
    proc: subprocess.Popen, url: str, deadline: float, log_path: Path | None = None, what: str = "server"
) -> None:
    import httpx

    t0 = getattr(proc, "started_at", time.monotonic())
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path is not None else ""
            raise RuntimeError(f"vLLM server {url} exited with {proc.returncode}: {tail}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                record_start("server", what, time.monotonic() - t0)
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"vLLM server {url} not ready by its deadline")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@dataclass
class Server:
    """One started server: where it answers, its log file and its process."""

    url: str
    log: Path
    proc: subprocess.Popen


@contextlib.contextmanager
def running(
    folders: Path | list[Path],
    *extra: str,
    env: Mapping[str, str | None] | None = None,
    python: str | None = None,
    model: Path = QWEN,
    limit: float = STARTUP_LIMIT,
) -> Iterator[list[Server]]:
    """One server per folder (its log there), started side by side (their startups overlap),
    each stopped on the way out."""
    started: list[tuple[Server, IO[bytes]]] = []
    try:
        for folder in [folders] if isinstance(folders, Path) else folders:
            folder.mkdir(parents=True, exist_ok=True)
            port, log_path = free_port(), folder / "server.log"
            f = log_path.open("wb")
            proc = start_server(port, f, *extra, env=env, python=python, model=model)
            started.append((Server(f"http://127.0.0.1:{port}", log_path, proc), f))
        deadline = time.monotonic() + limit
        for server, _ in started:
            wait_ready(server.proc, server.url, deadline, server.log)
        yield [server for server, _ in started]
    finally:
        for server, f in started:
            stop(server.proc)
            f.close()


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric of a vLLM server over the series matching ``labels``."""
    import httpx

    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        head = line.split(" ")[0]
        if (head == name or head.startswith(name + "{")) and all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


class LongServer(VLLMServer):
    """A client whose requests cannot stop before their ``max_tokens`` (vLLM's own ``min_tokens`` set to
    it): a generation that is still running when the test looks is then certain, not a property of the
    weights and of CPU batching (CI saw every sample of three seeds stop before two ran at once, and, with
    600 tokens, a distributed rollout end before the lagging gauge showed its four requests)."""

    def _payload(self, req, rid):
        path, payload = super()._payload(req, rid)
        params = payload["sampling_params"] if "sampling_params" in payload else payload
        params["min_tokens"] = params["max_tokens"]
        return path, payload


class RecordingServer(VLLMServer):
    """The VLLMServer client keeping what the server said of every request (``return_token_ids``): its
    prompt IDs and sampled IDs, by request id. ``max_tokens`` caps a request's tokens and ``min_tokens``
    (vLLM's) asks for at least that many, where a subclass sets them."""

    max_tokens: int | None = None
    min_tokens: int | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: dict[str, tuple[list[int], list[int]]] = {}

    def _payload(self, req, rid):
        path, payload = super()._payload(req, rid)
        params = payload["sampling_params"]
        if self.max_tokens is not None:
            params["max_tokens"] = min(params["max_tokens"], self.max_tokens)
        if self.min_tokens is not None:
            params["min_tokens"] = min(self.min_tokens, params["max_tokens"])
        payload["return_token_ids"] = True  # the server says which prompt IDs it ran
        return path, payload

    def _parse(self, req, body, url):
        if isinstance(body, dict) and body.get("choices"):
            self.seen[req.request_id] = (
                list(body.get("prompt_token_ids") or []),
                list(body["choices"][0]["token_ids"]),
            )
        return super()._parse(req, body, url)

"""The gateway (``tmpl.gateway``): added latency, saturation, per-call CPU by history length, isolation.

    python benchmarks/gateway.py [--quick] [--sessions 16 256 1024] [--turns 4] [--pool session|shared]
                                 [--no-gc-freeze] [--parts 123] [--data ../shared/tokenizers]

Template: Qwen2.5 (``tmpl.ChatTemplate``), one tool (``get_weather``). A tool episode is a user
question (holding a marker unique to its session), then ``--turns`` calls: every call but the last is
answered by the canned Qwen2.5 tool call ``<tool_call>{"name": "get_weather", ...}</tool_call><|im_end|>``
and followed by a tool result; the last call is answered ``It is sunny.<|im_end|>``; logprobs -0.1 each.
The backend (``Canned``) is a ``tmpl.backends.base.Backend`` whose ``agenerate`` awaits
``asyncio.sleep(delay)`` and returns those IDs, so the engine costs nothing but its delay.

The server is uvicorn (one worker, ``access_log`` off, uvloop/httptools where installed, as
``uvicorn.run`` picks them) on 127.0.0.1, run on this process's event loop. The load generator is a
**separate process** (this script with ``--_client``) using ``httpx.AsyncClient``: by default one
client (``limits=httpx.Limits(max_connections=1)``) per session, as each agent holds its own SDK
client; ``--pool shared`` uses one client with ``max_connections=N`` instead, but httpcore 1.0's pool
scans every connection on each request and release (O(N) per request: at 128 connections its
``_assign_requests_to_connections`` took ~80% of the client's CPU, ~17 ms of client CPU per call
against ~1.5 ms with a client per session; encode/httpx#3215, encode/httpcore#1035), so with a
shared pool the figures measure httpx. Server
and client share this machine's cores (``os.cpu_count()`` is printed): every latency below includes
the client's own queueing whenever it is busy, and the client's CPU per call is printed beside the
server's. The server process holds what a gateway process holds (the tokenizer, transformers and
the torch it imports): a full (generation 2) garbage collection of that heap pauses the event loop
(the load tables count them and print the longest pause). As ``tmpl serve`` does, the server holds
``tmpl.rollout.collector.fewer_collections()`` once everything is loaded (the loaded heap frozen out of
every collection, young objects collected less often); ``--no-gc-freeze`` leaves the collector as it is.

1. Added latency (ms): each of N sessions runs one episode; sessions start spread over one backend
   delay (as independent agents would), then each sends its next call as soon as the last returns
   (no tool time). 16 sessions is the lightly loaded reference; the goal is read at 256.
   - ``gateway``: a call's latency seen by the client (POST to ``/s/{session}/v1/chat/completions``
     until the response is read) minus the backend's ``--delay``;
   - ``in-app``: inside the server, from the ASGI app's entry to its last body byte, minus the delay
     (the gateway's share without the HTTP server, the sockets and the client);
   - ``direct``: the same backend object awaited directly (``await backend.agenerate(...)``) by N
     concurrent tasks on the server's event loop, minus the delay (what the loop's timers add);
   - ``floor``: a bare FastAPI route on the same server and client that sleeps the delay and returns a
     canned response of the same shape (what uvicorn + FastAPI + httpx add with no gateway work);
   - ``net``: gateway minus direct, the figure the goal (p50 <= 2 ms, p99 <= 10 ms at 256 sessions)
     is read against; ``gw/floor``: how much of the added time the HTTP stack alone accounts for.
   The offered load is N / delay calls per second: compare it with part 2's ceiling. Past it the
   closed loop queues (calls wait for the server's core, and for the client's), so the added time
   then measures the ceiling, not what one call costs.
2. Saturation: calls per second through the gateway with an instant backend (no sleep) and
   ``--clients`` concurrent episodes for ``--duration`` seconds, beside the floor route's rate under the
   same client; server and client CPU per call; ``1 / server CPU per call`` is the rate one core
   could serve if the client cost nothing.
3. Per-call CPU by history length, in-process (no HTTP): episodes whose prompt reaches about
   ``--history`` tokens at turn 1, 10 and 50 (``--reach``; tool results sized to get there; the turn-1
   episode's user message holds the history, then 4 turns with 100-token results). ``tmpl``:
   ``time.process_time`` around ``Gateway.complete`` minus the backend's own CPU; ``render``: what
   vLLM's ``/v1/chat/completions`` does on every call, ``tokenizer.apply_chat_template(messages,
   tools=..., add_generation_prompt=True, tokenize=True)`` of the whole history, timed right after each
   call on the same messages; ``parse``: ``json.loads`` + the OpenAI dialect's ``parse`` of the request
   body, which the HTTP path adds to ``tmpl`` (not in the ratio). Best of ``--reps`` episodes per turn.
   The goal: ``tmpl`` flat in history length and below ``render`` from turn 2 on. ``prompts = full
   render`` says whether every prompt the gateway built equals the full render's IDs.
4. Isolation: after part 1, every session's episode (``gateway.episode(key)``) is decoded and must
   hold its own marker and no other; calls per episode, sequences, and trained tokens (mask sum) are
   checked, and ``GET /s/{key}/episode`` is compared with the in-process episode for a sample of keys.

5. Against vLLM's own preprocessing (``--parts 5``, with ``--vllm-url URL`` of a running vLLM server of
   a Qwen2.5-template model, or ``--vllm-model FOLDER`` to start one here, e.g.
   ``../shared/models/qwen2.5-instruct-tools``; needs vLLM): the histories of part 3, sent over HTTP by
   one client, one call at a time, best of ``--reps`` per turn, wall milliseconds: ``gateway``, a
   chat completion through the gateway (an instant backend: what a call costs before the engine, the
   HTTP layer and the JSON body included); ``vllm``, vLLM's ``POST /tokenize`` of the same
   ``messages`` and ``tools`` with ``add_generation_prompt``, the chat-template render and
   tokenization its ``/v1/chat/completions`` runs on every call before the engine (also over HTTP, the
   same JSON body). Both prompts are compared (``same IDs``).

Default run: about a minute on 2 cores. ``--quick``: 32 and 128 sessions, 3 turns, 1.5 s saturation,
2,000-token histories reached at turns 1, 5 and 10, 2 repetitions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
ANSWER_TEXT = "It is sunny.<|im_end|>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city."}},
                "required": ["city"],
            },
        },
    }
]
RESULT = '{"city": "Paris", "temperature_c": 21.5, "conditions": "sunny"}'
MARKER = re.compile(r"\[sid:([^\]\s]+)\]")


def marker(key: str) -> str:
    return f"[sid:{key}]"


def question(key: str) -> str:
    return f"What is the weather in Paris? {marker(key)}"


def pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))]


# ---------------------------------------------------------------------------------------------
# the load generator (a separate process: only httpx, no tokenizer)
# ---------------------------------------------------------------------------------------------
async def _episode(
    client, key: str, turns: int, lat: list[float], modes: Counter, results: list[str] | None = None
) -> bool:
    """One tool episode over HTTP; True when it ended with the answer at the last turn. ``results``: the
    tool result of each turn (made unique to the session), else the short canned one."""
    messages: list[dict] = [{"role": "user", "content": question(key)}]
    for turn in range(1, turns + 1):
        body = {"model": "qwen", "messages": messages, "tools": TOOLS, "max_tokens": 64}
        start = time.perf_counter()
        r = await client.post(f"/s/{key}/v1/chat/completions", json=body)
        data = r.json()
        elapsed = time.perf_counter() - start
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        lat.append(elapsed)
        modes[(data.get("tmpl") or {}).get("prompt", "-")] += 1
        msg = data["choices"][0]["message"]
        calls = msg.get("tool_calls")
        if not calls:
            return turn == turns and "sunny" in (msg.get("content") or "")
        result = RESULT if results is None else f"[{key} turn {turn}] {results[turn - 1]}"
        messages = [*messages, msg, {"role": "tool", "tool_call_id": calls[0]["id"], "content": result}]
    return False


async def _client(cfg: dict) -> dict:
    import ssl

    import httpx

    n = cfg["connections"]
    lat: list[float] = []
    modes: Counter = Counter()
    errors: list[str] = []
    ok = bad = 0
    timeout = httpx.Timeout(cfg["timeout"])
    tls = ssl.create_default_context()  # built once: each client would load the CA bundle (~30 ms) otherwise
    if cfg["pool"] == "shared":  # one client, one pool of n connections
        shared = httpx.AsyncClient(
            base_url=cfg["url"],
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
            timeout=timeout,
            verify=tls,
        )
        clients = [shared] * n
    else:  # one client (one connection) per session or worker, as each agent holds its own SDK client
        clients = [
            httpx.AsyncClient(
                base_url=cfg["url"],
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                timeout=timeout,
                verify=tls,
            )
            for _ in range(n)
        ]

    async def one(client, key: str) -> None:
        nonlocal ok, bad
        try:
            good = await _episode(client, key, cfg["turns"], lat, modes, cfg.get("results"))
        except Exception as exc:  # noqa: BLE001 - counted and reported
            bad += 1
            if len(errors) < 5:
                errors.append(f"{key}: {type(exc).__name__}: {exc}"[:300])
            return
        ok += good
        bad += not good

    cpu0, start = time.process_time(), time.perf_counter()
    if cfg["mode"] == "sessions":  # N sessions, one episode each, starts spread over `stagger` s

        async def staggered(i: int) -> None:
            await asyncio.sleep(cfg["stagger"] * i / n)
            await one(clients[i], f"{cfg['tag']}-{i:05d}")

        await asyncio.gather(*(staggered(i) for i in range(n)))
    else:  # `n` workers, episode after episode, until the deadline
        deadline = start + cfg["duration"]

        async def worker(w: int) -> None:
            e = 0
            while time.perf_counter() < deadline:
                await one(clients[w], f"{cfg['tag']}-{w:03d}-{e:05d}")
                e += 1

        await asyncio.gather(*(worker(w) for w in range(n)))
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    for client in set(clients):
        await client.aclose()
    return {"lat": lat, "modes": dict(modes), "ok": ok, "bad": bad, "errors": errors, "wall": wall, "cpu": cpu}


def client_main(cfg_json: str) -> None:
    cfg = json.loads(cfg_json)
    if cfg.get("cpu") is not None:  # --pin: the load generator on its own core
        os.sched_setaffinity(0, {cfg["cpu"]})
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop) if cfg.get("uvloop") else asyncio.Runner()
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        out = runner.run(_client(cfg))
    print(json.dumps(out))


async def run_client(cfg: dict, timeout: float) -> dict:
    """Run the load generator in its own process; its result (latencies, CPU, errors)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).resolve()),
        "--_client",
        json.dumps(cfg),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"the load generator ran past {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"the load generator failed ({proc.returncode}): {err.decode()[-800:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# the backend, the apps, the server
# ---------------------------------------------------------------------------------------------
def make_backend_class():
    from tmpl.backends.base import Backend, GenerationResult

    class Canned(Backend):
        """Sleeps ``delay`` (none at 0), then returns the tool call until the session's last turn, then the answer."""

        def __init__(self, call_ids: list[int], answer_ids: list[int], turns: int, delay: float) -> None:
            self.call_ids, self.answer_ids, self.turns, self.delay = call_ids, answer_ids, turns, delay
            self.seen: dict[str, int] = {}
            self.cpu = 0.0  # process time spent in agenerate itself (not its sleep)

        async def agenerate(self, request):
            if self.delay:
                await asyncio.sleep(self.delay)
            t = time.process_time()
            n = self.seen.get(request.sample, 0) + 1
            self.seen[request.sample] = n
            ids = self.call_ids if n < self.turns else self.answer_ids
            result = GenerationResult(request.request_id, list(ids), [-0.1] * len(ids), "stop")
            self.cpu += time.process_time() - t
            return result

    return Canned


class GcPauses:
    """Pauses of the server process's full (generation 2) garbage collections, in seconds (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._start: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            if info.get("generation") == 2:
                self.pauses.append(time.perf_counter() - self._start)
            self._start = None


GC = GcPauses()


def gc_text(pauses: list[float]) -> str:
    return f"{len(pauses)} x {max(pauses) * 1e3:.0f} ms" if pauses else "none"


class Timed:
    """ASGI middleware: each HTTP request's time inside the app (entry to last body byte), in seconds."""

    def __init__(self, app) -> None:
        self.app = app
        self.times: list[float] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed_send(message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.times.append(time.perf_counter() - start)

        await self.app(scope, receive, timed_send)


def floor_app(delay: float, turns: int):
    """A bare FastAPI route at the gateway's path: reads the JSON body, sleeps ``delay``, answers a canned
    chat.completion of the gateway's shape (the tool call until the last turn, then the answer)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    def body(message: dict, finish: str) -> dict:
        return {
            "id": "chatcmpl-floor",
            "object": "chat.completion",
            "created": 0,
            "model": "qwen",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 200, "completion_tokens": 24, "total_tokens": 224},
            "tmpl": {"session": "s", "calls": ["c"], "sequences": [0], "prompt": "floor", "prompt_tokens_encoded": 0},
        }

    call = body(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_floor",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        "tool_calls",
    )
    answer = body({"role": "assistant", "content": "It is sunny."}, "stop")
    app = FastAPI(docs_url=None, redoc_url=None)

    async def chat(session, request):
        data = await request.json()
        if delay:
            await asyncio.sleep(delay)
        n = sum(m.get("role") == "assistant" for m in data["messages"]) + 1
        return JSONResponse(call if n < turns else answer, headers={"x-tmpl-session": session})

    # real classes, not the strings `from __future__ import annotations` leaves (FastAPI reads them)
    chat.__annotations__ = {"session": str, "request": Request}
    app.post("/s/{session}/v1/chat/completions")(chat)
    return app


@contextlib.asynccontextmanager
async def serving(app):
    """uvicorn serving ``app`` on 127.0.0.1 (a free port) on this event loop; yields its URL."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", backlog=4096, timeout_keep_alive=60
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(1000):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if not server.started:
        task.cancel()
        raise RuntimeError("uvicorn did not start in 10 s")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(task, 15)
        sock.close()


# ---------------------------------------------------------------------------------------------
# part 1: added latency; part 4: isolation
# ---------------------------------------------------------------------------------------------
async def direct(backend, prompt: list[int], stop, sessions: int, turns: int, delay: float) -> list[float]:
    """Latency minus the delay of the backend awaited directly: ``sessions`` tasks, ``turns`` calls each."""
    from tmpl.backends.base import GenerationRequest

    added: list[float] = []

    async def session(i: int) -> None:
        await asyncio.sleep(delay * i / sessions)
        for t in range(turns):
            request = GenerationRequest(f"direct-{i}-{t}", prompt, 64, stop, sample=f"direct-{sessions}-{i}")
            start = time.perf_counter()
            await backend.agenerate(request)
            added.append(time.perf_counter() - start - delay)

    await asyncio.gather(*(session(i) for i in range(sessions)))
    return added


async def through_http(app, cfg: dict, timeout: float, warm: dict | None = None, watch=None, profile=None):
    """Serve ``app`` (wrapped in :class:`Timed`), warm it up, run the load generator; (client result,
    in-app times, server CPU seconds, and the URL's episodes fetched by ``fetch`` while it is up).
    ``watch``: a :class:`tmpl.gateway.loopwatch.LoopWatch` measuring the loop over the run (not the
    warm-up); ``profile``: a ``cProfile.Profile`` enabled over the run."""
    timed = Timed(app)
    async with serving(timed) as url:
        if warm:
            await run_client({**cfg, **warm, "url": url}, timeout)
        timed.times.clear()
        if watch is not None:
            watch.reset()
            watch.start()
        if profile is not None:
            profile.enable()
        gc0, cpu0 = len(GC.pauses), time.process_time()
        result = await run_client({**cfg, "url": url}, timeout)
        cpu = time.process_time() - cpu0
        if profile is not None:
            profile.disable()
        if watch is not None:
            watch.stop()
        result["gc"] = GC.pauses[gc0:]
        fetched = {}
        if cfg.get("fetch"):
            import httpx

            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                for key in cfg["fetch"]:
                    r = await client.get(f"/s/{key}/episode")
                    fetched[key] = r.json() if r.status_code == 200 else {"status": r.status_code}
    return result, list(timed.times), cpu, fetched


def ms(x: float) -> str:
    return f"{x * 1e3:8.2f}"


async def part1(ctx, args) -> list[tuple]:
    from tmpl.gateway import Gateway, create_app

    Canned = ctx["Canned"]
    delay, turns = args.delay, args.turns
    print(f"\n1. added latency, ms (latency minus the backend's {delay * 1e3:.0f} ms; {turns} calls per session;")
    print(
        f"   load generator: a separate process on the same cores, httpx, "
        f"{'one client per session' if args.pool == 'session' else 'one shared client, max_connections=N'})"
    )
    head = (
        f"{'sessions':>8s} {'calls':>6s} | {'gateway p50':>11s} {'p99':>8s} | {'in-app p50':>10s} {'p99':>8s} | "
        f"{'direct p50':>10s} {'p99':>8s} | {'floor p50':>9s} {'p99':>8s} | {'net p50':>8s} {'p99':>8s} | "
        f"{'gw/floor p50':>12s} | goal (256: p50<=2, p99<=10)"
    )
    rows, load_rows, kept, store_rows = [], [], [], []
    for n in args.sessions:
        backend = Canned(ctx["call_ids"], ctx["answer_ids"], turns, delay)
        gateway = Gateway(ctx["tpl"], backend)
        d_added = await direct(backend, ctx["prompt"], ctx["tpl"].stop_token_ids, n, turns, delay)
        tag = f"p1n{n}"
        keys = [f"{tag}-{i:05d}" for i in range(n)]
        step = max(1, n // 8)
        cfg = {
            "mode": "sessions",
            "connections": n,
            "turns": turns,
            "stagger": delay,
            "tag": tag,
            "timeout": args.timeout,
            "uvloop": ctx["uvloop"],
            "pool": args.pool,
            "fetch": keys[::step][:8],
        }
        warm = {"connections": 8, "tag": f"warm{n}", "fetch": []}
        gw, gw_app, gw_cpu, fetched = await through_http(create_app(gateway), cfg, args.timeout, warm)
        fl, fl_app, fl_cpu, _ = await through_http(
            floor_app(delay, turns), {**cfg, "tag": f"floor{n}", "fetch": []}, args.timeout, warm
        )
        kept.append((n, gateway, keys, gw, fetched))
        if args.store:  # the same load on a gateway with the durable store (a fresh file): CPU per call beside
            import tempfile

            folder = tempfile.mkdtemp(prefix="tmpl-bench-store-")
            durable = Gateway(
                ctx["tpl"], Canned(ctx["call_ids"], ctx["answer_ids"], turns, delay), store=f"{folder}/gw.db"
            )
            st, st_app, st_cpu, _ = await through_http(
                create_app(durable), {**cfg, "tag": f"store{n}", "fetch": []}, args.timeout, warm
            )
            s_added = [x - delay for x in st["lat"]]
            scalls = max(len(st["lat"]), 1)
            log = durable.durable.log
            store_rows.append(
                f"{n:8d} {len(st['lat']):6d} | {ms(pct(s_added, 50)):>11s} {ms(pct(s_added, 99))} | "
                f"{ms(pct(s_added, 50) - pct(d_added, 50))} {ms(pct(s_added, 99) - pct(d_added, 99))} | "
                f"{st_cpu / scalls * 1e3:8.3f} {gw_cpu / max(len(gw['lat']), 1) * 1e3:8.3f} "
                f"{(st_cpu / scalls) / (gw_cpu / max(len(gw['lat']), 1)):6.2f}x | "
                f"{log.rows / max(log.commits, 1):6.1f} {log.size() / 2**20:7.1f} | {st['ok']:5d}/{n:<5d} {st['bad']:4d}"
            )
            durable.close()
        g_added = [x - delay for x in gw["lat"]]
        a_added = [x - delay for x in gw_app]
        f_added = [x - delay for x in fl["lat"]]
        g50, g99 = pct(g_added, 50), pct(g_added, 99)
        d50, d99 = pct(d_added, 50), pct(d_added, 99)
        net50, net99 = g50 - d50, g99 - d99
        goal = ""
        if n == 256:
            goal = f"p50 {'met' if net50 <= 0.002 else 'MISSED'}, p99 {'met' if net99 <= 0.010 else 'MISSED'}"
        rows.append(
            f"{n:8d} {len(gw['lat']):6d} | {ms(g50):>11s} {ms(g99)} | {ms(pct(a_added, 50)):>10s} {ms(pct(a_added, 99))} | "
            f"{ms(d50):>10s} {ms(d99)} | {ms(pct(f_added, 50)):>9s} {ms(pct(f_added, 99))} | {ms(net50)} {ms(net99)} | "
            f"{g50 / pct(f_added, 50):11.2f}x | {goal}"
        )
        calls = max(len(gw["lat"]), 1)
        fcalls = max(len(fl["lat"]), 1)
        rate = calls / gw["wall"]
        load_rows.append(
            f"{n:8d} {n / delay:9.0f} {rate:9.0f} {fcalls / fl['wall']:9.0f} | "
            f"{gw_cpu / calls * 1e3:8.3f} {gw['cpu'] / calls * 1e3:8.3f} {(gw_cpu + gw['cpu']) / gw['wall']:6.2f} | "
            f"{fl_cpu / fcalls * 1e3:8.3f} {fl['cpu'] / fcalls * 1e3:8.3f} | "
            f"{gw['ok']:5d}/{n:<5d} {gw['bad']:4d} {fl['bad']:4d} | {gc_text(gw['gc']):>12s} {gc_text(fl['gc']):>12s} | "
            f"{gw['modes']}"
        )
        for e in gw["errors"] + fl["errors"]:
            print(f"   error: {e}")
    print(head)
    print("\n".join(rows))
    print("\n   load: offered = sessions / delay; rates achieved (calls/s); CPU ms per call (server process, client")
    print("   process) and cores busy (both processes); episodes ok / sessions, failed episodes (gateway, floor).")
    print("   rates are calls / wall of the whole run (ramp and tail included: short runs read low); gc: the server")
    print("   process's full collections during the run (count x longest pause), gateway and floor")
    print(
        f"{'sessions':>8s} {'offered':>9s} {'gateway':>9s} {'floor':>9s} | {'srv cpu':>8s} {'cli cpu':>8s} {'cores':>6s} | "
        f"{'floor srv':>8s} {'cli':>8s} | {'ok':>11s} {'fail':>4s} {'fl':>4s} | {'gc gateway':>12s} {'gc floor':>12s} | "
        "prompts (gateway)"
    )
    print("\n".join(load_rows))
    if store_rows:
        print("\n   durable store (--store): the same sessions on a gateway keeping every call in SQLite (WAL, group")
        print("   commit) before answering; net = gateway+store minus direct; srv cpu ms per call with the store and")
        print("   without (the gateway row above, same run), their ratio (goal: at most 1.20x); rows per commit; MiB")
        print(
            f"{'sessions':>8s} {'calls':>6s} | {'store p50':>11s} {'p99':>8s} | {'net p50':>8s} {'p99':>8s} | "
            f"{'cpu store':>8s} {'cpu off':>8s} {'ratio':>7s} | {'rows/c':>6s} {'MiB':>7s} | {'ok':>11s} {'fail':>4s}"
        )
        print("\n".join(store_rows))
    return kept


def part4(ctx, kept, turns: int) -> None:
    print("\n4. isolation: each session's episode decoded; only its own marker may appear")
    tok = ctx["tok"]
    sampled = (turns - 1) * len(ctx["call_ids"]) + len(ctx["answer_ids"])
    print(
        f"{'sessions':>8s} {'checked':>8s} {'own marker':>10s} {'foreign':>8s} {'calls ok':>9s} {'1 sequence':>10s} "
        f"{'mask=sampled':>12s} {'HTTP = in-process':>18s}"
    )
    for n, gateway, keys, _gw, fetched in kept:
        checked = own = foreign = calls_ok = one_seq = mask_ok = 0
        leaks = []
        for key in keys:
            try:
                session = gateway.session(key)
            except Exception:  # noqa: BLE001 - a session the run never opened (a failed episode)
                continue
            checked += 1
            episode = session.episode
            seen = set()
            for s in episode.sequences:
                seen.update(MARKER.findall(tok.decode(s.ids.tolist())))
            own += key in seen
            others = seen - {key}
            foreign += bool(others)
            if others and len(leaks) < 3:
                leaks.append(f"{key} holds {sorted(others)[:3]}")
            calls_ok += session.calls == turns
            one_seq += len(episode.sequences) == 1
            mask_ok += sum(int(s.mask.sum()) for s in episode.sequences) == sampled
        same = sum(
            [s.ids.tolist() for s in gateway.episode(k).sequences] == [s["ids"] for s in body.get("sequences", [None])]
            for k, body in fetched.items()
        )
        print(
            f"{n:8d} {checked:8d} {own:10d} {foreign:8d} {calls_ok:9d} {one_seq:10d} {mask_ok:12d} "
            f"{f'{same} of {len(fetched)}':>18s}"
        )
        for leak in leaks:
            print(f"   LEAK: {leak}")
    print("   (checked: sessions open in the gateway; foreign: sessions whose tokens hold another session's marker)")


# ---------------------------------------------------------------------------------------------
# part a: agent-scale load (long histories, the durable store on, against the bare route)
# ---------------------------------------------------------------------------------------------
def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


async def part_agents(ctx, args) -> None:
    """Agent-scale load (issue #52): ``--sessions`` agents, ``--turns`` calls each, tool results sized
    so the history grows to ``--grow`` tokens by the last call, the backend answering after ``--delay``;
    the gateway with the durable store against the bare route, same client, one after the other."""
    import cProfile
    import pstats
    import tempfile

    from tmpl.gateway import Gateway, create_app
    from tmpl.gateway.loopwatch import LoopWatch

    tok, Canned, delay, turns = ctx["tok"], ctx["Canned"], args.delay, args.turns
    per_turn = 45  # the assistant's call and the tool turn's wrapping, tokens
    result_tokens = max((args.grow - len(ctx["prompt"])) // (turns - 1) - per_turn, 16)
    results = [text_of(tok, result_tokens, t) for t in range(turns - 1)]
    print(
        f"\na. agent-scale load: {turns} calls per session, tool results of ~{result_tokens} tokens (histories "
        f"to ~{args.grow} tokens), backend delay {delay * 1e3:.0f} ms, durable store on; load generator: one "
        f"httpx client per session{', pinned: server core 0, client core 1' if args.pin else ''}"
    )
    print("   added = latency minus the delay; net = gateway added minus the bare route's, same percentile")
    head = (
        f"{'sessions':>8s} {'calls':>6s} | {'gw p50':>7s} {'p99':>7s} | {'bare p50':>8s} {'p99':>7s} | "
        f"{'net p50':>7s} {'p99':>7s} | {'cpu gw':>6s} {'bare':>6s} {'ratio':>5s} | {'cli cpu':>7s} | "
        f"{'gc gw':>10s} {'gc bare':>10s} | {'loop gw max':>11s} {'>10ms':>5s} {'bare max':>8s} {'>10ms':>5s} | "
        f"{'prompt':>6s} {'ok':>9s} | load"
    )
    notes = []
    watch = LoopWatch(every=0.005, threshold=0.010)
    print(head, flush=True)
    for n in args.sessions:
        cfg = {
            "mode": "sessions",
            "connections": n,
            "turns": turns,
            "stagger": delay,
            "timeout": args.timeout,
            "uvloop": ctx["uvloop"],
            "pool": "session",
            "fetch": [],
            "results": results,
            "cpu": 1 if args.pin else None,
        }
        warm = {"connections": 8, "turns": 2, "tag": f"awarm{n}", "results": None}
        load0 = loadavg()
        folder = tempfile.mkdtemp(prefix="tmpl-bench-agents-")
        backend = Canned(ctx["call_ids"], ctx["answer_ids"], turns, delay)
        gateway = Gateway(ctx["tpl"], backend, store=f"{folder}/gw.db", max_context=4 * args.grow + 8192)
        profile = cProfile.Profile(time.process_time) if args.profile else None
        try:
            fl, _, fl_cpu, _ = await through_http(
                floor_app(delay, turns), {**cfg, "tag": f"abare{n}"}, args.timeout, warm, watch
            )
            fl_loop = (watch.longest, watch.over)
            gw, _, gw_cpu, _ = await through_http(
                create_app(gateway), {**cfg, "tag": f"agw{n}"}, args.timeout, warm, watch, profile
            )
        except RuntimeError as exc:  # the closed loop did not end within --timeout: the server saturated
            gateway.close()
            print(f"{n:8d}: not finished: {exc} (load {load0} -> {loadavg()}); raise --timeout", flush=True)
            continue
        gw_loop = (watch.longest, watch.over)
        try:
            prompt = len(gateway.session(f"agw{n}-00000").episode.calls[-1].prompt_ids)
        except Exception:  # noqa: BLE001 - the session failed: shown as 0
            prompt = 0
        gateway.close()
        g_added = [x - delay for x in gw["lat"]]
        f_added = [x - delay for x in fl["lat"]]
        g50, g99, f50, f99 = pct(g_added, 50), pct(g_added, 99), pct(f_added, 50), pct(f_added, 99)
        calls, fcalls = max(len(gw["lat"]), 1), max(len(fl["lat"]), 1)
        cg, cf = gw_cpu / calls, fl_cpu / fcalls
        print(
            f"{n:8d} {len(gw['lat']):6d} | {g50 * 1e3:7.2f} {g99 * 1e3:7.2f} | {f50 * 1e3:8.2f} {f99 * 1e3:7.2f} | "
            f"{(g50 - f50) * 1e3:7.2f} {(g99 - f99) * 1e3:7.2f} | {cg * 1e3:6.2f} {cf * 1e3:6.2f} {cg / cf:5.2f} | "
            f"{gw['cpu'] / calls * 1e3:7.2f} | {gc_text(gw['gc']):>10s} {gc_text(fl['gc']):>10s} | "
            f"{gw_loop[0] * 1e3:9.1f}ms {gw_loop[1]:5d} {fl_loop[0] * 1e3:6.1f}ms {fl_loop[1]:5d} | "
            f"{prompt:6d} {gw['ok']:4d}/{n:<4d} | {load0} -> {loadavg()}",
            flush=True,
        )
        goals = [
            f"net p50 {(g50 - f50) * 1e3:.2f} ms {'met' if g50 - f50 <= 0.002 else 'MISSED'} (<= 2)",
            f"net p99 {(g99 - f99) * 1e3:.2f} ms {'met' if g99 - f99 <= 0.010 else 'MISSED'} (<= 10)",
            f"loop pauses > 10 ms: {gw_loop[1]} {'met' if gw_loop[1] == 0 else 'MISSED'} (none)",
            f"CPU per call {cg / cf:.2f}x the bare route's {'met' if cg / cf <= 1.5 else 'MISSED'} (<= 1.5x)",
        ]
        notes.append(f"{n:8d}: " + "; ".join(goals))
        for e in gw["errors"] + fl["errors"]:
            notes.append(f"   error: {e}")
        if profile is not None:
            out = f"{args.profile}.{n}"
            profile.dump_stats(out)
            print(f"   (profile of the gateway run at {n} sessions: {out}; top by own time:)")
            pstats.Stats(out).sort_stats("tottime").print_stats(18)
    print("   goals (issue #52):")
    print("\n".join(notes))
    print(
        "   cpu: server CPU ms per call (gateway + store, bare route); cli cpu: the load generator's ms per call;"
        " gc: full collections in the server (count x longest); loop: the server loop's longest pause and pauses"
        " over 10 ms (tmpl.gateway.loopwatch); prompt: the last call's prompt tokens of one session; load:"
        " /proc/loadavg before -> after"
    )


# ---------------------------------------------------------------------------------------------
# part 2: saturation
# ---------------------------------------------------------------------------------------------
async def part2(ctx, args) -> None:
    from tmpl.gateway import Gateway, create_app

    Canned = ctx["Canned"]
    print(
        f"\n2. saturation: instant backend, {args.clients} concurrent clients, {args.turns}-call episodes, "
        f"{args.duration:g} s, one uvicorn worker"
    )
    cfg = {
        "mode": "duration",
        "connections": args.clients,
        "turns": args.turns,
        "duration": args.duration,
        "tag": "sat",
        "timeout": args.timeout,
        "uvloop": ctx["uvloop"],
        "pool": args.pool,
        "fetch": [],
    }
    warm = {"mode": "sessions", "connections": 8, "stagger": 0.0, "tag": "satwarm"}
    out = {}
    for label, app in (
        ("gateway", create_app(Gateway(ctx["tpl"], Canned(ctx["call_ids"], ctx["answer_ids"], args.turns, 0.0)))),
        ("floor", floor_app(0.0, args.turns)),
    ):
        result, _, cpu, _ = await through_http(app, {**cfg, "tag": f"sat{label}"}, args.timeout, warm)
        calls = max(len(result["lat"]), 1)
        out[label] = (calls / result["wall"], cpu / calls, result["cpu"] / calls, result, cpu)
    print(
        f"{'':8s} {'calls/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'srv cpu ms':>10s} {'cli cpu ms':>10s} "
        f"{'srv cores':>9s} {'cli cores':>9s} {'1/srv cpu':>10s} {'failed':>6s} {'gc':>12s}"
    )
    for label, (rate, srv, cli, result, cpu) in out.items():
        print(
            f"{label:8s} {rate:9.0f} {ms(pct(result['lat'], 50))} {ms(pct(result['lat'], 99))} {srv * 1e3:10.3f} "
            f"{cli * 1e3:10.3f} {cpu / result['wall']:9.2f} {result['cpu'] / result['wall']:9.2f} {1 / srv:10.0f} "
            f"{result['bad']:6d} {gc_text(result['gc']):>12s}"
        )
        for e in result["errors"]:
            print(f"   error: {e}")
    g, f = out["gateway"], out["floor"]
    print(
        f"ratios: gateway/floor calls/s {g[0] / f[0]:.2f}x; server CPU per call gateway/floor {g[1] / f[1]:.2f}x "
        f"(gateway's own share ~{(g[1] - f[1]) * 1e3:.3f} ms per call); offered load at 256 sessions "
        f"{256 / args.delay:.0f} calls/s = {256 / args.delay / g[0]:.2f}x the gateway's rate here"
    )


# ---------------------------------------------------------------------------------------------
# part 3: per-call CPU by history length
# ---------------------------------------------------------------------------------------------
def text_of(tok, tokens: int, salt: int) -> str:
    """About ``tokens`` tokens of varied tool output."""
    lines = [
        f"station {salt}-{i}: {20 + (i * 7 + salt) % 13}.{i % 10} C, wind {(i * 3) % 29} km/h, "
        f"humidity {40 + (i * 11) % 50}%, {['sunny', 'cloudy', 'rain', 'fog'][i % 4]}"
        for i in range(tokens // 12 + 8)
    ]
    ids = tok.encode("\n".join(lines), add_special_tokens=False)
    return tok.decode(ids[: max(tokens, 1)]).rstrip()


async def part3(ctx, args) -> None:
    from tmpl.gateway import CallParams, Gateway
    from tmpl.gateway.dialects import openai_chat

    tok, tpl, Canned = ctx["tok"], ctx["tpl"], ctx["Canned"]

    def render(messages):
        return list(
            tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)
        )

    base = len(render([{"role": "user", "content": question("p3-x")}]))
    per_turn = 45  # the call (24 IDs) and a tool result's wrapping, about
    print(
        f"\n3. per-call CPU by history length, microseconds (in-process, best of {args.reps}); "
        f"histories of ~{args.history} tokens reached at turn {', '.join(map(str, args.reach))}"
    )
    print(
        f"{'reach':>5s} {'turn':>4s} {'prompt':>7s} {'mode':>6s} {'encoded':>7s} | {'tmpl':>9s} {'render':>9s} "
        f"{'render/tmpl':>11s} | {'parse':>8s}"
    )
    summary = []
    for reach in args.reach:
        if reach == 1:
            turns, result_tokens = 5, 100
            user_tokens = max(args.history - base, 16)
        else:
            turns = reach
            user_tokens = 0
            result_tokens = max((args.history - base - (reach - 1) * per_turn) // (reach - 1), 16)
        backend = Canned(ctx["call_ids"], ctx["answer_ids"], turns, 0.0)
        gateway = Gateway(tpl, backend, max_context=4 * args.history + 32_768)
        best_tmpl = [float("inf")] * turns
        best_render = [float("inf")] * turns
        best_parse = [float("inf")] * turns
        info: list[tuple[int, str, int]] = [(0, "", 0)] * turns
        equal = True
        results = [text_of(tok, result_tokens, t) for t in range(turns)]
        for rep in range(args.reps):
            key = f"p3-{reach}-{rep}"
            content = question(key) + ("\n" + text_of(tok, user_tokens, 999) if user_tokens else "")
            messages = [{"role": "user", "content": content}]
            for t in range(turns):
                b0, c0 = backend.cpu, time.process_time()
                done = await gateway.complete(key, messages, TOOLS, CallParams())
                spent = time.process_time() - c0 - (backend.cpu - b0)
                c1 = time.process_time()
                ids = render(messages)
                rendered = time.process_time() - c1
                raw = json.dumps({"model": "qwen", "messages": messages, "tools": TOOLS}).encode()
                c2 = time.process_time()
                openai_chat.parse(json.loads(raw))
                parsed = time.process_time() - c2
                best_tmpl[t] = min(best_tmpl[t], spent)
                best_render[t] = min(best_render[t], rendered)
                best_parse[t] = min(best_parse[t], parsed)
                info[t] = (len(done.plan.prompt_ids), done.plan.mode, done.plan.encoded)
                equal &= list(done.plan.prompt_ids) == ids
                reply = done.replies[0].message
                if t + 1 < turns:
                    call_id = reply["tool_calls"][0]["id"]
                    messages = [*messages, reply, {"role": "tool", "tool_call_id": call_id, "content": results[t]}]
        shown = sorted({1, 2, 3, turns // 2, turns - 1, turns} & set(range(1, turns + 1)))
        for t in shown:
            n, mode, enc = info[t - 1]
            tm, rd = best_tmpl[t - 1] * 1e6, best_render[t - 1] * 1e6
            print(
                f"{reach:5d} {t:4d} {n:7d} {mode:>6s} {enc:7d} | {tm:9.0f} {rd:9.0f} {rd / tm:10.1f}x | "
                f"{best_parse[t - 1] * 1e6:8.0f}"
            )
        later_t = best_tmpl[1:] or [float("nan")]
        later_r = best_render[1:] or [float("nan")]
        summary.append(
            f"reach {reach:3d}: result ~{result_tokens} tokens; turns 2-{turns}: tmpl mean "
            f"{sum(later_t) / len(later_t) * 1e6:.0f} us vs render {sum(later_r) / len(later_r) * 1e6:.0f} us "
            f"({sum(later_r) / sum(later_t):.1f}x); tmpl turn {turns} / turn 2 = "
            f"{best_tmpl[-1] / best_tmpl[1]:.2f}x (render {best_render[-1] / best_render[1]:.2f}x); "
            f"below render at every turn >= 2: {all(a < b for a, b in zip(later_t, later_r))}; "
            f"prompts = full render: {equal}"
        )
        print(f"{'':5s} ----")
    print("\n".join(summary))


async def part5(ctx, args) -> None:
    import httpx

    from tmpl.gateway import Gateway, create_app

    tok, tpl, Canned = ctx["tok"], ctx["tpl"], ctx["Canned"]
    with contextlib.ExitStack() as stack:
        url = args.vllm_url or stack.enter_context(vllm_server(args.vllm_model))
        async with httpx.AsyncClient(timeout=120) as client:
            model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
            print(
                f"\n5. per call over HTTP, ms (one client, one call at a time, best of {args.reps}): the gateway "
                f"(instant backend) vs vLLM's own render + tokenize (POST /tokenize of the same messages; {url})"
            )
            print(
                f"{'reach':>5s} {'turn':>4s} {'prompt':>7s} | {'gateway':>8s} {'vllm':>8s} {'vllm/gw':>8s} | same IDs"
            )
            base = len(tok.apply_chat_template([{"role": "user", "content": question("p5-x")}], tools=TOOLS,
                                               add_generation_prompt=True, tokenize=True, return_dict=False))  # fmt: skip
            per_turn = 45
            summary = []
            for reach in args.reach:
                if reach == 1:
                    turns, result_tokens, user_tokens = 5, 100, max(args.history - base, 16)
                else:
                    turns, user_tokens = reach, 0
                    result_tokens = max((args.history - base - (reach - 1) * per_turn) // (reach - 1), 16)
                backend = Canned(ctx["call_ids"], ctx["answer_ids"], turns, 0.0)
                gateway = Gateway(tpl, backend, max_context=4 * args.history + 32_768, max_tokens=64)
                best_gw, best_vl = [float("inf")] * turns, [float("inf")] * turns
                sizes, same = [0] * turns, True
                results = [text_of(tok, result_tokens, t) for t in range(turns)]
                async with serving(create_app(gateway)) as gw_url:
                    for rep in range(args.reps):
                        key = f"p5-{reach}-{rep}"
                        content = question(key) + ("\n" + text_of(tok, user_tokens, 999) if user_tokens else "")
                        messages: list[dict] = [{"role": "user", "content": content}]
                        for t in range(turns):
                            body = {"model": "m", "messages": messages, "tools": TOOLS}
                            t0 = time.perf_counter()
                            r = await client.post(f"{gw_url}/s/{key}/v1/chat/completions", json=body)
                            t1 = time.perf_counter()
                            tokenized = await client.post(
                                f"{url}/tokenize",
                                json={
                                    "model": model,
                                    "messages": messages,
                                    "tools": TOOLS,
                                    "add_generation_prompt": True,
                                },
                            )
                            t2 = time.perf_counter()
                            r.raise_for_status()
                            tokenized.raise_for_status()
                            best_gw[t] = min(best_gw[t], t1 - t0)
                            best_vl[t] = min(best_vl[t], t2 - t1)
                            prompt = gateway.episode(key).calls[-1].prompt_ids.tolist()
                            sizes[t] = len(prompt)
                            same &= prompt == tokenized.json()["tokens"]
                            reply = r.json()["choices"][0]["message"]
                            if t + 1 < turns:
                                call = reply["tool_calls"][0]
                                messages = [
                                    *messages,
                                    {k: v for k, v in reply.items() if v is not None},
                                    {"role": "tool", "tool_call_id": call["id"], "content": results[t]},
                                ]
                gateway.close()
                for t in sorted({1, 2, 3, turns // 2, turns - 1, turns} & set(range(1, turns + 1))):
                    g, v = best_gw[t - 1] * 1e3, best_vl[t - 1] * 1e3
                    print(f"{reach:5d} {t:4d} {sizes[t - 1]:7d} | {g:8.2f} {v:8.2f} {v / g:7.1f}x |")
                later_g, later_v = best_gw[1:], best_vl[1:]
                summary.append(
                    f"reach {reach:3d}: turns 2-{turns} gateway mean {sum(later_g) / len(later_g) * 1e3:.2f} ms vs vLLM "
                    f"{sum(later_v) / len(later_v) * 1e3:.2f} ms ({sum(later_v) / sum(later_g):.1f}x); gateway turn "
                    f"{turns} / turn 2 = {best_gw[-1] / best_gw[1]:.2f}x (vLLM {best_vl[-1] / best_vl[1]:.2f}x); "
                    f"below vLLM at every turn >= 2: {all(a < b for a, b in zip(later_g, later_v))}; same IDs: {same}"
                )
                print(f"{'':5s} ----")
            print("\n".join(summary))


@contextlib.contextmanager
def vllm_server(model: str | None):
    """A vLLM server of ``model`` on a free port of 127.0.0.1 (one unbound CPU thread), stopped after."""
    import socket
    import subprocess
    import tempfile

    import httpx

    if not model:
        sys.exit("part 5 needs --vllm-url URL or --vllm-model FOLDER")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}  # fmt: skip
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "65536", "--enforce-eager"]  # fmt: skip
    log = tempfile.TemporaryFile()
    print(f"(starting vLLM on {model}: a minute or two)", flush=True)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                log.seek(0)
                sys.exit(f"vLLM exited: {log.read()[-2000:].decode(errors='replace')}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                sys.exit("vLLM did not start in 600 s")
            time.sleep(1)
        yield url
    finally:
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        log.close()


# ---------------------------------------------------------------------------------------------
async def main_async(args) -> None:
    from transformers import AutoTokenizer

    import tmpl

    data = Path(args.data)
    path = data / "qwen2.5-instruct"
    if not path.is_dir():
        sys.exit(f"tokenizer not found at {path}; pass --data or set TMPL_TEST_DATA")
    tok = AutoTokenizer.from_pretrained(str(path))
    tpl = tmpl.ChatTemplate(tok)
    call_ids = tok.encode(CALL_TEXT, add_special_tokens=False)
    answer_ids = tok.encode(ANSWER_TEXT, add_special_tokens=False)
    assert call_ids[-1] in tpl.stop_token_ids and answer_ids[-1] in tpl.stop_token_ids
    prompt = list(
        tok.apply_chat_template(
            [{"role": "user", "content": question("x")}],
            tools=TOOLS,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )
    try:
        import uvloop  # noqa: F401

        have_uvloop = True
    except ImportError:
        have_uvloop = False
    if args.pin:  # the server on core 0 (the load generator takes core 1)
        os.sched_setaffinity(0, {0})
    gc.callbacks.append(GC)
    if args.gc_freeze:  # as `tmpl serve` does: what is loaded now is left out of every collection
        from tmpl.rollout.collector import fewer_collections

        gc.collect()
        fewer_collections().__enter__()  # for the process's life, as `tmpl serve` holds it
    ctx = {
        "tok": tok,
        "tpl": tpl,
        "call_ids": call_ids,
        "answer_ids": answer_ids,
        "prompt": prompt,
        "Canned": make_backend_class(),
        "uvloop": have_uvloop and args.loop != "asyncio",
    }
    import fastapi
    import httpx
    import uvicorn

    loop = type(asyncio.get_running_loop()).__module__
    print(
        f"cores {os.cpu_count()}; server loop {loop}; uvicorn {uvicorn.__version__}, fastapi {fastapi.__version__}, "
        f"httpx {httpx.__version__}; compiled core {tmpl.NATIVE}; template {tpl.name}; "
        f"collector: {'fewer_collections() once loaded, as tmpl serve' if args.gc_freeze else 'left as it is (--no-gc-freeze)'}"
    )
    started = time.perf_counter()
    if "a" in args.parts:
        await part_agents(ctx, args)
    if "1" in args.parts:
        kept = await part1(ctx, args)
        part4(ctx, kept, args.turns)
        del kept
    if "2" in args.parts:
        await part2(ctx, args)
    if "3" in args.parts:
        await part3(ctx, args)
    if "5" in args.parts:
        await part5(ctx, args)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--_client":
        client_main(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("TMPL_TEST_DATA", REPO.parent / "shared" / "tokenizers"))
    parser.add_argument("--sessions", type=int, nargs="+", default=None, help="part 1 (default 16 256 1024)")
    parser.add_argument("--turns", type=int, default=None, help="calls per episode (default 4)")
    parser.add_argument("--delay", type=float, default=None, help="the backend's delay in part 1 (0.1) and a (2.0), s")
    parser.add_argument("--clients", type=int, default=64, help="part 2's concurrent clients")
    parser.add_argument("--duration", type=float, default=None, help="part 2's seconds per app (default 4)")
    parser.add_argument("--history", type=int, default=None, help="part 3's history tokens (default 8000)")
    parser.add_argument("--reach", type=int, nargs="+", default=None, help="part 3's turns (default 1 10 50)")
    parser.add_argument("--reps", type=int, default=None, help="part 3's episodes per history (default 5)")
    parser.add_argument("--parts", default="123", help="which parts to run (4 runs with 1; 5 needs vLLM; a: --agents)")
    parser.add_argument(
        "--agents",
        action="store_true",
        help="part a, agent-scale load: 256 and 1,024 sessions of 40 calls, histories to 16k tokens, delay 2 s, "
        "the durable store on, against the bare route (the defaults of --sessions --turns --grow --delay)",
    )
    parser.add_argument("--grow", type=int, default=16_000, help="part a: the history's tokens at the last call")
    parser.add_argument("--pin", action="store_true", help="server on core 0, load generator on core 1")
    parser.add_argument("--profile", help="part a: cProfile the server over each gateway run, to FILE.<sessions>")
    parser.add_argument("--loop", choices=["auto", "asyncio"], default="auto", help="auto: uvloop where installed")
    parser.add_argument(
        "--pool",
        choices=["session", "shared"],
        default="session",
        help="session: one httpx.AsyncClient (one connection) per session; shared: one client, max_connections=N",
    )
    parser.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave the collector as it is (default: tmpl serve's fewer_collections(), the loaded heap frozen)",
    )
    parser.add_argument("--vllm-url", help="part 5: a running vLLM server of a Qwen2.5-template model")
    parser.add_argument("--vllm-model", help="part 5: a model folder to start a vLLM server of (no --vllm-url)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a load-generator run may take")
    parser.add_argument("--quick", action="store_true", help="smaller counts (a smoke run)")
    parser.add_argument(
        "--store", action="store_true", help="part 1: also run each load on a gateway with the durable store"
    )
    args = parser.parse_args()
    q = args.quick
    if args.agents:
        args.parts = "a"
        args.sessions = args.sessions or ([32] if q else [256, 1024])
        args.turns = args.turns or (8 if q else 40)
        args.delay = 2.0 if args.delay is None else args.delay
        args.timeout = max(args.timeout, args.turns * args.delay * 6 + 120)
    args.delay = 0.1 if args.delay is None else args.delay
    args.sessions = args.sessions or ([32, 128] if q else [16, 256, 1024])
    args.turns = args.turns or (3 if q else 4)
    args.duration = args.duration or (1.5 if q else 4.0)
    args.history = args.history or (2000 if q else 8000)
    args.reach = args.reach or ([1, 5, 10] if q else [1, 10, 50])
    args.reps = args.reps or (2 if q else 5)
    if args.turns < 2:
        parser.error("--turns must be at least 2 (a tool call, then the answer)")
    if args.loop == "auto":
        try:
            import uvloop

            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:
            runner = asyncio.Runner()
    else:
        runner = asyncio.Runner()
    with runner:
        runner.run(main_async(args))


if __name__ == "__main__":
    main()

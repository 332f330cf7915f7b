"""Rollout at scale: time outside the engine by phase, and peak memory, against the naive loop.

    python benchmarks/rollout_scale.py [--samples 4096] [--turns 8] [--naive-samples 512]
                                       [--drift 0,0.0625,1] [--data ../shared/tokenizers]

The engine is ``tmpl.backends.Scripted`` replaying completions encoded before the clock starts,
so nearly all of a run is time outside the engine. The conversations call realistic tools:
four sync tools returning JSON records of varied shape and length (about 50 to 2000
characters), some failing (a raised exception, wrong arguments, an unknown tool, a malformed
call). Samples stop at different turns (most use every turn).

Every configuration runs in a fresh subprocess, so each peak RSS (``ru_maxrss``) is its own
(``TMPL_FAST_ENCODE=0`` in the environment turns tmpl's fast (tiktoken) encoder off everywhere, the
scale-out workers included; the first tmpl row is also run that way unless ``--no-fast-off-row``):

- ``tmpl drift=F``: ``tmpl.Rollout`` with ``measure_drift=F`` (0, the default 1/16, every sample),
  timed on its second run over the conversations (``--warm N``: the first run covers only N of them),
  so the suffix frames (built once per tool-message shape and process) are already there;
  time outside the engine = wall - engine time, broken down by the rollout's phases that run on
  the event loop's thread (``RolloutMetrics.outside``: tokenize, parse, suffix, bookkeeping,
  drift) and the rest: running the tools (sync tools on worker threads, overlapping other
  samples' phases, so not timed apart) and scheduling (the event loop, batching, starting samples);
- ``naive``: the loop trainers write without tmpl, on the first ``--naive-samples`` samples
  (its cost per sample-turn does not depend on how many samples run, it grows with turns):
  every turn decode the completions, parse, run the same tools, append the messages and
  re-render + re-tokenize every conversation with ``apply_chat_template`` (batched);
- ``floor``: in the first tmpl process, after its run, only the work no loop can skip, each part
  the fastest way there is (run the calls the samples made; encode all their results in one
  ``encode_batch_fast``; decode all completions in one ``decode_batch``); printed a second time
  with the encode done by tmpl's fast encoder (``Codec.encode_many``), faster than the
  tokenizer's own call on this workload. naive / floor is the
  most any loop could gain over the naive one on this workload.

Prints milliseconds per sample-turn (one generation of one sample) and naive / tmpl. The CPU
figures count every thread of the process; a tmpl row's leaves out the stand-in engine's own CPU
time (it replays on the event loop's thread, timed there with ``thread_time``), as its wall time
leaves out the engine's time.

Scale out (``--workers 1,2 --modes process,ray``, in one more fresh process, after the rows
above; ``--scale-only`` runs only this; ``--scale-samples``, default ``--samples``): sample-turns
per second of the same workload run by ``tmpl.DistributedRollout`` with 1 and 2 workers, local
processes then Ray actors (a local cluster), beside an in-process ``tmpl.Rollout``, all in the
same run: every configuration started and warmed, then ``--repeat`` round-robin rounds of timed
runs (best and median printed), so a change of load on a shared machine falls on all alike. The CPU
per sample-turn (median; the workers' processes, every thread, plus the driver's) is what the
load changes least: its growth from 1 to 2 workers is the cost of sharding itself. Each worker builds the rollout itself (:class:`ScaleFactory`: the template, the
scripted engine and its script, the tools) and is warmed by a first small run; the timed run's
wall time covers sharding, the workers' rollouts and shipping every result back. Prints the
machine's load average before and after (the ratios mean something only on an idle machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PHASES = ("parse", "tools", "suffix", "bookkeeping", "drift")
WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()
CITIES = ("Paris", "Lyon", "Tokyo", "Nairobi", "São Paulo", "Reykjavík", "Montréal", "Zürich", "Seoul", "Lima")


# -- tools: sync, instant, realistic JSON results ------------------------------------------
def _rng(*key: Any) -> random.Random:
    return random.Random(json.dumps(key, ensure_ascii=False))


def search_products(query: str, limit: int = 5) -> list[dict[str, Any]]:
    """Search the product catalogue.

    Args:
        query: Words to look for.
        limit: How many products to return at most.
    """
    rng = _rng("search", query, limit)
    return [
        {
            "sku": f"SKU-{rng.randrange(10**6):06d}",
            "title": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))).title(),
            "price": round(rng.uniform(1, 500), 2),
            "in_stock": rng.random() < 0.8,
            "tags": rng.sample(WORDS, rng.randint(0, 4)),
            "rating": {"mean": round(rng.uniform(1, 5), 1), "count": rng.randint(0, 5000)},
        }
        for _ in range(rng.randint(0, limit))
    ]


def get_weather(city: str, unit: str = "celsius") -> dict[str, Any]:
    """Current weather in a city.

    Args:
        city: The city name.
        unit: celsius or fahrenheit.
    """
    rng = _rng("weather", city, unit)
    return {"city": city, "temperature": round(rng.uniform(-10, 35), 1), "unit": unit, "humidity": rng.random()}


def read_file(path: str) -> str:
    """Read a text file of the workspace.

    Args:
        path: The file path.
    """
    if path.endswith(".missing"):
        raise FileNotFoundError(f"no such file: {path}")
    rng = _rng("file", path)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(rng.randint(1, 40))]
    return "\n".join(lines)


def lookup_order(order_id: int) -> dict[str, Any]:
    """Look an order up.

    Args:
        order_id: The order number.
    """
    if order_id % 11 == 0:
        raise KeyError(f"order {order_id} not found")
    rng = _rng("order", order_id)
    return {
        "order_id": order_id,
        "status": rng.choice(["shipped", "pending", "delivered", "cancelled"]),
        "items": [
            {"sku": f"SKU-{rng.randrange(10**6):06d}", "qty": rng.randint(1, 4)} for _ in range(rng.randint(1, 8))
        ],
        "address": {"city": rng.choice(CITIES), "zip": f"{rng.randrange(10**5):05d}"},
    }


TOOLS = [search_products, get_weather, read_file, lookup_order]


def _call(rng: random.Random) -> str:
    """The text of one tool call the scripted model writes (sometimes a broken one)."""
    roll = rng.random()
    if roll < 0.02:
        return '<tool_call>\n{"name": "search_products", "arguments": {"query": "red shoes"\n</tool_call>'  # bad JSON
    if roll < 0.03:
        return '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>'  # unknown tool
    if roll < 0.04:
        return '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>'  # wrong argument
    kind = rng.randrange(4)
    if kind == 0:
        args: dict[str, Any] = {"query": " ".join(rng.sample(WORDS, rng.randint(1, 3))), "limit": rng.randint(1, 12)}
        name = "search_products"
    elif kind == 1:
        args, name = {"city": rng.choice(CITIES)}, "get_weather"
    elif kind == 2:
        ext = ".missing" if rng.random() < 0.1 else ".txt"
        args, name = {"path": f"notes/{rng.choice(WORDS)}-{rng.randrange(1000)}{ext}"}, "read_file"
    else:
        args, name = {"order_id": rng.randrange(1, 10**5)}, "lookup_order"
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def completion_text(index: int, turn: int, last_turn: int) -> str:
    """What the scripted model writes for conversation ``index`` at ``turn`` (it stops at ``last_turn``)."""
    rng = _rng("completion", index, turn)
    if turn >= last_turn:
        return f"Here is what I found: {' '.join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))}.<|im_end|>"
    lead = f"Let me check {rng.choice(WORDS)}.\n" if rng.random() < 0.3 else ""
    calls = "\n".join(_call(rng) for _ in range(1 if rng.random() < 0.8 else 2))
    return lead + calls + "<|im_end|>"


def last_turn(index: int, turns: int) -> int:
    """The turn at which a conversation answers without tools (most use every turn)."""
    rng = _rng("length", index)
    return turns - 1 if rng.random() < 0.7 else rng.randint(1, turns - 1)


def conversation(index: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a shopping and logistics assistant. Use the tools."},
        {"role": "user", "content": f"Request {index}: find {_rng('q', index).choice(WORDS)} and check my orders."},
    ]


# -- one configuration, in its own process ---------------------------------------------------
def child(config: dict[str, Any]) -> dict[str, Any]:
    import tmpl

    CpuTimedScripted = _cpu_timed_scripted()
    tpl = tmpl.ChatTemplate.from_pretrained(Path(config["data"]) / config["family"])
    samples, turns = config["samples"], config["turns"]
    conversations = [conversation(i) for i in range(samples)]
    ends = [last_turn(i, turns) for i in range(samples)]
    script = [[tpl.codec.encode(completion_text(i, t, ends[i])) for t in range(ends[i] + 1)] for i in range(samples)]
    toolbox = tmpl.Toolbox(TOOLS, timeout=10)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if config["mode"] == "naive":
        cpu = _cpu()
        elapsed, n = run_naive(tpl, toolbox, conversations, script), sum(len(s) for s in script)
        cpu = _cpu() - cpu
        out = {"outside": elapsed, "engine": 0.0, "wall": elapsed, "sample_turns": n, "phases": {}}
    else:

        def policy(req: Any) -> list[int]:
            i, _, t = req.request_id.split("-")[:3]
            return script[int(i)][int(t)]

        engine = CpuTimedScripted(policy, record=False)  # keeps no request: peak RSS is the rollout's
        rollout = tmpl.Rollout(
            tpl,
            engine,
            tools=toolbox,
            max_turns=turns,
            max_length=32768,
            max_completion_length=None,
            measure_drift=config["drift"],
            progress=False,
        )
        # warm the parser, the suffix frames (one per tool-message shape, built once per template and
        # process) and caches: by default on every conversation, so the timed run is the steady state
        rollout.run(conversations[: config.get("warm") or samples])
        frames = len(tpl.engine.state.frames)
        engine.cpu = 0.0
        cpu = _cpu()
        results = rollout.run(conversations)
        cpu = _cpu() - cpu - engine.cpu  # outside the engine, as the wall time
        m = rollout.metrics
        assert m is not None
        n = sum(r.turns for r in results)
        assert n == sum(len(s) for s in script), "the scripted rollout did not run every turn"
        assert m.aborted == 0, m.abort_reasons
        out = {
            "outside": m.wall_time - m.engine_time,
            "engine": m.engine_time,
            "engine_cpu": engine.cpu,
            "wall": m.wall_time,
            "sample_turns": n,
            "phases": {k: m.outside.get(k, 0.0) for k in ("tokenize", *PHASES)},
            "tool_calls": m.tool_calls,
            "tool_failures": m.tool_failures,
            "drift_measured": m.drift_measured,
            "frames_built": len(tpl.engine.state.frames) - frames,
        }
    out["cpu"] = cpu
    out["rss_before_mib"] = rss_before / 1024
    out["rss_peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if config.get("floor"):  # after the peak RSS was read: encoding every result at once takes memory
        out["floor"] = floor(tpl, results, script)
    toolbox.close()
    return out


def _cpu_timed_scripted() -> type:
    from tmpl.backends import Scripted

    class CpuTimedScripted(Scripted):  # type: ignore[misc]
        """``Scripted``, counting the CPU seconds of its own replay (on the event loop's thread)."""

        cpu = 0.0

        def generate_batch(self, requests: Any) -> Any:
            start = time.thread_time()
            try:
                return super().generate_batch(requests)
            finally:
                self.cpu += time.thread_time() - start

    return CpuTimedScripted


def floor(tpl: Any, results: list[Any], script: list[list[list[int]]]) -> dict[str, float]:
    """Seconds of the work no loop can skip, each part done the fastest way there is, after the run
    (and ``cpu``: the CPU seconds of all three, every thread).

    Run the calls the samples made (the tool functions, their results serialized as the
    Toolbox does); encode every tool result text in one ``encode_batch_fast`` (the tokenizer's
    fastest call, threaded); decode every completion in one ``decode_batch`` (a loop must read
    the calls). No parsing, no bookkeeping, no scheduling: a loop doing only this would be free.
    """
    from tmpl.tools.procworker import content_of as _content

    fns = {f.__name__: f for f in TOOLS}
    calls, contents = [], []
    for r in results:
        for message in r.messages:
            if message.get("role") == "tool":
                contents.append(message["content"])
            for tc in message.get("tool_calls") or ():
                fn, args = fns.get(tc["function"]["name"]), tc["function"]["arguments"]
                if fn is not None and isinstance(args, dict):
                    calls.append((fn, args))
    cpu = _cpu()
    start = time.perf_counter()
    for fn, args in calls:
        try:
            _content(fn(**args))
        except Exception:  # noqa: BLE001, S112 - failing calls cost their raise, like in a loop
            continue
    tools = time.perf_counter() - start
    backend = tpl.codec.backend
    encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)  # as tmpl's Codec did
    cpu_encode = _cpu()
    start = time.perf_counter()
    encode_batch(contents, add_special_tokens=False)
    encode = time.perf_counter() - start
    cpu_encode = _cpu() - cpu_encode
    completions = [ids for sample in script for ids in sample]
    start = time.perf_counter()
    backend.decode_batch(completions, skip_special_tokens=False)
    decode = time.perf_counter() - start
    cpu = _cpu() - cpu
    # the same encode by tmpl's fast encoder (tiktoken where it serves, the rest in one batch call):
    # the floor's encode part done the fastest way tmpl knows
    cpu_fast = _cpu()
    start = time.perf_counter()
    tpl.codec.encode_many(contents)
    encode_fast = time.perf_counter() - start
    cpu_fast = _cpu() - cpu_fast
    return {
        "tools": tools,
        "encode": encode,
        "decode": decode,
        "cpu": cpu,
        "encode_fast": encode_fast,
        "cpu_fast": cpu - cpu_encode + cpu_fast,
    }


def _cpu() -> float:
    """CPU seconds of this process, every thread (tokenizer threads, tool workers) included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_naive(
    tpl: Any, toolbox: Any, conversations: list[list[dict[str, Any]]], script: list[list[list[int]]]
) -> float:
    """Decode, parse, run tools and re-render + re-tokenize every conversation, every turn."""
    from tmpl.toolcalls import parse_completion

    tok, schemas = tpl.tokenizer, toolbox.schemas
    histories = [list(c) for c in conversations]
    active = list(range(len(conversations)))
    start = time.perf_counter()
    turn = 0
    while active:
        prompts = tok.apply_chat_template(
            [histories[i] for i in active], tools=schemas, add_generation_prompt=True, tokenize=True
        )
        assert len(prompts["input_ids"]) == len(active)
        completions = [script[i][turn] for i in active]  # the engine's answer
        texts = tok.batch_decode(completions)  # what a text loop keeps
        assert len(texts) == len(active)
        parsed = [parse_completion(tpl, c, tools=toolbox) for c in completions]
        batch = toolbox.run_batch(parsed)
        still = []
        for i, p, msgs in zip(active, parsed, batch.messages):
            histories[i].append(p.to_message())
            if p.has_calls:
                histories[i].extend(msgs)
                still.append(i)
        active, turn = still, turn + 1
    return time.perf_counter() - start


# -- scale out: the same rollout on 1 and 2 workers (processes, then Ray) -----------------------
class ScriptPolicy:
    """The scripted engine's policy: the completion of conversation ``i`` at turn ``t``, from the request id."""

    def __init__(self, script: list[list[list[int]]]) -> None:
        self.script = script

    def __call__(self, req: Any) -> list[int]:
        i, _, t = req.request_id.split("-")[:3]
        return self.script[int(i)][int(t)]


class ScaleFactory:
    """Builds the benchmark's rollout (drift 0) in a worker: picklable, it carries settings only, and
    the worker encodes the script of every conversation itself (before the clock starts)."""

    def __init__(self, data: str, family: str, samples: int, turns: int) -> None:
        self.data, self.family, self.samples, self.turns = data, family, samples, turns

    def __call__(self) -> Any:
        import tmpl
        from tmpl.backends import Scripted

        # the worker runs the tmpl this benchmark's checkout holds (spawn passes sys.path, Ray PYTHONPATH)
        assert Path(tmpl.__file__).resolve().is_relative_to(REPO), (tmpl.__file__, REPO)
        tpl = tmpl.ChatTemplate.from_pretrained(Path(self.data) / self.family)
        ends = [last_turn(i, self.turns) for i in range(self.samples)]
        script = [
            [tpl.codec.encode(completion_text(i, t, ends[i])) for t in range(ends[i] + 1)] for i in range(self.samples)
        ]
        return tmpl.Rollout(
            tpl,
            Scripted(ScriptPolicy(script), record=False),
            tools=tmpl.Toolbox(TOOLS, timeout=10),
            max_turns=self.turns,
            max_length=32768,
            max_completion_length=None,
            measure_drift=0,
            progress=False,
        )


def scale_child(config: dict[str, Any]) -> dict[str, Any]:
    """Sample-turns per second: an in-process Rollout and DistributedRollout per mode and worker count.

    Every configuration is started and warmed first, then the timed runs go round-robin, ``repeat``
    rounds: a change of load on a shared machine falls on all of them alike. Idle workers wait on
    their pipe (or Ray call) and take no CPU.
    """
    from rollout_scale import ScaleFactory as Factory  # by its module's name: workers import it, not __main__

    from tmpl.rollout.scale import DistributedRollout

    samples, turns = config["samples"], config["turns"]
    factory = Factory(config["data"], config["family"], samples, turns)
    conversations = [conversation(i) for i in range(samples)]
    expected = sum(last_turn(i, turns) + 1 for i in range(samples))
    warm = conversations[: min(64, samples)]
    load = [os.getloadavg()]
    if "ray" in config["modes"]:
        import ray

        path = os.pathsep.join([str(Path(__file__).resolve().parent), str(REPO)])
        ray.init(  # logical CPUs: every runner's actors (num_cpus=1 each) exist at once; they take turns
            num_cpus=sum(config["workers"]),
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={  # Ray's workers get no environment of the driver's but what is listed
                "env_vars": {"PYTHONPATH": path, **{k: os.environ[k] for k in ("TMPL_FAST_ENCODE",) if k in os.environ}}
            },
        )
    rollout = factory()
    runners = {
        (m, w): DistributedRollout(factory, workers=w, mode=m) for m in config["modes"] for w in config["workers"]
    }
    walls: dict[str, list[float]] = {"in-process/0": []}
    cpus: dict[str, list[float]] = {"in-process/0": []}  # CPU seconds: the workers' plus this process's
    shards: dict[str, int] = {}
    traffic: dict[str, float] = {}
    try:
        rollout.run(warm)
        for runner in runners.values():
            runner.run(warm)  # starts every worker (each builds and encodes its script) and warms it
        for _ in range(config["repeat"]):
            start, cpu = time.perf_counter(), _cpu()
            results = rollout.run(conversations)
            walls["in-process/0"].append(time.perf_counter() - start)
            cpus["in-process/0"].append(_cpu() - cpu)
            assert sum(r.turns for r in results) == expected
            if not traffic:
                traffic = _traffic(results, expected)
            del results
            for (mode, workers), runner in runners.items():
                start, cpu = time.perf_counter(), _cpu()
                results = runner.run(conversations)
                walls.setdefault(f"{mode}/{workers}", []).append(time.perf_counter() - start)
                cpus.setdefault(f"{mode}/{workers}", []).append(_cpu() - cpu + runner.worker_cpu)
                m = runner.metrics
                assert m is not None and m.aborted == 0, m and m.abort_reasons
                assert sum(r.turns for r in results) == expected, "a sample-turn is missing or counted twice"
                assert runner.deaths == []
                shards[f"{mode}/{workers}"] = len(runner.attempts)
                del results
    finally:
        for runner in runners.values():
            runner.close()
        if "ray" in config["modes"]:
            ray.shutdown()
    load.append(os.getloadavg())
    rows = [
        {
            "mode": key.split("/")[0],
            "workers": int(key.split("/")[1]),
            "walls": w,
            "cpus": cpus[key],
            "sample_turns": expected,
            "shards": shards.get(key, 0),
        }
        for key, w in walls.items()
    ]
    return {"rows": rows, "load": load, "cores": len(os.sched_getaffinity(0)), "traffic": traffic}


def _traffic(results: list[Any], sample_turns: int) -> dict[str, float]:
    """Per sample-turn: prompt tokens sent to the engine (token-in: the whole sequence every turn), their
    size as a JSON list, completion tokens back, and the pickled results a worker ships to the driver."""
    import pickle

    sent = [len(r.prompt_ids) + sp.start for r in results for sp in r.spans if sp.kind == "completion"]
    first = results[: max(1, len(results) // 16)]
    ids = [r.prompt_ids.tolist() + r.completion_ids.tolist() for r in first]
    json_per_token = sum(len(json.dumps(x)) for x in ids) / sum(len(x) for x in ids)
    blob = pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
    start = time.perf_counter()
    pickle.loads(blob)
    loads = time.perf_counter() - start
    return {
        "sent_tokens": sum(sent) / sample_turns,
        "sent_json_bytes": sum(sent) * json_per_token / sample_turns,
        "generated_tokens": sum(int(r.mask.sum()) for r in results) / sample_turns,
        "result_bytes": len(blob) / sample_turns,
        "unpickle_ms": loads * 1e3 / sample_turns,
    }


def print_scale(out: dict[str, Any], samples: int, turns: int) -> None:
    (b1, b5, _), (a1, a5, _) = out["load"]
    rounds = len(out["rows"][0]["walls"])
    print(
        f"scale out: {samples} samples x up to {turns} turns (drift 0), sample-turns per second (wall of the whole run: "
        f"sharding, the workers' rollouts, every result shipped back), best and median of {rounds} round-robin rounds; "
        f"{out['cores']} cores; load average before {b1:.2f} (5 min {b5:.2f}), after {a1:.2f} (5 min {a5:.2f})"
    )
    rows = out["rows"]

    def rates(row: dict[str, Any]) -> tuple[float, float]:
        r = sorted(row["sample_turns"] / w for w in row["walls"])
        return r[-1], r[len(r) // 2]

    base = rates(rows[0])
    single: dict[str, tuple[float, float]] = {}
    cores_of_one: dict[str, float] = {}  # cores one worker keeps busy: its rate x its CPU per sample-turn
    for row in rows:
        best, median = rates(row)
        cpu_ms = sorted(row["cpus"])[len(row["cpus"]) // 2] * 1e3 / row["sample_turns"]
        if row["workers"] == 0:
            label, extra = "in-process tmpl.Rollout", ""
        else:
            label = (
                f"{row['mode']}, {row['workers']} worker{'s' if row['workers'] > 1 else ''} ({row['shards']} shards)"
            )
            extra = f"   vs in-process {best / base[0]:.2f}x (median {median / base[1]:.2f}x)"
            if row["workers"] == 1:
                single[row["mode"]] = (best, median)
                cores_of_one[row["mode"]] = median * cpu_ms / 1e3
                extra += (
                    f"   keeps {cores_of_one[row['mode']]:.2f} cores busy (all its threads: loop, tokenizer, tools)"
                )
            elif row["mode"] in single:
                one = single[row["mode"]]
                ceiling = min(row["workers"], out["cores"]) / cores_of_one[row["mode"]]
                extra += (
                    f"   {row['workers']} workers / 1 worker = {best / one[0]:.2f}x (median {median / one[1]:.2f}x;"
                    f" at most {ceiling:.2f}x on {out['cores']} cores)"
                )
        print(
            f"  {label:<34} {row['sample_turns']} sample-turns: {best:6.0f} /s (median {median:6.0f}), "
            f"cpu {cpu_ms:.3f} ms per sample-turn{extra}"
        )
    t = out["traffic"]
    print(
        f"  traffic per sample-turn: {t['sent_tokens']:.0f} prompt tokens to the engine (token-in, ~{t['sent_json_bytes'] / 1e3:.1f} kB "
        f"as JSON), {t['generated_tokens']:.0f} tokens generated; {t['result_bytes'] / 1e3:.2f} kB of pickled results "
        f"from a worker to the driver, which unpickles them in {t['unpickle_ms']:.3f} ms"
    )


# -- the parent: one subprocess per configuration, one table ---------------------------------
def spawn(config: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, **config.get("env", {})}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(config)], capture_output=True, text=True, check=False, env=env
    )
    if proc.returncode != 0:
        sys.exit(f"configuration {config} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("TMPL_TEST_DATA", REPO.parent / "shared" / "tokenizers"))
    parser.add_argument("--family", default="qwen2.5-instruct", help="a family whose template writes <tool_call> JSON")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--naive-samples", type=int, default=512, help="the naive loop runs on this many samples")
    parser.add_argument("--drift", default="0,0.0625,1", help="measure_drift values to run, comma-separated")
    parser.add_argument(
        "--warm",
        type=int,
        default=0,
        help="conversations of the tmpl rows' warm-up run (0: all, the steady state; 64 was the old default, "
        "whose timed run also built the suffix frames of the tool-message shapes it met first)",
    )
    parser.add_argument("--workers", default="1,2", help="worker counts of the scale-out rows ('' for none)")
    parser.add_argument("--modes", default="process,ray", help="DistributedRollout modes of the scale-out rows")
    parser.add_argument("--scale-samples", type=int, help="samples of the scale-out rows (default: --samples)")
    parser.add_argument("--scale-only", action="store_true", help="run only the scale-out rows")
    parser.add_argument("--repeat", type=int, default=3, help="round-robin rounds of the scale-out rows")
    parser.add_argument(
        "--fast-off-row",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the first tmpl row, the same run with TMPL_FAST_ENCODE=0 (the tokenizer encodes every text)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        config = json.loads(args.child)
        print(json.dumps(scale_child(config) if config["mode"] == "scale" else child(config)))
        return
    if not (Path(args.data) / args.family).is_dir():
        sys.exit(f"tokenizer data not found at {Path(args.data) / args.family}; pass --data or set TMPL_TEST_DATA")
    base = {"data": str(args.data), "family": args.family, "turns": args.turns}
    if not args.scale_only:
        phase_rows(args, base)
    workers = [int(w) for w in args.workers.split(",") if w]
    if workers:
        modes = [m for m in args.modes.split(",") if m]
        if "ray" in modes:
            try:
                import ray  # noqa: F401
            except ImportError:
                print("scale out: ray is not installed (pip install 'tmpl[ray]'): Ray rows skipped")
                modes.remove("ray")
        n = args.scale_samples or args.samples
        out = spawn({**base, "mode": "scale", "samples": n, "workers": workers, "modes": modes, "repeat": args.repeat})
        print_scale(out, n, args.turns)


def phase_rows(args: argparse.Namespace, base: dict[str, Any]) -> None:
    """The rows of one process: naive, tmpl at each drift fraction, the floor."""
    naive_n = min(args.naive_samples, args.samples)
    naive = spawn({**base, "mode": "naive", "samples": naive_n, "drift": 0})
    naive_ms = naive["outside"] * 1e3 / naive["sample_turns"]
    naive_cpu = naive["cpu"] * 1e3 / naive["sample_turns"]
    print(
        f"{args.family}, scripted engine, up to {args.turns} turns, tool results ~50-2000 chars (some errors); "
        "per sample-turn: wall ms outside the engine (and CPU ms, all threads); each row a fresh process"
    )
    print(
        f"  naive (decode + re-render), {naive_n} samples, {naive['sample_turns']} sample-turns: "
        f"{naive_ms:.3f} ms (cpu {naive_cpu:.3f})   peak RSS {naive['rss_peak_mib']:.0f} MiB "
        f"(after setup {naive['rss_before_mib']:.0f})"
    )
    for position, value in enumerate(args.drift.split(",")):
        drift = float(value)
        config = {**base, "mode": "tmpl", "samples": args.samples, "drift": drift, "floor": position == 0}
        r = spawn({**config, "warm": args.warm})
        n = r["sample_turns"]
        ms, cpu = r["outside"] * 1e3 / n, r["cpu"] * 1e3 / n
        # phases run on the event loop's thread one at a time: their sums do not overlap; tools
        # wait on worker threads while other samples run, so they are measured as the rest
        phases = {k: v * 1e3 / n for k, v in r["phases"].items() if k != "tools"}
        rest = ms - sum(phases.values())
        print(
            f"  tmpl drift={drift:<5g} {args.samples} samples, {n} sample-turns, {r['tool_calls']} calls "
            f"({r['tool_failures']} failed), {r['drift_measured']} drift-measured: {ms:.3f} ms (cpu {cpu:.3f})"
            f"   naive / tmpl = {naive_ms / ms:.1f}x (cpu {naive_cpu / cpu:.1f}x)   peak RSS "
            f"{r['rss_peak_mib']:.0f} MiB (after setup {r['rss_before_mib']:.0f})"
        )
        print(
            "      by phase: "
            + "  ".join(f"{k} {v:.3f}" for k, v in phases.items())
            + f"  tools+scheduling (the rest) {rest:.3f}   (engine {r['engine'] * 1e3 / n:.3f}, its cpu {r['engine_cpu'] * 1e3 / n:.3f}, wall {r['wall']:.1f} s;"
            f" suffix frames built in this run: {r['frames_built']})"
        )
        if "floor" in r and args.fast_off_row:
            off = spawn({**config, "warm": args.warm, "floor": False, "env": {"TMPL_FAST_ENCODE": "0"}})
            off_ms, off_cpu = off["outside"] * 1e3 / n, off["cpu"] * 1e3 / n
            off_phases = {k: v * 1e3 / n for k, v in off["phases"].items() if k != "tools"}
            print(
                f"  the same, fast encoder off (TMPL_FAST_ENCODE=0, the tokenizer encodes everything): {off_ms:.3f} ms"
                f" (cpu {off_cpu:.3f})   off / on = {off_ms / ms:.2f}x (cpu {off_cpu / cpu:.2f}x)   by phase: "
                + "  ".join(f"{k} {v:.3f}" for k, v in off_phases.items())
            )
        if "floor" in r:
            parts = {k: v * 1e3 / n for k, v in r["floor"].items()}
            floor_cpu, fast_cpu, fast = parts.pop("cpu"), parts.pop("cpu_fast"), parts.pop("encode_fast")
            total = sum(parts.values())
            total_fast = total - parts["encode"] + fast
            print(
                f"  floor (only the work no loop can skip, each the fastest way, in the process above): {total:.3f} ms"
                f" (cpu {floor_cpu:.3f})   naive / floor = {naive_ms / total:.1f}x: the most any loop could reach here;"
                f" tmpl / floor = {ms / total:.2f}x (cpu {cpu / floor_cpu:.2f}x)\n"
                "      "
                + "  ".join(f"{k} {v:.3f}" for k, v in parts.items())
                + "   (run the calls, serialize; encode every tool result, one encode_batch_fast; decode every"
                " completion, one decode_batch)\n"
                f"  floor, its encode by tmpl's fast encoder (encode {fast:.3f}): {total_fast:.3f} ms"
                f" (cpu {fast_cpu:.3f})   tmpl / floor = {ms / total_fast:.2f}x (cpu {cpu / fast_cpu:.2f}x)"
            )


if __name__ == "__main__":
    main()

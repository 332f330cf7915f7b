"""Routing replay on a real vLLM (issue 40): the routes a GPU vLLM server returns over a multi-turn tool
rollout, stitched by tmpl, against one transformers forward pass over each final sequence.

One command on a machine with a GPU and vLLM's GPU build (0.32, ``enable_return_routed_experts``)::

    python benchmarks/moe_routes_gpu.py --out /tmp/moe_routes.json

1. builds the tiny Qwen3-MoE fixture (``tests/fixture_moe.py``: hidden 128, 2 layers, 8 experts, top-2,
   the Qwen3 tokenizer from ``TMPL_TEST_DATA`` or ``--tokenizer``), or takes ``--model DIR``;
2. per dtype of ``--dtypes`` (default ``float32,bfloat16``), starts ``python -m
   vllm.entrypoints.openai.api_server --enable-scale-out --enable-return-routed-experts --dtype D
   --enforce-eager`` with ``VLLM_USE_V2_MODEL_RUNNER=1`` (vLLM 0.32's AuxOutput connector, which returns
   the routes, needs Model Runner V2 and prefix caching, on by default);
3. runs ``tmpl.Rollout(..., routes=True)`` through :class:`tmpl.backends.VLLMServer` (``routes=True``; once
   whole, once streamed) over the fixture's 12 ``get_time`` questions (6 with one call, 6 with two: two or
   three turns), greedy: every turn asks for the routes of its new positions
   (``routed_experts_prompt_start``) and stitches them. (Greedy, as the fixture is trained: a few seconds
   of training leave it near uniform at temperature 1, where it rambles and samples the padded vocabulary
   rows past the tokenizer's, which tmpl refuses);
4. runs the fixture model in transformers (float32, ``output_router_logits=True``, top-2 of each layer's
   router softmax, as Qwen3-MoE's router chooses) over every final sequence and compares, position by
   position, every position whose route is known (all but each sample's last sampled token);
5. prints one line per run and the agreement: ``exact`` (the same experts in the same order) and ``set``
   (the same experts).

``--dry-run`` runs the same steps on the CPU without vLLM: the "server" is tests/vllm_standin.py's
stand-in speaking vLLM's JSON (base64 ``.npy`` routes, prompt starts, streaming) over tmpl's Torch
backend on the fixture in float32, whose routes are the model's own router outputs. It proves the script
and the server path; its agreement must be 100%::

    python benchmarks/moe_routes_gpu.py --dry-run

Measured here, ``--dry-run`` (2 CPU cores shared with other work, 162 s with the fixture's build)::

    tiny MoE: /tmp/moe_routes_l27eyqvu/tiny-moe (2 layers, 8 experts, top-2; ready in 117.7 s)
    dry-run float32 whole: 12 samples, 12 finished, 3045 positions x 2 layers compared: exact 100.00%, set 100.00%
    dry-run float32 streamed: 12 samples, 12 finished, 3045 positions x 2 layers compared: exact 100.00%, set 100.00%

Expected on a GPU (a prediction, not run: no GPU machine was lent to this task; it needs vLLM's GPU build
installed there, since vLLM's wheel is over the 64 MiB a device call carries), the same shape, one pair of
lines per dtype (the positions differ where vLLM's greedy tokens do)::

    float32 whole: 12 samples, 12 finished, ~3045 positions x 2 layers compared: exact 100.00%, set 100.00%
    float32 streamed: 12 samples, 12 finished, ~3045 positions x 2 layers compared: exact 100.00%, set 100.00%
    bfloat16 whole: 12 samples, ... exact <100%, set <100%
    bfloat16 streamed: ...

float32 should agree exactly (vLLM's router is a float32 softmax top-k, as the reference's, on the same
hidden states up to kernel rounding: a disagreement there is a near tie, and the JSON of ``--out`` lists
each one with its router margin); bfloat16 flips the near ties, so it agrees less (the number is what
this script is for). A run whose engine returns no routes fails its samples with ``bad_routes``, named.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import tmpl  # noqa: E402
from tmpl.backends import Sampling, VLLMServer  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_vllm(model: Path, dtype: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A vLLM server with routes on, on a free port; waits for /health (10 minutes at most)."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", "2048"]
    cmd += ["--enforce-eager", "--seed", "0", "--gpu-memory-utilization", "0.3"]
    cmd += ["--enable-scale-out", "--enable-return-routed-experts"]
    env = {**os.environ, "VLLM_USE_V2_MODEL_RUNNER": "1", "PYTHONUNBUFFERED": "1"}
    out = log.open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"vLLM ({dtype}) exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
            )
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(proc)
    raise TimeoutError(f"vLLM ({dtype}) not ready in 600 s:\n{log.read_text(errors='replace')[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def rollout(url: str, tpl: Any, *, stream: bool, args: Any) -> list[Any]:
    """The fixture's questions (the first ``args.questions``) through VLLMServer with routing replay."""
    from tests.fixture_moe import get_time, questions

    backend = VLLMServer(url, timeout=300, routes=True, stream=stream)
    run = tmpl.Rollout(
        tpl,
        backend,
        tools=[get_time],
        max_turns=4,
        max_length=1024,
        max_tokens_per_turn=args.max_tokens,
        sampling=Sampling(temperature=args.temperature, n=args.samples, seed=args.seed),
        routes=True,
        progress=False,
    )
    try:
        return run.run(questions()[: args.questions])
    finally:
        asyncio.run(backend.http.aclose())


def reference_routes(model: Any, ids: list[int], top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(experts, margins)`` of one forward pass: ``[len, layers, top_k]`` top-k of each layer's router
    softmax, and the gap between the k-th and (k+1)-th probability (how near a tie each choice was)."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), output_router_logits=True)
    experts, margins = [], []
    for logits in out.router_logits:  # one [positions, experts] per MoE layer
        probs = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(probs, top_k + 1, dim=-1)
        experts.append(top.indices[:, :top_k].cpu().numpy())
        margins.append((top.values[:, top_k - 1] - top.values[:, top_k]).cpu().numpy())
    return np.stack(experts, axis=1), np.stack(margins, axis=1)


def compare(results: list[Any], model: Any, top_k: int) -> dict[str, Any]:
    """Agreement of the stitched routes with the reference over every known position of every sample."""
    codes: dict[str, int] = {}
    positions = exact = same = 0
    misses: list[dict[str, Any]] = []
    for r in results:
        codes[str(r.code.value if r.code else None)] = codes.get(str(r.code.value if r.code else None), 0) + 1
        if r.routes is None:
            continue
        ids = r.prompt_ids.tolist() + r.completion_ids.tolist()
        want, margins = reference_routes(model, ids, top_k)
        known = r.routes_known.astype(bool)
        got = r.routes[known].astype(np.int64)
        ref = want[known]
        ordered = (got == ref).all(axis=-1)  # [positions, layers]
        as_set = (np.sort(got, axis=-1) == np.sort(ref, axis=-1)).all(axis=-1)
        positions += int(known.sum())
        exact += int(ordered.sum())
        same += int(as_set.sum())
        where = np.argwhere(~as_set)
        for p, layer in where[:20]:
            at = int(np.flatnonzero(known)[p])
            misses.append(
                {
                    "sample": r.index,
                    "position": at,
                    "layer": int(layer),
                    "engine": got[p, layer].tolist(),
                    "reference": ref[p, layer].tolist(),
                    "margin": float(margins[at, layer]),
                }
            )
    layers = int(getattr(model.config, "num_hidden_layers", 1))
    total = max(positions * layers, 1)
    return {
        "samples": len(results),
        "codes": codes,
        "positions": positions,
        "layers": layers,
        "exact": exact / total,
        "set": same / total,
        "misses": misses,
    }


def line(name: str, summary: dict[str, Any]) -> str:
    finished = summary["codes"].get("finished", 0)
    return (
        f"{name}: {summary['samples']} samples, {finished} finished, {summary['positions']} positions x "
        f"{summary['layers']} layers compared: exact {100 * summary['exact']:.2f}%, set {100 * summary['set']:.2f}%"
        + ("" if finished == summary["samples"] else f" (codes {summary['codes']})")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the stand-in server over the Torch backend (CPU)")
    parser.add_argument("--model", type=Path, help="a built fixture (default: build it in a temporary folder)")
    parser.add_argument("--tokenizer", type=Path, help="the Qwen3 tokenizer folder (default: TMPL_TEST_DATA/qwen3)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="vLLM dtypes, one server each")
    parser.add_argument("--samples", type=int, default=1, help="samples per question")
    parser.add_argument("--questions", type=int, default=12, help="the first N of the fixture's 12 questions")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="the fixture is trained for greedy decoding (see the docstring)"
    )
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per turn at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write every summary (and each disagreement) as JSON here")
    args = parser.parse_args()
    if args.tokenizer is not None:
        os.environ["TMPL_TEST_DATA"] = str(args.tokenizer.resolve().parent)  # fixture_moe reads <data>/qwen3

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.fixture_moe import build_tiny_moe

    work = Path(tempfile.mkdtemp(prefix="moe_routes_"))
    t0 = time.perf_counter()
    model_dir = args.model or build_tiny_moe(work / "tiny-moe")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tpl = tmpl.ChatTemplate(tok, name="qwen3")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    top_k = int(model.config.num_experts_per_tok)
    print(
        f"tiny MoE: {model_dir} ({model.config.num_hidden_layers} layers, {model.config.num_experts} experts, "
        f"top-{top_k}; ready in {time.perf_counter() - t0:.1f} s)",
        flush=True,
    )
    report: dict[str, Any] = {"model": str(model_dir), "device": device, "runs": {}}
    failed = False
    if args.dry_run:
        from tests.vllm_standin import StandinServer
        from tmpl.backends import Torch

        cpu = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        with StandinServer(Torch(cpu, tokenizer=tok), routes=True) as server:
            for stream in (False, True):
                name = f"dry-run float32 {'streamed' if stream else 'whole'}"
                t = time.perf_counter()
                results = rollout(server.url, tpl, stream=stream, args=args)
                summary = compare(results, model, top_k) | {"seconds": time.perf_counter() - t}
                report["runs"][name] = summary
                print(line(name, summary), flush=True)
                failed |= summary["set"] < 1.0 or summary["positions"] == 0
    else:
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("vLLM is not installed here: install its GPU build (0.32), or run --dry-run", file=sys.stderr)
            return 2
        for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
            log = work / f"vllm-{dtype}.log"
            try:
                proc, url = start_vllm(Path(model_dir), dtype, log)
            except (RuntimeError, TimeoutError) as exc:
                print(f"{dtype}: the server did not start: {exc}", flush=True)
                report["runs"][dtype] = {"error": str(exc)[-3000:]}
                failed = True
                continue
            try:
                for stream in (False, True):
                    name = f"{dtype} {'streamed' if stream else 'whole'}"
                    t = time.perf_counter()
                    results = rollout(url, tpl, stream=stream, args=args)
                    summary = compare(results, model, top_k) | {"seconds": time.perf_counter() - t}
                    report["runs"][name] = summary
                    print(line(name, summary), flush=True)
                    failed |= summary["positions"] == 0
            finally:
                stop(proc)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))
    print(f"total {time.perf_counter() - t0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

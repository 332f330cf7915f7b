"""Per-call cost of the tool suffix: tmpl vs the tokenizer floor vs TRL's method vs renderers.

    python benchmarks/suffix.py [--data ../shared/tokenizers] [--calls 3000] [--families ...] [--baseline]

The floor is the fast ``tokenizers.Tokenizer.encode(content, add_special_tokens=False).ids``
of each tool content alone (the ``backend_tokenizer`` of the same tokenizer, no template
text, no added tokens around it), measured in this run with the same repetitions as tmpl:
the only part of a suffix that is new on each call. ``tmpl/floor`` is the headline ratio
(goal <= 1.5x for one 100-character result). tmpl itself encodes through ``Codec.encode_many``:
with tiktoken built from the tokenizer's own vocabulary and split regex (``tmpl.tokenize.fast``,
the same IDs, where the pipeline allows: Qwen, Llama 3, Mistral Nemo here), the rest through
``encode_batch_fast`` (the same IDs without character offsets), so the *fast floor* is printed
too: ``encode_batch_fast(contents)`` of the contents alone, and ``tmpl/fast``. Where the fast
encoder serves, tmpl is below both floors: they are the tokenizer's own calls.
``TMPL_FAST_ENCODE=0`` runs it without the fast encoder (the baseline of the tokenizer's own encode).

Every figure is measured in this run, on this machine, and printed with its ratio:
- tmpl (compiled core) and tmpl (pure twin): ``ChatTemplate.suffix_ids`` with a warm cache;
- no cuts (``--baseline``): tmpl with its boundary cuts switched off, i.e. every dynamic run
  encoded whole with its frame text (the path before :mod:`tmpl.suffix.cuts`);
- TRL: ``GRPOTrainer._get_tool_suffix_ids`` (two ``apply_chat_template`` renders per call),
  called on a minimal stand-in trainer (needs ``trl``);
- renderers: ``bridge_to_next_turn`` of its hand-written Qwen3 renderer (needs ``renderers``);
- fixed cost: ``encode("")`` (the binding's per-call floor) and tmpl's time beyond its own
  encode call (``Codec.encode_many`` of the texts it encodes) for a 10-character result (validation, frame lookup, splicing).
floor, tmpl, pure and no cuts are timed in turns (see ``interleaved``), best turn kept;
TRL and renderers are the best of 5 batches (they are 10-100x slower, so load hardly moves
their ratios). Microseconds per call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tmpl  # noqa: E402
from tmpl import _compat  # noqa: E402
from tmpl.suffix import clear_caches  # noqa: E402

SHORT = '{"city": "Paris", "temperature_c": 21.5, "conditions": "partly cloudy", "humidity": 0.4, "wind": 12}'
LONG = "\n".join([SHORT[:-3] + "1}"] * 19 + [SHORT])  # 20 JSON lines
SIZES = {"tiny (10 chars)": "21.5 C sun", "short (100 chars)": SHORT, "long (2,000 chars)": LONG}
assert [len(c) for c in SIZES.values()] == [10, 100, 2000]


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` microseconds per call; NaN (with the reason printed) when ``fn`` raises."""
    try:
        fn()
    except Exception as exc:  # e.g. TRL's method on stock Qwen3
        print(f"    ({getattr(fn, 'label', 'baseline')} fails: {type(exc).__name__}: {str(exc)[:90]})")
        return float("nan")
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def _same(fn, msgs, expected: list[int]) -> str:
    """Whether a baseline returns the suffix tmpl returns (tmpl's is checked against full renders
    by the test suite)."""
    if fn is None:
        return "-"
    try:
        got = fn(msgs)
    except Exception:
        return "fails"
    return "= tmpl" if list(got) == expected else f"differs ({len(got)} vs {len(expected)} ids)"


def _labelled(fn, label: str):
    fn.label = label
    return fn


def tool_messages(contents: list[str]) -> list[dict]:
    names = ["get_weather", "get_time", "search_web"]
    return [
        {"role": "tool", "tool_call_id": f"call{i}xyz9"[:9], "name": names[i % 3], "content": c}
        for i, c in enumerate(contents)
    ]


def trl_method(tokenizer):
    """TRL's own suffix function, bound to a stand-in with just the attributes it reads."""
    try:
        from trl import GRPOTrainer
    except ImportError:
        return None
    standin = SimpleNamespace(
        processing_class=tokenizer, _tokenizer=tokenizer, chat_template=None, chat_template_kwargs={}, _is_vlm=False
    )
    return lambda msgs: GRPOTrainer._get_tool_suffix_ids(standin, msgs)


def renderers_method(tokenizer, family: str):
    if family != "qwen3":
        return None
    try:
        from renderers import Qwen3RendererConfig, create_renderer
    except ImportError:
        return None
    renderer = create_renderer(tokenizer, Qwen3RendererConfig())
    prompt = renderer.render_ids([{"role": "user", "content": "Weather in Paris?"}], add_generation_prompt=True)
    completion = tokenizer.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        add_special_tokens=False,
    )
    return lambda msgs: renderer.bridge_to_next_turn(
        prompt, completion, [{"role": "tool", "content": m["content"]} for m in msgs]
    )


def interleaved(variants: dict, calls: int, rounds: int = 15) -> dict[str, float]:
    """Best microseconds per call of each variant, timed in turns (``calls // 5`` calls per turn,
    ``rounds`` turns each): on a loaded machine every variant sees the same load, so the ratios
    hold even when the absolute figures drift. A variant is (fn, context factory or None)."""
    per_turn = max(calls // 5, 10)
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for label, (fn, context) in variants.items():
            with context() if context else nullcontext():
                start = time.perf_counter()
                for _ in range(per_turn):
                    fn()
                best[label] = min(best[label], (time.perf_counter() - start) / per_turn * 1e6)
    return best


class _PureTwin:
    """Runs tmpl on the pure-Python twin of the compiled core."""

    def __enter__(self) -> None:
        self.saved = _compat.ids
        _compat.ids = _compat.load("pure")["ids"]

    def __exit__(self, *exc) -> None:
        _compat.ids = self.saved


class _NoCuts:
    """Switches off the boundary cuts of every run of a template's cached frames (the old path)."""

    def __init__(self, tpl) -> None:
        self.runs = [
            run
            for frame in tpl.engine.state.frames.values()
            if not isinstance(frame, Exception)
            for layout in frame.layouts.values()
            for run in layout.runs
        ]

    def __enter__(self) -> None:
        self.saved = [(run.head_cuts, run.tail_cuts) for run in self.runs]
        for run in self.runs:
            run.head_cuts = run.tail_cuts = ()

    def __exit__(self, *exc) -> None:
        for run, (heads, tails) in zip(self.runs, self.saved):
            run.head_cuts, run.tail_cuts = heads, tails


def fixed_cost(tpl, backend, calls: int) -> None:
    """What a 10-character result costs beyond its own encode: the per-call floor of tmpl."""
    msgs = tool_messages([SIZES["tiny (10 chars)"]])
    stop = [next(iter(tpl.stop_token_ids))]
    tpl.suffix_ids(msgs, completion_ids=stop)
    frame = tpl.engine.frame(msgs, None)
    layout, fns = tpl.engine.plan(frame, msgs)
    texts = layout.texts(msgs, fns)
    best = interleaved(
        {
            "empty": (lambda: backend.encode("", add_special_tokens=False).ids, None),
            "own": (lambda: tpl.codec.encode_many(texts), None),  # the call tmpl makes (fast encoder or batch)
            "total": (lambda: tpl.suffix_ids(msgs, completion_ids=stop), None),
        },
        calls * 3,
    )
    empty, own, total = best["empty"], best["own"], best["total"]
    print(
        f"fixed cost, 1 x tiny: encode('') {empty:.1f} us; tmpl's own encode of {texts!r} {own:.1f} us; "
        f"suffix_ids {total:.1f} us, so {total - own:.1f} us outside the tokenizer"
    )


def bench_family(data: Path, family: str, calls: int, baseline: bool) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(data / family))
    tpl = tmpl.ChatTemplate(tok, name=family)
    stop = [next(iter(tpl.stop_token_ids))]
    backend = tok.backend_tokenizer
    fast = getattr(backend, "encode_batch_fast", backend.encode_batch)
    trl_fn = trl_method(tok)
    rend_fn = renderers_method(tok, family)
    print(f"\n## {family}  (compiled core: {tmpl.NATIVE})")
    header = (
        f"{'tool results':26s} {'floor':>8s} {'fast':>8s} {'tmpl':>8s} {'pure':>8s} {'no cuts':>8s} {'TRL':>9s} "
        f"{'renderers':>10s}   tmpl/floor  tmpl/fast  nocuts/floor  TRL/tmpl  renderers/tmpl  TRL output"
    )
    print(header)
    rows = {}
    for k in (1, 3):
        for label, content in SIZES.items():
            msgs = tool_messages([content] * k)
            contents = [m["content"] for m in msgs]
            try:
                expected = tpl.suffix_ids(msgs, completion_ids=stop)
            except tmpl.TmplError as exc:
                print(f"{k} x {label:20s} (tmpl: {type(exc).__name__}: {str(exc)[:100]})")
                continue
            n = max(calls * 100 // max(len(content) * k, 100), 20)
            call = lambda: tpl.suffix_ids(msgs, completion_ids=stop)  # noqa: E731
            variants = {
                "floor": (lambda: [backend.encode(c, add_special_tokens=False).ids for c in contents], None),
                "fast": (lambda: [e.ids for e in fast(contents, add_special_tokens=False)], None),
                "tmpl": (call, None),
                "pure": (call, _PureTwin),
            }
            if baseline:
                with _NoCuts(tpl):
                    assert call() == expected
                variants["no cuts"] = (call, lambda: _NoCuts(tpl))
            best = interleaved(variants, n)
            floor, t_fast, t_native, t_pure = best["floor"], best["fast"], best["tmpl"], best["pure"]
            t_old = best.get("no cuts", float("nan"))
            slow = max(n // 20, 20)
            t_trl = per_call_us(_labelled(lambda: trl_fn(msgs), "TRL"), slow) if trl_fn else float("nan")
            t_rend = per_call_us(_labelled(lambda: rend_fn(msgs), "renderers"), slow) if rend_fn else float("nan")
            rows[(k, label)] = (floor, t_fast, t_native, t_trl)
            print(
                f"{k} x {label:22s} {floor:8.1f} {t_fast:8.1f} {t_native:8.1f} {t_pure:8.1f} {t_old:8.1f} {t_trl:9.1f} "
                f"{t_rend:10.1f}   {t_native / floor:9.2f}x {t_native / t_fast:9.2f}x {t_old / floor:12.2f}x "
                f"{t_trl / t_native:8.1f}x {t_rend / t_native:14.1f}x"
                f"  {_same(trl_fn, msgs, expected)}"
            )
    fixed_cost(tpl, backend, calls)
    for label in SIZES:
        floor, t_fast, t_native, t_trl = rows[(1, label)]
        print(
            f"ratios, 1 x {label}: tmpl/floor {t_native / floor:.2f}x (target <= 1.5x; tmpl/fast floor "
            f"{t_native / t_fast:.2f}x); "
            f"TRL/tmpl {t_trl / t_native:.1f}x (TRL/floor {t_trl / floor:.1f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("TMPL_TEST_DATA", REPO.parent / "shared" / "tokenizers"))
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument(
        "--families", nargs="*", default=["qwen2.5-instruct", "llama-3.2-instruct", "mistral-nemo-instruct-2407"]
    )
    parser.add_argument("--baseline", action="store_true", help="also time tmpl with its boundary cuts off")
    args = parser.parse_args()
    data = Path(args.data)
    if not data.is_dir():
        sys.exit(f"tokenizer data not found at {data}; pass --data or set TMPL_TEST_DATA")
    print(
        "Per-call suffix time, microseconds (best turn of calls timed in turns, see interleaved); ratios from the same run."
    )
    print("floor = `tokenizers.Tokenizer.encode(content, add_special_tokens=False)` of the tool contents alone.")
    for family in args.families:
        clear_caches()
        bench_family(data, family, args.calls, args.baseline)


if __name__ == "__main__":
    main()

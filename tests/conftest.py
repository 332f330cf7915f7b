"""Shared fixtures: where the real tokenizers are, and the compiled/pure twins.

Real tokenizer data is found through ``TMPL_TEST_DATA`` (default ``../shared/tokenizers``
next to the repository). Tests that need it skip with a clear reason when it is absent.
With ``TMPL_TEST_HUB=1`` and hub access, families missing locally load by hub id.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tmpl import _compat

REPO = Path(__file__).resolve().parent.parent
#: One OpenMP thread for torch and for vLLM's CPU engine, in this process and every process a test starts
#: (set before torch or vLLM loads its OpenMP runtime). The suite runs two workers on two cores, with
#: servers and engines beside them: with a thread per core, a parallel region waits at each barrier for
#: the thread whose core another process holds. Measured on the 2-core machine (a vLLM CPU server of
#: the Qwen fixture, 400 greedy tokens): vLLM's default (two threads bound to the two cores) 5.0 s idle
#: and 96 s beside one busy process; one unbound thread 7.0 s idle and 7.5 s beside it. An environment
#: that sets OMP_NUM_THREADS keeps its own.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
for _key, _value in ONE_THREAD.items():
    os.environ.setdefault(_key, _value)
#: the environment before any test ran: subprocesses that must not inherit what imported libraries or
#: earlier tests set in ``os.environ`` (vLLM sets engine settings there) start from this
PRISTINE_ENV = dict(os.environ)
DATA = Path(os.environ.get("TMPL_TEST_DATA", REPO.parent / "shared" / "tokenizers")).resolve()

#: family folder -> hub id (used only with TMPL_TEST_HUB=1 when the folder is absent)
HUB_IDS = {
    "qwen2.5-instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "qwen3": "Qwen/Qwen3-4B",
    "llama-3.2-instruct": "meta-llama/Llama-3.2-1B-Instruct",
    "gemma-2-it": "google/gemma-2-2b-it",
    "gemma-3-it": "google/gemma-3-1b-it",
    "gemma-4-it": "google/gemma-4-E2B-it",
    "mistral-nemo-instruct-2407": "mistralai/Mistral-Nemo-Instruct-2407",
    "phi-3-mini-4k-instruct": "microsoft/Phi-3-mini-4k-instruct",
    "phi-4-mini-instruct": "microsoft/Phi-4-mini-instruct",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "gpt-oss": "openai/gpt-oss-20b",
}

FAMILIES = tuple(HUB_IDS)


def family_source(family: str) -> str | None:
    """A local folder or hub id for ``family``, or None when neither is available."""
    local = DATA / family
    if local.is_dir():
        return str(local)
    if os.environ.get("TMPL_TEST_HUB") == "1":
        return HUB_IDS.get(family)
    return None


@functools.lru_cache(maxsize=None)
def load_tokenizer(family: str):
    """The Hugging Face tokenizer of a family (cached for the session); skips when absent."""
    source = family_source(family)
    if source is None:
        pytest.skip(f"tokenizer data for {family!r} not found under TMPL_TEST_DATA={DATA} (set it, or TMPL_TEST_HUB=1)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


@functools.lru_cache(maxsize=1)
def catalog() -> list[dict]:
    """Entries of ``templates/catalog.json`` (empty when the data folder is absent)."""
    path = DATA / "templates" / "catalog.json"
    if not path.is_file():
        return []
    return json.loads(path.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def host_tokenizer(folder: str):
    """The tokenizer of a folder of TMPL_TEST_DATA (cached for the session); skips when absent."""
    if not (DATA / folder).is_dir():
        pytest.skip(f"host tokenizer {folder!r} is not in TMPL_TEST_DATA={DATA}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DATA / folder))


def template_under_test(key: str):
    """A family's own template (``key`` a family folder) or a catalog template on its host tokenizer
    (``key`` its path in the catalog), as a ChatTemplate; skips when the data is absent."""
    import tmpl

    if key in FAMILIES:
        return tmpl.ChatTemplate(host_tokenizer(key), name=key)
    entry = next(e for e in catalog() if e["template"] == key)
    text = (DATA / key).read_text(encoding="utf-8")
    return tmpl.ChatTemplate(host_tokenizer(entry["host_tokenizer"]), text, name=Path(key).name)


def catalog_ids() -> list[str]:
    return [Path(e["template"]).name for e in catalog()] or ["<no catalog>"]


@pytest.fixture
def tokenizer_of():
    """``tokenizer_of(family)`` -> the real tokenizer (skips when the data is absent)."""
    return load_tokenizer


def _load_twin(kind: str) -> SimpleNamespace:
    try:
        modules = _compat.load(kind)
    except ImportError as exc:
        pytest.skip(f"compiled core not built ({exc}); run `pip install -e .`")
    return SimpleNamespace(kind=kind, **modules)


@pytest.fixture(params=["native", "pure"], scope="session")
def core(request):
    """The compiled core or its pure twin, for tests that call the twin modules directly
    (session-scoped, so hypothesis tests may use it)."""
    return _load_twin(request.param)


@pytest.fixture(params=["native", "pure"])
def twin(request, monkeypatch):
    """Run a test on the compiled core and on its pure-Python twin.

    The twin's modules replace the ones in use where they are held (``tmpl._compat.ids``,
    ``tmpl.trajectory._twin.builder``: ``_compat.HOLDERS``), so code that calls a twin through its
    holder runs on that twin. Returns a namespace of the modules.
    """
    loaded = _load_twin(request.param)
    for name in _compat.TWIN_MODULES:
        monkeypatch.setattr(importlib.import_module(_compat.HOLDERS[name]), name, getattr(loaded, name))
    return loaded


@pytest.fixture(scope="session")
def tiny_qwen2():
    """A random-weight 2-layer Qwen2 built from a config, with the real Qwen2.5 tokenizer.

    Returns ``(model, tokenizer)``; the model is in eval mode on the CPU.
    """
    torch = pytest.importorskip("torch")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = load_tokenizer("qwen2.5-instruct")
    torch.manual_seed(1234)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )
    model = Qwen2ForCausalLM(config).eval()
    return model, tok


@pytest.fixture(scope="session")
def scale_out_server(tmp_path_factory):
    """One vLLM CPU server of the Qwen fixture with ``--enable-scale-out`` (the tokens endpoint),
    shared by the modules that need no more than that: test_vllm_server_real and
    test_rollout_distributed_vllm (xdist group engines-2, one after the other on one worker; a start is
    a minute of a 2-core CI machine). Nothing there restarts, pauses or kills it; their tests read its
    log and counters from where they began. Stopped with the worker's session (an idle server takes no
    CPU here). A :class:`tests.vllm_servers.Server`."""
    from .vllm_servers import running

    with running(tmp_path_factory.mktemp("vllm-scale-out"), "--enable-scale-out") as [server]:
        yield server


def pytest_configure(config):
    """Give the session a ledger of real-engine starts (``tests/vllm_servers.py``), unless a parent
    process (``.ci/run``) already named one; subprocesses and workers inherit it."""
    from .engine_ledger import LEDGER_ENV

    if not os.environ.get(LEDGER_ENV):
        import tempfile

        fd, path = tempfile.mkstemp(prefix="tmpl-engine-ledger-", suffix=".jsonl")
        os.close(fd)
        os.environ[LEDGER_ENV] = path
        config._tmpl_ledger_owned = path  # removed at the end of the session


def pytest_unconfigure(config):
    path = getattr(config, "_tmpl_ledger_owned", None)
    if path:
        with contextlib.suppress(OSError):
            os.remove(path)


def pytest_sessionfinish(session, exitstatus):
    """Hold the session's real-engine starts to the budget (tests/engine_ledger.py): over it, the run
    fails. Checked here, once every test ran (under pytest-xdist by the controller, whose ledger file
    every worker wrote to), not in a test that could run before others."""
    if hasattr(session.config, "workerinput"):
        return
    from .engine_ledger import over_budget, read_ledger

    problem = over_budget(read_ledger())
    if problem is not None:
        session.config._tmpl_budget_problem = problem
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    """List the session's real-engine starts (how many, their seconds, which test started each) and the
    tries of real-engine tests that missed their timing and ran again."""
    from .engine_ledger import read_ledger

    starts = read_ledger()
    if starts:
        total = sum(s["seconds"] for s in starts)
        terminalreporter.section(f"real-engine starts: {len(starts)}, {total:.0f} s until ready")
        for s in starts:
            terminalreporter.write_line(f"{s['seconds']:7.1f} s  {s['kind']:8s} {s['what']:40s} {s['test']}")
    retries = read_ledger(retries=True)
    if retries:
        terminalreporter.section(f"real-engine tries missed and run again: {len(retries)}")
        for r in retries:
            terminalreporter.write_line(f"{r['test']}: {r['what']}")
    problem = getattr(config, "_tmpl_budget_problem", None)
    if problem is not None:
        terminalreporter.section("REAL-ENGINE BUDGET EXCEEDED", red=True)
        terminalreporter.write_line(problem, red=True)


#: under pytest-xdist (``-n 2 --dist loadgroup``, pyproject's addopts) each module runs whole on one
#: worker (its module-scoped fixtures made once), except these, which share a worker with the others of
#: their group, one module after another: the real-engine modules (so at most two engines run at once,
#: one per worker and core) and the Ray clusters (one at a time). Their groups are handed out first:
#: they are the longest; "fixes" holds the two modules that share tests/fixes.py. tests/run_envs.sh's
#: modules are here too (they run in their own environments).
SERIAL_GROUPS = {
    "test_async_rl_real": "engines-1",
    "test_vllm_real": "engines-1",
    "test_vision_backends_vllm": "engines-1",
    "test_vision_rollout_vllm": "engines-1",
    "test_vllm_server_real": "engines-2",
    "test_env_vllm": "engines-2",  # on the session's scale-out server (environments, issue 38)
    "test_rollout_distributed_vllm": "engines-2",
    "test_rollout_distributed": "engines-2",
    "test_vision_backends_server": "engines-2",
    "test_history_modes_vllm": "engines-2",  # on the session's scale-out server, with the two above
    "test_gateway_vllm": "engines-2",  # on the session's scale-out server too
    "test_gateway_engine_restart": "engines-2",  # kills a server of its own, then goes on on the scale-out server
    "test_view_browser": "engines-2",  # its real rollout on the session's scale-out server
    "test_tools_mcp_vllm": "engines-2",  # on the session's scale-out server too
    "test_integrations_trl_harness": "engines-2",  # its harness runs on the session's scale-out server too
    "test_harness_vllm_dialects": "engines-2",  # one harness per dialect on the session's scale-out server
    "test_integrations_verl_agent_loop": "engines-1",
    "test_integrations_verl_vision": "engines-2",
    "test_integrations_renderers_verifiers": "engines-1",
    "test_integrations_verifiers_env": "engines-2",
    # not engines: these two ask for the same template fixes (tests/fixes.py), made once on one worker
    "test_fix": "fixes",
    "test_generation_markers": "fixes",
}


#: the agent harnesses' modules run last: CI installs their CLIs and venvs beside the suite
#: (tests/harness_installs.py), so by the time these start the installs have usually ended
HARNESS_MODULES = ("test_harness_",)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Group the tests for pytest-xdist (see :data:`SERIAL_GROUPS`); nothing changes without it.

    A wrapper, so the groups are set before any plugin's own hook reads them (xdist's worker turns
    each ``xdist_group`` mark into its node id's ``@group`` there; with pytest 9.2 a ``tryfirst``
    conftest hook ran after it and the groups were lost)."""
    if getattr(config.option, "loadgroup", False):  # --dist loadgroup, on the controller and each worker
        first, rest, last = [], [], []
        for item in items:
            module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else item.nodeid
            group = SERIAL_GROUPS.get(module)
            item.add_marker(pytest.mark.xdist_group(group or module))
            (first if group else last if module.startswith(HARNESS_MODULES) else rest).append(item)
        items[:] = first + rest + last
    return (yield)

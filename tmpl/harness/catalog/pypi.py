"""Harness specs of the PyPI harnesses and of tmpl's small SDK agents (docs/harnesses.md, "PyPI harnesses and
SDK agents").

Each runs from a venv of its own, ``<venvs>/venv-h-<name>``, that ``.ci/harnesses_py`` makes (exact pins, no
tmpl inside: a harness is a separate process talking HTTP to the gateway). ``<venvs>`` is
``$TMPL_HARNESS_VENVS`` when set, else the ``build/`` folder beside the ``tmpl`` package (a source
checkout), so the argv of every spec is an absolute path with no placeholder: the spec runs as it is.
:func:`make` builds the specs for another folder.

The SDK agents (smolagents, the OpenAI Agents SDK, LangGraph, pydantic-ai, the OpenHands SDK) are scripts of
:mod:`tmpl.harness.agents` run by path with their venv's python; each gives its model one tool,
``shell(command)``, but the OpenHands one, which uses the SDK's own ``TerminalTool`` (``terminal``). Harbor's
Terminus-2 has no spec: it runs only inside a Harbor environment (a container or a cloud sandbox).

>>> specs = make("/opt/venvs")
>>> specs["llm"].argv[0]
'/opt/venvs/venv-h-llm/bin/llm'
>>> specs["openai-agents"].argv[1].endswith("tmpl/harness/agents/openai_agents_agent.py")
True
"""

from __future__ import annotations

import os
from pathlib import Path

from ..spec import Harness

__all__ = ["AGENTS_DIR", "HARNESSES", "VENV_PINS", "make", "venv_dir", "venvs_root"]

#: the folder of the SDK agents' scripts (run by path: they import no tmpl)
AGENTS_DIR = Path(__file__).resolve().parent.parent / "agents"

#: name -> (venv name, minimum Python, exact requirements): what .ci/harnesses_py installs (kept equal to it;
#: tests/test_harness_pypi_catalog.py checks)
VENV_PINS: dict[str, tuple[str, str, str]] = {
    "mini-swe-agent": ("mini-swe-agent", "3.11", "mini-swe-agent==2.4.6"),
    "aider": ("aider", "3.11", "aider-chat==0.86.2"),
    "smolagents": ("smolagents", "3.11", "smolagents[openai]==1.26.0"),
    "openai-agents": ("openai-agents", "3.11", "openai-agents==0.24.0"),
    "langgraph": ("langgraph", "3.11", "langgraph==1.2.24 langchain-openai==1.7.4"),
    "llm": ("llm", "3.11", "llm==0.36"),
    "pydantic-ai": ("pydantic-ai", "3.11", "pydantic-ai-slim[openai]==2.68.0"),
    "openhands": ("openhands", "3.12", "openhands-sdk==1.58.2 openhands-tools==1.58.2"),
    "kimi-cli": ("kimi-cli", "3.12", "kimi-cli==1.51.0"),
}


def venvs_root() -> Path:
    """Where the harness venvs are: ``$TMPL_HARNESS_VENVS``, else ``build/`` beside the ``tmpl`` package."""
    env = os.environ.get("TMPL_HARNESS_VENVS")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[3] / "build"


def venv_dir(name: str, root: str | Path | None = None) -> Path:
    """The venv of harness ``name`` (a key of :data:`VENV_PINS`) under ``root`` (default :func:`venvs_root`)."""
    return Path(root if root is not None else venvs_root()) / f"venv-h-{VENV_PINS[name][0]}"


def _version(name: str) -> str:
    return VENV_PINS[name][2]


def _install(name: str) -> str:
    return f".ci/harnesses_py {name}  (venv-h-{VENV_PINS[name][0]}: pip install {VENV_PINS[name][2]})"


#: litellm (under mini-swe-agent, aider and the OpenHands SDK) fetches its model-price map from GitHub at import unless told not to
_LITELLM = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}

#: the ``--functions`` code given to the ``llm`` CLI: one tool, shell(command)
LLM_FUNCTIONS = '''import subprocess


def shell(command: str) -> str:
    """Run a shell command in the working directory and return its output and exit status."""
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr + "[exit " + str(done.returncode) + "]"
'''


#: aider's --test-cmd: shows the edited file and fails, so aider sends the output back once (a reflection,
#: its second call) after the edit; an answer without an edit ends the run
AIDER_TEST_CMD = "cat proof.txt; exit 1"


#: kimi-cli's ~/.kimi/config.toml: the session's chat-completions endpoint as its only model
KIMI_CONFIG = """default_model = "tmpl"
telemetry = false

[providers.gateway]
type = "openai_legacy"
base_url = "{base_url}"
api_key = "unused"

[models.tmpl]
provider = "gateway"
model = "{model}"
max_context_size = 131072
"""


def make(root: str | Path | None = None) -> dict[str, Harness]:
    """The specs with their venvs under ``root`` (default :func:`venvs_root`)."""

    def exe(name: str, program: str) -> str:
        return str(venv_dir(name, root) / "bin" / program)

    def agent(name: str, script: str, notes: str, **env: str) -> Harness:
        return Harness(
            name,
            (exe(name, "python"), str(AGENTS_DIR / script), "--model", "{model}", "{task}"),
            dialect="openai-chat",
            env={"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "unused", **env},
            timeout=300,
            version=_version(name),
            install=_install(name),
            notes=notes,
        )

    specs = [
        Harness(
            "mini-swe-agent",
            (
                exe("mini-swe-agent", "mini"),
                "--yolo",
                "--exit-immediately",
                "--model",
                "openai/{model}",
                "--task",
                "{task}",
                "--config",
                "mini.yaml",
                "--config",
                "model.model_kwargs.api_base={base_url}",
                "--output",
                "{home}/mini-trajectory.json",
            ),
            dialect="openai-chat",
            env={
                **_LITELLM,
                "OPENAI_API_KEY": "unused",
                "MSWEA_CONFIGURED": "true",  # no first-run setup prompt
                "MSWEA_COST_TRACKING": "ignore_errors",  # the gateway's model has no litellm price
                "MSWEA_GLOBAL_CONFIG_DIR": "{home}/.config/mini-swe-agent",
            },
            timeout=300,
            version=_version("mini-swe-agent"),
            install=_install("mini-swe-agent"),
            notes="litellm chat completions with one tool, bash; ends when a command prints "
            "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
        ),
        Harness(
            "aider",
            (
                exe("aider", "aider"),
                "--model",
                "openai/{model}",
                "--openai-api-base",
                "{base_url}",
                "--openai-api-key",
                "unused",
                "--message",
                "{task}",
                "--yes-always",
                "--no-git",
                "--edit-format",
                "whole",
                "--map-tokens",
                "0",
                "--no-check-update",
                "--no-show-release-notes",
                "--no-show-model-warnings",
                "--analytics-disable",
                "--no-pretty",
                "--no-fancy-input",
                "--no-detect-urls",
                "--auto-test",
                "--test-cmd",
                AIDER_TEST_CMD,
            ),
            dialect="openai-chat",
            env={**_LITELLM},
            timeout=300,
            version=_version("aider"),
            install=_install("aider"),
            notes="no function tools: its file tool is the edit format (whole files in fenced blocks); one "
            "--message turn, then a reflection when --test-cmd fails after an edit (a second call)",
        ),
        agent(
            "smolagents",
            "smolagents_agent.py",
            "ToolCallingAgent: ends with its final_answer tool; sends stop strings; sends its earlier calls "
            "back as text (a branch per call)",
        ),
        agent("openai-agents", "openai_agents_agent.py", "Runner on OpenAIChatCompletionsModel; tracing off"),
        agent("langgraph", "langgraph_agent.py", "create_react_agent on langchain-openai's ChatOpenAI"),
        agent("pydantic-ai", "pydantic_ai_agent.py", "Agent on OpenAIChatModel"),
        agent(
            "openhands",
            "openhands_agent.py",
            "openhands-sdk's Agent in a local Conversation with its TerminalTool (litellm chat completions); "
            "sends reasoning_effort and prompt_cache_key",
            **_LITELLM,
            OPENHANDS_SUPPRESS_BANNER="1",
        ),
        Harness(
            "kimi-cli",
            (exe("kimi-cli", "kimi"), "--print", "--yolo", "--prompt", "{task}"),
            dialect="openai-chat",
            files={"{home}/.kimi/config.toml": KIMI_CONFIG},
            timeout=300,
            version=_version("kimi-cli"),
            install=_install("kimi-cli"),
            notes="print mode; an openai_legacy provider in ~/.kimi/config.toml (reasoning_content sent back); "
            "telemetry off; 1.51.0 is the last working release (1.52.0 only prints that the package is "
            "archived)",
        ),
        Harness(
            "llm",
            (exe("llm", "llm"), "prompt", "--model", "tmpl", "--no-log", "--functions", LLM_FUNCTIONS, "{task}"),
            dialect="openai-chat",
            env={"LLM_USER_PATH": "{home}/llm"},
            files={
                "{home}/llm/extra-openai-models.yaml": (
                    "- model_id: tmpl\n  model_name: {model}\n  api_base: {base_url}\n  supports_tools: true\n"
                )
            },
            timeout=300,
            version=_version("llm"),
            install=_install("llm"),
            notes="an OpenAI-compatible model from extra-openai-models.yaml; tools from --functions, run "
            "without approval (no --ta)",
        ),
    ]
    return {spec.name: spec for spec in specs}


HARNESSES: dict[str, Harness] = make()

"""What the PyPI harness tests share (tests/test_harness_<name>.py for the specs of
:mod:`tmpl.harness.catalog.pypi`): the spec of an installed harness (skipped, naming the install, when its
venv is missing) and one run of it through the gateway on a template, checked by
:func:`tests.harness_util.check_episode`.

>>> served, ran, episode = episode_of("llm", "qwen2.5-instruct", monkeypatch)  # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tmpl.harness import Harness
from tmpl.harness.catalog import pypi

from .harness_util import FAMILIES, TASK, Ran, Served, check_episode, gateway_for, run_spec, shell_command


def installed(name: str) -> Harness:
    """The catalog's spec of ``name`` whose venv ``.ci/harnesses_py`` made; skips the test when it is absent."""
    venv = pypi.venv_dir(name)
    if not (venv / ".tmpl-pins").is_file():
        pytest.skip(f"{name} is not installed ({venv} missing): run .ci/harnesses_py {pypi.VENV_PINS[name][0]}")
    return pypi.HARNESSES[name]


def call_text(family: str, tool: str, arguments: dict[str, Any]) -> str:
    """``tool(arguments)`` written as ``family``'s model writes a call (tests/harness_util.py's FAMILIES)."""
    return FAMILIES[family][0].format(name=tool, args=json.dumps(arguments))


def episode_of(
    name: str,
    family: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    *,
    tool: str = "shell",
    answer: str | None = None,
) -> tuple[Served, Ran, Any]:
    """One run of harness ``name`` on ``family``: its one call is ``tool`` running
    :func:`~tests.harness_util.shell_command`; ``answer`` (the family's text answer when ``None``) is what
    the policy says once the call is in the prompt. Returns the served gateway, the run and its episode,
    the five assertions checked."""
    spec = installed(name)
    session = f"{name}-{family}"
    with gateway_for(family, tool, {"command": shell_command()}, monkeypatch) as served:
        if answer is not None:
            served.policy.answer = answer
        workdir = tmp_path / "work"
        workdir.mkdir()
        ran = run_spec(spec, served.url, session, TASK, workdir)
        episode = check_episode(served, ran, session)
    return served, ran, episode

"""What the PyPI harness tests share (tests/test_harness_<name>.py for the specs of
:mod:`tmpl.harness.catalog.pypi`): the spec of an installed harness (skipped, naming the install, when its
venv is missing) and one run of it through the gateway on a template, checked by
:func:`tests.harness_util.check_episode`.

>>> served, ran, episode = episode_of("llm", "qwen2.5-instruct", monkeypatch, tmp_path)  # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tmpl.harness import Harness
from tmpl.harness.catalog import pypi

from .harness_installs import wait_for_installs
from .harness_util import FAMILIES, TASK, Ran, Served, check_episode, check_masks, gateway_for, run_spec, shell_command


def installed(name: str) -> Harness:
    """The catalog's spec of ``name`` whose venv ``.ci/harnesses_py`` made; skips the test when it is absent
    (in CI, where the venvs are made beside the suite, it first waits for them: tests/harness_installs.py)."""
    wait_for_installs()
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
    call: tuple[str, str] | None = None,
    drops_reasoning: bool = False,
    rewrites: str | None = None,
) -> tuple[Served, Ran, Any]:
    """One run of harness ``name`` on ``family``: its one call is ``tool`` running
    :func:`~tests.harness_util.shell_command`; ``answer`` (the family's text answer when ``None``) is what
    the policy says once the call is in the prompt; ``call``: (the text of the one call, the text whose
    presence in a prompt asks for it) for a harness without function tools (aider's edit blocks). Returns
    the served gateway, the run and its episode, the five assertions checked, and every request the harness
    made a POST of its session's chat completions (each of these harnesses sends nothing else).

    Two ways a harness cannot pass the fourth (the answer's prompt continues the call's prompt and sampled
    IDs), each the harness's own doing with no setting to change it; there the run must pass the first
    three, fail the fourth, and the gateway must have opened a second sequence whose branch names the
    message field the client changed (docs/gateway.md: a client that changed its history gets the
    template's render of what it sent). A harness that stops doing so fails its test, to be written as the
    plain five then.

    - ``drops_reasoning``: it sends no ``reasoning_content`` back: on Qwen3 only (whose template renders the
      reasoning of the turns after the last user message), field ``reasoning_content``;
    - ``rewrites``: it sends its earlier turns back rewritten, on every template: the field it changes."""
    spec = installed(name)
    session = f"{name}-{family}"
    with gateway_for(family, tool, {"command": shell_command()}, monkeypatch) as served:
        if answer is not None:
            served.policy.answer = answer
        if call is not None:
            served.policy.call, served.policy.shows = call
        workdir = tmp_path / "work"
        workdir.mkdir()
        ran = run_spec(spec, served.url, session, TASK, workdir)
        # nothing beyond its main loop reaches the gateway: no model listing, no side route
        main_loop = ("POST", f"/s/{session}/v1/chat/completions", 200)
        assert served.routes and set(served.routes) == {main_loop}, (served.routes, ran.tail())
        field = "reasoning_content" if drops_reasoning and family == "qwen3" else rewrites
        if field is None:
            return served, ran, check_episode(served, ran, session)
        with pytest.raises(AssertionError, match="no later call continues the tool call's prompt") as failed:
            check_episode(served, ran, session)
        episode = served.gateway.episode(session)
        branches = [s.branch for s in episode.sequences[1:]]
        assert any(b.kind == "diverged" and b.field == field for b in branches), failed.value
        check_masks(served, session)  # the fifth still holds on the branch
        if field == "reasoning_content":  # the call's reply held the reasoning the client dropped
            for call_id in served.policy.calls:
                assert "<think>" in served.gateway.tpl.tokenizer.decode(served.policy.sampled[call_id])
    return served, ran, episode

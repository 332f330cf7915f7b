"""aider (``aider-chat``), unmodified, from its venv (.ci/harnesses_py), against the gateway on three templates:
``--model openai/<model> --openai-api-base <session URL>``, one ``--message`` turn, ``--yes-always --no-git``,
the ``whole`` edit format. aider has no function tools: its file tool is the edit block it reads from the
reply (a file name, then the file in a fence), so the policy's one call is such a block writing proof.txt;
``--auto-test --test-cmd`` (a command that shows the file and fails) makes aider send the result back once,
the answer. The issue's five assertions (tests/harness_util.py's ``check_episode``), but for the fourth: aider
builds its whole context again for every call (its edit-format reminder moves from the task's turn to the
last, the edited file's content comes in as a new user turn, "I updated the files." follows the edit), so
every prompt is the template's render of what it sent and the answer's prompt a second sequence whose
branch names the rewritten content (tests/harness_pypi.py's ``rewrites``)."""

from __future__ import annotations

import pytest

from .harness_pypi import episode_of
from .harness_util import FAMILIES, PROOF_FILE, PROOF_TEXT, TEMPLATES


@pytest.mark.parametrize("family", TEMPLATES)
def test_aider_through_the_gateway(family, monkeypatch, tmp_path):
    eos = FAMILIES[family][1].removeprefix("<think>\nIt ran.\n</think>\n\n").removeprefix("Done.")
    think = "<think>\nA whole-file edit does it.\n</think>\n\n" if family == "qwen3" else ""
    edit = f"{think}{PROOF_FILE}\n```\n{PROOF_TEXT}\n```{eos}"
    served, ran, episode = episode_of(
        "aider", family, monkeypatch, tmp_path, call=(edit, PROOF_FILE), rewrites="content"
    )
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert not any(b.get("tools") for b in (a.body for a in served.arrivals))  # no function tools
    last = served.arrivals[-1].body["messages"]
    assert PROOF_TEXT in last[-1]["content"]  # the answer's prompt ends with the test command's output

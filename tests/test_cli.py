"""Command line and the generated compatibility matrix."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys

import pytest

import tmpl
from tmpl.cli import main
from tmpl.report import matrix

from .conftest import DATA, REPO

CATALOG = DATA / "templates" / "catalog.json"


def test_matrix_of_shipped_templates_runs_offline(capsys):
    assert main(["matrix", "-q"]) == 0
    out = capsys.readouterr().out
    for info in tmpl.templates.available():
        assert f"| {info.name} | shipped | SAFE | SAFE |" in out


def test_matrix_html_is_one_self_contained_sortable_page(tmp_path):
    out = tmp_path / "m.html"
    assert main(["matrix", "-q", "--format", "html", "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and '<table id="matrix">' in page
    assert "function sortBy" in page and 'onclick="sortBy(0)"' in page
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    assert page.count("<tr>") == len(tmpl.templates.available()) + 1


def test_matrix_json_and_errors(tmp_path, capsys):
    assert main(["matrix", "-q", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == {t.name for t in tmpl.templates.available()}
    assert all(r["report"]["verdicts"]["tool_loop"]["level"] == "SAFE" for r in rows)
    assert main(["matrix", str(tmp_path / "nothing.txt")]) == 2
    assert "nothing.txt: does not exist; expected a catalog .json" in capsys.readouterr().err
    (tmp_path / "nothing.txt").write_text("x", encoding="utf-8")
    assert main(["matrix", str(tmp_path / "nothing.txt")]) == 2
    assert "not a catalog" in capsys.readouterr().err
    assert main(["matrix", str(REPO / "tmpl" / "templates")]) == 2  # bare .jinja files need --tokenizer
    assert "--tokenizer" in capsys.readouterr().err


def test_check_one_model_folder(tokenizer_of, capsys):
    tokenizer_of("qwen2.5-instruct")  # skips without the data
    assert main(["check", str(DATA / "qwen2.5-instruct"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdicts"]["tool_loop"]["label"] == "SAFE" and report["tool_close"] == "<|im_end|>"
    assert main(["check", str(DATA / "qwen3")]) == 1  # not safe itself: tmpl ships a safe one
    out, err = capsys.readouterr()
    assert "SAFE WITH tmpl TEMPLATE qwen3" in out and "tmpl ships a safe template for it: qwen3" in err


def test_training_safe_picks_the_shipped_template(tokenizer_of):
    tokenizer_of("qwen3")
    tpl = tmpl.report.training_safe(tmpl.ChatTemplate.from_pretrained(DATA / "qwen3"))
    assert tpl.template == tmpl.templates.load("qwen3") and tpl.name == "qwen3"
    plain = tmpl.report.training_safe(tmpl.ChatTemplate.from_pretrained(DATA / "qwen2.5-instruct"))
    assert plain.template == plain.tokenizer.chat_template  # already safe: unchanged


def test_console_script_entry_point():
    out = subprocess.run([sys.executable, "-m", "tmpl", "matrix", "-q"], capture_output=True, text=True, check=True)
    assert "Tool loop: 5 SAFE." in out.stdout


#: docs/compatibility.md: the generated matrix, then this line, then text written by hand
HAND_WRITTEN = "<!-- written by hand below this line -->"


@pytest.mark.skipif(not CATALOG.is_file(), reason=f"no catalog under TMPL_TEST_DATA={DATA}")
def test_compatibility_doc_is_current():
    """docs/compatibility.md is `tmpl matrix <catalog>` output; regenerate it when this fails:
    python -m tmpl matrix ../shared/tokenizers/templates/catalog.json -o /tmp/m.md, then replace the part above
    HAND_WRITTEN with it"""
    committed = (REPO / "docs" / "compatibility.md").read_text(encoding="utf-8").split(HAND_WRITTEN)[0]
    fresh = matrix.to_markdown(matrix.run_matrix(matrix.sources_from_paths([CATALOG]), progress=False))
    if fresh.rstrip("\n") != committed.rstrip("\n"):
        changed = difflib.unified_diff(
            committed.splitlines(), fresh.splitlines(), "committed", "fresh", lineterm="", n=0
        )
        pytest.fail("docs/compatibility.md differs from a fresh `tmpl matrix` run:\n" + "\n".join(list(changed)[:60]))


def test_require_images_gates_on_the_images_check(tokenizer_of, capsys):
    """``--require images``: a template that drops tool images exits 3 (UNSUPPORTED, named on stderr),
    one whose images are exact exits 0, and one that renders no image parts has nothing to gate."""
    tokenizer_of("gemma-4-it")  # skips without the data
    folder = str(DATA / "gemma-4-it")
    drops = DATA / "templates" / "llama.cpp" / "google-gemma-4-31B-it.jinja"
    exact = DATA / "templates" / "ollama" / "gemma4_e2b_chat_template.jinja"
    assert main(["check", folder, "--template", str(drops), "--require", "images"]) == 3
    assert "images suffix is UNSUPPORTED (the template drops images in tool results" in capsys.readouterr().err
    assert main(["check", folder, "--template", str(exact), "--require", "images"]) == 0
    capsys.readouterr()
    assert main(["check", str(DATA / "qwen2.5-instruct"), "--require", "images"]) == 0
    with pytest.raises(SystemExit) as bad:
        main(["check", folder, "--template", str(drops), "--require", "nothing"])
    assert bad.value.code == 2 and "choose from tool_loop, multi_user, images" in capsys.readouterr().err

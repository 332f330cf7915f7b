"""tmpl.harness.catalog.pypi's specs as data (no harness runs here): the pins .ci/harnesses_py installs are the
ones the specs' rows name, every argv points into its venv (or at a shipped agent script that exists and
imports no tmpl), and $TMPL_HARNESS_VENVS moves the venvs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tmpl.harness.catalog import pypi

ROOT = Path(__file__).resolve().parent.parent


def script_pins() -> dict[str, tuple[str, str]]:
    """.ci/harnesses_py's SPECS lines: venv name -> (minimum python, requirements), read from the script."""
    text = (ROOT / ".ci" / "harnesses_py").read_text()
    block = re.search(r"^SPECS=\((.*?)^\)", text, re.S | re.M)
    assert block, "no SPECS=( ... ) in .ci/harnesses_py"
    out = {}
    for line in re.findall(r'"([^"]+)"', block.group(1)):
        name, minpy, reqs = line.split("|")
        out[name] = (minpy, reqs)
    return out


def test_the_install_script_pins_what_the_specs_name():
    pins = script_pins()
    assert pins == {venv: (minpy, reqs) for venv, minpy, reqs in pypi.VENV_PINS.values()}
    for name, spec in pypi.HARNESSES.items():
        assert spec.version == pypi.VENV_PINS[name][2]
        assert all("==" in r for r in spec.version.split()), f"{name}: not an exact pin"


def test_every_spec_runs_from_its_venv_and_the_agent_scripts_import_no_tmpl(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPL_HARNESS_VENVS", str(tmp_path))
    specs = pypi.make()
    assert set(specs) == set(pypi.HARNESSES)
    for name, spec in specs.items():
        assert spec.argv[0].startswith(str(tmp_path / f"venv-h-{pypi.VENV_PINS[name][0]}" / "bin")), spec.argv
        assert "{" not in spec.argv[0]
        scripts = [a for a in spec.argv[1:] if a.endswith(".py")]
        for script in scripts:
            path = Path(script)
            assert path.is_file() and path.parent == pypi.AGENTS_DIR
            tree = ast.parse(path.read_text())
            imported = {
                (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names
            }
            assert not any(m == "tmpl" or m.startswith("tmpl.") for m in imported), (script, imported)


def test_the_default_root_is_build_beside_the_package(monkeypatch):
    monkeypatch.delenv("TMPL_HARNESS_VENVS", raising=False)
    assert pypi.venvs_root() == ROOT / "build"
    with pytest.raises(KeyError):
        pypi.venv_dir("no-such-harness")

"""The source layout and what gets installed from it.

The checkout keeps the Cython core in ``_native/`` (``.pyx`` with its ``.pyi``) and the shipped
templates in ``templates/``; setup.py installs them inside the package (``tmpl._ids_c``,
``tmpl.trajectory._builder_c``, ``tmpl/templates/``), into a wheel or, for an editable install, into
the checkout's ``tmpl/`` (git-ignored copies).
"""

from __future__ import annotations

import filecmp
import importlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import tmpl
from tmpl import _compat

REPO = Path(__file__).resolve().parent.parent
NATIVE_DIR = REPO / "_native"
TEMPLATES_DIR = REPO / "templates"
FROM_THIS_CHECKOUT = Path(tmpl.__file__).resolve().parent == REPO / "tmpl"


def native_modules() -> dict[str, Path]:
    """{importable name: .pyx source} from ``_native/``."""
    return {".".join(("tmpl", *p.relative_to(NATIVE_DIR).with_suffix("").parts)): p for p in NATIVE_DIR.rglob("*.pyx")}


def test_every_native_source_is_a_twin_with_a_stub_and_a_pure_twin() -> None:
    sources = native_modules()
    assert set(sources) == {compiled for compiled, _ in _compat.TWINS.values()}
    for compiled, pure in _compat.TWINS.values():
        assert sources[compiled].with_suffix(".pyi").is_file(), compiled
        assert (REPO / (pure.replace(".", "/") + ".py")).is_file(), pure  # the pure twin beside its users
    assert not list((REPO / "tmpl").rglob("*.pyx")), "Cython sources belong in _native/"


def test_native_means_every_compiled_twin_is_in_use() -> None:
    if not tmpl.NATIVE:
        pytest.skip(f"the compiled core is not in use here: {_compat.REASON}")
    from tmpl.trajectory import _twin

    for compiled, _ in _compat.TWINS.values():
        module = importlib.import_module(compiled)
        assert module.__file__ and module.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert _compat.ids.__name__ == "tmpl._ids_c" and _twin.builder.__name__ == "tmpl.trajectory._builder_c"


@pytest.mark.skipif(not FROM_THIS_CHECKOUT, reason="tmpl is not imported from this checkout")
def test_the_packages_templates_are_the_checkouts() -> None:
    # an editable install copies templates/ into tmpl/templates/: after editing templates/, the copies
    # are stale until `pip install -e .` runs again
    sources = sorted(p.name for p in TEMPLATES_DIR.iterdir() if p.suffix in (".jinja", ".json"))
    assert len(sources) >= 10
    shipped = Path(str(tmpl.templates.shipped_dir()))
    installed = sorted(p.name for p in shipped.iterdir() if p.suffix in (".jinja", ".json"))
    assert installed == sources, "tmpl/templates/ differs from templates/: run `pip install -e .`"
    stale = [n for n in sources if not filecmp.cmp(TEMPLATES_DIR / n, shipped / n, shallow=False)]
    assert not stale, f"stale copies in tmpl/templates/ (run `pip install -e .`): {stale}"
    assert sorted(t.name + ".jinja" for t in tmpl.templates.available()) == [n for n in sources if n.endswith(".jinja")]


def copy_sources(dest: Path) -> None:
    """What a clean checkout has: no compiled modules, no generated C, no in-package copies."""
    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "_native", dest / "_native", ignore=shutil.ignore_patterns("*.c", "*.html"))
    shutil.copytree(REPO / "templates", dest / "templates")
    shutil.copytree(
        REPO / "tmpl",
        dest / "tmpl",
        ignore=shutil.ignore_patterns("*.so", "*.c", "*.pyi", "_*_c.html", "*.jinja", "*.json", "__pycache__"),
    )


def venv_seeing_this_environment(venv: Path) -> Path:
    """A new venv whose packages are its own, then this environment's (never the base interpreter's).

    ``--system-site-packages`` would reach the *base* interpreter's site-packages, not this environment's
    when it is itself a venv (CI's is): on a fresh machine the base has only the image's packages (issue
    49). This environment's site directories are added as plain paths by a ``.pth`` file, so its ``.pth``
    files (an editable install's finder of the checkout's tmpl) do not run there. Returns its python.
    """
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    ours = dict.fromkeys(p for p in (sysconfig.get_path("purelib"), sysconfig.get_path("platlib")) if p)
    (Path(purelib) / "zz-this-environment.pth").write_text("".join(f"{p}\n" for p in ours))
    return python


@pytest.mark.slow
def test_a_wheel_holds_the_compiled_core_and_the_templates_and_runs_on_them(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    copy_sources(source)
    isolation = [] if importlib.util.find_spec("Cython") is None else ["--no-build-isolation"]
    env = {k: v for k, v in os.environ.items() if k not in ("TMPL_NO_EXTENSIONS", "TMPL_PURE")}
    # what goes where is checked here, not the compiled core's speed: -O0 (appended after Python's own
    # flags, so it wins) compiles the generated C several times faster on the 2-core CI machine
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            *isolation,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**env, "CFLAGS": (env.get("CFLAGS", "") + " -O0").strip()},
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("tmpl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for compiled in native_modules():
        path = compiled.replace(".", "/")
        assert path + suffix in names and path + ".pyi" in names, compiled
    templates = {f"tmpl/templates/{p.name}" for p in TEMPLATES_DIR.iterdir() if p.suffix in (".jinja", ".json")}
    assert templates <= names
    assets = {f"tmpl/view/assets/{p.name}" for p in (REPO / "tmpl" / "view" / "assets").iterdir()}
    assert {"tmpl/view/assets/page.css", "tmpl/view/assets/page.js"} <= assets <= names  # tmpl view's page
    assert not [n for n in names if n.endswith((".pyx", ".c")) or n.startswith(("_native/", "templates/"))]

    venv = tmp_path / "venv"
    python = venv_seeing_this_environment(venv)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    probe = (
        "import tmpl, json; t = tmpl.templates.available(); "
        "print(json.dumps([tmpl.__file__, tmpl.NATIVE, str(tmpl.templates.shipped_dir()), [x.name for x in t], "
        "tmpl.Trajectory.__module__, len(tmpl.templates.load('qwen3'))]))"
    )
    ran = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    where, native, shipped, available, module, length = json.loads(ran.stdout.splitlines()[-1])
    assert where.startswith(str(venv)) and shipped.startswith(str(venv))  # the wheel's tmpl, not the checkout's
    assert native is True and module == "tmpl.trajectory._builder_c"
    assert sorted(available) == sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja")) and length > 1000

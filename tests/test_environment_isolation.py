"""The guard of issue 49: what tmpl imports at run time comes from this environment, never from outside it.

CI runs in its own venv (``.ci/run`` makes ``build/venv`` from the base interpreter). A fresh machine's base
interpreter has only the image's packages (numpy, Jinja2), so a core dependency that resolves in the base
interpreter's site-packages, or in a user site directory, passes on a machine where somebody installed it
there by hand and fails on a fresh one. This test fails first, naming the package.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import site
import sys
import sysconfig
from pathlib import Path

import pytest

import tmpl

REPO = Path(__file__).resolve().parent.parent


def outside_dirs() -> list[str]:
    """Site directories that are not this environment's: the base interpreter's (when this is a venv), the user's."""
    dirs: list[str] = []
    if sys.prefix != sys.base_prefix:
        base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
        dirs += [sysconfig.get_path("purelib", vars=base), sysconfig.get_path("platlib", vars=base)]
    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if user:
        dirs.append(user)
    ours = {os.path.realpath(p) for p in (sysconfig.get_path("purelib"), sysconfig.get_path("platlib"))}
    return sorted({os.path.realpath(d) for d in dirs} - ours)


def foreign(path: str | None, outside: list[str]) -> str | None:
    """The outside directory that ``path`` lies in, or None when it is this environment's (or the stdlib's)."""
    if not path:
        return None
    real = os.path.realpath(path)
    return next((d for d in outside if real == d or real.startswith(d + os.sep)), None)


def core_requirements() -> list[str]:
    """tmpl's core dependencies (no extras), by distribution name, from the installed metadata."""
    names = []
    for line in importlib.metadata.requires("tmpl") or []:
        if "extra ==" in line:
            continue
        names.append(re.split(r"[\s<>=!~;\[(]", line, maxsplit=1)[0])
    return names


def test_foreign_names_a_module_under_the_base_interpreters_site_packages() -> None:
    # the check itself can fail: a path under an outside directory is named, this environment's is not
    outside = ["/opt/base/lib/python3.11/site-packages"]
    assert foreign("/opt/base/lib/python3.11/site-packages/tiktoken/__init__.py", outside) == outside[0]
    assert foreign("/opt/base/lib/python3.11/site-packages-other/x.py", outside) is None
    assert foreign(sysconfig.get_path("purelib") + "/x/__init__.py", outside_dirs()) is None


def test_core_dependencies_and_everything_tmpl_imports_resolve_inside_this_environment() -> None:
    outside = outside_dirs()
    requirements = core_requirements()
    assert "tiktoken" in requirements and "tokenizers" in requirements, requirements
    top_level = importlib.metadata.packages_distributions()
    wrong: list[str] = []
    for dist_name in requirements:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            wrong.append(f"{dist_name}: not installed in this environment ({sys.prefix})")
            continue
        where = foreign(str(dist.locate_file("")), outside)
        if where:
            wrong.append(f"{dist_name}: installed in {where}, outside this environment ({sys.prefix})")
        for module in sorted(m for m, dists in top_level.items() if dist.metadata["Name"] in dists):
            if module.startswith("_") and module != "_yaml":
                continue
            try:
                imported = importlib.import_module(module)
            except ImportError:
                continue  # a top-level name that is not a module of its own (a data directory)
            where = foreign(getattr(imported, "__file__", None), outside)
            if where:
                wrong.append(f"{dist_name}: its module {module} resolves to {imported.__file__}, outside ({where})")
    import tmpl.backends
    import tmpl.gateway  # noqa: F401

    for name, module in list(sys.modules.items()):
        where = foreign(getattr(module, "__file__", None), outside)
        if where:
            wrong.append(f"module {name} (imported by tmpl or a dependency) resolves to {module.__file__}, outside")
    assert not wrong, "\n".join(wrong)


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="this run is not in a venv (CI's is: .ci/run)")
def test_a_venv_run_does_not_see_the_base_interpreters_site_packages() -> None:
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    base_site = {os.path.realpath(sysconfig.get_path(k, vars=base)) for k in ("purelib", "platlib")}
    seen = [p for p in sys.path if os.path.realpath(p) in base_site]
    assert not seen, f"sys.path holds the base interpreter's site-packages {seen}: a --system-site-packages venv"
    assert Path(tmpl.__file__).resolve().is_relative_to(REPO) or Path(tmpl.__file__).resolve().is_relative_to(
        Path(sys.prefix).resolve()
    )

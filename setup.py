"""Build script: the compiled core from ``_native/`` and the shipped templates from ``templates/``.

The source tree keeps them outside the package; what gets installed keeps them inside it:

- ``_native/<path>/<name>.pyx`` is cythonized into the extension module ``tmpl.<path>.<name>``
  (``_native/_ids_c.pyx`` -> ``tmpl._ids_c``, ``_native/trajectory/_builder_c.pyx`` ->
  ``tmpl.trajectory._builder_c``); its ``.pyi`` stub is installed beside the compiled module;
- ``templates/*.jinja`` and ``templates/*.json`` are installed as ``tmpl/templates/``, where
  :mod:`tmpl.templates` reads them (``importlib.resources``).

A wheel gets both under ``tmpl/``; an editable install (``pip install -e .``) builds the extensions
in place and copies the templates into ``tmpl/templates/`` of the checkout (git-ignored copies:
after editing ``templates/``, run ``pip install -e .`` again, as after editing a ``.pyx``; the test
suite checks the copies are current).

Set ``TMPL_NO_EXTENSIONS=1`` to install the pure-Python package only (the package then runs on its
pure twins; ``tmpl.NATIVE`` is False).
"""

import os
import shutil
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent.resolve()
NATIVE = "_native"
TEMPLATES = "templates"


def native_extensions() -> list:
    if os.environ.get("TMPL_NO_EXTENSIONS", "") not in ("", "0"):
        return []
    from Cython.Build import cythonize

    sources = sorted((HERE / NATIVE).rglob("*.pyx"))
    extensions = [
        Extension(
            ".".join(("tmpl", *path.relative_to(HERE / NATIVE).with_suffix("").parts)),
            [str(path.relative_to(HERE))],
        )
        for path in sources
    ]
    return cythonize(
        extensions,
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "embedsignature": True,
        },
    )


def shipped_files() -> list[tuple[Path, Path]]:
    """(source in the checkout, destination relative to the folder holding ``tmpl/``)."""
    pairs = [(p, Path("tmpl", *p.relative_to(HERE / NATIVE).parts)) for p in sorted((HERE / NATIVE).rglob("*.pyi"))]
    for pattern in ("*.jinja", "*.json"):
        pairs += [(p, Path("tmpl", "templates", p.name)) for p in sorted((HERE / TEMPLATES).glob(pattern))]
    return pairs


class BuildPy(build_py):
    """build_py that also installs the stubs of ``_native/`` and the templates of ``templates/``
    into the package (into the build folder for a wheel, into the checkout's package for an
    editable install)."""

    def run(self) -> None:
        super().run()
        root = HERE if getattr(self, "editable_mode", False) else Path(self.build_lib)
        for source, relative in shipped_files():
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            if root != HERE:
                self._shipped.append(str(target))

    def initialize_options(self) -> None:
        super().initialize_options()
        self._shipped: list[str] = []

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *self._shipped]


setup(
    packages=find_packages(include=["tmpl", "tmpl.*"]),
    package_data={"tmpl": ["py.typed"]},
    ext_modules=native_extensions(),
    cmdclass={"build_py": BuildPy},
    zip_safe=False,
)

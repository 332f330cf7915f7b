"""Build script: cythonizes ``_native/*.pyx`` into ``tmpl._native.*``.

Set ``TMPL_NO_EXTENSIONS=1`` to install the pure-Python package only (the
package then runs on its pure twins; ``tmpl.NATIVE`` is False).
"""

import os
from pathlib import Path

from setuptools import Extension, find_packages, setup

HERE = Path(__file__).parent


def native_extensions() -> list:
    if os.environ.get("TMPL_NO_EXTENSIONS", "") not in ("", "0"):
        return []
    from Cython.Build import cythonize

    sources = sorted((HERE / "_native").glob("*.pyx"))
    extensions = [
        Extension(f"tmpl._native.{path.stem}", [f"_native/{path.name}"])
        for path in sources
    ]
    return cythonize(
        extensions,
        include_path=["_native"],
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "embedsignature": True,
        },
    )


setup(
    packages=find_packages(include=["tmpl", "tmpl.*"]) + ["tmpl.shipped"],
    package_dir={"tmpl.shipped": "templates"},
    package_data={"tmpl.shipped": ["*.jinja", "*.json"]},
    ext_modules=native_extensions(),
    zip_safe=False,
)

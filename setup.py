"""Build script: cythonizes each compiled twin (``tmpl/**/_*_c.pyx``) in place.

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

    sources = sorted((HERE / "tmpl").rglob("*.pyx"))
    extensions = [
        Extension(".".join(path.relative_to(HERE).with_suffix("").parts), [str(path.relative_to(HERE))])
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


setup(
    packages=find_packages(include=["tmpl", "tmpl.*"]),
    package_data={"tmpl": ["py.typed", "**/*.pyi"], "tmpl.templates": ["*.jinja", "*.json"]},
    ext_modules=native_extensions(),
    zip_safe=False,
)

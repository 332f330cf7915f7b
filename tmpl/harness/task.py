"""A task a harness is run on: the user's prompt, the files it starts from, the verifier that rewards it.

``files`` is either a mapping of relative path -> content (``str`` written as UTF-8, ``bytes`` as they
are) or the path of a directory whose tree is copied into each run's fresh working directory. A path
that escapes the working directory (absolute, or through ``..``) is refused when the task is made, as
is a directory that does not exist (:class:`~tmpl.errors.HarnessTaskError`); a directory that
disappears after that fails only its own runs (status ``SETUP_FAILED``, the error naming it).

>>> t = HarnessTask("Fix the bug in app.py", files={"app.py": "print(1/0)\\n"}, id="bug-1")
>>> t.id, sorted(t.files)
('bug-1', ['app.py'])
>>> HarnessTask("x", files={"../evil": ""})
Traceback (most recent call last):
...
tmpl.errors.HarnessTaskError: task 'task': files key '../evil' leaves the working directory
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import HarnessTaskError

__all__ = ["HarnessTask"]


@dataclass(frozen=True)
class HarnessTask:
    """One task: ``prompt`` (the ``{task}`` placeholder), ``files`` (see the module docstring),
    ``verifier`` (a :class:`~tmpl.harness.verifier.CommandVerifier` or a callable ``(workdir, episode) ->
    float``; None: the run has no reward), ``id`` (names its results and sessions; default: its index in
    the batch), ``timeout`` (seconds its runs may take, instead of the harness's own ``timeout``)."""

    prompt: str
    files: Mapping[str, str | bytes] | str | os.PathLike[str] | None = field(default=None)
    verifier: Any = None
    id: str | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        name = self.id or "task"
        if self.timeout is not None and not self.timeout > 0:
            raise HarnessTaskError(name, f"timeout must be positive seconds or None, not {self.timeout!r}")
        if not isinstance(self.prompt, str):
            raise HarnessTaskError(name, f"prompt must be a string, not {type(self.prompt).__name__}")
        if self.verifier is not None and not callable(self.verifier):
            raise HarnessTaskError(
                name, f"verifier must be callable (workdir, episode) -> float, not {self.verifier!r}"
            )
        if self.files is None:
            object.__setattr__(self, "files", {})
        elif isinstance(self.files, Mapping):
            for key, value in self.files.items():
                _relative(name, key)
                if not isinstance(value, (str, bytes)):
                    raise HarnessTaskError(name, f"files[{key!r}] must be str or bytes, not {type(value).__name__}")
            object.__setattr__(self, "files", dict(self.files))
        elif isinstance(self.files, (str, os.PathLike)):
            path = Path(self.files)
            if not path.is_dir():
                raise HarnessTaskError(name, f"files: {str(path)!r} is not a directory (it is missing or a file)")
            object.__setattr__(self, "files", path.resolve())
        else:
            raise HarnessTaskError(
                name, f"files must be a mapping of path -> content or a directory, not {type(self.files).__name__}"
            )

    def lay_out(self, workdir: Path) -> None:
        """Write (or copy) this task's files into ``workdir``, which exists; HarnessTaskError naming what failed."""
        name = self.id or "task"
        if isinstance(self.files, Path):
            if not self.files.is_dir():
                raise HarnessTaskError(name, f"files: the directory {str(self.files)!r} is gone")
            try:
                shutil.copytree(self.files, workdir, symlinks=True, dirs_exist_ok=True)
            except (OSError, shutil.Error) as exc:
                raise HarnessTaskError(name, f"files: copying {str(self.files)!r} failed: {exc}") from None
            return
        assert isinstance(self.files, Mapping)
        for key, value in self.files.items():
            target = workdir / key
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(value, bytes):
                    target.write_bytes(value)
                else:
                    target.write_text(value, encoding="utf-8")
            except OSError as exc:
                raise HarnessTaskError(name, f"files[{key!r}]: {exc}") from None


def _relative(name: str, key: Any) -> None:
    """A files key must be a relative path that stays inside the working directory."""
    if not isinstance(key, str) or not key:
        raise HarnessTaskError(name, f"files keys must be non-empty relative paths, not {key!r}")
    parts = PurePosixPath(key).parts
    if PurePosixPath(key).is_absolute() or ".." in parts:
        raise HarnessTaskError(name, f"files key {key!r} leaves the working directory")

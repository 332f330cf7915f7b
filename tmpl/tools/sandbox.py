"""``Toolbox(isolation="sandbox")``: each tool worker in a bubblewrap sandbox.

A sandboxed worker is the same worker as with ``isolation="process"`` (:func:`.procworker.serve`:
the tools arrive pickled, calls and answers cross one pipe, the same memory, CPU-time and output
limits), started by ``bwrap`` instead of the forkserver, in namespaces of its own:

- **no network**: a network namespace with only its own loopback (``--unshare-net``);
- **a read-only view of the system**: ``/usr``, ``/etc`` and the other system directories, the
  Python installation (prefixes and site-packages), tmpl's package and the modules the tools come
  from, all read-only; nothing else of the host (no home, no repository, no trainer's files);
- **a private scratch directory**, ``/scratch`` (also ``/tmp``, ``$HOME``, ``$TMPDIR`` and the
  working directory): a tmpfs of ``scratch_mb``, so a tool that fills it gets ``ENOSPC`` and the
  host's disk is untouched; it is the worker's own and vanishes with it;
- **a bounded number of processes** (``max_processes``, ``RLIMIT_NPROC``): a fork bomb gets
  ``EAGAIN``. ``RLIMIT_NPROC`` counts the processes of a user, and never limits root: a trainer
  running as root runs each sandbox as a user id of its own (a fresh one per worker, unused by
  any account) after bwrap set it up; other trainers get a user namespace, where the count is
  the sandbox's own (Linux 5.14+);
- **its process tree killed with it**: a PID namespace (``--unshare-pid``) whose PID 1 is the
  worker's keeper (``--as-pid-1``; :func:`.proctree.keep`: it forks the worker, reaps whatever
  is orphaned inside, and sweeps when the worker ends). Killing it (what the pool does at a
  timeout or close) makes the kernel kill every process of the namespace, ``setsid`` or not,
  before bwrap sees it gone; the keeper's lifeline does the same if the trainer dies. (bwrap's
  own init would not do: bwrap exits as soon as the command does, and its init, left behind,
  becomes a zombie of a PID 1 that may not reap);
- an empty environment (``--clearenv``: no tokens or keys of the trainer), a new session (no
  terminal to write to), IPC and UTS namespaces of its own.

>>> Sandbox(scratch_mb=16).scratch_mb
16
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.spawn
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import SandboxError

#: directories of the system shown read-only in every sandbox (those that exist)
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
#: where the scratch tmpfs is mounted inside
SCRATCH = "/scratch"
#: seconds to wait for bwrap to say the PID of its sandbox
INFO_TIMEOUT = 30.0
_UIDS = itertools.count()


@dataclass(frozen=True)
class Sandbox:
    """How ``isolation="sandbox"`` confines each worker.

    ``scratch_mb``: size of its private ``/scratch`` tmpfs. ``max_processes``: processes its user
    may hold at once (the worker included). ``paths``: host paths shown read-only inside, at the
    same place, beyond the defaults (data files a tool reads). ``bwrap``: the bubblewrap binary.

    >>> Sandbox(paths=("/data/corpus",)).paths
    ('/data/corpus',)
    """

    scratch_mb: int = 64
    max_processes: int = 64
    paths: tuple[str, ...] = ()
    bwrap: str = "bwrap"

    def __post_init__(self) -> None:
        for what in ("scratch_mb", "max_processes"):
            value = getattr(self, what)
            if not (isinstance(value, int) and value >= 1):
                raise SandboxError(f"{what} must be a positive integer, not {value!r}")
        if isinstance(self.paths, str):
            raise SandboxError(f"paths must be a list of paths, not the string {self.paths!r}")

    def launcher(self, modules: Iterable[str]) -> Launcher:
        """What starts workers whose tools come from ``modules`` (module names); raises
        :class:`~tmpl.errors.SandboxError` when bubblewrap is missing."""
        found = shutil.which(self.bwrap)
        if found is None:
            raise SandboxError(
                f"bubblewrap ({self.bwrap!r}) is not installed: `apt-get install bubblewrap` "
                "(Debian, Ubuntu), `dnf install bubblewrap` (Fedora)"
            )
        return Launcher(self, found, sorted(set(modules)))


def _visible(modules: list[str], prep: dict[str, Any], extra: Iterable[str]) -> list[str]:
    """Host paths the sandbox shows read-only: Python, site-packages, tmpl, the tools' modules."""
    import tmpl

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if ("site-packages" in p or "dist-packages" in p) and os.path.isdir(p))
    paths.add(os.path.dirname(os.path.abspath(tmpl.__file__)))
    for name in modules:
        if name in ("__main__", "__mp_main__"):
            continue  # the main script: below
        top = sys.modules.get(name.split(".")[0])
        if top is None:
            continue
        package = getattr(top, "__path__", None)
        if package is not None:
            paths.update(os.path.abspath(p) for p in package)
        elif getattr(top, "__file__", None):
            paths.add(os.path.abspath(str(top.__file__)))
    main = prep.get("init_main_from_path")
    if main:
        paths.add(main)
    paths.update(os.path.abspath(p) for p in extra)
    kept: list[str] = []
    for p in sorted(paths, key=len):  # a path under one already shown needs no mount of its own
        if os.path.exists(p) and not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return [p for p in kept if not any(p == s or p.startswith(s + "/") for s in SYSTEM)]


class Launcher:
    """Starts sandboxed workers: the bwrap command line is built once, per Toolbox."""

    def __init__(self, sandbox: Sandbox, bwrap: str, modules: list[str]) -> None:
        self.sandbox = sandbox
        self.bwrap = bwrap
        prep = multiprocessing.spawn.get_preparation_data("tmpl-tool-sandbox")
        prep.pop("dir", None)  # the trainer's working directory is not inside: it starts in /scratch
        if "authkey" in prep:  # multiprocessing refuses to pickle it as is (it is this pipe's, not a secret here)
            prep["authkey"] = bytes(prep["authkey"])
        self.prep = prep
        self.visible = _visible(modules, prep, sandbox.paths)
        self.root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.as_root = os.getuid() == 0

    def command(self, fd: int, info_fd: int, lifeline: int) -> list[str]:
        """The bwrap command line of one worker talking on ``fd`` (``lifeline``: see :func:`.proctree.keep`)."""
        cmd = [self.bwrap, "--unshare-ipc", "--unshare-pid", "--as-pid-1", "--unshare-net", "--unshare-uts"]
        cmd += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
        if self.as_root:  # no user namespace: the worker drops to a user id of its own (see the module)
            cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        for path in SYSTEM:
            if os.path.islink(path):
                cmd += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                cmd += ["--ro-bind", path, path]
        made: set[str] = set()
        for path in self.visible:
            parents = []
            parent = os.path.dirname(path)
            while parent not in ("/", "") and parent not in made:
                parents.append(parent)
                parent = os.path.dirname(parent)
            for d in reversed(parents):  # bwrap would make them 0700: closed to the worker's own user
                cmd += ["--perms", "0755", "--dir", d]
                made.add(d)
            cmd += ["--ro-bind", path, path]
        cmd += ["--proc", "/proc", "--dev", "/dev"]
        cmd += ["--size", str(self.sandbox.scratch_mb * 2**20), "--perms", "1777", "--tmpfs", SCRATCH]
        if not any(p == "/tmp" or p.startswith("/tmp/") for p in self.visible):  # else /tmp holds them
            cmd += ["--symlink", SCRATCH, "/tmp"]
        cmd += ["--remount-ro", "/", "--chdir", SCRATCH, "--clearenv"]
        bindir = os.path.dirname(sys.executable)
        env = {
            "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": SCRATCH,
            "TMPDIR": SCRATCH,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        for key, value in env.items():
            cmd += ["--setenv", key, value]
        boot = f"import sys; sys.path.insert(0, {self.root!r}); from tmpl.tools.sandbox import main; main({fd}, {lifeline})"
        return [*cmd, "--", sys.executable, "-I", "-c", boot]

    def start(self, blob: bytes, memory_mb: int | None) -> tuple[SandboxProcess, Any, Any]:
        """Start one worker; its process handle, the pool's end of its pipe, and of its lifeline."""
        parent, child = multiprocessing.Pipe()
        lifeline, life = multiprocessing.Pipe(duplex=False)
        info_r, info_w = os.pipe()
        try:
            popen = subprocess.Popen(
                self.command(child.fileno(), info_w, lifeline.fileno()),
                pass_fds=(child.fileno(), info_w, lifeline.fileno()),
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
            lifeline.close()
            os.close(info_w)
        try:
            init = _child_pid(info_r)
        finally:
            os.close(info_r)
        uid = 2_000_000_000 + (os.getpid() % 100_000) * 1000 + next(_UIDS) % 1000 if self.as_root else None
        try:
            parent.send((self.prep, blob, memory_mb, self.sandbox.max_processes, uid))
        except OSError:
            pass  # bwrap failed: the pool reads EOF and says how it ended
        return SandboxProcess(popen, init), parent, life


def _child_pid(fd: int) -> int | None:
    """The PID (here) of the sandbox's init, from bwrap's ``--info-fd`` JSON; None if bwrap failed."""
    data = b""
    while b"}" not in data:
        ready, _, _ = select.select([fd], [], [], INFO_TIMEOUT)
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            return None
        data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


class SandboxProcess:
    """A sandboxed worker as the pool sees it: the ``multiprocessing.Process`` methods it uses.

    ``terminate`` kills the sandbox's PID 1 (``SIGKILL``), which takes every process of the
    sandbox with it; ``exitcode`` is the worker's (bwrap exits with 128 + a signal's number for
    a worker killed by it: read back as ``-signal``, as ``Process`` says it).
    """

    def __init__(self, popen: subprocess.Popen[bytes], init: int | None) -> None:
        self.popen = popen
        self.init = init
        self.pid = popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    @property
    def exitcode(self) -> int | None:
        code = self.popen.returncode
        if code is None:
            return None
        return -(code - 128) if 128 < code < 128 + signal.NSIG else code

    def terminate(self) -> None:
        if self.init is not None and self.popen.poll() is None and _parent(self.init) == self.popen.pid:
            try:
                os.kill(self.init, signal.SIGKILL)
            except OSError:
                pass
        elif self.init is None:
            self.popen.kill()

    def kill(self) -> None:
        self.terminate()
        if self.popen.poll() is None:
            self.popen.kill()

    def close(self) -> None:
        pass


def _parent(pid: int) -> int | None:
    """The parent PID of ``pid`` (None if it is gone): the init's is bwrap's while it lives."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def main(fd: int, lifeline: int) -> None:
    """Inside the sandbox: take the setup from the pool, drop privileges, then serve calls."""
    from .proctree import keep
    from .procworker import serve

    conn = multiprocessing.connection.Connection(fd)
    try:
        prep, blob, memory_mb, max_processes, uid = conn.recv()
        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)  # clears every capability bwrap left
        multiprocessing.spawn.prepare(prep)  # sys.path, and the main script run as __mp_main__
    except BaseException as exc:  # noqa: BLE001 - told to the pool, which raises or answers with it
        conn.send(("broken", f"the sandbox could not start: {type(exc).__name__}: {exc}"))
        return
    keep(serve, conn, blob, memory_mb, as_code=True, lifeline=lifeline)

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
  terminal to write to), IPC and UTS namespaces of its own;
- **a seccomp filter** (:mod:`.seccomp`, loaded by bwrap with ``--seccomp``): no new namespaces
  (``unshare -U -r`` fails: no root in a user namespace of its own), no ``bpf``, ``ptrace``,
  ``perf_event_open``, ``userfaultfd``, keyrings, mounts or kernel modules; where bwrap runs
  unprivileged (0.8+) also ``--disable-userns``.

:func:`wrap_command` puts any program (an agent harness: a node CLI, a Python venv) in the same
kind of sandbox, hardened the same way, with one way out: the gateway, a Unix socket bound in and
forwarded to ``127.0.0.1:PORT`` inside (:class:`GatewayRelay` makes such a socket for a gateway
that serves TCP).

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
from .seccomp import program, program_fd

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

    def command(self, fd: int, info_fd: int, lifeline: int, seccomp_fd: int | None = None) -> list[str]:
        """The bwrap command line of one worker talking on ``fd`` (``lifeline``: see :func:`.proctree.keep`;
        ``seccomp_fd``: where bwrap reads the filter of :mod:`.seccomp`)."""
        cmd = [self.bwrap, "--unshare-ipc", "--unshare-pid", "--as-pid-1", "--unshare-net", "--unshare-uts"]
        cmd += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
        cmd += _userns_args(self.bwrap, self.as_root)
        if seccomp_fd is not None:
            cmd += ["--seccomp", str(seccomp_fd)]
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
        seccomp_fd = program_fd()
        try:
            popen = subprocess.Popen(
                self.command(child.fileno(), info_w, lifeline.fileno(), seccomp_fd),
                pass_fds=(child.fileno(), info_w, lifeline.fileno(), seccomp_fd),
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
            lifeline.close()
            os.close(info_w)
            os.close(seccomp_fd)
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


# -- any program in the sandbox (harnesses): wrap_command ---------------------------------------
#: where the gateway's Unix socket appears inside a wrapped command's sandbox
GATEWAY_SOCKET = "/run/tmpl/gateway.sock"
#: where the in-sandbox init program (:mod:`.sandbox_run`) appears inside
INIT_SCRIPT = "/run/tmpl/sandbox_run.py"
#: HOME inside when ``home`` is None: a private tmpfs
PRIVATE_HOME = "/home/sandbox"
_DISABLE_USERNS: dict[str, bool] = {}


def _userns_args(bwrap: str, as_root: bool) -> list[str]:
    """``--unshare-user --disable-userns`` where bwrap has it (0.8+) and runs unprivileged: the
    sandbox then cannot make a user namespace of its own (its max_user_namespaces is 1, used).
    As root there is no user namespace (the sandbox drops to a user id of its own instead), and
    the seccomp filter's namespace rule is what denies it."""
    if as_root:
        return []
    if bwrap not in _DISABLE_USERNS:
        try:
            setuid = bool(os.stat(bwrap).st_mode & 0o4000)  # a setuid bwrap refuses the option
            text = (
                "" if setuid else subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30).stdout
            )
        except (OSError, subprocess.SubprocessError):
            text = ""
        _DISABLE_USERNS[bwrap] = "--disable-userns" in text
    return ["--unshare-user", "--disable-userns"] if _DISABLE_USERNS[bwrap] else []


def _sandbox_uid() -> int:
    """A user id of its own for a sandbox started by root (unused by any account; see the module)."""
    return 2_000_000_000 + (os.getpid() % 100_000) * 1000 + next(_UIDS) % 1000


def _under(path: str, tops: Iterable[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)


def wrap_command(
    argv: list[str],
    *,
    workdir: str,
    home: str | None = None,
    read_only: Iterable[str] = (),
    env: dict[str, str] | None = None,
    scratch_mb: int = 512,
    max_processes: int = 256,
    gateway_socket: str | None = None,
    gateway_port: int | None = None,
    bwrap: str = "bwrap",
    pass_fds: Iterable[int] = (),
) -> list[str]:
    """The command line that runs ``argv`` in a sandbox whose only way out is the gateway.

    Start it with any ``subprocess.Popen`` (or ``asyncio.create_subprocess_exec``): the process
    is a small Python step (:mod:`.sandbox_run`) that puts the seccomp filter on a pipe, starts
    bwrap and waits for it. Killing it (any signal, ``SIGKILL`` included) kills the whole sandbox:
    it holds the one write end of a lifeline the sandbox's PID 1 reads, which at its EOF kills
    itself, and the kernel then every process of its PID namespace. Its exit status is the
    command's (128 + N when signal N killed it); 127: the command could not be started.

    Inside: the system (``/usr``, ``/etc``, ...) and ``read_only`` (a harness's install: its
    ``node_modules``, its venv; any host path) read-only at the same paths; ``workdir`` bound
    read-write at the same path (the command starts there); ``HOME`` a private tmpfs at
    ``/home/sandbox`` of ``scratch_mb``, or ``home``, a host directory bound read-write at the
    same path (where the caller wrote the harness's config files); ``/tmp`` a private tmpfs of
    ``scratch_mb``; nothing else of the host. Network: a namespace of its own with only
    loopback; with ``gateway_socket`` (the host path of a Unix socket where the gateway listens:
    ``uvicorn.run(app, uds=...)``, or a :class:`GatewayRelay`'s ``.path``) it is bound in and the
    sandbox's PID 1 forwards ``127.0.0.1:gateway_port`` (and ``[::1]``) inside to it, so the
    harness's base URL is ``http://127.0.0.1:{gateway_port}/...``; every other address is
    unreachable and DNS fails. The environment is ``env`` alone (plus ``PATH``, ``HOME``,
    ``TMPDIR``, ``LANG`` when ``env`` lacks them). Open file descriptors: the standard three, and
    ``pass_fds``, those the caller also passes to ``Popen(pass_fds=...)``, at the same numbers
    (a pipe the harness reports on); no other. At most ``max_processes`` processes
    (``RLIMIT_NPROC``). The seccomp filter of :mod:`.seccomp` holds for every process: no new
    namespaces (``unshare -U -r`` fails), no ``bpf``, ``ptrace``, ``mount``, module or keyring calls.

    Run as root, the sandbox runs as a user id of its own (as ``Toolbox``'s do), and ``workdir``
    and ``home`` are handed to it (``chown -R``) when it starts: their files belong to that id
    afterwards (root reads them all the same). Run as another user, it keeps that user's id (in a
    user namespace of bwrap's, closed with ``--disable-userns`` on bwrap 0.8+).

    >>> with GatewayRelay("127.0.0.1", 8000) as relay:                       # doctest: +SKIP
    ...     cmd = wrap_command(
    ...         ["node", "/opt/agent/node_modules/.bin/agent", "--task", "fix the bug"],
    ...         workdir="/tmp/episode-17/repo",
    ...         read_only=["/opt/agent"],
    ...         env={"OPENAI_BASE_URL": "http://127.0.0.1:8080/s/17/v1", "OPENAI_API_KEY": "x"},
    ...         gateway_socket=relay.path,
    ...         gateway_port=8080,
    ...     )
    ...     done = subprocess.run(cmd, capture_output=True, timeout=600)
    >>> wrap_command(["true"], workdir="/usr")
    Traceback (most recent call last):
    ...
    tmpl.errors.SandboxError: isolation='sandbox': '/usr' is a system directory: it cannot be the sandbox's writable directory
    """
    if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
        raise SandboxError(f"argv must be a non-empty list of strings, not {argv!r}")
    for what, value in (("scratch_mb", scratch_mb), ("max_processes", max_processes)):
        if not (isinstance(value, int) and value >= 1):
            raise SandboxError(f"{what} must be a positive integer, not {value!r}")
    if isinstance(read_only, str):
        raise SandboxError(f"read_only must be a list of paths, not the string {read_only!r}")
    pass_fds = list(pass_fds)
    if not all(isinstance(fd, int) and fd > 2 for fd in pass_fds):
        raise SandboxError(f"pass_fds must be file descriptors above 2, not {pass_fds!r}")
    if (gateway_socket is None) != (gateway_port is None):
        raise SandboxError("gateway_socket and gateway_port go together: the socket and the port it appears on inside")
    if gateway_port is not None and not (isinstance(gateway_port, int) and 1024 <= gateway_port <= 65535):
        raise SandboxError(
            f"gateway_port must be an unprivileged TCP port (1024-65535: the sandbox has no capability), "
            f"not {gateway_port!r}"
        )
    found = shutil.which(bwrap)
    if found is None:
        raise SandboxError(
            f"bubblewrap ({bwrap!r}) is not installed: `apt-get install bubblewrap` (Debian, Ubuntu), "
            "`dnf install bubblewrap` (Fedora)"
        )
    workdir = os.path.abspath(workdir)
    if not os.path.isdir(workdir):
        raise SandboxError(f"workdir {workdir!r} is not a directory")
    if home is not None:
        home = os.path.abspath(home)
        if not os.path.isdir(home):
            raise SandboxError(f"home {home!r} is not a directory")
    if gateway_socket is not None:
        gateway_socket = os.path.abspath(gateway_socket)
        if not os.path.exists(gateway_socket):
            raise SandboxError(f"gateway_socket {gateway_socket!r} does not exist: start the gateway (or relay) first")
    as_root = os.getuid() == 0
    uid = _sandbox_uid() if as_root else None
    python = os.path.realpath(sys.executable)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_run.py")

    ro = {sys.base_prefix, os.path.dirname(python), *(os.path.abspath(p) for p in read_only)}
    missing = sorted(p for p in ro if not os.path.exists(p))
    if missing:
        raise SandboxError(f"read_only paths do not exist: {missing}")
    ro_kept: list[str] = []
    for p in sorted(ro, key=len):  # a path under one already shown needs no mount of its own
        if not _under(p, ro_kept) and not _under(p, SYSTEM):
            ro_kept.append(p)

    cmd = [found, "--unshare-ipc", "--unshare-pid", "--as-pid-1", "--unshare-net", "--unshare-uts"]
    cmd += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    cmd += _userns_args(found, as_root)
    cmd += ["--seccomp", "{seccomp}"]
    if as_root:  # PID 1 drops to the sandbox's user id itself, then runs the command
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    for path in SYSTEM:
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    size = str(scratch_mb * 2**20)
    made: set[str] = {"/tmp", "/run", "/run/tmpl"}
    cmd += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"]
    cmd += ["--perms", "0755", "--dir", "/run", "--perms", "0755", "--dir", "/run/tmpl"]
    if home is None:
        cmd += ["--size", size, "--perms", "0777" if as_root else "0700", "--tmpfs", PRIVATE_HOME]
        made.add(PRIVATE_HOME)

    def parents(path: str) -> list[str]:
        out = []
        parent = os.path.dirname(path)
        while parent not in ("/", "") and parent not in made and not _under(parent, SYSTEM):
            out.append(parent)
            parent = os.path.dirname(parent)
        for d in reversed(out):  # bwrap would make them 0700: closed to the sandbox's own user
            made.add(d)
        return [a for d in reversed(out) for a in ("--perms", "0755", "--dir", d)]

    writable = [workdir] + ([home] if home else [])
    for path in writable:
        if path == "/" or _under(path, SYSTEM):
            raise SandboxError(f"{path!r} is a system directory: it cannot be the sandbox's writable directory")
    binds = [(p, "--ro-bind") for p in ro_kept if p not in writable] + [(p, "--bind") for p in writable]
    for path, how in sorted(binds, key=lambda b: len(b[0])):  # outer first: a venv inside the workdir stays read-only
        cmd += parents(path) + [how, path, path]
    cmd += ["--ro-bind", here, INIT_SCRIPT]
    if gateway_socket is not None:
        cmd += ["--bind", gateway_socket, GATEWAY_SOCKET]
    cmd += ["--remount-ro", "/", "--chdir", workdir, "--clearenv"]
    full = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home or PRIVATE_HOME,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        **(env or {}),
    }
    for key, text in full.items():
        cmd += ["--setenv", key, text]
    init = {
        "argv": list(argv),
        "env": full,
        "max_processes": max_processes,
        "uid": uid,
        "socket": GATEWAY_SOCKET if gateway_socket is not None else None,
        "port": gateway_port,
        "pass_fds": sorted(pass_fds),
    }
    cmd += ["--", python, "-I", "-S", INIT_SCRIPT, "init", json.dumps(init), "{lifeline}"]
    host = {
        "seccomp": program().hex(),
        "bwrap": cmd,
        "uid": uid,
        "chown": [workdir] + ([home] if home else []),
    }
    return [python, "-I", "-S", here, "host", json.dumps(host)]


class GatewayRelay:
    """A Unix socket on the host that relays each connection to the gateway's TCP address: what
    :func:`wrap_command` binds into a sandbox as ``gateway_socket`` when the gateway serves TCP.

    Its socket lives in a private directory of its own (``.path``), connectable by any user (the
    sandbox may run as a user id of its own); closing the relay (or leaving the ``with``) removes
    it. Connections already relayed run on until either side closes.

    >>> with GatewayRelay("127.0.0.1", 9) as relay:
    ...     os.path.basename(relay.path)
    'gateway.sock'
    """

    def __init__(self, host: str, port: int) -> None:
        import socket
        import tempfile
        import threading

        from . import sandbox_run

        self.host, self.port = host, port
        self.dir = tempfile.mkdtemp(prefix="tmpl-gateway-")
        os.chmod(self.dir, 0o755)
        self.path = os.path.join(self.dir, "gateway.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o666)
        self.listener.listen(128)

        def connect() -> socket.socket:
            return socket.create_connection((host, port), timeout=30)

        def connect_blocking() -> socket.socket:
            sock = connect()
            sock.settimeout(None)
            return sock

        self.thread = threading.Thread(
            target=sandbox_run.relay, args=(self.listener, connect_blocking), daemon=True, name="tmpl-gateway-relay"
        )
        self.thread.start()

    def close(self) -> None:
        """Stop accepting and remove the socket and its directory."""
        import socket

        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self.thread.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> GatewayRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

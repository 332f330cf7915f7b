"""Escape attempts, each a real call to the kernel: run inside a sandbox (a ``Toolbox`` tool, a
command of :func:`tmpl.tools.sandbox.wrap_command`) and outside it as controls.

Standard library only (ctypes), so that it runs as a script in any sandbox: ``python
sandbox_escapes.py NAME...`` prints ``{name: outcome}`` as JSON. An outcome is ``"ok ..."`` when
the kernel did what was asked, ``"denied ERRNO"`` when the call failed with that errno.

Its syscall numbers are its own (from the kernel's syscall tables), not tmpl's.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile

# name: (x86_64, aarch64)
NR = {
    "unshare": (272, 97),
    "clone": (56, 220),
    "bpf": (321, 280),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "mount": (165, 40),
    "umount2": (166, 39),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "setns": (308, 268),
}
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def nr(name: str) -> int:
    return NR[name][0 if platform.machine() in ("x86_64", "AMD64") else 1]


def syscall(name: str, *args: int | bytes | ctypes.Array | None) -> int:
    """The raw syscall; raises OSError with its errno when it fails."""
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ret = _libc.syscall(ctypes.c_long(nr(name)), *conv)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def _close(fd: int) -> str:
    os.close(fd)
    return "ok"


def unshare_user_cli() -> str:
    """util-linux ``unshare -U -r id``: root in a user namespace of one's own."""
    done = subprocess.run(["unshare", "-U", "-r", "id"], capture_output=True, text=True, timeout=30)
    if done.returncode == 0:
        return "ok " + done.stdout.strip()
    return "denied " + done.stderr.strip()


def unshare_mount_cli() -> str:
    """``unshare -U -r -m`` then mount a tmpfs: the classic chain to mount rights."""
    script = "mount -t tmpfs none /tmp && echo mounted"
    done = subprocess.run(["unshare", "-U", "-r", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=30)
    if done.returncode == 0:
        return "ok " + done.stdout.strip()
    return "denied " + done.stderr.strip()


def unshare_user() -> str:
    """``unshare(CLONE_NEWUSER)`` in a child (the caller's namespaces stay as they are)."""
    return _in_child(lambda: syscall("unshare", CLONE_NEWUSER))


def clone_user() -> str:
    """``clone(CLONE_NEWUSER | SIGCHLD)``: a child born in a new user namespace."""
    try:
        pid = syscall("clone", CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)
    except OSError as exc:
        return "denied " + errno.errorcode[exc.errno]
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return "ok"


def _in_child(call) -> str:
    """Run ``call`` in a forked child; its outcome as the child reports it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            call()
            out = "ok"
        except OSError as exc:
            out = "denied " + errno.errorcode.get(exc.errno, str(exc.errno))
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1024):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return data.decode()


def bpf() -> str:
    """``bpf(BPF_MAP_CREATE)`` of a one-entry array map."""
    attr = (ctypes.c_uint32 * 30)(2, 4, 4, 1)  # map_type ARRAY, key_size, value_size, max_entries
    return _close(syscall("bpf", 0, attr, ctypes.sizeof(attr)))


def keyctl() -> str:
    """``keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_PROCESS_KEYRING, create)``: a keyring of its own."""
    syscall("keyctl", 0, -2, 1)
    return "ok"


def add_key() -> str:
    """``add_key("user", ...)`` into the process keyring."""
    return "ok" if syscall("add_key", b"user", b"tmpl-probe", b"x", 1, -2) > 0 else "ok?"


def perf_event_open() -> str:
    """``perf_event_open`` of a software task clock on itself, user space only."""
    attr = (ctypes.c_uint64 * 16)()
    attr[0] = 1 | (64 << 32)  # type PERF_TYPE_SOFTWARE, size PERF_ATTR_SIZE_VER0
    attr[1] = 1  # config PERF_COUNT_SW_TASK_CLOCK
    attr[5] = 1 | (1 << 5) | (1 << 6)  # disabled, exclude_kernel, exclude_hv
    return _close(syscall("perf_event_open", attr, 0, -1, -1, 0))


def userfaultfd() -> str:
    """``userfaultfd(O_CLOEXEC | UFFD_USER_MODE_ONLY)`` (what an unprivileged user may open)."""
    return _close(syscall("userfaultfd", os.O_CLOEXEC | 1))


def ptrace_sibling() -> str:
    """``PTRACE_ATTACH`` from one child to its sibling (same user, neither an ancestor)."""
    target = subprocess.Popen(["sleep", "30"])
    try:
        attacker = [sys.executable, "-I", "-S", os.path.abspath(__file__), "ptrace_attach", str(target.pid)]
        done = subprocess.run(attacker, capture_output=True, text=True, timeout=30)
        return done.stdout.strip() or "denied " + done.stderr.strip()[-200:]
    finally:
        target.kill()
        target.wait()


def ptrace_attach(pid: int) -> str:
    try:
        syscall("ptrace", 16, pid, 0, 0)  # PTRACE_ATTACH
    except OSError as exc:
        return "denied " + errno.errorcode[exc.errno]
    os.waitpid(pid, 0x40000000)  # __WALL: the tracee stopped
    syscall("ptrace", 17, pid, 0, 0)  # PTRACE_DETACH
    return "ok"


def process_vm_readv() -> str:
    """``process_vm_readv`` of its own memory (what a reader of a sibling's memory calls)."""
    src = ctypes.create_string_buffer(b"secret")
    dst = ctypes.create_string_buffer(6)

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    local = Iovec(ctypes.cast(dst, ctypes.c_void_p), 6)
    remote = Iovec(ctypes.cast(src, ctypes.c_void_p), 6)
    syscall("process_vm_readv", os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return "ok " + dst.raw.decode()


def mount() -> str:
    """``mount("none", dir, "tmpfs")`` in a child that first tries a mount namespace of its own."""

    def call() -> None:
        try:
            syscall("unshare", CLONE_NEWNS)  # as root outside: keeps the host's mounts untouched
        except OSError:
            pass
        where = tempfile.mkdtemp()
        syscall("mount", b"none", where.encode(), b"tmpfs", 0, 0)
        syscall("umount2", where.encode(), 0)

    return _in_child(call)


def init_module() -> str:
    """``init_module`` of an empty image: refused by the module loader (not EPERM) where allowed."""
    syscall("init_module", 0, 0, b"")
    return "ok"


def finit_module() -> str:
    """``finit_module`` of a file that is no module."""
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        syscall("finit_module", fd, b"", 0)
    finally:
        os.close(fd)
    return "ok"


def setns() -> str:
    """``setns`` into its own network namespace (a no-op where allowed)."""
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        syscall("setns", fd, 0)
    finally:
        os.close(fd)
    return "ok"


ATTEMPTS = {
    f.__name__: f
    for f in (
        unshare_user_cli,
        unshare_mount_cli,
        unshare_user,
        clone_user,
        bpf,
        keyctl,
        add_key,
        perf_event_open,
        userfaultfd,
        ptrace_sibling,
        process_vm_readv,
        mount,
        init_module,
        finit_module,
        setns,
    )
}


def attempt(name: str) -> str:
    """One attempt's outcome: ``"ok ..."`` or ``"denied ERRNO"``."""
    try:
        return ATTEMPTS[name]()
    except OSError as exc:
        return "denied " + errno.errorcode.get(exc.errno or 0, str(exc.errno))


def attempt_all() -> str:
    """Every attempt, as JSON (a tool's answer)."""
    return json.dumps({name: attempt(name) for name in ATTEMPTS})


def raw_all(numbers: list[int]) -> str:
    """``syscall(nr, -1, -1, -1, -1, -1, -1)`` for each number: its errno name, or "ok"."""
    out = {}
    for n in numbers:
        ret = _libc.syscall(ctypes.c_long(n), *[ctypes.c_long(-1)] * 6)
        out[str(n)] = "ok" if ret >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
    return json.dumps(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["ptrace_attach"]:
        print(ptrace_attach(int(sys.argv[2])))
    elif sys.argv[1:2] == ["raw"]:
        print(raw_all([int(a) for a in sys.argv[2:]]))
    else:
        print(json.dumps({name: attempt(name) for name in (sys.argv[1:] or ATTEMPTS)}))

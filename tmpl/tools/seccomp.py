"""The seccomp filter of every sandbox: a classic-BPF program, built here, that bwrap loads.

bwrap loads it (``--seccomp FD``, after ``PR_SET_NO_NEW_PRIVS``) just before it runs the sandbox's
first process, so bwrap's own setup (mounts, namespaces) is done and everything the sandbox runs
(a tool worker, a harness, whatever they start) inherits it; no process can remove a filter.

What it denies, each with ``EPERM`` unless said otherwise (neither a tool nor a harness needs any
of these; each is kernel attack surface that sandbox escapes and privilege escalations have used):

- **new namespaces**: ``unshare`` and ``clone`` whose flags ask for one (``CLONE_NEWUSER`` above
  all: a nested user namespace makes its creator root inside it, with every capability there,
  and opens the parts of the kernel that trust ``CAP_SYS_ADMIN``: mounts, netfilter, ...);
  ``setns``; ``clone3``, whose flags lie in memory a filter cannot read, answers ``ENOSYS``, the
  answer of an older kernel, so libc falls back to ``clone`` (glibc 2.34+ does);
- **eBPF and tracing**: ``bpf``, ``perf_event_open``;
- **kernel keyrings**: ``keyctl``, ``add_key``, ``request_key``;
- **userfaultfd** (it lets a process stall the kernel mid-copy: the classic race-widener);
- **debugging other processes**: ``ptrace`` (all of it, ``PTRACE_TRACEME`` included: a sandbox
  runs no debugger, and a harness has no business reading a sibling's memory), ``process_vm_readv``
  / ``process_vm_writev``, ``pidfd_getfd`` (stealing another process's file descriptors), ``kcmp``;
- **kernel modules**: ``init_module``, ``finit_module``, ``delete_module`` (and the obsolete
  ``create_module``, ``get_kernel_syms``, ``query_module``, ``uselib``, ``nfsservctl``);
- **mounts**: ``mount``, ``umount2``, ``pivot_root``, ``chroot``, and the new mount API
  (``open_tree``, ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``,
  ``mount_setattr``);
- **the machine's state**: ``kexec_load``, ``kexec_file_load``, ``reboot``, ``swapon``, ``swapoff``,
  ``acct``, ``quotactl``, ``quotactl_fd``, ``syslog``, the clock (``settimeofday``,
  ``clock_settime``, ``clock_adjtime``, ``adjtimex``), ``vhangup``, ``iopl`` and ``ioperm`` (x86),
  ``lookup_dcookie``, ``fanotify_init``, ``name_to_handle_at`` and ``open_by_handle_at`` (the
  "shocker" escape, opening host files by handle);
- **io_uring** (``io_uring_setup``, ``_enter``, ``_register``) answers ``ENOSYS``: a large
  kernel surface with a long record of exploits (Google turned it off on its servers and in
  ChromeOS); ``ENOSYS`` is how an older kernel answers, so libuv (node), liburing users and
  runtimes fall back to ``epoll`` and threads.

A syscall of another ABI (a 32-bit ``int 0x80`` call on x86_64, an x32 call) would bypass the
numbers above, which are the native ABI's: the filter kills the process (``SECCOMP_RET_KILL_PROCESS``)
for any other architecture, and denies every x32 syscall number.

Syscall numbers exist for x86_64 and aarch64; any other machine raises
:class:`~tmpl.errors.SandboxError`.

>>> len(program("x86_64")) % 8
0
>>> sorted(DENIED)[:3]
['acct', 'add_key', 'adjtimex']
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import struct

from ..errors import SandboxError

# classic BPF opcodes (linux/filter.h, linux/bpf_common.h)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

# seccomp return values (linux/seccomp.h)
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

# offsets in struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # args[0]'s low 32 bits: both architectures are little-endian

#: AUDIT_ARCH_* of each supported machine (linux/audit.h)
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
#: x86_64's x32 ABI: its syscall numbers carry this bit
X32_SYSCALL_BIT = 0x40000000

#: the namespace flags of clone(2) and unshare(2) (linux/sched.h); CLONE_NEWTIME (0x80) is
#: unshare's only: clone's low byte is the exit signal
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080
CLONE_NAMESPACES = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
)

#: syscall numbers: name -> (x86_64, aarch64); None where the ABI has no such call
#: (from the kernel's arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h)
SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    "bpf": (321, 280),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "kcmp": (312, 272),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "create_module": (174, None),
    "get_kernel_syms": (177, None),
    "query_module": (178, None),
    "uselib": (134, None),
    "nfsservctl": (180, 42),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "setns": (308, 268),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "quotactl": (179, 60),
    "quotactl_fd": (443, 443),
    "syslog": (103, 116),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "clock_adjtime": (305, 266),
    "adjtimex": (159, 171),
    "vhangup": (153, 58),
    "iopl": (172, None),
    "ioperm": (173, None),
    "lookup_dcookie": (212, 18),
    "fanotify_init": (300, 262),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    # answered specially (below), never denied outright
    "unshare": (272, 97),
    "clone": (56, 220),
    "clone3": (435, 435),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
}
#: answered ENOSYS: "this kernel has no such call", so that callers fall back
NOT_IMPLEMENTED = ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register")
#: denied only with a namespace flag in args[0]
NAMESPACE_FLAGS = {"clone": CLONE_NAMESPACES, "unshare": CLONE_NAMESPACES | CLONE_NEWTIME}
#: denied outright (EPERM)
DENIED = tuple(name for name in SYSCALLS if name not in NOT_IMPLEMENTED and name not in NAMESPACE_FLAGS)


def machine() -> str:
    """This machine's architecture, as :data:`AUDIT_ARCH` names it.

    >>> machine() in AUDIT_ARCH
    True
    """
    name = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def number(name: str, arch: str | None = None) -> int | None:
    """The syscall number of ``name`` on ``arch`` (this machine's by default); None where it has none.

    >>> number("bpf", "x86_64"), number("bpf", "aarch64"), number("iopl", "aarch64")
    (321, 280, None)
    """
    arch = arch or machine()
    if arch not in AUDIT_ARCH:
        raise SandboxError(f"no seccomp syscall table for the {arch!r} architecture (x86_64 and aarch64 have one)")
    return SYSCALLS[name][0 if arch == "x86_64" else 1]


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program(arch: str | None = None) -> bytes:
    """The compiled filter for ``arch`` (this machine's by default): an array of
    ``struct sock_filter``, what ``bwrap --seccomp FD`` reads from ``FD``. Built once per
    architecture (every sandboxed run asks for it; the bytes never change).

    >>> program("aarch64") != program("x86_64")
    True
    """
    return _program(arch or machine())


@functools.cache
def _program(arch: str) -> bytes:
    if arch not in AUDIT_ARCH:
        raise SandboxError(f"no seccomp syscall table for the {arch!r} architecture (x86_64 and aarch64 have one)")
    eperm = RET_ERRNO | errno.EPERM
    enosys = RET_ERRNO | errno.ENOSYS
    out = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, AUDIT_ARCH[arch], jt=1),  # another ABI: killed
        _insn(_RET_K, RET_KILL_PROCESS),
        _insn(_LD_W_ABS, _NR),
    ]
    if arch == "x86_64":
        out += [_insn(_JGE_K, X32_SYSCALL_BIT, jf=1), _insn(_RET_K, eperm)]
    for names, answer in ((DENIED, eperm), (NOT_IMPLEMENTED, enosys)):
        for name in names:
            nr = number(name, arch)
            if nr is not None:  # if nr: answer, else skip the answer
                out += [_insn(_JEQ_K, nr, jf=1), _insn(_RET_K, answer)]
    for name, mask in NAMESPACE_FLAGS.items():
        nr = number(name, arch)
        assert nr is not None
        # if nr: load args[0], deny if it has a namespace flag, else allow; else skip these 4
        out += [
            _insn(_JEQ_K, nr, jf=4),
            _insn(_LD_W_ABS, _ARG0_LOW),
            _insn(_JSET_K, mask, jf=1),
            _insn(_RET_K, eperm),
            _insn(_RET_K, RET_ALLOW),
        ]
    out.append(_insn(_RET_K, RET_ALLOW))
    return b"".join(out)


def program_fd(arch: str | None = None) -> int:
    """A file descriptor to read the filter from (a pipe's read end, its write end closed): what
    ``bwrap --seccomp FD`` takes. The caller passes it to bwrap and closes it afterwards.

    >>> fd = program_fd(); data = os.read(fd, 1 << 16); os.close(fd); data == program()
    True
    """
    data = program(arch)
    read, write = os.pipe()
    try:
        os.write(write, data)  # a few hundred bytes: far below a pipe's buffer
    finally:
        os.close(write)
    return read

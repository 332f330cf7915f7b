"""The two small programs behind :func:`tmpl.tools.sandbox.wrap_command` (standard library only).

It runs with ``python -I -S`` and imports nothing of tmpl, so that it starts fast and needs only
the interpreter inside the sandbox. Two roles, the first argument says which:

``host CONFIG``
    On the host, what the caller's ``Popen`` starts: it puts the seccomp program into a pipe,
    hands the working directory (and a host HOME) to the sandbox's own user id when run as root,
    starts bwrap (the pipe's file descriptor in place of ``{seccomp}`` in its arguments, a
    lifeline's read end in place of ``{lifeline}``), waits for it and exits as it did. It holds
    the lifeline's write end alone: killed by the caller, or exiting when it sees the caller gone
    (its parent process changed), its end closes, and the sandbox's PID 1, which reads the other
    end, kills the sandbox.
``init CONFIG``
    Inside the sandbox, its PID 1 (bwrap ``--as-pid-1``): it limits the number of processes,
    listens on ``127.0.0.1:PORT`` (and ``[::1]:PORT``) of the sandbox's own network namespace
    and relays each connection to the gateway's Unix socket bound in from the host (a Unix
    socket is a file: it crosses network namespaces, which nothing else here does), drops to the
    sandbox's user id when bwrap left it root, starts the command, reaps every orphan, and when
    the command ends kills whatever is left and exits as the command did (128 + N for a signal N).
    The lifeline's EOF tells it the host step died: it then kills the sandbox (the kernel kills
    every process of its PID namespace with its PID 1).

``relay(accept_from, connect)`` is the byte pump both the sandbox's forwarder and the host's
:class:`tmpl.tools.sandbox.GatewayRelay` use.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

CHUNK = 1 << 16
#: seconds between two looks at whether the caller still lives
ORPHAN_POLL = 1.0


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until EOF, then half-close ``dst`` (the other way may go on)."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _pair(client: socket.socket, connect: Callable[[], socket.socket]) -> None:
    try:
        upstream = connect()
    except OSError:
        client.close()  # the gateway is gone: the client sees its connection closed
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def relay(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    """Accept on ``listener`` forever (until it is closed); relay each connection to ``connect()``."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_pair, args=(client, connect), daemon=True).start()


def _orphaned(parent: int) -> None:
    """Exit once the caller (its process, whichever thread started this) is gone: the lifeline
    closes, and the sandbox dies with it."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL)
    os._exit(128 + signal.SIGKILL)


def _host(config: dict[str, Any]) -> None:
    """Run bwrap with the seccomp program on a pipe and a lifeline (see the module)."""
    parent = os.getppid()
    data = bytes.fromhex(config["seccomp"])
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    os.set_inheritable(read, True)
    life_r, life_w = os.pipe()  # the lifeline: its write end stays here alone (not inheritable)
    os.set_inheritable(life_r, True)
    uid = config.get("uid")
    if uid is not None:  # root: the sandbox runs as its own user id, which must own its directories
        for top in config.get("chown", ()):
            os.chown(top, uid, uid)
            for base, dirs, files in os.walk(top):
                for name in dirs + files:
                    try:
                        os.chown(os.path.join(base, name), uid, uid, follow_symlinks=False)
                    except FileNotFoundError:
                        pass
    fds = {"{seccomp}": str(read), "{lifeline}": str(life_r)}
    argv = [fds.get(a, a) for a in config["bwrap"]]
    pid = os.posix_spawn(argv[0], argv, os.environ)
    os.close(read)
    os.close(life_r)
    threading.Thread(target=_orphaned, args=(parent,), daemon=True).start()
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


def _listen(port: int) -> list[socket.socket]:
    """Listening sockets on 127.0.0.1:port and, where the namespace has IPv6, [::1]:port."""
    out = []
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(128)
        except OSError:
            sock.close()
            if family == socket.AF_INET:
                raise
            continue
        out.append(sock)
    return out


def _watch(lifeline: int) -> None:
    """At the lifeline's EOF (the host step died: it held the write end alone), kill the sandbox.

    bwrap's ``--die-with-parent`` cannot do it once PID 1 changed its user id: the kernel clears
    a parent-death signal at a change of credentials, and checks one set again against the
    rights of the dying parent, which a root bwrap that dropped its capabilities lacks."""
    while True:
        try:
            if not os.read(lifeline, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    try:
        os.kill(-1, signal.SIGKILL)
    finally:
        os._exit(128 + signal.SIGKILL)


def _init(config: dict[str, Any], lifeline: int) -> None:
    """PID 1 of the sandbox (see the module)."""
    # nothing of the host's open files goes further (bwrap's seccomp pipe, whatever the caller left
    # open) but the descriptors the caller named (``pass_fds``), kept at their numbers
    keep = sorted({lifeline, *config.get("pass_fds", ())})
    low = 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)
    os.set_inheritable(lifeline, False)
    for fd in config.get("pass_fds", ()):
        os.set_inheritable(fd, True)
    threading.Thread(target=_watch, args=(lifeline,), daemon=True).start()
    limit = config["max_processes"]
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    listeners = _listen(config["port"]) if config.get("socket") else []
    uid = config.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # every capability bwrap left goes with it
    path = config.get("socket")
    if path:

        def connect() -> socket.socket:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(path)
            except OSError:
                upstream.close()
                raise
            return upstream

        for listener in listeners:
            threading.Thread(target=relay, args=(listener, connect), daemon=True).start()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        pid = os.posix_spawnp(config["argv"][0], config["argv"], config["env"])
    except OSError as exc:
        sys.stderr.write(f"sandbox: cannot run {config['argv'][0]!r}: {exc}\n")
        os._exit(127)
    code = 1
    while True:  # PID 1 of the namespace: every orphan is ours to reap
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            try:
                os.kill(-1, signal.SIGKILL)  # all of the namespace but PID 1 itself
            except OSError:
                pass
    os._exit(code)


def main(argv: list[str]) -> None:
    role, config = argv[1], json.loads(argv[2])
    if role == "host":
        _host(config)
    else:
        _init(config, int(argv[3]))


if __name__ == "__main__":
    main(sys.argv)

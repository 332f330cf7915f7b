"""The two small programs behind :func:`tmpl.tools.sandbox.wrap_command` (standard library only).

It runs with ``python -I -S`` and imports nothing of tmpl, so that it starts fast and needs only
the interpreter inside the sandbox. Two roles, the first argument says which:

``host CONFIG``
    On the host, what the caller's ``Popen`` starts: it puts the seccomp program into a pipe,
    hands the working directory (and a host HOME) to the sandbox's own user id when run as root,
    and becomes bwrap (``exec``), the pipe's file descriptor in place of ``{seccomp}`` in its
    arguments. The caller's process handle is therefore bwrap's.
``init CONFIG``
    Inside the sandbox, its PID 1 (bwrap ``--as-pid-1``): it limits the number of processes,
    listens on ``127.0.0.1:PORT`` (and ``[::1]:PORT``) of the sandbox's own network namespace
    and relays each connection to the gateway's Unix socket bound in from the host (a Unix
    socket is a file: it crosses network namespaces, which nothing else here does), drops to the
    sandbox's user id when bwrap left it root, starts the command, reaps every orphan, and when
    the command ends kills whatever is left and exits as the command did (128 + N for a signal N).

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
from collections.abc import Callable
from typing import Any

CHUNK = 1 << 16


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


def _host(config: dict[str, Any]) -> None:
    """Become bwrap with the seccomp program on a pipe (see the module)."""
    data = bytes.fromhex(config["seccomp"])
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    os.set_inheritable(read, True)
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
    argv = [str(read) if a == "{seccomp}" else a for a in config["bwrap"]]
    os.execv(argv[0], argv)


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


def _init(config: dict[str, Any]) -> None:
    """PID 1 of the sandbox (see the module)."""
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
    {"host": _host, "init": _init}[role](config)


if __name__ == "__main__":
    main(sys.argv)

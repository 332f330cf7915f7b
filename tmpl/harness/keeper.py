"""A command run under a keeper: the subreaper of its whole process tree (:mod:`tmpl.tools.proctree`).

Run as a script, ``python -I -S keeper.py LIFELINE_FD -- ARGV...``: it sets ``PR_SET_CHILD_SUBREAPER``,
forks, execs ``ARGV`` in the child and waits. Every process the command starts stays below the keeper,
whatever it does (a daemon that double-forks, a child that calls ``setsid``); when the command ends, or
the keeper gets ``SIGTERM`` (the command's timeout), or ``LIFELINE_FD`` reaches EOF (the trainer that
holds its write end died), the keeper kills the command (``SIGKILL``) and everything left below it,
reaps them, and exits as the command did (its exit code, or its signal). A command that cannot be
executed exits 127 (not found) or 126 (not executable), as a shell says it, its reason on stderr.

It loads ``proctree.py`` by its path, so starting a keeper imports nothing of tmpl or its dependencies
(nor ``pathlib``, ``typing``, ``importlib``: it runs once per harness run): a few ms over the interpreter's
own start, not the seconds ``import tmpl`` takes.

>>> argv = keeper_argv(["true"], lifeline=-1)
>>> argv[1:3], argv[-2:]
(['-I', '-S'], ['--', 'true'])
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing's: importing typing costs a keeper ~10 ms

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["KEEPER", "keeper_argv"]

KEEPER = os.path.realpath(__file__)
_PROCTREE = os.path.join(os.path.dirname(os.path.dirname(KEEPER)), "tools", "proctree.py")


def keeper_argv(argv: Sequence[str], lifeline: int = -1) -> list[str]:
    """The argv that runs ``argv`` under a keeper (``lifeline``: the read end of the trainer's pipe, or -1)."""
    return [sys.executable, "-I", "-S", KEEPER, str(lifeline), "--", *argv]


class _NoPipe:
    """``proctree.keep`` closes its worker's pipe in the keeper; a command has none."""

    def close(self) -> None:
        pass


def _exec(_conn: Any, argv: list[str], lifeline: int) -> None:
    """In the keeper's child: become the command (the lifeline's read end not passed on to it)."""
    if lifeline >= 0:
        os.close(lifeline)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"tmpl keeper: cannot run {argv[0]!r}: {exc.strerror or exc}\n")
        sys.stderr.flush()
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def _load_proctree() -> dict[str, Any]:
    proctree: dict[str, Any] = {"__name__": "_tmpl_proctree", "__file__": _PROCTREE}
    with open(_PROCTREE, "rb") as f:
        exec(compile(f.read(), _PROCTREE, "exec"), proctree)  # noqa: S102 - tmpl's own module, by its path
    return proctree


def _exec_env(_conn: Any, argv: list[str], env: dict[str, str]) -> None:
    """In a served keeper's child: become the command, with its environment."""
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        sys.stderr.write(f"tmpl keeper: cannot run {argv[0]!r}: {exc.strerror or exc}\n")
        sys.stderr.flush()
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def serve(fd: int) -> None:
    """The keeper server: on the Unix socket ``fd`` (SOCK_SEQPACKET), each request ``{"id", "argv",
    "cwd", "env"}`` with its stdout and stderr descriptors attached (and a third, optional: a pipe's
    write end the keeper tells the time its command ended, ``proctree.keep``'s ``ended``) forks a keeper
    (warm: no interpreter start), answered ``{"id", "pid"}``; each keeper reaped is told ``{"pid", "status"}`` (its wait
    status). At the socket's EOF (the trainer closed it, or died) it exits, and every keeper it forked,
    whose parent-death signal is ``SIGTERM``, kills its tree."""
    import json
    import socket
    import threading

    proctree = _load_proctree()
    proctree["prctl"](proctree["PR_SET_PDEATHSIG"], 9)  # the trainer gone: this server too (then the keepers)
    sock = socket.socket(fileno=fd)
    lock = threading.Lock()
    forked = threading.Condition()
    alive = [0]

    def send(message: dict[str, Any]) -> None:
        with lock:
            try:
                sock.send(json.dumps(message).encode())
            except OSError:
                pass

    def reap() -> None:
        while True:
            with forked:
                while alive[0] == 0:
                    forked.wait()
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                continue
            with forked:
                alive[0] -= 1
            send({"pid": pid, "status": status})

    threading.Thread(target=reap, daemon=True).start()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 22, 3)
        except OSError:
            break
        if not data:
            break
        request = json.loads(data)
        with forked:
            pid = os.fork()
            if pid == 0:
                try:
                    sock.close()
                    os.dup2(fds[0], 1)
                    os.dup2(fds[1], 2)
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    ended = fds[2] if len(fds) > 2 else -1
                    for f in (*fds[:2], null):
                        os.close(f)
                    if ended >= 0:
                        os.set_inheritable(ended, False)  # the command's exec closes it
                    os.chdir(request["cwd"])
                    proctree["keep"](_exec_env, _NoPipe(), request["argv"], request["env"], ended=ended)
                finally:
                    os._exit(126)
            alive[0] += 1
            forked.notify()
        for f in fds:
            os.close(f)
        send({"id": request["id"], "pid": pid})
    os._exit(0)


def main(args: list[str]) -> None:
    if len(args) == 2 and args[0] == "--serve":
        serve(int(args[1]))
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: keeper.py LIFELINE_FD -- ARGV...  |  keeper.py --serve SOCKET_FD\n")
        os._exit(2)
    lifeline, argv = int(args[0]), args[2:]
    _load_proctree()["keep"](_exec, _NoPipe(), argv, lifeline, lifeline=lifeline if lifeline >= 0 else None)


if __name__ == "__main__":
    main(sys.argv[1:])

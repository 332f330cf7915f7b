"""The sandbox, hardened: the seccomp filter of :mod:`tmpl.tools.seccomp` in a ``Toolbox`` tool's
sandbox and in a command of :func:`tmpl.tools.sandbox.wrap_command` (a harness's), and the
wrapped command's one way out, the gateway.

Every escape attempt (tests/sandbox_escapes.py: real syscalls through ctypes, real ``unshare``)
runs three times: outside any sandbox (the control: the kernel here does what is asked), inside a
sandboxed tool, and inside a wrapped command, where each must fail. Network: a real HTTP server on
the host answers through the gateway socket; a port listening on the host's 127.0.0.1, a public
address and DNS do not.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import tmpl
from tmpl.errors import SandboxError
from tmpl.tools import seccomp
from tmpl.tools.sandbox import GatewayRelay, Sandbox, wrap_command

from . import sandbox_escapes as escapes

REPO = Path(__file__).resolve().parent.parent
ESCAPES = os.path.abspath(escapes.__file__)
PYTHON = os.path.realpath(sys.executable)
ROOT = os.getuid() == 0


def _bwrap_works() -> str | None:
    """Why the sandbox cannot run here, or None."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap"
    probe = ["bwrap", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc", "true"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    return None if done.returncode == 0 else f"bwrap cannot make namespaces here: {done.stderr.strip()}"


WHY = _bwrap_works()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")


def _wrapped(argv: list[str], workdir: Path, timeout: float = 60, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        wrap_command(argv, workdir=str(workdir), **kw), capture_output=True, text=True, timeout=timeout
    )


# -- escape attempts ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def outside() -> dict[str, str]:
    """The control: every attempt outside any sandbox, as this user."""
    done = subprocess.run([PYTHON, "-I", "-S", ESCAPES], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def in_tool() -> dict[str, str]:
    box = tmpl.Toolbox(
        [escapes.attempt_all], isolation="sandbox", workers=1, timeout=60, max_output_chars=100_000, sandbox=Sandbox()
    )
    try:
        message = box.run_batch([[{"name": "attempt_all", "arguments": {}}]]).messages[0][0]["content"]
    finally:
        box.close()
    return json.loads(message)


@pytest.fixture(scope="module")
def in_wrapped(tmp_path_factory) -> dict[str, str]:
    work = tmp_path_factory.mktemp("escapes")
    done = _wrapped([PYTHON, "-I", "-S", ESCAPES], work, read_only=[ESCAPES])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


#: attempt -> what the kernel answers outside (as root; as another user where it differs)
CONTROL = {
    "unshare_user_cli": "ok uid=0(root) gid=0(root) groups=0(root)",
    "unshare_mount_cli": "ok mounted",
    "unshare_user": "ok",
    "clone_user": "ok",
    "bpf": "ok" if ROOT else None,  # unprivileged eBPF: kernel.unprivileged_bpf_disabled decides
    "keyctl": "ok",
    "add_key": "ok",
    "perf_event_open": "ok",
    "userfaultfd": "ok",
    "ptrace_sibling": "ok",
    "process_vm_readv": "ok secret",
    "mount": "ok" if ROOT else "denied EPERM",
    "init_module": None,  # root: the module loader's own refusal (ENOSYS without modules, EINVAL, ...)
    "finit_module": None,
    "setns": "ok" if ROOT else "denied EPERM",
}
SYSCTL = {
    "perf_event_open": ("kernel/perf_event_paranoid", lambda v: int(v) <= 2),
    "unshare_user_cli": ("user/max_user_namespaces", lambda v: int(v) > 0),
    "ptrace_sibling": ("kernel/yama/ptrace_scope", lambda v: ROOT or v == "0"),  # Yama: 1 = descendants only
}


def test_every_attempt_is_probed():
    assert sorted(CONTROL) == sorted(escapes.ATTEMPTS)


@pytest.mark.parametrize("name", sorted(escapes.ATTEMPTS))
def test_outside_the_kernel_lets_it_through(outside, name):
    """The control: the same call outside a sandbox does what it asks (else the denial inside
    would prove nothing), or, for the module calls, fails for the loader's reason, not EPERM."""
    if name in SYSCTL:
        key, allows = SYSCTL[name]
        try:
            value = Path("/proc/sys", key).read_text().strip()
        except OSError:
            value = None
        if value is not None and not allows(value):
            pytest.skip(f"this host's {key} = {value} forbids it outside a sandbox too")
    if CONTROL[name] is None:
        if name.endswith("_module") and ROOT:
            assert outside[name] != "denied EPERM", outside[name]
        return
    assert outside[name] == CONTROL[name]


@pytest.mark.parametrize("where", ["tool", "wrapped"])
@pytest.mark.parametrize("name", sorted(escapes.ATTEMPTS))
def test_inside_every_escape_fails(request, where, name):
    got = request.getfixturevalue("in_tool" if where == "tool" else "in_wrapped")[name]
    if name.endswith("_cli"):  # util-linux's own words: unshare() failed; nobody became root
        assert got == "denied unshare: unshare failed: Operation not permitted"
        assert "uid=0" not in got
    else:
        assert got == "denied EPERM"


def test_a_wrapped_commands_user_is_not_root_and_has_the_filter(tmp_path):
    done = _wrapped(["sh", "-c", "id -u; grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status"], tmp_path)
    assert done.returncode == 0, done.stderr
    uid, *status = done.stdout.split("\n")[:4]
    assert int(uid) != 0 if ROOT else int(uid) == os.getuid()
    fields = dict(re.split(r":\s*", line, maxsplit=1) for line in status)
    assert fields == {"NoNewPrivs": "1", "Seccomp": "2", "CapEff": "0000000000000000"}


# -- the filter's table, call by call ------------------------------------------------------------
def _header_numbers(path: str, pattern: str) -> dict[str, int]:
    text = Path(path).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(pattern, text)}


@pytest.mark.parametrize(
    ("arch", "header", "pattern"),
    [
        ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", r"#define __NR_(\w+)\s+(\d+)"),
        ("aarch64", "/usr/include/asm-generic/unistd.h", r"#define __NR(?:3264)?_(\w+)\s+(\d+)"),
    ],
)
def test_the_syscall_numbers_are_the_kernel_headers(arch, header, pattern):
    """The numbers in tmpl.tools.seccomp against the system's own kernel headers (linux-libc-dev)."""
    if not os.path.exists(header):
        pytest.skip(f"{header} is not installed (apt-get install linux-libc-dev)")
    known = _header_numbers(header, pattern)
    ours = {name: seccomp.number(name, arch) for name in seccomp.SYSCALLS}
    theirs = {name: known.get(name) for name in seccomp.SYSCALLS if name in known}
    assert {name: ours[name] for name in theirs} == theirs
    assert [name for name in ours if ours[name] is not None and name not in known] in ([], ["lookup_dcookie"])


def _raw(numbers: list[int], seccomp_fd: int | None) -> dict[int, str]:
    """Each syscall with every argument -1, in a bwrap sandbox as root with every capability
    (so that nothing but the filter can answer EPERM), with or without the filter."""
    cmd = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "--die-with-parent"]
    cmd += ["--new-session", "--cap-add", "ALL"]
    cmd += ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    cmd += ["--", PYTHON, "-I", "-S", ESCAPES, "raw", *map(str, numbers)]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, pass_fds=() if seccomp_fd is None else (seccomp_fd,)
    )
    assert done.returncode == 0, done.stderr
    return {int(k): v for k, v in json.loads(done.stdout).items()}


@pytest.mark.skipif(not ROOT, reason="needs root: the control runs the calls with every capability")
def test_each_denied_call_is_denied_by_the_filter_even_with_every_capability():
    """Garbage arguments (-1): without the filter the kernel answers EFAULT, EINVAL, EBADF, ...
    (it ran its own code: a valid call would have run); with it, EPERM (ENOSYS for clone3 and
    io_uring), for every call in the table. clone is checked by its flags elsewhere."""
    names = [n for n in seccomp.SYSCALLS if n != "clone" and seccomp.number(n) is not None]
    numbers = [seccomp.number(n) for n in names]
    fd = seccomp.program_fd()
    try:
        filtered = _raw(numbers, fd)
    finally:
        os.close(fd)
    bare = _raw(numbers, None)
    expected = {n: ("ENOSYS" if n in seccomp.NOT_IMPLEMENTED else "EPERM") for n in names}
    assert {n: filtered[seccomp.number(n)] for n in names} == expected
    reached = [n for n in names if bare[seccomp.number(n)] != expected[n]]
    # only a call the kernel itself refuses to everyone (lockdown, removed calls) may match bare
    assert len(reached) >= len(names) - 8, {n: bare[seccomp.number(n)] for n in names}
    assert "unshare" in reached and "bpf" in reached and "ptrace" in reached


def test_a_plain_fork_and_thread_still_work_under_the_filter(tmp_path):
    """clone without namespace flags (fork, threads: glibc falls back from clone3's ENOSYS)."""
    code = "import os, threading; t = threading.Thread(target=print, args=('thread',)); t.start(); t.join(); pid = os.fork()\nif pid == 0: os._exit(7)\nprint(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))"
    done = _wrapped([PYTHON, "-I", "-S", "-c", code], tmp_path)
    assert (done.returncode, done.stdout) == (0, "thread\n7\n"), done.stderr


def test_the_program_is_refused_for_an_unknown_machine():
    with pytest.raises(SandboxError, match="no seccomp syscall table for the 'riscv64' architecture"):
        seccomp.program("riscv64")


# -- the gateway and nothing else --------------------------------------------------------------
class _Hello(BaseHTTPRequestHandler):
    token = uuid.uuid4().hex

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"token": self.token, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


NET_PROBE = r"""
import json, socket, sys, urllib.request
out = {}
port, other, public = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
out["gateway"] = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10).read())
for name, addr in (("host_port", ("127.0.0.1", other)), ("public", (public, 443)), ("gateway_direct", ("127.0.0.1", int(sys.argv[4])))):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(addr)
        out[name] = "connected"
    except OSError as exc:
        out[name] = type(exc).__name__ + ": " + (exc.strerror or str(exc))
    s.close()
try:
    out["dns"] = socket.getaddrinfo("example.com", 443)[0][4][0]
except OSError as exc:
    out["dns"] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def gateway():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_wrapped_command_reaches_the_gateway_and_nothing_else(gateway, tmp_path):
    with socket.socket() as other:  # a port listening on the host's loopback: reachable outside
        other.bind(("127.0.0.1", 0))
        other.listen(4)
        other_port = other.getsockname()[1]
        socket.create_connection(("127.0.0.1", other_port), timeout=5).close()  # the control
        other.accept()[0].close()
        with GatewayRelay("127.0.0.1", gateway) as relay:
            args = [str(8080), str(other_port), "1.1.1.1", str(gateway)]
            done = _wrapped(
                [PYTHON, "-I", "-S", "-c", NET_PROBE, *args], tmp_path, gateway_socket=relay.path, gateway_port=8080
            )
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        other.settimeout(0.3)
        with pytest.raises(TimeoutError):  # nothing reached the host's listening socket
            other.accept()
    assert got["gateway"] == {"token": _Hello.token, "path": "/v1/models"}
    assert got["host_port"] == "ConnectionRefusedError: Connection refused"
    assert got["gateway_direct"] == "ConnectionRefusedError: Connection refused"  # its TCP port: only via the socket
    assert got["public"] == "OSError: Network is unreachable"
    assert got["dns"] == "gaierror"


def test_without_a_gateway_socket_there_is_no_network_at_all(gateway, tmp_path):
    code = f"import socket; s = socket.socket(); print(s.connect_ex(('127.0.0.1', {gateway})), s.connect_ex(('127.0.0.1', 8080)))"
    done = _wrapped([PYTHON, "-I", "-S", "-c", code], tmp_path)
    assert (done.returncode, done.stdout.split()) == (0, [str(errno.ECONNREFUSED)] * 2), done.stderr


def test_a_uvicorn_unix_socket_is_a_gateway_socket(tmp_path):
    """The other way to give the sandbox its gateway: the server itself listens on the socket."""
    uvicorn = pytest.importorskip("uvicorn")
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict[str, str]:
        return {"object": "list", "served": "uds"}

    path = tmp_path / "gw.sock"
    server = uvicorn.Server(uvicorn.Config(app, uds=str(path), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until = time.monotonic() + 20
    while not server.started and time.monotonic() < until:
        time.sleep(0.05)
    work = tmp_path / "work"
    work.mkdir()
    try:
        code = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9000/v1/models', timeout=10).read().decode())"
        done = _wrapped([PYTHON, "-I", "-S", "-c", code], work, gateway_socket=str(path), gateway_port=9000)
    finally:
        server.should_exit = True
        thread.join(10)
    assert json.loads(done.stdout) == {"object": "list", "served": "uds"}, done.stderr


# -- files, processes --------------------------------------------------------------------------
FILE_PROBE = r"""
import json, os, sys
out = {}
for name, path in (("workdir", "result.txt"), ("tmp", "/tmp/t.txt"), ("home", os.path.expanduser("~/.config-x")),
                   ("outside", sys.argv[1]), ("usr", "/usr/x"), ("root", "/x"), ("etc", "/etc/x")):
    try:
        with open(path, "w") as f:
            f.write(name)
        out[name] = "wrote"
    except OSError as exc:
        out[name] = exc.strerror
out["repo"] = os.path.exists(sys.argv[2])
out["host_home"] = sorted(os.listdir(sys.argv[3])) if os.path.isdir(sys.argv[3]) else None
out["cwd"] = os.getcwd()
out["env"] = sorted(os.environ)
print(json.dumps(out))
"""


def test_a_wrapped_command_writes_only_its_workdir_and_scratch(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "task.txt").write_text("fix it")
    outside = tmp_path / "elsewhere" / "outside.txt"
    outside.parent.mkdir()
    host_home = os.path.expanduser("~")
    env = {"OPENAI_API_KEY": "sk-gateway", "HARNESS_FLAG": "1"}
    os.environ["TMPL_TRAINER_SECRET"] = "s3cret"  # the trainer's environment: not inside
    try:
        args = [str(outside), str(REPO / "pyproject.toml"), host_home]
        done = _wrapped([PYTHON, "-I", "-S", "-c", FILE_PROBE, *args], work, env=env)
    finally:
        del os.environ["TMPL_TRAINER_SECRET"]
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["workdir"], got["tmp"], got["home"]) == ("wrote",) * 3
    assert (work / "result.txt").read_text() == "workdir"  # the workdir is the host's
    assert got["outside"] == "No such file or directory" and not outside.exists()
    assert (got["usr"], got["root"], got["etc"]) == ("Read-only file system",) * 3
    assert not Path("/usr/x").exists() and not Path("/x").exists() and not Path("/etc/x").exists()
    assert got["repo"] is False
    host_entries = sorted(os.listdir(host_home))
    assert got["host_home"] in (None, [], [".pyenv"]) and got["host_home"] != host_entries  # at most a mount point
    assert got["cwd"] == str(work)
    assert got["env"] == sorted(["HARNESS_FLAG", "HOME", "LANG", "OPENAI_API_KEY", "PATH", "TMPDIR"])
    assert not Path("/tmp/t.txt").exists() or Path("/tmp/t.txt").read_text() != "tmp"


def test_a_host_home_is_bound_read_write(tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    (home / ".agent").mkdir(parents=True)
    (home / ".agent" / "config.toml").write_text('model = "policy"\n')
    code = "import os; h = os.environ['HOME']; print(open(h + '/.agent/config.toml').read().strip()); open(h + '/.agent/log', 'w').write('ran')"
    done = _wrapped([PYTHON, "-I", "-S", "-c", code], work, home=str(home))
    assert (done.returncode, done.stdout) == (0, 'model = "policy"\n'), done.stderr
    assert (home / ".agent" / "log").read_text() == "ran"


TREE = r"""
import subprocess, sys, time
marker = sys.argv[1]
subprocess.Popen([sys.executable, "-I", "-S", "-c", "import time; time.sleep(600)", marker], start_new_session=True)
subprocess.Popen(["sh", "-c", "(sleep 600 &) ; exec sleep 600", marker])
print("started", flush=True)
time.sleep(600)
"""


def _marked(marker: str) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    pids.append(int(name))
            except OSError:
                pass
    return pids


def test_killing_the_wrapped_command_kills_its_whole_tree(tmp_path):
    marker = f"tree{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        wrap_command([PYTHON, "-I", "-S", "-c", TREE, marker], workdir=str(tmp_path)), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"
        until = time.monotonic() + 10
        while len(_marked(marker)) < 4 and time.monotonic() < until:  # PID 1's argv names it too
            time.sleep(0.05)
        seen = _marked(marker)
        assert len(seen) >= 4
    finally:
        proc.send_signal(signal.SIGKILL)  # the trainer kills bwrap: the sandbox's PID 1 dies with it
        proc.wait(10)
    until = time.monotonic() + 10
    while [p for p in seen if os.path.exists(f"/proc/{p}")] and time.monotonic() < until:
        time.sleep(0.05)
    assert [p for p in seen if os.path.exists(f"/proc/{p}")] == []


def test_the_exit_status_is_the_commands_and_processes_are_bounded(tmp_path):
    assert _wrapped(["sh", "-c", "exit 3"], tmp_path).returncode == 3
    assert _wrapped(["sh", "-c", "kill -TERM $$"], tmp_path).returncode == 128 + signal.SIGTERM
    missing = _wrapped(["no-such-harness"], tmp_path)
    assert missing.returncode == 127 and "cannot run 'no-such-harness'" in missing.stderr
    code = "import subprocess\nprocs = []\ntry:\n    for _ in range(40): procs.append(subprocess.Popen(['sleep', '30']))\nexcept OSError as exc: print(len(procs), exc.errno)\nfor p in procs: p.kill()"
    done = _wrapped([PYTHON, "-I", "-S", "-c", code], tmp_path, max_processes=8)
    started, err = map(int, done.stdout.split())
    assert err == errno.EAGAIN and 0 < started < 8, done.stdout


def test_wrong_arguments_are_clear_errors(tmp_path):
    with pytest.raises(SandboxError, match="gateway_socket and gateway_port go together"):
        wrap_command(["true"], workdir=str(tmp_path), gateway_port=8080)
    with pytest.raises(SandboxError, match=r"gateway_port must be an unprivileged TCP port \(1024-65535"):
        wrap_command(["true"], workdir=str(tmp_path), gateway_socket=str(tmp_path), gateway_port=80)
    with pytest.raises(SandboxError, match="workdir '/no/such/dir' is not a directory"):
        wrap_command(["true"], workdir="/no/such/dir")
    with pytest.raises(SandboxError, match="argv must be a non-empty list of strings, not 'true'"):
        wrap_command("true", workdir=str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(SandboxError, match=r"read_only paths do not exist: \['/no/such/venv'\]"):
        wrap_command(["true"], workdir=str(tmp_path), read_only=["/no/such/venv"])
    with pytest.raises(SandboxError, match=r"bubblewrap \('no-bwrap'\) is not installed"):
        wrap_command(["true"], workdir=str(tmp_path), bwrap="no-bwrap")


TRAINER = r"""
import subprocess, sys
from tmpl.tools.sandbox import wrap_command
marker, workdir = sys.argv[1], sys.argv[2]
code = "import subprocess, sys, time; subprocess.Popen(['sleep', '600']); print('started', flush=True); time.sleep(600)"
import os
proc = subprocess.Popen(wrap_command([os.path.realpath(sys.executable), "-I", "-S", "-c", code, marker], workdir=workdir), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
line = proc.stdout.readline().strip()
from tests.test_sandbox_hardening import _marked
print(line, *[p for p in _marked(marker) if p != os.getpid()], flush=True)  # then exits, its harness still running
"""


def test_a_trainer_that_dies_takes_the_wrapped_command_with_it(tmp_path):
    """The trainer exits without killing its harness: the host step sees its parent gone."""
    marker = f"orphan{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", TRAINER, marker, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )
    said, *pids = done.stdout.split()
    assert said == "started", done.stderr
    seen = [int(p) for p in pids]
    assert len(seen) == 4  # the host step, bwrap, the sandbox's PID 1, the command (the sleep has no marker)
    until = time.monotonic() + 15
    while [p for p in seen if os.path.exists(f"/proc/{p}")] and time.monotonic() < until:
        time.sleep(0.1)
    assert [p for p in seen if os.path.exists(f"/proc/{p}")] == []


NODE_PROBE = r"""
const port = process.argv[2];
(async () => {
  const out = {};
  for (const host of ["127.0.0.1", "localhost"]) {
    const r = await fetch(`http://${host}:${port}/v1/chat`);
    out[host] = (await r.json()).path;
  }
  try { await fetch("https://example.com/", {signal: AbortSignal.timeout(5000)}); out.public = "reached"; }
  catch (e) { out.public = (e.cause && e.cause.code) || e.name; }
  console.log(JSON.stringify(out));
})();
"""


def test_a_node_program_reaches_the_gateway_under_the_filter(gateway, tmp_path):
    """node (libuv: io_uring answered ENOSYS, threads through clone) runs, fetches through the
    gateway by 127.0.0.1 and by localhost, and reaches nothing else."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (apt-get install -y nodejs)")
    script = tmp_path / "probe.js"
    script.write_text(NODE_PROBE)
    with GatewayRelay("127.0.0.1", gateway) as relay:
        done = _wrapped([node, str(script), "8080"], tmp_path, gateway_socket=relay.path, gateway_port=8080)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got == {"127.0.0.1": "/v1/chat", "localhost": "/v1/chat", "public": "EAI_AGAIN"}


def test_a_venvs_python_and_its_packages_run_from_read_only(gateway, tmp_path):
    """A harness installed in a venv: the venv shown read-only, its packages import, its client
    (httpx, what the OpenAI and Anthropic SDKs use) reaches the gateway."""
    venv = sys.prefix
    code = "import httpx; print(httpx.get('http://127.0.0.1:8080/v1/models', timeout=10).json()['path'])"
    with GatewayRelay("127.0.0.1", gateway) as relay:
        done = _wrapped(
            [os.path.join(venv, "bin", "python"), "-c", code],
            tmp_path,
            read_only=[venv],
            gateway_socket=relay.path,
            gateway_port=8080,
        )
    assert (done.returncode, done.stdout) == (0, "/v1/models\n"), done.stderr


# -- the program itself, run by a classic-BPF interpreter of the test's own ------------------------
def _run_filter(program: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel's seccomp would return for this syscall: the program interpreted as
    classic BPF (struct sock_filter {u16 code; u8 jt, jf; u32 k}) over struct seccomp_data."""
    import struct

    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        cls = code & 0x07
        if cls == 0x00:  # BPF_LD
            assert code == 0x20, hex(code)  # W | ABS: the only load seccomp allows here
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif cls == 0x05:  # BPF_JMP
            op = code & 0xF0
            assert code & 0x08 == 0, "BPF_K only"
            taken = {0x10: acc == k, 0x20: acc > k, 0x30: acc >= k, 0x40: bool(acc & k)}[op]
            pc += 1 + (jt if taken else jf)
        elif cls == 0x06:  # BPF_RET
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


KILL, ALLOW = 0x80000000, 0x7FFF0000
EPERM_RET, ENOSYS_RET = 0x50000 | errno.EPERM, 0x50000 | errno.ENOSYS
AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
#: the test's own numbers (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h)
NUMBERS = {
    "x86_64": {
        "read": 0,
        "write": 1,
        "clone": 56,
        "unshare": 272,
        "clone3": 435,
        "bpf": 321,
        "ptrace": 101,
        "io_uring_setup": 425,
    },
    "aarch64": {
        "read": 63,
        "write": 64,
        "clone": 220,
        "unshare": 97,
        "clone3": 435,
        "bpf": 280,
        "ptrace": 117,
        "io_uring_setup": 425,
    },
}
THREAD = 0x3D0F00  # CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID|CHILD_CLEARTID: pthread_create


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_program_answers_as_designed(arch):
    prog = seccomp.program(arch)
    n = NUMBERS[arch]
    run = lambda nr, *args, a=AUDIT[arch]: _run_filter(prog, a, nr, args)  # noqa: E731
    assert run(n["read"]) == ALLOW and run(n["write"], 1, 0, 5) == ALLOW
    assert run(n["bpf"]) == EPERM_RET and run(n["ptrace"], 16) == EPERM_RET
    assert run(n["clone3"]) == ENOSYS_RET and run(n["io_uring_setup"]) == ENOSYS_RET
    assert run(n["clone"], THREAD) == ALLOW  # a thread
    assert run(n["clone"], 0x01200000 | signal.SIGCHLD) == ALLOW  # fork: CHILD_SETTID|CHILD_CLEARTID|SIGCHLD
    assert run(n["clone"], 0x80 | signal.SIGCHLD) == ALLOW  # clone's low byte is the exit signal, not CLONE_NEWTIME
    for flag in (0x10000000, 0x20000, 0x40000000, 0x20000000, 0x8000000, 0x4000000, 0x2000000):
        assert run(n["clone"], flag | signal.SIGCHLD) == EPERM_RET, hex(flag)
        assert run(n["unshare"], flag) == EPERM_RET, hex(flag)
    assert run(n["unshare"], 0x80) == EPERM_RET  # CLONE_NEWTIME
    assert run(n["unshare"], 0x400) == ALLOW  # CLONE_FILES: a private file table, no namespace
    assert run(n["unshare"], 0x10000000 | (1 << 40)) == EPERM_RET  # high bits do not hide the flag
    other = AUDIT["aarch64" if arch == "x86_64" else "x86_64"]
    assert _run_filter(prog, other, n["read"]) == KILL  # another architecture's ABI
    assert _run_filter(prog, 0x40000003, 3) == KILL  # i386 (int 0x80): AUDIT_ARCH_I386
    if arch == "x86_64":
        assert run(0x40000000 | n["read"]) == EPERM_RET  # x32: every call denied


def test_only_the_named_descriptors_go_in(tmp_path):
    """A pipe named in pass_fds reaches the command at its number; another open one does not."""
    report_r, report_w = os.pipe()
    other_r, other_w = os.pipe()
    code = f"import os; os.write({report_w}, b'reported'); print(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
    try:
        argv = wrap_command([PYTHON, "-I", "-S", "-c", code], workdir=str(tmp_path), pass_fds=[report_w])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, pass_fds=(report_w, other_w))
        os.close(report_w)
        os.close(other_w)
        assert done.returncode == 0, done.stderr
        assert os.read(report_r, 100) == b"reported"
        fds = json.loads(done.stdout)
        assert report_w in fds and other_w not in fds
        assert len([fd for fd in fds if fd not in (0, 1, 2, report_w)]) == 1  # listdir's own
    finally:
        os.close(report_r)
        os.close(other_r)


def test_read_only_inside_the_workdir_stays_read_only(tmp_path):
    """A harness's install inside the working directory (a repository's node_modules) and a
    working directory inside a read-only tree: each mount where it belongs."""
    install = tmp_path / "work" / "node_modules"
    install.mkdir(parents=True)
    code = "import sys\nfor p in sys.argv[1:]:\n    try: open(p, 'w').write('x'); print('wrote')\n    except OSError as e: print(e.strerror)"
    done = _wrapped(
        [PYTHON, "-I", "-S", "-c", code, str(install / "x.js"), str(tmp_path / "work" / "out.txt")],
        tmp_path / "work",
        read_only=[str(install)],
    )
    assert done.stdout.split("\n")[:2] == ["Read-only file system", "wrote"], done.stderr
    (tmp_path / "tree" / "run").mkdir(parents=True)
    done = _wrapped(
        [PYTHON, "-I", "-S", "-c", code, str(tmp_path / "tree" / "x"), str(tmp_path / "tree" / "run" / "y")],
        tmp_path / "tree" / "run",
        read_only=[str(tmp_path / "tree")],
    )
    assert done.stdout.split("\n")[:2] == ["Read-only file system", "wrote"], done.stderr

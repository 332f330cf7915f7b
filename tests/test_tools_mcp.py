"""``Toolbox.from_mcp`` against real MCP servers (issue 38, part 3): tools, results, crashes and hangs.

Servers, all real processes spoken to through the ``mcp`` SDK:

- ``mcp-server-time`` and ``mcp-server-git`` from PyPI (the modelcontextprotocol reference servers; git
  on a repository made here, offline), over stdio;
- tests/mcp_server.py, written with the SDK's ``MCPServer``: over stdio, and over streamable HTTP on
  127.0.0.1 (uvicorn), with a tool for each thing a server can do to a client (an image, ``isError``, a
  crash, a hang that blocks it, a stall that does not).

Ground truths are the servers' own: the schemas their SDK objects list in-process, Python's ``zoneinfo``
for the times, ``git log`` for the repository, PIL's own drawing for the image (and the processor's full
render of the conversation holding it), the operating system for the servers' processes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import tmpl
from tmpl.errors import MCPServerError, ToolboxError
from tmpl.toolcalls.schema import tool_schema
from tmpl.tools.mcp import Adapter, Server

from .conftest import REPO
from .fixture_models import get_time, get_weather

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'tmpl[mcp]')")
pytest.importorskip("mcp_server_time", reason="mcp-server-time is not installed (a test dependency)")

SERVER = str(REPO / "tests" / "mcp_server.py")
MINE = [sys.executable, SERVER]
TIME = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
#: the cities the fixture model asks about, by the zone a time server knows them by
ZONES = {"Paris": "Europe/Paris", "Tokyo": "Asia/Tokyo", "Lima": "America/Lima", "Rome": "Europe/Rome"}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def one(box: tmpl.Toolbox, name: str, **arguments: Any) -> Any:
    """The outcome of one call."""
    return box.run_batch([[call(name, **arguments)]]).outcomes[0][0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited: it only waits to be reaped
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def pid_of(box: tmpl.Toolbox) -> int:
    out = one(box, "whoami")
    assert out.ok, out.content
    return int(out.content.split()[1])


def wait_until(condition: Any, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {limit:g} s for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def box(tmp_path_factory: Any) -> Any:
    """One Toolbox over three stdio servers: this module's, the time server and the git server (hang and
    stall time out at 1 s). The tests that crash, hang and close it come last."""
    pytest.importorskip("mcp_server_git", reason="mcp-server-git is not installed (a test dependency)")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path_factory.mktemp("repo")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "first light"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    git = [sys.executable, "-m", "mcp_server_git", "--repository", str(repo)]
    with tmpl.Toolbox.from_mcp(
        MINE, TIME, git, timeout=20.0, timeouts={"hang": 1.0, "stall": 1.0}, probe_timeout=1.5
    ) as b:
        b.repo = repo
        yield b


# -- tools and results ------------------------------------------------------------------------------


def test_schemas_are_what_the_servers_list(box: Any) -> None:
    from mcp_server_time.server import TimeTools

    from . import mcp_server

    mine = {t.name: t for t in asyncio.run(mcp_server.server.list_tools())}
    schemas = {s["function"]["name"]: s["function"] for s in box.schemas}
    assert set(mine) | {t.value for t in TimeTools} <= set(schemas)
    assert {"git_status", "git_log", "git_diff"} <= set(schemas)
    for name, listed in mine.items():  # the server's own objects, read in this process
        assert schemas[name]["parameters"] == listed.input_schema, name
        assert schemas[name]["description"] == listed.description, name
    time_fn = schemas["get_current_time"]
    assert time_fn["parameters"]["required"] == ["timezone"] and "IANA" in str(time_fn["parameters"])
    assert box.mcp.starts == {"mcp_server.py": 1, "mcp_server_time": 1, "mcp_server_git": 1}


def test_the_schemas_render_into_the_prompt_as_any_tools(box: Any, tokenizer_of: Any) -> None:
    tok = tokenizer_of("qwen2.5-instruct")
    tpl = tmpl.ChatTemplate(tok)
    messages = [{"role": "user", "content": "What time is it in Tokyo?"}]
    ids = tpl.prompt_ids(messages, tools=box.schemas)
    truth = tok.apply_chat_template(messages, tools=box.schemas, add_generation_prompt=True, tokenize=True)
    assert ids == list(truth["input_ids"] if hasattr(truth, "keys") else truth)
    assert "get_current_time" in tok.decode(ids) and "Shows the commit logs" in tok.decode(ids)


def test_text_structured_and_error_results_are_tool_messages(box: Any) -> None:
    batch = box.run_batch(
        [
            [call("add", a=2, b="40"), call("get_current_time", timezone="Asia/Tokyo")],
            [call("fail", reason="the disk is full"), call("get_current_time", timezone="Mars/Olympus")],
            [call("add", a=1), call("git_log", repo_path=str(box.repo), max_count=3)],
        ]
    )
    add, tokyo = batch.outcomes[0]
    assert add.ok and add.content == "42" and add.output == {"result": 42}  # "40" coerced by the schema
    assert tokyo.ok and tokyo.output["timezone"] == "Asia/Tokyo"
    now = dt.datetime.fromisoformat(tokyo.output["datetime"])
    assert now.utcoffset() == dt.datetime.now(ZoneInfo("Asia/Tokyo")).utcoffset()
    assert abs((now - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 60
    assert tokyo.content.startswith("{") and '"Asia/Tokyo"' in tokyo.content  # the server's own text
    failed, mars = batch.outcomes[1]
    assert (failed.error, mars.error) == ("exception", "exception")
    assert failed.content.startswith("Error: fail failed: ") and "cannot do that: the disk is full" in failed.content
    assert "Mars/Olympus" in mars.content and failed.output is None
    short, log = batch.outcomes[2]
    assert short.error == "bad_arguments" and "'b'" in short.content  # checked before the server saw it
    assert log.ok and "first light" in log.content
    assert batch.messages[1][0] == {
        "role": "tool",
        "tool_call_id": failed.call_id,
        "name": "fail",
        "content": failed.content,
    }
    m = batch.metrics
    assert (m.calls, m.ok, m.failures["exception"], m.failures["bad_arguments"]) == (6, 3, 2, 1)


def test_one_long_lived_session_per_server(box: Any) -> None:
    first = one(box, "whoami").content
    again = box.run_batch([[call("whoami")] for _ in range(5)])
    pids = {o.content.split()[1] for s in again.outcomes for o in s}
    counts = sorted(int(o.content.split()[3]) for s in again.outcomes for o in s)
    assert pids == {first.split()[1]}  # one process answered them all...
    assert counts == list(range(int(first.split()[3]) + 1, int(first.split()[3]) + 6))  # ...in one session


def test_calls_from_several_event_loops_at_once(box: Any) -> None:
    """The Toolbox is called from threads each running its own loop (run_batch_async), all at once."""
    results: dict[int, Any] = {}

    def worker(k: int) -> None:
        results[k] = asyncio.run(box.run_batch_async([[call("add", a=k, b=j)] for j in range(6)]))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2, 3]
    for k, batch in results.items():
        assert [s[0].output for s in batch.outcomes] == [{"result": k + j} for j in range(6)]


def test_an_image_result_goes_to_the_vision_path(box: Any) -> None:
    """The server's PNG comes back as a PIL image in content parts: the vision rollout's input."""
    from PIL import Image

    from tmpl.rollout.images import tool_messages

    out = box.run_batch([[call("chart", width=40, height=30)]])
    got = out.outcomes[0][0]
    assert got.ok and got.content == "chart 40x30:\n[image: image/png, 40x30]"  # what a text template shows
    message = tool_messages(out.outcomes[0], out.messages[0])[0]
    text, image = message["content"]
    assert text == {"type": "text", "text": "chart 40x30:"} and image["type"] == "image"
    drawn = Image.new("RGB", (40, 30), (220, 20, 20))
    assert image["image"].size == (40, 30) and image["image"].convert("RGB").tobytes() == drawn.tobytes()


def test_a_vision_rollout_with_an_mcp_image_equals_the_processors_render(box: Any) -> None:
    """A scripted model on Qwen2.5-VL's processor calls ``chart``; the next prompt is the processor's own
    full render of the conversation with an image drawn here (IDs and pixel arrays), with verify_every=1."""
    pytest.importorskip("transformers")
    import numpy as np
    from PIL import Image

    from tmpl.backends.scripted import Scripted

    from .test_vision import assert_same_inputs
    from .test_vision_rollout import QWEN, setup

    processor, vt, kwargs = setup(QWEN)
    history: list[dict[str, Any]] = [{"role": "user", "content": "Draw me a chart."}]
    chart = {"type": "function", "id": "c0", "function": {"name": "chart", "arguments": {"width": 40, "height": 30}}}
    turns = [{"role": "assistant", "content": "", "tool_calls": [chart]}, {"role": "assistant", "content": "Red."}]
    drawn = Image.new("RGB", (40, 30), (220, 20, 20))  # what the server draws, drawn here
    checked = []

    def render(messages: list[dict[str, Any]], gen: bool) -> dict[str, Any]:
        out = processor.apply_chat_template(
            messages, tools=box.schemas, tokenize=True, return_dict=True, return_tensors="np",
            add_generation_prompt=gen, **kwargs,
        )  # fmt: skip
        return {k: np.asarray(v) for k, v in out.items()}

    def model(request: Any) -> list[int]:
        turn = int(request.request_id.split("-")[2])
        truth = render(history, True)
        ids = truth["input_ids"][0].tolist()
        assert list(request.prompt_ids) == ids, f"turn {turn}: the prompt is not the processor's render"
        if turn:  # the image the server sent, in the prompt as the processor expands it, pixel for pixel
            assert_same_inputs(request.images.model_inputs(list(request.prompt_ids)), truth, f"turn {turn}")
        checked.append(turn)
        whole = render(history + [turns[turn]], False)["input_ids"][0].tolist()
        end = next(t for t in range(len(ids), len(whole)) if whole[t] in vt.stop_token_ids)
        history.append(turns[turn])
        if turn == 0:
            content = [{"type": "text", "text": "chart 40x30:"}, {"type": "image", "image": drawn}]
            history.append({"role": "tool", "tool_call_id": "c0", "name": "chart", "content": content})
        return whole[len(ids) : end + 1]

    rollout = tmpl.Rollout(vt, Scripted(model), tools=box, max_turns=3, max_length=8000, verify_every=1, progress=False)
    [r] = rollout.run([history[:1]])
    assert r.code.name == "FINISHED" and r.tool_calls == 1 and r.tool_failures == 0, (r.code, r.reason)
    assert checked == [0, 1] and r.unverified == 0 and r.images.count == 1


# -- adapters and bad setups ----------------------------------------------------------------------------


def test_an_adapter_shows_the_time_server_as_the_fixtures_get_time(box: Any) -> None:
    """The fixture model calls get_time(city); the time server has get_current_time(timezone)."""
    adapter = Adapter(
        "get_current_time", schema=get_time, arguments=lambda a: {"timezone": ZONES.get(a["city"], a["city"])}
    )
    # the same sessions, other tools: the adapter, a function of this process, a server tool as listed
    b = tmpl.Toolbox(box.mcp.tools([adapter, get_weather, "convert_time"]), timeout=20.0)
    assert b.schemas[:2] == [tool_schema(get_time), tool_schema(get_weather)]
    assert b.names == ["get_time", "get_weather", "convert_time"]
    assert one(b, "get_weather", city="Oslo").content == get_weather("Oslo")
    batch = b.run_batch(
        [[call("get_time", city="Lima")], [call("get_time", city="Tezora")], [call("get_current_time")]]
    )
    lima, tezora, hidden = (s[0] for s in batch.outcomes)
    assert lima.ok and lima.output["timezone"] == "America/Lima" and lima.name == "get_time"
    assert dt.datetime.fromisoformat(lima.output["datetime"]).utcoffset() == dt.timedelta(hours=-5)
    assert tezora.error == "exception" and tezora.content.startswith("Error: get_time failed: ")
    assert "Tezora" in tezora.content
    assert hidden.error == "unknown_tool"  # only what was asked for is shown


def test_bad_setups_are_named(box: Any) -> None:
    with pytest.raises(MCPServerError, match="'mcp_server_time': lists no tool 'get_time'"):
        box.mcp.tools([Adapter("get_time", server="mcp_server_time")])
    with pytest.raises(MCPServerError, match="both list a tool 'get_current_time'") as clash:
        tmpl.Toolbox.from_mcp(Server(tuple(TIME), name="a"), Server(tuple(TIME), name="b"))
    assert clash.value.server == "a and b"
    with pytest.raises(MCPServerError, match=r"'broken': did not start: .*its stderr ends: no config here"):
        tmpl.Toolbox.from_mcp(
            Server((sys.executable, "-c", "import sys; sys.exit('no config here')"), name="broken"), connect_timeout=20
        )
    with pytest.raises(ToolboxError, match="isolation must be 'thread'"):
        tmpl.Toolbox.from_mcp(TIME, isolation="process")


# -- crashes and hangs ----------------------------------------------------------------------------------


def test_a_crash_is_answered_and_the_server_restarted(box: Any) -> None:
    before, starts = pid_of(box), dict(box.mcp.starts)
    batch = box.run_batch([[call("crash")], [call("get_current_time", timezone="UTC")], [call("add", a=1, b=1)]])
    crashed, other, later = (s[0] for s in batch.outcomes)
    assert crashed.error == "crashed" and crashed.content == (
        "Error: crash crashed: the MCP server 'mcp_server.py' closed the connection during the call; it was restarted"
    )
    assert other.ok  # another server's call, in the same batch
    assert later.error in (None, "crashed")  # sent with the crash: answered by the old process or with it
    assert batch.metrics.failures["crashed"] >= 1
    after = pid_of(box)
    assert after != before and alive(after) and not alive(before)
    assert box.mcp.starts == {**starts, "mcp_server.py": starts["mcp_server.py"] + 1}  # that server alone


def test_a_hang_times_out_and_a_stuck_server_is_restarted(box: Any) -> None:
    before, starts = pid_of(box), box.mcp.starts["mcp_server.py"]
    began = time.monotonic()
    batch = box.run_batch([[call("hang")], [call("get_current_time", timezone="UTC")]])
    hung, other = (s[0] for s in batch.outcomes)
    assert hung.error == "timeout" and hung.content == "Error: hang timed out after 1 s"
    assert other.ok and other.latency < 1.0 and time.monotonic() - began < 3.0
    # its loop is blocked: it does not answer tools/list within probe_timeout, so it is restarted
    wait_until(lambda: box.mcp.starts["mcp_server.py"] == starts + 1, 10, "the restart")
    after = pid_of(box)
    assert after != before
    wait_until(lambda: not alive(before), 15, "the stuck server's end")
    # a call that only waits (the server answers others meanwhile) times out and leaves the server be
    assert one(box, "stall").error == "timeout"
    assert one(box, "nap", seconds=0.05).content == "slept 0.05 s"
    time.sleep(2.0)  # past the probe
    assert box.mcp.starts["mcp_server.py"] == starts + 1 and pid_of(box) == after


def test_close_ends_the_servers(box: Any) -> None:
    pid = pid_of(box)
    box.close()
    wait_until(lambda: not alive(pid), 10, "the server's end at close")
    assert pid_of(box) != pid  # a call after close opens the sessions again


# -- streamable HTTP ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def http_server(tmp_path: Path) -> Any:
    """This module's server over streamable HTTP on 127.0.0.1 (uvicorn), in a process of its own:
    ``(url, start)``, ``start()`` (re)starting it on its port and returning the process."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        log = tmp_path / f"http-{len(procs)}.log"
        with log.open("wb") as f:
            proc = subprocess.Popen([*MINE, "http", str(port)], stdout=f, stderr=subprocess.STDOUT)
        procs.append(proc)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return proc
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(log.read_text()) from None
                time.sleep(0.05)

    try:
        yield f"http://127.0.0.1:{port}/mcp", start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_over_http_results_a_hang_and_a_crash(http_server: Any) -> None:
    url, start = http_server
    proc = start()
    name = url.split("://")[1]
    with tmpl.Toolbox.from_mcp(
        url, timeout=20.0, timeouts={"hang": 1.0}, probe_timeout=1.0, connect_timeout=10, retry_after=0.2
    ) as b:
        batch = b.run_batch([[call("add", a=2, b=3), call("fail", reason="no"), call("chart", width=8, height=6)]])
        add, failed, chart = batch.outcomes[0]
        assert add.output == {"result": 5} and failed.error == "exception" and chart.output[1]["image"].size == (8, 6)
        assert pid_of(b) == proc.pid  # the HTTP server's process answers
        # a hang blocks the HTTP server's loop: answered at its timeout, and a new session is opened (the
        # server is not ours to restart)
        assert one(b, "hang").content == "Error: hang timed out after 1 s"
        wait_until(lambda: b.mcp.starts[name] == 2, 10, "a new session")
        proc.kill()  # whoever runs the server restarts it: the next calls reach the new one
        proc.wait()
        proc = start()
        wait_until(lambda: one(b, "whoami").ok, 20, "a session with the restarted server")
        assert pid_of(b) == proc.pid
        crashed = one(b, "crash")
        assert crashed.error == "crashed" and crashed.content == (
            f"Error: crash crashed: the MCP server {name!r} closed the connection during the call; a new session was opened"
        )
        gone = one(b, "add", a=1, b=2)  # nobody restarts this one
        assert gone.error == "crashed" and gone.content.startswith(
            f"Error: add could not run: the MCP server {name!r} could not be reached: "
        )

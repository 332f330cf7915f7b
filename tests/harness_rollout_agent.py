"""A trivial agent harness, run as its own process by tests/test_harness_rollout.py: the real ``openai`` SDK
against ``OPENAI_BASE_URL`` (a gateway session), one tool (``get_weather``) it really runs, then the answer
written to ``answer.txt`` in its working directory.

    python harness_rollout_agent.py "<task text holding mode:NAME>"

Modes (a word ``mode:NAME`` in the task): ``ok`` (the loop, exit 0), ``daemon`` (forks a daemon that
double-forks and calls setsid, then the loop), ``sleep`` (forks a child, then both sleep past any timeout),
``exit3`` (the loop, then exit 3), ``escape`` (tries a file outside its places and
``ESCAPE_PORT`` on the host's 127.0.0.1 and a public address, says how each ended, then the loop), ``nocall`` (exits 0 without calling), ``flood`` (its second call sends a
huge tool result; a refusal is printed, not fatal). ``PIDS_DIR`` (env): it writes ``<session>.pid`` (and
the daemon ``<session>.daemon``, the sleeper's child ``<session>.child``) there, so the test can check no process is left.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

task = sys.argv[1]
mode = re.search(r"mode:(\w+)", task).group(1)
session = os.environ["OPENAI_BASE_URL"].rstrip("/").split("/")[-2]
pids = os.environ.get("PIDS_DIR")
if pids:
    with open(os.path.join(pids, f"{session}.pid"), "w") as f:
        f.write(str(os.getpid()))

if mode == "daemon":
    if os.fork() == 0:  # a daemon: setsid, double fork, parent exits; it would outlive a process group kill
        os.setsid()
        if os.fork() == 0:
            if pids:
                with open(os.path.join(pids, f"{session}.daemon"), "w") as f:
                    f.write(str(os.getpid()))
            time.sleep(3600)
        os._exit(0)
if mode == "sleep":  # past any timeout, with a child of its own
    if os.fork() == 0:
        if pids:
            with open(os.path.join(pids, f"{session}.child"), "w") as f:
                f.write(str(os.getpid()))
        time.sleep(3600)
        os._exit(0)
    time.sleep(3600)
if mode == "escape":  # (run in the sandbox) write outside its places, reach the host: each must fail
    import socket

    try:
        with open(os.environ["ESCAPE_TO"], "w") as f:
            f.write("out")
        print("write: escaped", file=sys.stderr)
    except OSError as exc:
        print(f"write: blocked ({type(exc).__name__})", file=sys.stderr)
    for host, port in (("127.0.0.1", int(os.environ["ESCAPE_PORT"])), ("1.1.1.1", 80)):
        try:
            socket.create_connection((host, port), timeout=3).close()
            print(f"connect {host}: escaped", file=sys.stderr)
        except OSError as exc:
            print(f"connect {host}: blocked ({type(exc).__name__})", file=sys.stderr)
    with open("home.txt", "w") as f:
        f.write(os.environ["HOME"])
if mode == "nocall":
    print("nothing to do")
    sys.exit(0)

import openai  # noqa: E402 - after the modes that never call

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]

client = openai.OpenAI(max_retries=0)
model = os.environ["MODEL"]
messages: list[dict] = [{"role": "user", "content": task}]
for _ in range(4):
    try:
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=64)
    except openai.BadRequestError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        break
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
        with open("answer.txt", "w") as f:
            f.write(message.content or "")
        break
    for call in message.tool_calls:
        city = json.loads(call.function.arguments)["city"]
        result = json.dumps({"city": city, "weather": f"sunny, {city}"})
        if mode == "flood":
            result += " padding" * 3000
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
print("done")
sys.exit(3 if mode == "exit3" else 0)

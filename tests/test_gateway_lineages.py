"""Side calls are lineages, not edits: a harness's main loop interleaved with title calls and a sub-agent
(its own system prompt and tools), sent through one gateway session by the real ``openai`` and
``anthropic`` SDKs, over a Scripted backend writing Qwen2.5's and Llama 3.2's own tool-call formats.

For every call the engine's prompt is the template's full render of what the client sent
(``apply_chat_template``, computed here from the request, not by tmpl). The main loop is one sequence
(agent None): each of its calls continues the previous main call's prompt and sampled IDs by a suffix,
whatever side calls came between. Each side call is in a lineage of its own (``agent`` ``side-...``), the
sub-agent's calls one sequence of theirs. Every sampled token is in exactly one loss mask. The
``X-Tmpl-Lineage`` header names a lineage; a compaction of the main history is still a branch of the
main lineage.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.gateway import Gateway, create_app

from .conftest import load_tokenizer
from .gateway_util import full_render_ids, served

openai = pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")


def _tool(name: str, description: str, arg: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


MAIN_SYSTEM = "You are a weather agent. Use your tools."
MAIN_TOOLS = [
    _tool("get_weather", "The weather in a city.", "city"),
    _tool("delegate", "Hand a task to a research sub-agent.", "task"),
]
TITLE_SYSTEM = "Write a three-word title for this conversation. Answer with the title only."
SUB_SYSTEM = "You are a research sub-agent. Search, then answer in one line."
SUB_TOOLS = [_tool("search", "Search the web.", "query")]
QUESTION = "Weather in Paris and Lima?"

#: each family's completions: a tool call (name, arguments as JSON), and a text answer
FAMILIES = {
    "qwen2.5-instruct": (
        lambda name, args: f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call><|im_end|>",
        lambda text: f"{text}<|im_end|>",
    ),
    "llama-3.2-instruct": (
        lambda name, args: f"{json.dumps({'name': name, 'parameters': args})}<|eot_id|>",
        lambda text: f"{text}<|eot_id|>",
    ),
}


class Policy:
    """Scripted by what the prompt holds: a title call answers a title; the sub-agent searches, then
    answers; the main loop looks Paris up, delegates Lima, then answers. Keeps what it sampled, by request."""

    def __init__(self, tokenizer: Any, family: str) -> None:
        self.tok = tokenizer
        self.call, self.text = FAMILIES[family]
        self.sampled: dict[str, list[int]] = {}

    def __call__(self, req: Any) -> list[int]:
        prompt = self.tok.decode(list(req.prompt_ids))
        if TITLE_SYSTEM in prompt:
            out = self.text("Paris Lima weather")
        elif SUB_SYSTEM in prompt:
            out = self.text("Lima is sunny.") if "found: Lima" in prompt else self.call("search", {"query": "Lima"})
        elif "Lima is sunny." in prompt:
            out = self.text("Paris and Lima are sunny.")
        elif "sunny, Paris" in prompt:
            out = self.call("delegate", {"task": "Weather in Lima"})
        else:
            out = self.call("get_weather", {"city": "Paris"})
        ids = self.tok.encode(out, add_special_tokens=False)
        self.sampled[req.request_id] = ids
        return ids


def gateway_of(family: str) -> tuple[Gateway, Scripted, Policy]:
    tok = load_tokenizer(family)
    policy = Policy(tok, family)
    backend = Scripted(policy)
    return Gateway(tmpl.ChatTemplate(tok), backend), backend, policy


class Client:
    """One SDK's calls, on conversations kept in the OpenAI chat shape (what the full render reads):
    ``ask`` sends a conversation (system first) and returns the assistant turn in that shape and how the
    gateway made the prompt (``append`` or ``render``)."""

    def __init__(self, sdk: str, url: str, session: str) -> None:
        self.sdk = sdk
        if sdk == "openai":
            self.client: Any = openai.OpenAI(base_url=f"{url}/s/{session}/v1", api_key="unused", max_retries=0)
        else:
            self.client = anthropic.Anthropic(base_url=f"{url}/s/{session}", api_key="unused", max_retries=0)

    def ask(self, chat: list[dict], tools: list[dict] | None, lineage: str | None = None) -> tuple[dict, str]:
        headers = {"X-Tmpl-Lineage": lineage} if lineage else None
        if self.sdk == "openai":
            extra = {"tools": tools} if tools else {}
            reply = self.client.chat.completions.create(model="m", messages=chat, extra_headers=headers, **extra)
            return reply.choices[0].message.model_dump(exclude_none=True), reply.tmpl["prompt"]
        extra = {"tools": [_anthropic_tool(t) for t in tools]} if tools else {}
        reply = self.client.messages.create(
            model="m",
            max_tokens=256,
            system=chat[0]["content"],
            messages=_anthropic_messages(chat[1:]),
            extra_headers=headers,
            **extra,
        )
        blocks = [b.model_dump(exclude_none=True) for b in reply.content]
        turn: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(b["text"] for b in blocks if b["type"] == "text"),
        }
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if uses:
            turn["tool_calls"] = [
                {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
                for b in uses
            ]
        return turn, reply.model_extra["tmpl"]["prompt"]


def _anthropic_tool(tool: dict) -> dict:
    fn = tool["function"]
    return {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}


def _anthropic_messages(chat: list[dict]) -> list[dict]:
    """The chat (no system) as Anthropic messages: calls as ``tool_use`` blocks, results as ``tool_result``
    blocks of one user message."""
    out: list[dict] = []
    for m in chat:
        if m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m["role"] == "assistant":
            blocks: list[dict] = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            for c in m.get("tool_calls", ()):
                args = c["function"]["arguments"]
                blocks.append(
                    {"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                     "input": json.loads(args) if isinstance(args, str) else args}
                )  # fmt: skip
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def _arguments(call: dict) -> dict:
    args = call["function"]["arguments"]
    return json.loads(args) if isinstance(args, str) else args


def run_harness(client: Client, *, title_lineage: str | None = None) -> list[tuple[str, list[dict], Any, str]]:
    """The harness: its main loop, a title call after each of its first two turns, and a sub-agent run by
    the main loop's ``delegate`` call. Returns every call as (who, the chat it sent, its tools, prompt mode)."""
    calls: list[tuple[str, list[dict], Any, str]] = []

    def ask(who: str, chat: list[dict], tools: Any, lineage: str | None = None) -> dict:
        sent = json.loads(json.dumps(chat))
        turn, mode = client.ask(chat, tools, lineage)
        calls.append((who, sent, tools, mode))
        chat.append(turn)
        return turn

    main: list[dict] = [{"role": "system", "content": MAIN_SYSTEM}, {"role": "user", "content": QUESTION}]
    for turn_index in range(6):
        turn = ask("main", main, MAIN_TOOLS)
        if turn_index < 2:  # the harness titles the conversation as it goes
            title = [
                {"role": "system", "content": TITLE_SYSTEM},
                {"role": "user", "content": f"{QUESTION} ({turn_index})"},
            ]
            ask("title", title, None, title_lineage)
        if not turn.get("tool_calls"):
            return calls
        for call in turn["tool_calls"]:
            if call["function"]["name"] == "get_weather":
                result = f"sunny, {_arguments(call)['city']}"
            else:  # the sub-agent: its own system prompt, tools and loop
                sub = [{"role": "system", "content": SUB_SYSTEM}, {"role": "user", "content": _arguments(call)["task"]}]
                for _ in range(4):
                    step = ask("sub", sub, SUB_TOOLS)
                    if not step.get("tool_calls"):
                        break
                    for c in step["tool_calls"]:
                        sub.append({"role": "tool", "tool_call_id": c["id"], "content": "found: Lima 24C, sunny"})
                result = step["content"]
            main.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise AssertionError("the main loop did not end")


def check_calls(gateway: Gateway, backend: Scripted, policy: Policy, key: str, calls: list) -> None:
    """Every prompt the full render of its request, sampled IDs unchanged, every sampled token in
    exactly one loss mask."""
    episode = gateway.episode(key)
    assert len(episode.calls) == len(calls)
    engine = {r.request_id: list(r.prompt_ids) for r in backend.requests}
    for k, (call, (who, chat, tools, _)) in enumerate(zip(episode.calls, calls)):
        prompt = call.prompt_ids.tolist()
        assert prompt == engine[call.id], f"call {k} ({who}): the engine was sent other IDs"
        assert call.completion_ids.tolist() == policy.sampled[call.id], f"call {k} ({who}): sampled IDs changed"
        assert prompt == full_render_ids(gateway.tpl.tokenizer, chat, tools), f"call {k} ({who}): not the full render"
    seqs = episode.sequences
    assert sum(int(s.mask.sum()) for s in seqs) == sum(len(c.completion_ids) for c in episode.calls)
    for call in episode.calls:  # in the mask of its own sequence (so, with the total, of no other)
        seq = seqs[episode.sequence_of(call.id)]
        span = seq.spans[seq.calls.index(call.id)]
        assert seq.ids[span.start : span.end].tolist() == call.completion_ids.tolist()
        assert seq.mask[span.start : span.end].all()


def continues(before: Any, after: Any) -> bool:
    kept = before.prompt_ids.tolist() + before.completion_ids.tolist()
    return after.prompt_ids.tolist()[: len(kept)] == kept


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_side_calls_are_lineages_and_the_main_loop_one_sequence(family, sdk):
    gateway, backend, policy = gateway_of(family)
    with served(create_app(gateway)) as url:
        calls = run_harness(Client(sdk, url, "s"))
        record = httpx.get(f"{url}/s/s/episode").json()
    assert [who for who, *_ in calls] == ["main", "title", "main", "title", "sub", "sub", "main"]
    check_calls(gateway, backend, policy, "s", calls)
    episode = gateway.episode("s")
    by = {who: [c for c, (w, *_) in zip(episode.calls, calls) if w == who] for who in ("main", "title", "sub")}
    modes = {who: [m for w, *_, m in calls if w == who] for who in ("main", "title", "sub")}
    # the main loop: one sequence, each call a suffix of the previous main call's prompt and sampled IDs
    main = {episode.sequence_of(c.id) for c in by["main"]}
    assert len(main) == 1, [str(s.branch) for s in episode.sequences]
    seq = episode.sequences[main.pop()]
    assert seq.agent is None and seq.branch.kind == "first" and seq.calls == tuple(c.id for c in by["main"])
    assert all(continues(a, b) for a, b in zip(by["main"], by["main"][1:]))
    assert modes["main"] == ["render", "append", "append"] and modes["sub"] == ["render", "append"]
    last = by["main"][-1]
    assert seq.ids.tolist() == last.prompt_ids.tolist() + last.completion_ids.tolist()
    # the sub-agent: one sequence of its own lineage
    sub = {episode.sequence_of(c.id) for c in by["sub"]}
    assert len(sub) == 1
    sub_seq = episode.sequences[sub.pop()]
    assert sub_seq.agent is not None and sub_seq.agent.startswith("side-") and sub_seq.branch.kind == "agent"
    # the titles: a lineage of their own (the second asks about another text: a branch of that lineage)
    titles = [episode.sequences[episode.sequence_of(c.id)] for c in by["title"]]
    assert {s.agent for s in titles} == {titles[0].agent} and titles[0].agent not in (None, sub_seq.agent)
    assert titles[0].branch.kind == "agent" and titles[1].branch.kind == "diverged"
    assert titles[1].branch.against == titles[0].index
    assert not {s.index for s in titles} & {seq.index, sub_seq.index}
    # the episode's JSON and record name each call's lineage
    assert [s["agent"] for s in record["sequences"]] == [s.agent for s in episode.sequences]
    assert [c["agent"] for c in record["record"]["calls"]] == [c.agent for c in episode.calls]


def test_the_header_names_a_lineage():
    """``X-Tmpl-Lineage`` names the title calls' lineage (their agent label); a call with the main loop's
    system prompt and tools that names a lineage of its own does not continue the main sequence; a name
    that is not one is refused (400, OpenAI's error shape)."""
    gateway, backend, policy = gateway_of("qwen2.5-instruct")
    with served(create_app(gateway)) as url:
        client = Client("openai", url, "h")
        calls = run_harness(client, title_lineage="titler")
        # a judge with the main loop's prompt and tools: by its digest it would be the main lineage
        judge = [{"role": "system", "content": MAIN_SYSTEM}, {"role": "user", "content": QUESTION}]
        turn, mode = client.ask(json.loads(json.dumps(judge)), MAIN_TOOLS, "judge")
        calls.append(("judge", judge, MAIN_TOOLS, mode))
        bad = httpx.post(
            f"{url}/s/h/v1/chat/completions",
            json={"model": "m", "messages": judge},
            headers={"X-Tmpl-Lineage": "no spaces"},
        )
    check_calls(gateway, backend, policy, "h", calls)
    episode = gateway.episode("h")
    agents = [c.agent for c in episode.calls]
    assert agents[1] == agents[3] == "titler" and agents[-1] == "judge"
    assert {agents[k] for k, (who, *_) in enumerate(calls) if who == "main"} == {None}
    judge_seq = episode.sequences[episode.sequence_of(episode.calls[-1].id)]
    assert judge_seq.branch.kind == "agent" and judge_seq.calls == (episode.calls[-1].id,)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Tmpl-Lineage"
    assert len(episode.calls) == len(calls)  # the refused call recorded nothing


def test_a_compaction_of_the_main_history_is_a_branch_of_the_main_lineage():
    """After a title call, the harness compacts its main history (the same system prompt and tools): the
    next main call is a branch of the main lineage naming the message it changed, not a lineage of its own."""
    gateway, backend, policy = gateway_of("llama-3.2-instruct")
    with served(create_app(gateway)) as url:
        client = Client("openai", url, "c")
        calls: list = []
        main = [{"role": "system", "content": MAIN_SYSTEM}, {"role": "user", "content": QUESTION}]
        turn, mode = client.ask(json.loads(json.dumps(main)), MAIN_TOOLS)
        calls.append(("main", json.loads(json.dumps(main)), MAIN_TOOLS, mode))
        title = [{"role": "system", "content": TITLE_SYSTEM}, {"role": "user", "content": QUESTION}]
        calls.append(("title", json.loads(json.dumps(title)), None, client.ask(title, None)[1]))
        compacted = [main[0], {"role": "user", "content": f"{QUESTION} Summary so far: Paris is sunny, Lima next."}]
        calls.append(("main", json.loads(json.dumps(compacted)), MAIN_TOOLS, client.ask(compacted, MAIN_TOOLS)[1]))
    check_calls(gateway, backend, policy, "c", calls)
    episode = gateway.episode("c")
    first, title_seq, branch = (episode.sequences[episode.sequence_of(c.id)] for c in episode.calls)
    assert first.agent is None and branch.agent is None and title_seq.agent not in (None,)
    assert branch.branch.kind == "diverged" and branch.branch.against == first.index
    assert (branch.branch.message, branch.branch.field) == (1, "content"), str(branch.branch)
    assert "client changed messages[1] (content)" in branch.branch.edit


def test_many_side_lineages_never_push_out_the_main_loop():
    """More side lineages than a session keeps heads for (one title prompt per call, as a harness that puts
    the date in its title prompt would): the main loop still continues by a suffix, and a side lineage whose
    heads were dropped continues its own sequence through a render that keeps its sampled IDs."""
    import asyncio

    from tmpl.gateway.service import CallParams
    from tmpl.gateway.session import MAX_LINEAGES

    gateway, backend, policy = gateway_of("qwen2.5-instruct")

    def call(messages: list[dict], tools: Any) -> Any:
        return asyncio.run(gateway.complete("many", messages, tools, CallParams()))

    main = [{"role": "system", "content": MAIN_SYSTEM}, {"role": "user", "content": QUESTION}]
    first = call(main, MAIN_TOOLS).replies[0]
    main += [
        first.message,
        {"role": "tool", "tool_call_id": first.message["tool_calls"][0]["id"], "content": "sunny, Paris"},
    ]
    titles = []
    for k in range(MAX_LINEAGES + 2):
        chat = [{"role": "system", "content": f"{TITLE_SYSTEM} ({k})"}, {"role": "user", "content": QUESTION}]
        titles.append((chat, call(chat, None).replies[0]))
    done = call(main, MAIN_TOOLS)
    assert done.plan.mode == "append"
    session = gateway.session("many")
    assert len(session.lineages) == MAX_LINEAGES + 1 and session.main in session.lineages
    chat, reply = titles[0]  # its heads were dropped: rendered, its sampled IDs kept, its sequence continued
    again = call([*chat, reply.message, {"role": "user", "content": "Shorter?"}], None)
    assert again.plan.mode == "render"
    episode = gateway.episode("many")
    calls = {c.id: c for c in episode.calls}
    before, after = calls[reply.call], calls[again.replies[0].call]
    assert continues(before, after) and episode.sequence_of(before.id) == episode.sequence_of(after.id)
    assert episode.sequence_of(first.call) == episode.sequence_of(done.replies[0].call)
    assert sum(int(s.mask.sum()) for s in episode.sequences) == sum(len(c.completion_ids) for c in episode.calls)

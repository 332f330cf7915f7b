"""Sub-agents (issue 36): a tool that runs its own model episode, whose calls join the parent's episode.

The parent (Qwen2.5's template, real tokenizer) calls ``research``; the sub-agent, a Rollout of its own
with a weather tool, calls that tool and answers; its answer is the parent's tool result. A scripted
engine answers both from their request IDs and records every prompt it was sent and every ID it
sampled. Oracles: the tokenizer's ``apply_chat_template`` for every prompt, and the recorded IDs for
every training sequence.
"""

from __future__ import annotations

import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.errors import ToolboxError
from tmpl.rollout import EndCode, SubAgent

from .conftest import load_tokenizer

TASK = "Weather in Paris?"
ANSWER = "It is sunny in Paris, 21 C."


def get_weather(city: str) -> str:
    """Current weather.

    Args:
        city: The city.
    """
    return f"{city}: 21 C, sunny"


def call_text(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call><|im_end|>'


class Engine:
    """Answers the parent (request IDs ``i-s-t``) and the sub-agent (``research@<call>/i-s-t``) by turn."""

    def __init__(self, tpl: tmpl.ChatTemplate, final: str = "Paris is sunny: pack light."):
        enc = tpl.codec.encode
        self.parent = [enc(call_text("research", '{"task": "' + TASK + '"}')), enc(final + "<|im_end|>")]
        self.sub = [enc(call_text("get_weather", '{"city": "Paris"}')), enc(ANSWER + "<|im_end|>")]
        self.sent: dict[str, list[int]] = {}
        self.sampled: dict[str, list[int]] = {}

    def __call__(self, request):
        rid = request.request_id
        turn = int(rid.rsplit("-", 1)[1])
        ids = (self.sub if "@" in rid else self.parent)[turn]
        self.sent[rid], self.sampled[rid] = list(request.prompt_ids), list(ids)
        return ids


def render(tpl, messages, tools) -> list[int]:
    out = tpl.tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=tpl.template, add_generation_prompt=True, tokenize=True
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("history", ["append", "template"])
def test_a_subagents_calls_join_the_parents_episode_each_trained_once(twin, history):
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen2.5-instruct"), name="qwen2.5-instruct")
    engine = Engine(tpl)
    backend = Scripted(engine)
    sub = tmpl.Rollout(tpl, backend, tools=[get_weather], max_turns=4)
    research = SubAgent(sub, name="research", description="Look something up and answer in one line.")
    parent = tmpl.Rollout(tpl, backend, tools=[research], max_turns=4, history=history)
    [res] = parent.run([[{"role": "user", "content": "Should I pack an umbrella for Paris?"}]])
    assert res.code is EndCode.FINISHED, res.reason

    # the parent saw the sub-agent's answer as the result of its call; the sub-agent ran its own tool
    [tool_message] = [m for m in res.messages if m["role"] == "tool"]
    assert tool_message["content"] == ANSWER
    subs = sorted(rid for rid in engine.sent if "@" in rid)
    parents = sorted(rid for rid in engine.sent if "@" not in rid)
    assert parents == ["0-0-0", "0-0-1"] and len(subs) == 2 and all(r.startswith("research@") for r in subs)

    # every prompt is the template's full render of its own conversation, with its own tools
    research_schema = research.tool_schema
    weather_schema = tmpl.Toolbox([get_weather]).schemas
    assert engine.sent[parents[0]] == render(tpl, res.messages[:1], [research_schema])
    assert engine.sent[subs[0]] == render(tpl, [{"role": "user", "content": TASK}], weather_schema)
    assert engine.sent[parents[1]] == render(tpl, res.messages[:3], [research_schema])

    # the episode: the parent's sequence and the sub-agent's, each sampled token in one loss mask once
    seqs = res.sequences
    assert sorted(str(s.agent) for s in seqs) == ["None", "research"]
    assert sum(int(s.mask.sum()) for s in seqs) == sum(len(ids) for ids in engine.sampled.values())
    # the parent rollout's metrics count the sub-agent's sampled tokens too
    assert parent.metrics.tokens_generated == sum(len(ids) for ids in engine.sampled.values())
    by_agent = {s.agent: s for s in seqs}
    for agent, rids in ((None, parents), ("research", subs)):
        seq = by_agent[agent]
        assert len(seq.spans) == 2
        for span, rid in zip(seq.spans, rids):
            assert seq.ids[: span.start].tolist() == engine.sent[rid]  # what the engine was sent ...
            assert seq.ids[span.start : span.end].tolist() == engine.sampled[rid]  # ... and sampled
            assert seq.mask[span.start : span.end].all()
    # exported and read back, the sub-agent's sequence is there still
    [back] = tmpl.export.from_records(tmpl.export.to_records([res]))
    assert [(s.agent, s.ids.tolist(), s.mask.tolist()) for s in back.sequences] == [
        (s.agent, s.ids.tolist(), s.mask.tolist()) for s in seqs
    ]
    calls = {c.id: c for c in res.episode.calls}
    sub_calls = [c for c in calls.values() if c.agent == "research"]
    assert [c.parent for c in sub_calls] == ["turn-0", "turn-0"]  # under the parent's call that ran it
    assert all(c.id.startswith("research@") for c in sub_calls)


def test_a_subagent_that_does_not_finish_says_so_in_the_tool_result(twin):
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen2.5-instruct"), name="qwen2.5-instruct")
    engine = Engine(tpl)
    sub = tmpl.Rollout(tpl, Scripted(engine), tools=[get_weather], max_turns=1)  # no turn for the answer
    research = SubAgent(sub, name="research", description="Look something up.")
    [res] = tmpl.Rollout(tpl, Scripted(engine), tools=[research], max_turns=4).run([[{"role": "user", "content": "?"}]])
    [tool_message] = [m for m in res.messages if m["role"] == "tool"]
    assert tool_message["content"].startswith("The sub-agent research stopped (max_turns)")
    # its one sampled call is still trained, in its own sequence
    assert sum(int(s.mask.sum()) for s in res.sequences) == sum(len(ids) for ids in engine.sampled.values())


def test_bad_subagents_are_refused_by_name():
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen2.5-instruct"), name="qwen2.5-instruct")
    sub = tmpl.Rollout(tpl, Scripted(lambda r: [0]), sampling=tmpl.backends.Sampling(n=2))
    with pytest.raises(ToolboxError, match="'research'.*n=2"):
        SubAgent(sub, name="research", description="x")
    ok = SubAgent(tmpl.Rollout(tpl, Scripted(lambda r: [0])), name="research", description="x")
    with pytest.raises(ToolboxError, match="research.*isolation='process'"):
        tmpl.Toolbox([ok], isolation="process")
    with pytest.raises(ToolboxError, match="name"):
        SubAgent(tmpl.Rollout(tpl, Scripted(lambda r: [0])), name="two words", description="x")

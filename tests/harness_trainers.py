"""What the trainer tests of harness runs share (tests/test_integrations_*_harness*.py): two tiny harness
processes on the real ``openai`` SDK, and the Scripted policy's answer as the template renders it.

- :data:`REWRITE`: calls once with the task, then once with a rewritten history ("Summary: <reply>"), so its
  episode has two training sequences; writes the first reply to ``answer.txt``;
- :data:`SILENT`: exits 0 without a model call.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tmpl.harness import Harness

ANSWER = "Done."
REWRITER = """
import sys, openai
client = openai.OpenAI(max_retries=0)
first = [{"role": "user", "content": sys.argv[1]}]
reply = client.chat.completions.create(model=sys.argv[2], messages=first).choices[0].message.content
client.chat.completions.create(model=sys.argv[2], messages=[{"role": "user", "content": "Summary: " + reply}])
open("answer.txt", "w").write(reply)
"""
REWRITE = Harness(
    "rewriter",
    (sys.executable, "-c", REWRITER.replace("{", "{{").replace("}", "}}"), "{task}", "{model}"),
    dialect="openai-chat",
    env={"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "unused"},
    timeout=60,
)
SILENT = Harness("silent", (sys.executable, "-c", "print('no model call')"), dialect="openai-chat", timeout=60)


def answer_ids(tok, close: str = "<|im_end|>") -> list[int]:
    """The assistant turn :data:`ANSWER` as the template renders it, through its turn close."""
    history = [{"role": "user", "content": "x"}]
    prompt = tok.apply_chat_template(history, add_generation_prompt=True)["input_ids"]
    full = tok.apply_chat_template([*history, {"role": "assistant", "content": ANSWER}])["input_ids"]
    end = tok.convert_tokens_to_ids(close)
    return list(full[len(prompt) : full.index(end, len(prompt)) + 1])


def render(tok, text: str) -> list[int]:
    """The tokenizer's own render of one user message with the generation prompt."""
    return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)["input_ids"])


def verifier(workdir: Path, episode) -> float:
    """1.0 when the harness wrote the policy's answer to answer.txt."""
    answer = workdir / "answer.txt"
    return 1.0 if answer.exists() and answer.read_text() == ANSWER else 0.0

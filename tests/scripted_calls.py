"""A Scripted policy of the dialect tests (tests/test_gateway_gemini.py, tests/test_gateway_responses.py): turn
k, counted by the tool results (``RESULT-``) in the prompt, makes the script's k-th call in the family's own call
text, then answers."""

from __future__ import annotations

import json

CALLS = {
    "qwen2.5-instruct": (
        '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call><|im_end|>',
        "{text}<|im_end|>",
    ),
    "qwen3": (
        '<think>\nStep {k}.\n</think>\n\n<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call><|im_end|>',
        "<think>\nStep {k}.\n</think>\n\n{text}<|im_end|>",
    ),
    "llama-3.2-instruct": ('{{"name": "{name}", "parameters": {args}}}<|eot_id|>', "{text}<|eot_id|>"),
}


class Policy:
    """Turn k (k tool results in the prompt) makes SCRIPT[k]'s call in the family's format, then answers."""

    def __init__(self, tok, family: str, script) -> None:
        self.tok, self.script = tok, script
        self.call, self.answer = CALLS[family]
        self.sampled: dict[str, list[int]] = {}

    def __call__(self, req):
        k = self.tok.decode(list(req.prompt_ids)).count("RESULT-")
        if k < len(self.script):
            name, args = self.script[k]
            out = self.call.format(name=name, args=json.dumps(args), k=k)
        else:
            out = self.answer.format(text="All done.", k=k)
        ids = self.tok.encode(out, add_special_tokens=False)
        self.sampled[req.request_id] = ids
        return ids

"""``tmpl serve``'s own server (:func:`tmpl.gateway.serve.run`) over a scripted Qwen2.5 engine, for the
durable-store tests that kill it (tests/test_gateway_durable.py).

    python tests/durable_serve.py --store gw.db --port 8123 --slow-file /tmp/slow

The engine calls ``get_weather`` once per city the conversation names no result for yet, then answers.
While ``--slow-file`` exists, each generation waits 60 s first (a non-streamed one before it answers, a
streamed one after its first piece): a test kills the server with a call in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CITIES = ["Paris", "Lima", "Oslo", "Quito"]
CALL = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call><|im_end|>'
ANSWER = "It is sunny in every city you named.<|im_end|>"


def main() -> int:
    mine = argparse.ArgumentParser()
    mine.add_argument("--slow-file", required=True)
    mine.add_argument("--calls", type=int, default=3)
    ours, rest = mine.parse_known_args()

    from conftest import load_tokenizer

    import tmpl
    from tmpl.backends import Scripted
    from tmpl.gateway import serve
    from tmpl.gateway.service import Gateway

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "qwen2.5-instruct", *rest])
    tok = load_tokenizer("qwen2.5-instruct")
    tpl = tmpl.ChatTemplate(tok)

    def policy(req):
        text = tok.decode(list(req.prompt_ids))
        done = sum(text.count(f"sunny, {c}") for c in CITIES)
        out = CALL.format(city=CITIES[done % len(CITIES)]) if done < ours.calls else ANSWER
        return tok.encode(out, add_special_tokens=False)

    async def pace(req, k):
        if k == 1 and os.path.exists(ours.slow_file):
            await asyncio.sleep(60)

    class Slow(Scripted):
        async def agenerate(self, request):
            if os.path.exists(ours.slow_file):
                await asyncio.sleep(60)
            return await super().agenerate(request)

    backend = Slow(policy, record=False, pieces=3, pace=pace)
    gateway = Gateway(
        tpl, backend, store=args.store, max_store_bytes=args.max_store_bytes, max_tokens=256, call_timeout=120
    )
    print(
        f"ready: resumed {gateway.durable.resumed} open, {gateway.durable.requeued} finished",
        file=sys.stderr,
        flush=True,
    )
    return serve.run(args, gateway)


if __name__ == "__main__":
    sys.exit(main())

"""``tmpl serve``: the gateway from the command line, over vLLM servers or a local Torch model.

    tmpl serve ../shared/models/qwen2.5-instruct-tools                 # Torch on this machine
    tmpl serve Qwen/Qwen3-8B --vllm http://127.0.0.1:8000 --port 8100   # in front of vLLM servers

Then any client with a configurable base URL talks to ``http://HOST:PORT/s/<session>/v1`` (OpenAI) or
``http://HOST:PORT/s/<session>`` (Anthropic); docs/gateway.md has each client's two lines.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

__all__ = ["add_parser", "build_gateway"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``tmpl serve`` on the CLI's subcommands."""
    serve: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="a token-exact OpenAI / Anthropic endpoint for agent harnesses (the gateway)",
        epilog="exit status: 0 stopped cleanly; 2 bad input or usage. See docs/gateway.md.",
    )
    serve.add_argument(
        "model", metavar="SOURCE", help="a model or tokenizer folder, or a hub id (its template renders)"
    )
    serve.add_argument("--template", metavar="FILE", help="a chat template file to use instead of the folder's")
    serve.add_argument(
        "--vllm", metavar="URL", action="append", help="a vLLM server to generate with (repeat for several); "
        "without it the model is loaded here with torch"
    )  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8100, help="port to listen on (default 8100)")
    serve.add_argument("--max-tokens", type=int, default=1024, help="sampled tokens per call at most (default 1024)")
    serve.add_argument("--max-context", type=int, default=32768, help="prompt plus sampled tokens at most")
    serve.add_argument("--temperature", type=float, default=1.0, help="default where a request names none")
    serve.add_argument("--ttl", type=float, default=3600.0, help="seconds a session may stay idle (default 3600)")
    serve.add_argument("--max-sessions", type=int, default=10_000, help="open sessions at most (default 10000)")
    serve.add_argument(
        "--call-timeout",
        type=float,
        default=600.0,
        help="seconds an engine request may take (504 past it; default 600)",
    )
    serve.add_argument(
        "--max-session-tokens",
        type=int,
        default=4_000_000,
        help="tokens (prompts and samples of every call) one session's episode may hold (default 4000000)",
    )
    serve.add_argument("--strict", action="store_true", help="refuse (409) a history the gateway never produced")
    serve.add_argument(
        "--store",
        metavar="PATH",
        help="keep every recorded call in this SQLite file (WAL) before answering; started again on it, the "
        "gateway resumes its open sessions and gives again the finished episodes no reader acknowledged",
    )
    serve.add_argument(
        "--max-store-bytes",
        type=int,
        help="bytes the store may hold: past it, episodes read and not acknowledged are dropped, then calls "
        "are refused (507)",
    )
    serve.add_argument("--model-name", help="the name /v1/models lists (default: the template's)")
    serve.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave the garbage collector as it is (default: what is loaded at start-up is frozen out of its "
        "reach and young collections are rarer, tmpl.rollout.collector.fewer_collections; see GET /metrics)",
    )
    serve.add_argument(
        "--admin-token",
        default=os.environ.get("TMPL_ADMIN_TOKEN"),
        help="serve POST /admin/weights (a trainer's weight update) to holders of this bearer token "
        "(default: $TMPL_ADMIN_TOKEN; unset: not served)",
    )
    return serve


#: seconds open connections get to finish once the server is told to stop
GRACE = 10


def build_gateway(args: argparse.Namespace) -> Any:
    """The :class:`~tmpl.gateway.Gateway` the arguments describe."""
    from ..chat_template import ChatTemplate
    from .service import Gateway

    tpl = ChatTemplate.from_pretrained(args.model, chat_template=args.template)
    backend: Any
    if args.vllm:
        from ..backends import VLLMServer

        backend = VLLMServer(args.vllm, api="generate")
    else:
        from transformers import AutoModelForCausalLM

        from ..backends import Torch

        print(f"tmpl serve: loading {args.model} with torch", file=sys.stderr, flush=True)
        backend = Torch(AutoModelForCausalLM.from_pretrained(args.model).eval(), tokenizer=tpl.tokenizer)
    return Gateway(
        tpl,
        backend,
        model=args.model_name,
        max_tokens=args.max_tokens,
        max_context=args.max_context,
        temperature=args.temperature,
        ttl=args.ttl,
        max_sessions=args.max_sessions,
        strict=args.strict,
        call_timeout=args.call_timeout,
        max_session_tokens=args.max_session_tokens,
        store=getattr(args, "store", None),
        max_store_bytes=getattr(args, "max_store_bytes", None),
    )


def run(args: argparse.Namespace, gateway: Any = None) -> int:
    """Serve until interrupted (SIGINT or SIGTERM): open sessions are ended on the way out (with a
    ``--store`` they stay in it). ``gateway``: serve this one instead of the one the arguments describe."""
    try:
        import uvicorn
    except ImportError as exc:
        raise ImportError("tmpl serve needs FastAPI and uvicorn: pip install 'tmpl[gateway]'") from exc
    from .app import create_app

    if gateway is None:
        gateway = build_gateway(args)
    app = create_app(gateway, admin_token=args.admin_token, watch_loop=True)
    where = f"http://{args.host}:{args.port}"
    print(
        f"tmpl serve: {gateway.model} at {where}/s/<session>/v1 (OpenAI chat completions) and "
        f"{where}/s/<session>/v1/messages (Anthropic)",
        file=sys.stderr,
        flush=True,
    )
    from ..rollout.collector import fewer_collections

    try:
        # the loaded tokenizer, template and model frozen out of the collector's reach: a full collection
        # of that heap paused the event loop for 140-190 ms (benchmarks/gateway.py)
        with fewer_collections() if getattr(args, "gc_freeze", True) else contextlib.nullcontext():
            # on SIGINT/SIGTERM, open connections (an /episodes/stream waiting up to its idle time, a call
            # up to call_timeout) get GRACE seconds, then their tasks are cancelled (engine requests stopped)
            uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=GRACE)
    finally:
        gateway.close()
    return 0

"""What every harness test shares (tests/test_harness_*.py): a real agent CLI, unmodified, run against
the gateway on a real tokenizer over a Scripted backend.

- :class:`OneCall`: the scripted policy. For a template family it writes ONE call of a named tool (in
  the family's own tool-call text) when the prompt shows that tool and the call has not been made yet
  (its ``marker`` is not in the prompt: the call's arguments hold it), and a short text answer otherwise
  (side calls such as a title get text too).
- :func:`gateway_for`: a :class:`~tmpl.gateway.Gateway` with that policy served on 127.0.0.1, every raw
  request body kept as it arrived (per dialect) and tied to the engine calls it made.
- :func:`run_spec`: a catalog spec's rendered argv, env, files and setup run as a real process tree with
  a throwaway ``HOME`` and a timeout.
- :func:`check_episode`: the issue's five assertions (exit 0, the tool ran, every prompt the template's
  full render of the raw request as the dialect's documented mapping reads it, the answer's prompt the
  call's prompt and sampled IDs unchanged, every sampled token in exactly one loss mask).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.harness import Harness

from .conftest import load_tokenizer
from .gateway_util import full_render_ids, served
from .harness_installs import wait_for_installs

ROOT = Path(__file__).resolve().parent.parent
#: where .ci/harnesses installs the npm CLIs
NPM_BIN = ROOT / "build" / "harnesses" / "node_modules" / ".bin"
#: the three templates every harness runs on (a reasoning one among them)
TEMPLATES = ("qwen2.5-instruct", "llama-3.2-instruct", "qwen3")
#: per family: a call's text (``{name}``, ``{args}`` filled) and a text answer, as the model writes them
FAMILIES = {
    "qwen2.5-instruct": (
        '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call><|im_end|>',
        "Done.<|im_end|>",
    ),
    "qwen3": (
        '<think>\nThe shell tool does it.\n</think>\n\n<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n'
        "</tool_call><|im_end|>",
        "<think>\nIt ran.\n</think>\n\nDone.<|im_end|>",
    ),
    "llama-3.2-instruct": ('{{"name": "{name}", "parameters": {args}}}<|eot_id|>', "Done.<|eot_id|>"),
}
#: what a harness test asks, the file its one call writes, and the text that proves the call ran
PROOF_FILE = "proof.txt"
PROOF_TEXT = "tmpl-harness-ran"
TASK = f"Create the file {PROOF_FILE} in the current directory with your tool, then say Done."


def shell_command() -> str:
    """The command a shell tool runs: writes :data:`PROOF_TEXT` into :data:`PROOF_FILE` (the shell joins
    its two pieces, so the file's text is in no prompt; the call's arguments hold :data:`MARKER`)."""
    return f"printf '%s-%s' tmpl-harness ran > {PROOF_FILE}"


#: the marker that says "the call was made": in every call's arguments this module writes
MARKER = "tmpl-harness"


def npm_bin(name: str) -> str:
    """The path of an npm CLI installed by .ci/harnesses; skips the test (naming the install) when absent."""
    wait_for_installs()  # in CI, the npm install may still run beside the suite
    path = NPM_BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed: run .ci/harnesses (npm install into build/harnesses)")
    return str(path)


class OneCall:
    """The scripted policy of a harness test (see the module docstring); ``sampled`` by request id,
    ``calls``: the ids of the requests it answered with the tool call."""

    def __init__(self, tokenizer: Any, family: str, tool: str, arguments: dict[str, Any]) -> None:
        self.tok = tokenizer
        call, self.answer = FAMILIES[family]
        self.call = call.format(name=tool, args=json.dumps(arguments))
        self.shows = f'"{tool}"'
        self.sampled: dict[str, list[int]] = {}
        self.calls: set[str] = set()
        self.prompts: dict[str, str] = {}

    def __call__(self, req: Any) -> list[int]:
        text = self.tok.decode(list(req.prompt_ids))
        self.prompts[req.request_id] = text
        made = MARKER in text
        out = self.call if self.shows in text and not made else self.answer
        if out is self.call:
            self.calls.add(req.request_id)
        ids = self.tok.encode(out, add_special_tokens=False)
        self.sampled[req.request_id] = ids
        return ids


@dataclass
class Arrival:
    """A raw request body as it arrived, its dialect, and the engine calls it made (call ids)."""

    dialect: str
    body: dict[str, Any]
    kwargs: dict[str, Any]
    request: Any = None
    calls: list[str] = field(default_factory=list)


@dataclass
class Served:
    """A served gateway of a harness test: its URL, the gateway, backend and policy, the arrivals."""

    url: str
    gateway: Any
    backend: Scripted
    policy: OneCall
    family: str
    arrivals: list[Arrival]
    #: every HTTP request the harness made: (method, path, status), in order
    routes: list[tuple[str, str, int]] = field(default_factory=list)


def recording(app: Any, routes: list[tuple[str, str, int]]) -> Any:
    """``app`` (ASGI) with every HTTP request's method, path and response status appended to ``routes``."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)

        async def sent(message: Any) -> None:
            if message["type"] == "http.response.start":
                routes.append((scope["method"], scope["path"], message["status"]))
            await send(message)

        return await app(scope, receive, sent)

    return asgi


def _dialect_modules() -> list[tuple[str, Any]]:
    from tmpl.gateway.dialects import anthropic, openai_chat, responses

    out = [("chat", openai_chat), ("responses", responses), ("anthropic", anthropic)]
    with contextlib.suppress(ImportError):
        from tmpl.gateway.dialects import gemini

        out.append(("gemini", gemini))
    return out


def record_arrivals(gateway: Any, monkeypatch: pytest.MonkeyPatch) -> list[Arrival]:
    """Every raw request body the gateway's dialects parse, as it arrived, each tied to the engine calls
    its request made (the list fills as the harness runs)."""
    arrivals: list[Arrival] = []
    for name, module in _dialect_modules():
        real = module.parse

        def keep(body: Any, *args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any) -> Any:
            arrival = Arrival(_name, json.loads(json.dumps(body)), dict(kwargs))
            arrivals.append(arrival)
            arrival.request = _real(body, *args, **kwargs)
            return arrival.request

        monkeypatch.setattr(module, "parse", keep)
    complete = gateway.complete

    async def tied(key: str, messages: Any, *args: Any, **kwargs: Any) -> Any:
        done = await complete(key, messages, *args, **kwargs)
        for arrival in reversed(arrivals):
            if arrival.request is not None and arrival.request.messages is messages:
                arrival.calls += [r.call for r in done.replies]
                break
        return done

    monkeypatch.setattr(gateway, "complete", tied)
    return arrivals


@contextlib.contextmanager
def gateway_for(family: str, tool: str, arguments: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """A gateway on ``family``'s tokenizer whose Scripted policy makes one call of ``tool(arguments)``,
    served on 127.0.0.1; every raw body each dialect's ``parse`` got is kept, with the engine calls its
    request made (``Gateway.complete`` wrapped on the instance: the streamed path goes through it too)."""
    pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")
    from tmpl.gateway import Gateway, create_app

    tok = load_tokenizer(family)
    tpl = tmpl.ChatTemplate(tok, enable_thinking=True) if family == "qwen3" else tmpl.ChatTemplate(tok)
    policy = OneCall(tok, family, tool, arguments)
    backend = Scripted(policy)
    gateway = Gateway(tpl, backend, max_tokens=4096, max_context=131_072)
    arrivals = record_arrivals(gateway, monkeypatch)
    routes: list[tuple[str, str, int]] = []
    with served(recording(create_app(gateway), routes)) as url:
        yield Served(url, gateway, backend, policy, family, arrivals, routes)


@dataclass(frozen=True)
class Ran:
    """How a harness run ended, what it printed, and its working directory."""

    code: int
    timed_out: bool
    seconds: float
    stdout: str
    stderr: str
    workdir: Path
    home: Path

    def tail(self, n: int = 3000) -> str:
        return f"exit {self.code} after {self.seconds:.1f} s\n--- stdout\n{self.stdout[-n:]}\n--- stderr\n{self.stderr[-n:]}"


def run_spec(spec: Harness, url: str, session: str, task: str, workdir: Path, *, model: str = "tmpl") -> Ran:
    """``spec`` rendered for one run and run as a real process tree (its own process group, killed whole
    at ``spec.timeout``) in ``workdir`` with a throwaway ``HOME`` (a temporary folder, removed after); the
    environment is ``PATH`` (the npm CLIs first), ``HOME``, a UTF-8 locale and the spec's variables, no
    more (no key or setting of the machine leaks in)."""
    home = Path(tempfile.mkdtemp(prefix="tmpl-home-"))
    try:
        run = spec.render(gateway=url, session=session, task=task, workdir=str(workdir), home=str(home), model=model)
        for path, content in run.files.items():
            target = Path(path) if os.path.isabs(path) else workdir / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content, encoding="utf-8")
        env = {
            "PATH": f"{NPM_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "TMPDIR": str(home),
            "NO_COLOR": "1",
            **run.env,
        }
        if run.setup:
            subprocess.run(run.setup, cwd=workdir, env=env, check=True, timeout=120, stdin=subprocess.DEVNULL)
        out, err = home / ".tmpl-stdout", home / ".tmpl-stderr"
        start = time.monotonic()
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = subprocess.Popen(
                run.argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, start_new_session=True
            )
            timed_out = False
            try:
                proc.wait(spec.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            with contextlib.suppress(ProcessLookupError):  # the whole tree: what it left running too
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        seconds = time.monotonic() - start
        return Ran(
            proc.returncode,
            timed_out,
            seconds,
            out.read_text(errors="replace"),
            err.read_text(errors="replace"),
            workdir,
            home,
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _refuses_mid_system(tokenizer: Any) -> bool:
    """Whether the template refuses (raises on, or drops) a system turn after the first user turn: the
    Anthropic mapping folds such turns then (tests/mapping_anthropic.py)."""
    turns = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "system", "content": "zq-mid-system"},
        {"role": "user", "content": "c"},
    ]
    try:
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - the template's own refusal
        return True
    return "zq-mid-system" not in text


def _refuses_system(tokenizer: Any) -> bool:
    turns = [{"role": "system", "content": "zq-lead-system"}, {"role": "user", "content": "a"}]
    try:
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001
        return True
    return "zq-lead-system" not in text


def mapped(arrival: Arrival, tokenizer: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A raw body as messages and tools by its dialect's documented mapping (tests/mapping_*.py)."""
    if arrival.dialect == "chat":
        from .mapping_chat import chat_messages

        return chat_messages(arrival.body)
    if arrival.dialect == "responses":
        from .mapping_responses import responses_messages

        return responses_messages(arrival.body)
    if arrival.dialect == "anthropic":
        from .mapping_anthropic import anthropic_messages

        return anthropic_messages(
            arrival.body, fold=_refuses_mid_system(tokenizer), fold_leading=_refuses_system(tokenizer)
        )
    from .mapping_gemini import gemini_messages

    return gemini_messages(arrival.body)


def check_episode(served: Served, ran: Ran, session: str, *, proof: str = PROOF_FILE, text: str = PROOF_TEXT) -> Any:
    """The issue's five assertions on one harness run; returns the episode."""
    # 1. the harness exits 0
    assert not ran.timed_out, f"the harness ran past its timeout\n{ran.tail()}"
    assert ran.code == 0, ran.tail()
    # 2. the tool really ran: the file it wrote
    made = ran.workdir / proof
    assert made.is_file(), f"{proof} was not written: the tool did not run\n{ran.tail()}"
    assert made.read_text().strip() == text
    refused = [r for r in served.routes if r[2] >= 400]
    assert not refused, f"the gateway refused some of the harness's requests: {refused}\n{ran.tail()}"
    gateway, backend, policy = served.gateway, served.backend, served.policy
    tok = gateway.tpl.tokenizer
    episode = gateway.episode(session)
    calls = episode.calls
    assert policy.calls, f"the policy never saw its tool in a prompt\n{ran.tail()}"
    # 3. every prompt: what the engine got, and the template's full render of the raw request as the
    # dialect's documented mapping reads it
    engine = {r.request_id: list(r.prompt_ids) for r in backend.requests}
    by_call = {c: a for a in served.arrivals for c in a.calls}
    for k, call in enumerate(calls):
        prompt = call.prompt_ids.tolist()
        assert prompt == engine[call.id], f"call {k}: the engine was sent other IDs"
        assert call.completion_ids.tolist() == policy.sampled[call.id], f"call {k}: sampled IDs changed"
        arrival = by_call.get(call.id)
        assert arrival is not None, f"call {k}: no raw request made it"
        messages, tools = mapped(arrival, tok)
        expected = full_render_ids(tok, messages, tools)
        if prompt != expected:
            got, want = tok.decode(prompt), tok.decode(expected)
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            raise AssertionError(
                f"call {k} ({arrival.dialect}): not the full render of the raw request; first difference at "
                f"char {at}:\n  prompt: {got[max(0, at - 200) : at + 200]!r}\n  render: {want[max(0, at - 200) : at + 200]!r}"
            )
    # 4. the answer's prompt continues the call's prompt and sampled IDs unchanged
    for call in (c for c in calls if c.id in policy.calls):
        kept = call.prompt_ids.tolist() + call.completion_ids.tolist()
        later = [c for c in calls if c.prompt_ids.tolist()[: len(kept)] == kept and len(c.prompt_ids) > len(kept)]
        assert later, (
            "no later call continues the tool call's prompt and sampled IDs (the next main-loop prompt was "
            f"re-rendered): {[str(s.branch) for s in episode.sequences]}"
        )
        answer = later[0]
        assert policy.sampled[answer.id] != policy.sampled[call.id], "the answer repeated the call"
    # 5. every sampled token in exactly one loss mask
    check_masks(served, session)
    return episode


def check_masks(served: Served, session: str) -> None:
    """The fifth assertion alone (also where a harness's own rewrite of its history makes a branch, so
    that the fourth cannot hold): every call's sampled IDs in exactly one training sequence, all in its
    loss mask, and nothing else in any mask."""
    episode = served.gateway.episode(session)
    calls, policy = episode.calls, served.policy
    where: dict[str, int] = {}
    for seq in episode.sequences:
        for cid, span in zip(seq.calls, seq.spans):
            assert seq.ids[span.start : span.end].tolist() == policy.sampled[cid]
            assert seq.mask[span.start : span.end].all(), f"call {cid}: sampled tokens outside the mask"
            where[cid] = where.get(cid, 0) + 1
    assert all(where.get(c.id) == 1 for c in calls), f"calls not in exactly one sequence: {where}"
    assert sum(int(s.mask.sum()) for s in episode.sequences) == sum(len(c.completion_ids) for c in calls)


@dataclass(frozen=True)
class Outcome:
    """One harness test's run: the served gateway, how the harness ended, and the checked episode."""

    served: Served
    ran: Ran
    episode: Any
    seconds: float


def run_harness(
    spec: Harness,
    family: str,
    tool: str,
    arguments: dict[str, Any],
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    session: str = "h1",
    timeout: float = 240.0,
) -> Outcome:
    """A harness test's whole body: ``spec``'s CLI (skipped when not installed) against a gateway whose
    policy calls ``tool(arguments)`` once, run on :data:`TASK`, then :func:`check_episode`."""
    npm_bin(spec.argv[0])
    start = time.monotonic()
    limited = dataclasses.replace(spec, timeout=min(spec.timeout, timeout))
    with gateway_for(family, tool, arguments, monkeypatch) as served:
        ran = run_spec(limited, served.url, session, TASK, workdir)
        episode = check_episode(served, ran, session)
    return Outcome(served, ran, episode, time.monotonic() - start)

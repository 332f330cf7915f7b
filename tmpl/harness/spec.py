"""A harness as data: what to run, in which dialect, and how it is pointed at a gateway session.

A :class:`Harness` is the argv and environment of an agent program (Claude Code, Codex CLI, Gemini CLI,
mini-swe-agent, a script on the OpenAI Agents SDK...), written with placeholders that
:meth:`Harness.render` fills for one run:

=============== =====================================================================================
placeholder     value
=============== =====================================================================================
``{base_url}``  the session's base URL in the harness's dialect (:data:`BASE_URLS`)
``{gateway}``   the gateway's root URL (no session), e.g. ``http://127.0.0.1:8100``
``{session}``   the session key
``{task}``      the task's text (the user's prompt)
``{workdir}``   the run's working directory (the task's files laid into it)
``{home}``      the run's throwaway ``HOME``
``{model}``     the model name the gateway lists
=============== =====================================================================================

``files`` are written before the run (config files: a path under ``{home}`` or relative to the working
directory), ``setup`` runs in the working directory before the harness. A literal brace is written
``{{`` / ``}}``.

>>> h = Harness("echo", ("sh", "-c", "echo {task}"), dialect="openai-chat", env={"OPENAI_BASE_URL": "{base_url}"})
>>> run = h.render(gateway="http://127.0.0.1:8100", session="s1", task="hi", workdir="/w", home="/h", model="m")
>>> run.argv, run.env["OPENAI_BASE_URL"]
(('sh', '-c', 'echo hi'), 'http://127.0.0.1:8100/s/s1/v1')
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import HarnessSpecError

__all__ = ["BASE_URLS", "DIALECTS", "PLACEHOLDERS", "Harness", "RenderedRun"]

#: the wire dialects the gateway serves, by the name a :class:`Harness` gives
DIALECTS = ("openai-chat", "openai-responses", "anthropic", "gemini")
#: each dialect's base URL for a session: what its clients put before their own paths
#: (the OpenAI clients append ``/chat/completions`` or ``/responses``; the Anthropic ones ``/v1/messages``;
#: the Gemini ones ``/v1beta/models/<model>:generateContent``)
BASE_URLS = {
    "openai-chat": "{gateway}/s/{session}/v1",
    "openai-responses": "{gateway}/s/{session}/v1",
    "anthropic": "{gateway}/s/{session}",
    "gemini": "{gateway}/s/{session}",
}
PLACEHOLDERS = ("base_url", "gateway", "session", "task", "workdir", "home", "model")


@dataclass(frozen=True)
class RenderedRun:
    """One run's argv, environment and files, every placeholder filled."""

    argv: tuple[str, ...]
    env: dict[str, str]
    files: dict[str, str | bytes]
    setup: tuple[str, ...] | None


@dataclass(frozen=True)
class Harness:
    """An agent program as data (see the module's docstring for the placeholders).

    - ``name``: what results and logs call it; ``dialect``: one of :data:`DIALECTS`;
    - ``argv``, ``env``: the command and the variables added to the run's environment (placeholders
      filled); ``files``: path -> content written before the run (placeholders filled in both; a path
      under ``{home}`` or relative to the working directory); ``setup``: a command run in the working
      directory before the harness (its failure ends the run);
    - ``timeout``: seconds the harness may run before its whole process tree is killed;
    - ``version``, ``install``, ``notes``: what the compatibility table (docs/harnesses.md) says of it: the
      pinned version, how it is installed, what it sends beyond its main loop.
    """

    name: str
    argv: tuple[str, ...]
    dialect: str
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    setup: tuple[str, ...] | None = None
    timeout: float = 600.0
    version: str = ""
    install: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        if self.dialect not in DIALECTS:
            raise HarnessSpecError(self.name, f"dialect must be one of {', '.join(DIALECTS)}, not {self.dialect!r}")
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise HarnessSpecError(self.name, "argv must be a non-empty sequence of strings")
        object.__setattr__(self, "argv", tuple(self.argv))
        if self.setup is not None:
            object.__setattr__(self, "setup", tuple(self.setup))
        if not self.timeout > 0:
            raise HarnessSpecError(self.name, f"timeout must be positive seconds, not {self.timeout!r}")
        for where, text in self._templates():
            _check(self.name, where, text)

    def _templates(self) -> list[tuple[str, str]]:
        out = [(f"argv[{k}]", a) for k, a in enumerate(self.argv)]
        out += [(f"env[{k!r}]", v) for k, v in self.env.items()]
        out += [(f"files key {k!r}", k) for k in self.files]
        out += [(f"files[{k!r}]", v) for k, v in self.files.items() if isinstance(v, str)]
        out += [(f"setup[{k}]", a) for k, a in enumerate(self.setup or ())]
        return out

    def base_url(self, gateway: str, session: str) -> str:
        """The session's base URL in this harness's dialect.

        >>> Harness("c", ("claude",), dialect="anthropic").base_url("http://127.0.0.1:9", "s1")
        'http://127.0.0.1:9/s/s1'
        """
        return BASE_URLS[self.dialect].format(gateway=gateway.rstrip("/"), session=session)

    def render(self, *, gateway: str, session: str, task: str, workdir: str, home: str, model: str) -> RenderedRun:
        """This harness's argv, env, files and setup for one run, every placeholder filled."""
        values: dict[str, Any] = {
            "gateway": gateway.rstrip("/"),
            "session": session,
            "task": task,
            "workdir": workdir,
            "home": home,
            "model": model,
        }
        values["base_url"] = self.base_url(gateway, session)

        def fill(text: str) -> str:
            return text.format_map(values)

        return RenderedRun(
            argv=tuple(fill(a) for a in self.argv),
            env={k: fill(v) for k, v in self.env.items()},
            files={fill(k): (fill(v) if isinstance(v, str) else v) for k, v in self.files.items()},
            setup=tuple(fill(a) for a in self.setup) if self.setup else None,
        )


def _check(name: str, where: str, text: str) -> None:
    """A template whose placeholders are all known (a typo fails when the spec is made, not mid-run)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise HarnessSpecError(name, f"{where}: {exc} (write a literal brace as {{{{ or }}}})") from None
    unknown = sorted({f for f in fields if f not in PLACEHOLDERS})
    if unknown:
        raise HarnessSpecError(
            name, f"{where}: unknown placeholder(s) {', '.join(unknown)}; known: {', '.join(PLACEHOLDERS)}"
        )

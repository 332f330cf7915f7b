"""Harness specs of three more npm agent CLIs (docs/harnesses.md, "More npm CLIs"): Cline CLI, pi and
Kilo Code CLI, run unmodified through the gateway.

Each is pointed at the session by its own documented OpenAI-compatible provider setting, with a
throwaway ``HOME`` (its configuration written there), its telemetry and update checks off, and its
tools approved without a prompt. The commands are the ones ``.ci/harnesses`` installs into
``build/harnesses/node_modules/.bin`` (found on ``PATH``).

>>> run = HARNESSES["pi"].render(gateway="http://127.0.0.1:9", session="s1", task="hi", workdir="/w",
...                              home="/h", model="tmpl")
>>> json.loads(run.files["/h/.pi/agent/models.json"])["providers"]["tmpl"]["baseUrl"]
'http://127.0.0.1:9/s/s1/v1'
"""

from __future__ import annotations

import json

from ..spec import Harness

__all__ = ["HARNESSES"]

_INSTALL = ".ci/harnesses (npm install of .ci/harnesses.json into build/harnesses)"


def _escape(text: str) -> str:
    """JSON text as a spec template: its braces doubled, ``@base_url@`` and ``@model@`` the placeholders."""
    return text.replace("{", "{{").replace("}", "}}").replace("@base_url@", "{base_url}").replace("@model@", "{model}")


#: Cline's global settings: telemetry off, no update
_CLINE_SETTINGS = json.dumps({"telemetryOptOut": True, "autoUpdateEnabled": False})

#: pi's custom provider (docs/models.md of the package): chat completions at the session's base URL; the
#: system prompt as a ``system`` turn and no ``reasoning_effort`` (what a local OpenAI-compatible server takes)
_PI_MODELS = _escape(
    json.dumps(
        {
            "providers": {
                "tmpl": {
                    "baseUrl": "@base_url@",
                    "api": "openai-completions",
                    "apiKey": "unused",
                    "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                    "models": [{"id": "@model@", "reasoning": False, "contextWindow": 131072, "maxTokens": 4096}],
                }
            }
        },
        indent=2,
    )
)

#: where Cline keeps its state in a run: under the throwaway HOME, named with ``--data-dir`` (which also
#: runs the session in the CLI's own process: no hub daemon left behind)
_CLINE_DATA = "{home}/.cline/data"

#: Kilo's configuration (opencode's format: ``KILO_CONFIG`` names the file): a provider on the AI SDK's
#: OpenAI-compatible package at the session's base URL, its one model the session's
_KILO_CONFIG = _escape(
    json.dumps(
        {
            "provider": {
                "tmpl": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "tmpl",
                    "options": {"baseURL": "@base_url@", "apiKey": "unused"},
                    "models": {"@model@": {"name": "@model@", "tool_call": True}},
                }
            },
            "model": "tmpl/@model@",
            "small_model": "tmpl/@model@",
            "autoupdate": False,
            "share": "disabled",
        },
        indent=2,
    )
)

HARNESSES: dict[str, Harness] = {
    "cline": Harness(
        "cline",
        ("cline", "--data-dir", _CLINE_DATA, "-P", "openai-compatible", "-m", "{model}", "{task}"),
        dialect="openai-chat",
        setup=(
            "cline",
            "auth",
            "--data-dir",
            _CLINE_DATA,
            "--provider",
            "openai-compatible",
            "--apikey",
            "unused",
            "--modelid",
            "{model}",
            "--baseurl",
            "{base_url}",
        ),  # fmt: skip
        files={_CLINE_DATA + "/settings/global-settings.json": _escape(_CLINE_SETTINGS)},
        timeout=300.0,
        version="cline 3.0.65",
        install=_INSTALL,
        notes="tools auto-approved by default (no --yolo: it requires a submit_and_exit call to end); no side calls seen",
    ),
    "kilo": Harness(
        "kilo",
        ("kilo", "run", "--auto", "-m", "tmpl/{model}", "{task}"),
        dialect="openai-chat",
        env={
            "KILO_CONFIG": "{home}/kilo.json",
            "KILO_TELEMETRY_LEVEL": "off",
            "KILO_NO_DAEMON": "1",
            "KILO_DISABLE_AUTOUPDATE": "1",
            "KILO_DISABLE_MODELS_FETCH": "1",
            "KILO_DISABLE_SHARE": "1",
        },
        files={"{home}/kilo.json": _KILO_CONFIG},
        timeout=300.0,
        version="@kilocode/cli 7.7.7",
        install=_INSTALL,
        notes="--auto approves its tools; the session title from the prompt (no title call seen)",
    ),
    "pi": Harness(
        "pi",
        ("pi", "--offline", "--no-session", "--provider", "tmpl", "--model", "{model}", "-p", "{task}"),
        dialect="openai-chat",
        env={"PI_OFFLINE": "1", "PI_TELEMETRY": "0"},
        files={"{home}/.pi/agent/models.json": _PI_MODELS},
        timeout=300.0,
        version="@mariozechner/pi-coding-agent 0.73.1",
        install=_INSTALL,
        notes="tools run without approval (pi has none); no side calls seen in print mode",
    ),
}

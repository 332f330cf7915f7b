"""The npm agent CLIs as harness specs (docs/harnesses.md, "npm CLIs"): each is what a user copies, the
harness pointed at a gateway session by its own documented settings only (a base URL variable or a config
file under the throwaway ``HOME``), telemetry and update checks off, and the flag that lets its shell tool
run without asking. ``.ci/harnesses`` installs the pinned versions; tests/test_harness_<name>.py runs each.

>>> HARNESSES["claude-code"].render(gateway="http://127.0.0.1:8100", session="s1", task="hi", workdir="/w",
...                                 home="/h", model="m").env["ANTHROPIC_BASE_URL"]
'http://127.0.0.1:8100/s/s1'
"""

from __future__ import annotations

from ..spec import Harness

__all__ = ["HARNESSES"]

CLAUDE_CODE = Harness(
    "claude-code",
    ("claude", "-p", "{task}", "--model", "{model}", "--allowedTools", "Bash", "Write", "Edit", "Read"),
    dialect="anthropic",
    env={
        "ANTHROPIC_BASE_URL": "{base_url}",
        "ANTHROPIC_API_KEY": "unused",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
    },
    version="2.1.197",
    install="npm install @anthropic-ai/claude-code@2.1.197",
)

HARNESSES: dict[str, Harness] = {h.name: h for h in (CLAUDE_CODE,)}

CODEX = Harness(
    "codex",
    (
        "codex",
        "exec",
        "--dangerously-bypass-approvals-and-sandbox",
        "--skip-git-repo-check",
        "--strict-config",
        "{task}",
    ),
    dialect="openai-responses",
    env={"TMPL_GATEWAY_KEY": "unused"},
    files={
        "{home}/.codex/config.toml": (
            'model = "{model}"\n'
            'model_provider = "tmpl"\n'
            "\n"
            "[model_providers.tmpl]\n"
            'name = "tmpl gateway"\n'
            'base_url = "{base_url}"\n'
            'wire_api = "responses"\n'
            'env_key = "TMPL_GATEWAY_KEY"\n'
            "\n"
            "[analytics]\n"
            "enabled = false\n"
        )
    },
    version="0.171.0",
    install="npm install @openai/codex@0.171.0",
)
HARNESSES[CODEX.name] = CODEX

GEMINI_CLI = Harness(
    "gemini-cli",
    ("gemini", "--prompt", "{task}", "--model", "{model}", "--approval-mode", "yolo", "--skip-trust"),
    dialect="gemini",
    env={"GOOGLE_GEMINI_BASE_URL": "{base_url}", "GEMINI_API_KEY": "unused"},
    files={
        "{home}/.gemini/settings.json": (
            '{{"security": {{"auth": {{"selectedType": "gemini-api-key"}}}}, '
            '"privacy": {{"usageStatisticsEnabled": false}}, "telemetry": {{"enabled": false}}, '
            '"general": {{"disableAutoUpdate": true}}}}\n'
        )
    },
    version="0.61.0",
    install="npm install @google/gemini-cli@0.61.0",
)
HARNESSES[GEMINI_CLI.name] = GEMINI_CLI

QWEN_CODE = Harness(
    "qwen-code",
    ("qwen", "--model", "{model}", "--auth-type", "openai", "--approval-mode", "yolo", "{task}"),
    dialect="openai-chat",
    env={"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "unused", "OPENAI_MODEL": "{model}"},
    files={
        "{home}/.qwen/settings.json": (
            '{{"privacy": {{"usageStatisticsEnabled": false}}, "telemetry": {{"enabled": false}}, '
            '"general": {{"disableAutoUpdate": true}}}}\n'
        )
    },
    version="0.24.4",
    install="npm install @qwen-code/qwen-code@0.24.4",
)
HARNESSES[QWEN_CODE.name] = QWEN_CODE

OPENCODE = Harness(
    "opencode",
    ("opencode", "run", "--model", "tmpl/{model}", "{task}"),
    dialect="openai-chat",
    env={"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"},
    files={
        "{home}/.config/opencode/opencode.json": (
            '{{"$schema": "https://opencode.ai/config.json", "autoupdate": false, "share": "disabled",\n'
            ' "permission": {{"bash": "allow", "edit": "allow"}},\n'
            ' "provider": {{"tmpl": {{"npm": "@ai-sdk/openai-compatible", "name": "tmpl gateway",\n'
            '   "options": {{"baseURL": "{base_url}", "apiKey": "unused"}},\n'
            '   "models": {{"{model}": {{"name": "{model}", "tool_call": true}}}}}}}}}}\n'
        )
    },
    version="1.18.33",
    install="npm install opencode-ai@1.18.33",
)
HARNESSES[OPENCODE.name] = OPENCODE

CONTINUE_CLI = Harness(
    "continue-cli",
    ("cn", "--print", "--auto", "--config", "{home}/.continue/config.yaml", "{task}"),
    dialect="openai-chat",
    env={"CONTINUE_CLI_ENABLE_TELEMETRY": "0"},
    files={
        "{home}/.continue/config.yaml": (
            "name: tmpl gateway\n"
            "version: 1.0.0\n"
            "schema: v1\n"
            "models:\n"
            "  - name: {model}\n"
            "    provider: openai\n"
            "    model: {model}\n"
            "    apiBase: {base_url}\n"
            "    apiKey: unused\n"
            "    roles: [chat, edit, apply]\n"
            "    capabilities: [tool_use]\n"
        )
    },
    version="1.5.47",
    install="npm install @continuedev/cli@1.5.47",
)
HARNESSES[CONTINUE_CLI.name] = CONTINUE_CLI

CRUSH = Harness(
    "crush",
    ("crush", "run", "{task}"),
    dialect="openai-chat",
    env={"CRUSH_DISABLE_METRICS": "1", "CRUSH_DISABLE_PROVIDER_AUTO_UPDATE": "1"},
    files={
        "{home}/.config/crush/crush.json": (
            '{{"$schema": "https://charm.land/crush.json",\n'
            ' "options": {{"disable_metrics": true, "disable_provider_auto_update": true}},\n'
            ' "permissions": {{"allowed_tools": ["bash", "edit", "write", "view", "ls", "glob", "grep"]}},\n'
            ' "providers": {{"tmpl": {{"name": "tmpl gateway", "type": "openai-compat", "base_url": "{base_url}",\n'
            '   "api_key": "unused", "models": [{{"id": "{model}", "name": "{model}", "context_window": 32768,\n'
            '   "default_max_tokens": 1024}}]}}}},\n'
            ' "models": {{"large": {{"provider": "tmpl", "model": "{model}"}}, "small": {{"provider": "tmpl", "model": "{model}"}}}}}}\n'
        )
    },
    version="0.96.1",
    install="npm install @charmland/crush@0.96.1 (its postinstall downloads the binary from github.com)",
)
HARNESSES[CRUSH.name] = CRUSH

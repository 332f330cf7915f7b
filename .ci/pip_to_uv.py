"""pip's configuration as uv's environment variables (uv does not read pip's configuration).

    eval "$(python .ci/pip_to_uv.py)"      # shell: export UV_INDEX_URL=... lines
    python .ci/pip_to_uv.py --json          # the same as a JSON object (tests)

Indexes, extra indexes (with pip's rule of the best version over all indexes), find-links,
constraints and the certificate bundle carry over; uv never downloads an interpreter. Only the
standard library and ``pip config list``, so any interpreter with pip can run it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys


def pip_config() -> dict[str, str]:
    """``pip config list`` as {key: value}, the last scope winning (``global.index-url`` -> ``index-url``)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    config: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        config[key.split(".", 1)[-1]] = value.strip().strip("'\"")
    return config


def uv_env(config: dict[str, str]) -> dict[str, str]:
    env = {"UV_PYTHON_DOWNLOADS": "never"}
    if config.get("index-url"):
        env["UV_INDEX_URL"] = config["index-url"]
    if config.get("extra-index-url"):
        env["UV_EXTRA_INDEX_URL"] = config["extra-index-url"]
        env["UV_INDEX_STRATEGY"] = "unsafe-best-match"  # pip's rule: the best version over all indexes
    if config.get("find-links"):
        env["UV_FIND_LINKS"] = config["find-links"]
    if config.get("constraint"):
        env["UV_CONSTRAINT"] = config["constraint"]
    if config.get("cert"):
        env["SSL_CERT_FILE"] = config["cert"]
    return env


def main(argv: list[str]) -> int:
    env = uv_env(pip_config())
    if argv == ["--json"]:
        print(json.dumps(env))
    else:
        for key, value in env.items():
            print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

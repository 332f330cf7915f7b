"""The one tool every agent script here gives its model, and their shared command line (standard library only).

>>> run_shell("echo hi")
'hi\\n[exit 0]'
"""

from __future__ import annotations

import argparse
import os
import subprocess

#: what the tool says of itself to the model
DESCRIPTION = "Run a shell command in the working directory and return its output and exit status."


def run_shell(command: str) -> str:
    """Run ``command`` with ``sh -c`` in the current directory (60 s at most): its stdout and stderr, then ``[exit N]``."""
    try:
        done = subprocess.run(
            command, shell=True, cwd=os.getcwd(), capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        return "[timed out after 60 s]"
    return f"{done.stdout}{done.stderr}[exit {done.returncode}]"


def parse_args(prog: str) -> argparse.Namespace:
    """``--model M`` and the task; the endpoint comes from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``."""
    parser = argparse.ArgumentParser(prog=prog, description=f"a small {prog} agent with a shell tool")
    parser.add_argument("--model", required=True, help="the model name the endpoint serves")
    parser.add_argument("--max-steps", type=int, default=6, help="model calls at most")
    parser.add_argument("task", help="the user's prompt")
    args = parser.parse_args()
    if not os.environ.get("OPENAI_BASE_URL"):
        parser.error("OPENAI_BASE_URL is not set (the OpenAI-compatible endpoint, e.g. http://host/s/key/v1)")
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    return args

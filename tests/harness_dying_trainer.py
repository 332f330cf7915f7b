"""A trainer that runs one harness per sample and is killed mid-run by tests/test_harness_rollout.py.

    python harness_dying_trainer.py MARKS_DIR

Its harness (``sh``) writes its PID, starts a ``setsid`` daemon that writes its own, and sleeps; the
gateway is a URL nothing listens on (the harness never calls it, the trainer dies before it would read
an episode): only the process trees are under test.
"""

from __future__ import annotations

import sys

from tmpl.harness import Harness, HarnessRollout, HarnessTask

marks = sys.argv[1]
script = f"echo $$ > {marks}/$1.pid; setsid sh -c 'echo $$ > {marks}/'$1'.daemon; exec sleep 600' & exec sleep 600"
harness = Harness("sleeper", ("sh", "-c", script, "sh", "{session}"), dialect="openai-chat", timeout=600)
HarnessRollout(harness, "http://127.0.0.1:9", concurrency=2, progress=False, model="none").run(
    [HarnessTask("x", id="a"), HarnessTask("y", id="b")]
)

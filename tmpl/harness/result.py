"""What one harness run gives: its training sequences, its reward, and how it ended (a status code).

=================== =========================================================================================
status              meaning
=================== =========================================================================================
``HARNESS_DONE``    the harness exited 0 and its verifier (if any) gave a reward
``HARNESS_TIMEOUT`` it ran past its timeout: its whole process tree was killed (its calls so far are kept)
``HARNESS_EXITED``  it exited with a non-zero code (``exit_code``; ``-N``: killed by signal N)
``CALLS_REFUSED``   the gateway refused some of its model calls (``error`` quotes why: e.g. the session's
                    ``max_session_tokens``, a body too large); the calls it answered are kept
``NO_CALLS``        it exited without a model call recorded: nothing to train on, no verifier run
``VERIFIER_FAILED`` its verifier hung, crashed or gave something that is not a number (``error`` says which)
``SETUP_FAILED``    the run could not start: the task's files are gone, a harness file outside its places,
                    the harness's ``setup`` command failed, the sandbox could not start
``GATEWAY_FAILED``  the gateway could not be read for it (a remote gateway's episode, reward or finish
                    route failed): ``error`` says how
=================== =========================================================================================

The first that applies, in the order ``SETUP_FAILED``, ``GATEWAY_FAILED``, ``HARNESS_TIMEOUT``,
``HARNESS_EXITED``, ``CALLS_REFUSED``, ``NO_CALLS``, ``VERIFIER_FAILED``, ``HARNESS_DONE``, is the status; ``error`` joins
every reason that applied. The verifier runs for every run with calls (a harness that timed out may have
done the task), so ``reward`` is set whenever the verifier gave one, whatever the status.

A result is also what :func:`tmpl.export.episodes_to_jsonl` takes (``key``, ``episode``, ``reason``):
``tmpl view`` opens the file like any episode's.

>>> r = HarnessResult(status=HARNESS_EXITED, exit_code=2, task_id="t1", session="t1-0-ab")
>>> r.ok, r.rows(), r.reason
(False, [], 'HARNESS_EXITED (exit 2)')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..episode import Episode

__all__ = [
    "CALLS_REFUSED",
    "GATEWAY_FAILED",
    "HARNESS_DONE",
    "HARNESS_EXITED",
    "HARNESS_TIMEOUT",
    "NO_CALLS",
    "SETUP_FAILED",
    "STATUSES",
    "VERIFIER_FAILED",
    "HarnessResult",
]

HARNESS_DONE = "HARNESS_DONE"
HARNESS_TIMEOUT = "HARNESS_TIMEOUT"
HARNESS_EXITED = "HARNESS_EXITED"
CALLS_REFUSED = "CALLS_REFUSED"
NO_CALLS = "NO_CALLS"
VERIFIER_FAILED = "VERIFIER_FAILED"
SETUP_FAILED = "SETUP_FAILED"
GATEWAY_FAILED = "GATEWAY_FAILED"
#: every status, in the order the first that applies is chosen
STATUSES = (
    SETUP_FAILED,
    GATEWAY_FAILED,
    HARNESS_TIMEOUT,
    HARNESS_EXITED,
    CALLS_REFUSED,
    NO_CALLS,
    VERIFIER_FAILED,
    HARNESS_DONE,
)


@dataclass
class HarnessResult:
    """One harness run (see the module docstring for ``status``).

    - ``episode``: its calls merged into training sequences (None when it made none); ``rows()`` them;
    - ``reward``: the verifier's (also on ``episode.reward``); ``calls``: model calls recorded;
    - ``exit_code``: the harness's (None when it did not run); ``stdout_tail``/``stderr_tail``: the last
      characters it wrote; ``seconds``: the whole run, ``timings``: its phases in seconds (``open``,
      ``setup``, ``start``, ``harness``, ``kill``, ``verifier``, ``finish``, ``cleanup``: what each
      holds, :mod:`tmpl.harness.rollout`; a run that ended early has only those it reached);
    - ``session``: the gateway session key; ``task_id``, ``sample``: which task, which run of its group;
      ``harness``: the harness's name (its spec's ``name``);
    - ``error``: every reason the run is not ``HARNESS_DONE``, joined; ``refused``: the gateway's
      answers to the calls it refused; ``workdir``: where its files are (kept only with
      ``keep_workdirs``).
    """

    status: str
    exit_code: int | None = None
    reward: float | None = None
    episode: Episode | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    seconds: float = 0.0
    calls: int = 0
    session: str = ""
    task_id: str = ""
    sample: int = 0
    error: str = ""
    refused: list[str] = field(default_factory=list)
    workdir: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)
    harness: str = ""

    @property
    def ok(self) -> bool:
        """Whether the run is ``HARNESS_DONE``."""
        return self.status == HARNESS_DONE

    @property
    def key(self) -> str:
        """The session key (what :func:`tmpl.export.episode_entry` names the episode by)."""
        return self.session

    @property
    def reason(self) -> str:
        """The status and why, in words (what an exported episode line says of how it ended)."""
        if self.status == HARNESS_EXITED and self.exit_code is not None and not self.error:
            return f"{self.status} (exit {self.exit_code})"
        return f"{self.status}: {self.error}" if self.error else self.status

    def rows(self) -> list[Any]:
        """The episode's training rows (one per sequence) for :func:`tmpl.collate`; [] without calls."""
        return [] if self.episode is None else self.episode.rows()

    def __getstate__(self) -> dict[str, Any]:
        """A result pickles (to and from workers: :mod:`tmpl.harness.distributed`) with its episode as a
        record (:func:`tmpl.episode.records.to_record`), the compiled episode itself not being picklable."""
        from ..episode.records import to_record

        state = dict(self.__dict__)
        if self.episode is not None:
            state["episode"] = ("record", to_record(self.episode), self.episode.sample_id)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        episode = state.get("episode")
        if isinstance(episode, tuple) and episode and episode[0] == "record":
            from ..episode.records import from_record

            state = {**state, "episode": from_record(episode[1], sample_id=episode[2])}
        self.__dict__.update(state)

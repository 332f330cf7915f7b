"""An episode to a plain record and back: its calls, in order, with the edits that started branches.

The record holds what the merge rule needs to rebuild the same sequences: every call (prompt and sampled
IDs, logprobs, versions, ``trained``, id, parent, agent, turn, and its reward as the episode holds it
now, after ``set_call_reward``), the edit label of each call that
started a branch, the calls kept apart from sequences they extend (``Episode.add_call(apart=...)``), the
episode's budget, reward and how it ended. Rebuilt, the sequences are the same
(IDs, masks, logprobs, versions, lineages, statuses, branch kinds and edits); a branch's first differing
message and field, which come from the messages a call was rendered from, are not kept.

>>> from tmpl.episode import Call, Episode
>>> ep = Episode(sample_id="s")
>>> _ = ep.add_call(Call([1, 2], [3], [-0.5], id="a"))
>>> _ = ep.add_call(Call([1, 9], [4], [-0.2], id="b"), edit="compaction")
>>> again = from_record(to_record(ep))
>>> [s.ids.tolist() for s in again.sequences], again.sequences[1].branch.edit
([[1, 2, 3], [1, 9, 4]], 'compaction')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import EpisodeError
from ..trajectory.types import Status
from .builder import Episode
from .types import Call

__all__ = ["from_record", "to_record"]


def to_record(episode: Episode) -> dict[str, Any]:
    """The episode as JSON-ready lists, numbers and strings (see the module docstring)."""
    edits = {}
    for seq in episode.sequences:
        if seq.branch.edit is not None and seq.calls:
            edits[seq.calls[0]] = seq.branch.edit
    last = episode.sequences[-1] if episode.sequences else None
    return {
        "max_length": episode.max_length,
        "reward": episode.reward,
        "finished": episode.finished,
        "status": last.status.name if last is not None else None,
        "reason": last.reason if last is not None else "",
        "edits": edits,
        # calls kept from continuing some sequences (images that differ under the same IDs): kept so again
        "apart": {c.id: list(episode.kept_apart(c.id)) for c in episode.calls if c.id and episode.kept_apart(c.id)},
        "calls": [
            {
                "id": c.id,
                "prompt_ids": c.prompt_ids.tolist(),
                "completion_ids": c.completion_ids.tolist(),
                "logprobs": c.logprobs.tolist(),
                "versions": c.versions.tolist(),
                "trained": c.trained,
                "parent": c.parent,
                "agent": c.agent,
                "turn": c.turn,
                "reward": episode.call_reward(c.id) if c.id is not None else c.reward,
            }
            for c in episode.calls
        ],
    }


def from_record(record: Mapping[str, Any], sample_id: Any = None) -> Episode:
    """Rebuild the episode :func:`to_record` wrote (its calls added again, in order).

    Raises EpisodeError (or CallError) naming the sample and the call when the record does not hold one.
    """
    if not isinstance(record, Mapping) or not isinstance(record.get("calls"), list):
        raise EpisodeError(sample_id, None, "an episode record needs a list of 'calls'")
    episode = Episode(max_length=record.get("max_length"), sample_id=sample_id, reward=record.get("reward"))
    edits = record.get("edits") or {}
    apart = record.get("apart") or {}
    for k, c in enumerate(record["calls"]):
        if not isinstance(c, Mapping):
            raise EpisodeError(sample_id, None, f"calls[{k}] is not a mapping")
        try:
            call = Call(
                c["prompt_ids"],
                c["completion_ids"],
                c["logprobs"],
                versions=c.get("versions", 0),
                trained=bool(c.get("trained", True)),
                id=c.get("id"),
                parent=c.get("parent"),
                agent=c.get("agent"),
                turn=c.get("turn"),
                reward=c.get("reward"),
            )
        except KeyError as exc:
            raise EpisodeError(sample_id, c.get("id"), f"calls[{k}] has no {exc.args[0]!r}") from None
        episode.add_call(
            call,
            edit=edits.get(call.id) if call.id is not None else None,
            apart=apart.get(call.id, ()) if call.id is not None else (),
        )
    if record.get("finished"):
        status = record.get("status") or "DONE"
        if status not in Status.__members__:
            raise EpisodeError(sample_id, None, f"unknown status {status!r}")
        episode.finish(Status[status], record.get("reason") or "")
    return episode

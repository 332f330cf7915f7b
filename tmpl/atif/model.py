"""ATIF's version and extra key, the ``atif`` package's models (imported only when needed), and validation
of a document by them, each problem named by its place in the document."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import AtifError

#: The ATIF version written (``atif`` 1.8's models).
SCHEMA_VERSION = "ATIF-v1.8"


#: The key, in ATIF ``extra`` fields, of what tmpl keeps that ATIF has no field for.
EXTRA_KEY = "tmpl"


#: The tmpl record format the records read from ATIF carry (tmpl.export.FORMAT).
_FORMAT = "tmpl.rollout.v1"


_SCHEMA = re.compile(r'"schema_version"\s*:\s*"ATIF-', re.IGNORECASE)


#: Record fields the ATIF steps carry (not repeated in the trajectory's extra).
_CARRIED = ("format", "prompt_ids", "completion_ids", "mask", "logprobs", "versions", "messages")


def _models() -> Any:
    """The ``atif`` package, or an ImportError that says how to get it."""
    try:
        import atif
    except ImportError as exc:
        raise ImportError(
            "ATIF import and export need the atif package (its models validate every document): "
            "pip install 'tmpl[atif]'"
        ) from exc
    return atif


def validate(doc: Any, where: str = "ATIF") -> Any:
    """``doc`` (a dict, a JSON string or an ``atif.Trajectory``) as a validated ``atif.Trajectory``, with
    tmpl's own checks on its token arrays (every embedded trajectory's too). AtifError names the step
    and the field."""
    atif = _models()
    if isinstance(doc, atif.Trajectory):
        model = atif.Trajectory.model_validate(doc.model_dump())
    else:
        if isinstance(doc, (str, bytes)):
            try:
                doc = json.loads(doc)
            except ValueError as exc:
                raise AtifError(where, f"not JSON: {exc}") from None
        if not isinstance(doc, Mapping):
            raise AtifError(where, f"an ATIF trajectory is a JSON object, not a {type(doc).__name__}")
        try:
            model = atif.Trajectory.model_validate(doc)
        except ValueError as exc:  # pydantic's ValidationError is one
            raise AtifError(where, f"not an ATIF trajectory: {_pydantic(exc)}") from None
    _check_arrays(model, where, "")
    return model


def _pydantic(exc: Exception) -> str:
    """A pydantic ValidationError in one line: each error's location (``steps[2].metrics.logprobs``,
    named as its step) and message."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc).splitlines()[0]
    parts = []
    for e in errors()[:3]:
        loc = list(e.get("loc", ()))
        parts.append(f"{_loc(loc)}: {e.get('msg', '')}")
    more = len(errors()) - 3
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _loc(loc: Sequence[Any]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            if i > 0 and loc[i - 1] == "steps":
                out += f" (step {part + 1})"
        else:
            out += ("." if out else "") + str(part)
    return out or "(document)"


def _check_arrays(model: Any, where: str, path: str) -> None:
    for i, step in enumerate(model.steps):
        at = f"{path}steps[{i}] (step {step.step_id})"
        m = step.metrics
        if m is None:
            continue
        n = None if m.completion_token_ids is None else len(m.completion_token_ids)
        if m.logprobs is not None and n is not None and len(m.logprobs) != n:
            raise AtifError(
                where,
                f"{at}: metrics.logprobs has {len(m.logprobs)} entries but metrics.completion_token_ids has {n}",
                step=step.step_id,
                field="metrics.logprobs",
            )
        if m.logprobs is not None and n is None:
            raise AtifError(
                where, f"{at}: metrics.logprobs without metrics.completion_token_ids", step.step_id, "metrics.logprobs"
            )
        if (m.prompt_token_ids is None) != (n is None):
            field = "metrics.prompt_token_ids" if m.prompt_token_ids is None else "metrics.completion_token_ids"
            raise AtifError(
                where,
                f"{at}: {field} is missing (a step's token IDs are its whole prompt and what it sampled: "
                "tmpl needs both)",
                step.step_id,
                field,
            )
        if n == 0:
            raise AtifError(
                where, f"{at}: metrics.completion_token_ids is empty", step.step_id, "metrics.completion_token_ids"
            )
    for k, sub in enumerate(model.subagent_trajectories or []):
        _check_arrays(sub, where, f"{path}subagent_trajectories[{k}] ({sub.trajectory_id}).")

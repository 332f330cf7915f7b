"""Rollouts to files and tables any trainer can read: JSON Lines, and ``datasets.Dataset`` (Parquet).

>>> results = rollout.run(conversations)                                      # doctest: +SKIP
>>> tmpl.export.to_jsonl(results, "rollouts.jsonl", metrics=rollout.metrics)  # doctest: +SKIP
>>> again = tmpl.export.from_jsonl("rollouts.jsonl")   # RolloutResults, identical arrays  # doctest: +SKIP
>>> tmpl.export.to_dataset(results).to_parquet("rollouts.parquet")            # doctest: +SKIP

One record per sample (``to_records``), in the order given:

- ``prompt_ids``, ``completion_ids``: token IDs; ``mask``: 1 on model tokens, 0 on appended
  tokens (tool results, generation prompts); ``logprobs``: the rollout logprobs (0.0 where
  ``mask`` is 0). The four arrays of a sample are read back exactly (int32, uint8, float32).
- ``status`` (``DONE`` / ``TRUNCATED`` / ``ABORTED``), ``reason``, ``finish_reason``;
  ``turns``, ``tool_calls``, ``tool_failures``, ``tool_failure_kinds`` (failed calls by kind,
  every kind present), ``drift``; ``drift_cause``, ``drift_position``, ``drift_ours``,
  ``drift_rendered`` (where and why a drifted sample would change if re-rendered: see
  :mod:`tmpl.rollout.drift`; None when it did not drift or was not measured); ``messages`` (the parsed
  conversation, for rewards and logs); ``spans`` (``kind``, ``turn``, ``message``, ``start``,
  ``end``); budgets (``max_length``, ``max_completion_length``, ``vocab_size``), ``tokens_cut``,
  ``num_turns``, ``sample_id``; ``times`` (seconds per phase outside the engine);
- ``versions``: the policy version that sampled each completion token (-1 on appended tokens),
  ``version`` (the rollout's version when the sample ended), ``staleness``, ``stale_action``
  (what ``max_staleness`` did: None, ``withhold``, ``drop``, ``mask``), ``loss_mask`` (``mask``
  after that policy), ``resumed`` (partial rollouts continued after an abort-mode weight update).
  Records written before versions existed read back with -1 everywhere.
- ``episode``: None for a sample whose one sequence is its trajectory (append mode); else (template mode,
  an ``edit_history`` hook, sub-agents) its episode's calls (:mod:`tmpl.episode.records`), so that
  ``result.sequences`` and ``result.rows()`` read back the same (a JSON string in a ``Dataset``).
- ``run_metrics``: the rollout's :class:`tmpl.RolloutMetrics` as flat numbers, when given.
- ``images``: None for a text-only sample; for a trajectory with images
  (:class:`tmpl.trajectory.images.ImageTrajectory`) its image inputs: ``image_token_id``,
  ``spans`` (sequence positions: ``prompt_ids + completion_ids``), ``parts``, ``token_type_keys``
  and ``arrays`` (per key ``dtype``, ``shape`` and either ``b64``, the bytes inline, or ``file``: a
  ``.npy`` file relative to the JSONL's folder, for arrays over ``inline_bytes``, 64 KiB by
  default, written by :func:`to_jsonl` to ``<name>.images/``). Read back, the trajectory holds
  them again and ``result.trajectory.model_inputs()`` rebuilds the model inputs. A sample of template
  mode (or an ``edit_history`` hook) with a ``VisionTemplate`` also has ``sequences``: per sequence of
  its episode, its own images in the same form (None for a sequence without), read back as
  ``result.sequence_images`` (each checked against its sequence's placeholders).
- ``routes``: None without routing replay; for a sample of ``Rollout(routes=True)`` its mixture-of-experts
  routes (:mod:`tmpl.trajectory.routes`): ``dtype``, ``shape`` (``[positions, layers, top_k]``), ``data``
  (base64 of the array bytes) and ``known`` (base64 of the packed known flags), read back exactly into the
  trajectory; ``sequence_routes``: in template mode, the same per training sequence (by index), read back as
  ``result.sequence_routes``. JSON strings in a ``Dataset``.

In a ``Dataset``, ``messages`` is a JSON string (tool-call arguments differ in shape from call to
call, which a columnar schema cannot hold); :func:`from_dataset` parses it back. ``datasets``
is imported only by the two dataset functions.

ATIF (the Agent Trajectory Interchange Format, ``atif`` on PyPI): :func:`to_atif` writes one ATIF
trajectory per result, :func:`from_atif` reads ATIF written by tmpl or anyone else (docs/atif.md; the
mapping is in :mod:`tmpl.atif`, the ``atif`` package is imported only by these two).

Its modules, one per format: :mod:`.records` (the record of a sample, and back), :mod:`.jsonl`,
:mod:`.episodes` (the gateway's episodes as lines), :mod:`.dataset`, :mod:`.atif`.
"""

from __future__ import annotations

from .atif import from_atif, to_atif
from .dataset import from_dataset, to_dataset
from .episodes import episode_entry, episode_from_entry, episodes_from_jsonl, episodes_to_jsonl
from .jsonl import from_jsonl, to_jsonl
from .records import FORMAT, from_records, to_records

__all__ = [
    "FORMAT",
    "episode_entry",
    "episode_from_entry",
    "episodes_from_jsonl",
    "episodes_to_jsonl",
    "from_dataset",
    "from_jsonl",
    "from_atif",
    "from_records",
    "to_atif",
    "to_dataset",
    "to_jsonl",
    "to_records",
]

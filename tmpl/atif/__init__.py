"""ATIF, the Agent Trajectory Interchange Format (``atif`` on PyPI, v1.8), to tmpl records and back.

``tmpl.export.to_atif`` and ``tmpl.export.from_atif`` are the public names; this package converts
between ATIF documents and tmpl's export records (:func:`tmpl.export.to_records`), so it needs nothing
above the episode layer. Every document written or read is validated by the ``atif`` package's own
pydantic models (``atif.Trajectory``); ``atif`` is imported only when a document is built or checked.

>>> docs = records_to_documents(tmpl.export.to_records(results))       # doctest: +SKIP
>>> records = documents_to_records(docs, source="run.atif.jsonl")      # doctest: +SKIP

The mapping (docs/atif.md has it in full):

- one tmpl sample (a ``RolloutResult``) is one ATIF ``Trajectory``; its messages are the steps
  (``system``/``user`` messages a step each, an assistant message an ``agent`` step with its
  ``reasoning_content`` and ``tool_calls``, the tool messages after it that step's ``observation``);
- each model call of the sample is an agent step's ``metrics``: ``prompt_token_ids`` (the whole
  prompt the engine was sent), ``completion_token_ids`` and ``logprobs`` (what it sampled);
- a sub-agent's calls (a lineage ``(agent, parent)`` other than the root's) are an embedded trajectory
  (``subagent_trajectories``), referenced from the observation of the step whose call ran it;
- a branch (each training sequence after the first: compaction, a template that drops reasoning, an
  ``edit_history`` hook) is an embedded trajectory too, marked ``extra["tmpl"]["branch"]`` (so it is read
  back as a branch of the same agent, not a sub-agent), held by its lineage's trajectory and referenced
  from the step where it diverged; the root keeps the whole conversation, its steps' tokens the first
  sequence's calls (files written before, and other programs' files with branches as plain steps,
  read as well, and are written back as they were);
- what ATIF has no field for is kept under the key ``"tmpl"`` of ``extra``: per step the call's id,
  policy versions, ``trained`` (the mask: a step's completion tokens are in the loss mask exactly when
  it is trained), turn, reward and lineage; per trajectory the tmpl record less the arrays the steps
  carry (status, reason, spans, budgets, drift, staleness, times, tokens appended after the last call).

Read back, ATIF written by anyone gives tmpl records: a trajectory whose calls extend one another is
one sequence (an append-mode sample, which ``tmpl replay`` re-renders); otherwise its calls are merged
into an episode's sequences by tmpl's rule, as the gateway's are.

Its modules: :mod:`.model` (version, models, validation), :mod:`.steps` (messages and calls as steps and
back), :mod:`.layout` (where each call goes: root, sub-agents, branches), :mod:`.write` (records to
documents), :mod:`.read` (documents to records), :mod:`.source` (what a document read back keeps of its
source), :mod:`.files` (ATIF files).
"""

from __future__ import annotations

from .files import document_tools, looks_like_atif, read_documents, write_documents
from .model import EXTRA_KEY, SCHEMA_VERSION, validate
from .read import documents_to_records
from .source import AtifResult, with_source
from .write import records_to_documents

__all__ = [
    "AtifResult",
    "EXTRA_KEY",
    "SCHEMA_VERSION",
    "document_tools",
    "documents_to_records",
    "looks_like_atif",
    "read_documents",
    "records_to_documents",
    "validate",
    "with_source",
    "write_documents",
]

"""Many samples' suffixes in one call into the template; each alone where that call fails.

>>> suffixes_of(tpl, [tool_messages], [completion_ids], [history], schemas)  # doctest: +SKIP
[([151645, 198, ...], None)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate


def suffixes_of(
    tpl: ChatTemplate,
    messages: list[list[dict[str, Any]]],
    completions: list[list[int]],
    histories: list[list[dict[str, Any]]],
    schemas: Any,
) -> list[tuple[list[int] | None, Exception | None]]:
    """(suffix IDs, None) or (None, the error) per sample: one ``suffix_ids_batch``; when it fails,
    each sample alone, so an error is its own sample's only."""
    try:
        out = tpl.suffix_ids_batch(messages, completion_ids=completions, tools=schemas, histories=histories)
        return [(ids, None) for ids in out]
    except Exception:  # noqa: BLE001 - found again below, sample by sample
        pass
    results: list[tuple[list[int] | None, Exception | None]] = []
    for msgs, completion, history in zip(messages, completions, histories):
        try:
            results.append((tpl.suffix_ids(msgs, completion_ids=completion, tools=schemas, history=history), None))
        except Exception as exc:  # noqa: BLE001 - handed to the sample, which ends or crashes with it
            results.append((None, exc))
    return results

"""ATIF files: written (:func:`write_documents`), read (:func:`read_documents`, JSON or JSON Lines, gzipped
or not), their tools (:func:`document_tools`), and whether a file is ATIF (:func:`looks_like_atif`)."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, cast

from ..errors import AtifError
from .model import _SCHEMA


def write_documents(documents: Sequence[Any], path: str | os.PathLike[str]) -> Path:
    """Write ATIF documents: a ``.json`` file holds one (indented, as Harbor writes ``trajectory.json``),
    a ``.jsonl`` (or ``.jsonl.gz``) file one per line."""
    path = Path(path)
    dicts = [d.to_json_dict() if hasattr(d, "to_json_dict") else dict(d) for d in documents]
    lines = path.name.endswith((".jsonl", ".jsonl.gz"))
    if not lines and len(dicts) != 1:
        raise AtifError(
            str(path), f"an ATIF .json file holds one trajectory, not {len(dicts)}: write them to a .jsonl file"
        )
    with _open(path, "w") as f:
        if lines:
            for d in dicts:
                f.write(json.dumps(d, ensure_ascii=False, allow_nan=False))
                f.write("\n")
        else:
            json.dump(dicts[0], f, ensure_ascii=False, allow_nan=False, indent=2)
            f.write("\n")
    return path


def read_documents(path: str | os.PathLike[str]) -> Iterator[tuple[Any, str]]:
    """Each JSON document of an ATIF file with where it is (``path``, ``path[k]`` or ``path:line``): one
    document (indented or not), a JSON array of them, or JSON lines. Detected by content, not name."""
    path = Path(path)
    if not path.is_file():
        raise AtifError(str(path), "is a folder" if path.is_dir() else "does not exist")
    try:
        with _open(path, "r") as f:
            text = f.read()
    except (UnicodeDecodeError, EOFError, OSError) as exc:
        raise AtifError(str(path), f"cannot be read as text ({exc})") from None
    if not text.strip():
        raise AtifError(str(path), "the file is empty")
    try:
        value = json.loads(text)
    except ValueError as whole:
        first = text.lstrip().split("\n", 1)[0]
        try:  # JSON lines: the first line is a document of its own
            json.loads(first)
        except ValueError:
            raise AtifError(str(path), f"not JSON: {whole}") from None
        yield from _json_lines(path, text)
        return
    if isinstance(value, list):
        for k, doc in enumerate(value):
            yield doc, f"{path}[{k}]"
    else:
        yield value, str(path)


def _json_lines(path: Path, text: str) -> Iterator[tuple[Any, str]]:
    lines = text.split("\n")
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line), f"{path}:{line_no}"
        except ValueError as exc:
            cut = " (the last line, cut short: a truncated file?)" if line_no == len(lines) else ""
            raise AtifError(f"{path}:{line_no}", f"not JSON: {exc}{cut}") from None


def document_tools(path: str | os.PathLike[str]) -> list[list[dict[str, Any]] | None]:
    """The tool schemas of each document of an ATIF file (``agent.tool_definitions``; None where absent),
    in the order :func:`read_documents` gives the documents."""
    out = []
    for doc, _ in read_documents(path):
        agent = doc.get("agent") if isinstance(doc, Mapping) else None
        tools = agent.get("tool_definitions") if isinstance(agent, Mapping) else None
        out.append(list(tools) if isinstance(tools, list) else None)
    return out


def looks_like_atif(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds ATIF (its first document has ``schema_version`` ``ATIF-...``), by content.

    >>> looks_like_atif("rollouts.jsonl")        # doctest: +SKIP
    False
    """
    try:
        with _open(Path(path), "r") as f:
            head = f.read(1 << 16)
            if _SCHEMA.search(head) is not None:
                return True
            if not head.lstrip().startswith(("{", "[")) or '"steps"' not in head or '"tmpl.rollout.' in head:
                return False
            # schema_version after 64 KiB of steps: read the first document whole
            first = head.lstrip()
            rest = f.read()
    except (UnicodeDecodeError, EOFError, OSError):
        return False
    try:
        value = json.loads(first + rest)
    except ValueError:
        try:
            value = json.loads((first + rest).split("\n", 1)[0])
        except ValueError:
            return False
    value = value[0] if isinstance(value, list) and value else value
    return isinstance(value, Mapping) and str(value.get("schema_version", "")).upper().startswith("ATIF-")


def _open(path: Path, mode: str) -> IO[str]:
    """A text file, gzip-compressed when its name ends with ``.gz`` or (read) its bytes say so."""
    gz = path.name.endswith(".gz")
    if not gz and mode == "r":
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
    if gz:
        return cast(IO[str], gzip.open(path, mode + "t", encoding="utf-8"))
    return open(path, mode, encoding="utf-8")

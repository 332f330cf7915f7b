"""Where a chat template and its tokenizer come from: template files, tokenizer folders, the hub.

A path argument is always a path (never template text); a file that is not a template, a folder
without tokenizer files and a hub that does not answer each raise a typed error naming what was
given and what was expected. :class:`~tmpl.ChatTemplate` loads through these.

>>> is_hub_id("Qwen/Qwen3-4B"), looks_like_path("fixed.jinja")
(True, True)
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .errors import (
    HubUnreachableError,
    NotATemplateError,
    SourceNotFoundError,
    TemplateSourceError,
    TmplError,
)

#: what a chat template's text must contain: a Jinja expression or statement
_JINJA_SYNTAX = ("{{", "{%")
#: file names that say "this argument is a path", even when no such file exists
_TEMPLATE_SUFFIXES = (".jinja", ".jinja2", ".j2", ".txt", ".json")
#: files that make a folder a tokenizer folder
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "tekken.json", "vocab.json")
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_TOKENIZER_DIR = "a tokenizer folder (with tokenizer_config.json or tokenizer.json)"
_TOKENIZER_FOLDER = f"{_TOKENIZER_DIR}, or a hub id like owner/name"
_TEMPLATE_FILE = "a chat template file (Jinja text, or a tokenizer_config.json with a chat_template)"

#: seconds tmpl waits for the hub to answer (per try) before it calls it unreachable
HUB_TIMEOUT_ENV = "TMPL_HUB_TIMEOUT"
#: how many more tries after an unanswered one
HUB_RETRIES_ENV = "TMPL_HUB_RETRIES"
DEFAULT_HUB_TIMEOUT = 5.0
DEFAULT_HUB_RETRIES = 1


def has_jinja_syntax(text: str) -> bool:
    """Whether ``text`` reads as a Jinja template (holds a ``{{ ... }}`` or a ``{% ... %}``)."""
    return any(mark in text for mark in _JINJA_SYNTAX)


def looks_like_path(text: str) -> bool:
    """Whether a string without Jinja syntax names a file: a template suffix or a path separator."""
    if has_jinja_syntax(text) or "\n" in text:
        return False
    return text.lower().endswith(_TEMPLATE_SUFFIXES) or "/" in text or os.sep in text


def is_hub_id(text: str) -> bool:
    """Whether ``text`` has the shape of a hub repository id, ``owner/name``."""
    return _HUB_ID.fullmatch(text) is not None and ".." not in text


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long, a NUL byte: not a path of this machine
        return False


def read_template_file(path: str | os.PathLike[str], expected: str = _TEMPLATE_FILE) -> str:
    """A chat template's text from a file: Jinja text, or the ``chat_template`` of a tokenizer config
    (``tokenizer_config.json``, ``chat_template.json``).

    Raises :class:`~tmpl.errors.SourceNotFoundError` when the file does not exist and
    :class:`~tmpl.errors.NotATemplateError` when it is no chat template (a folder, a binary or
    non-UTF-8 file, text without Jinja syntax, JSON without a ``chat_template``); both name the path
    and say what was ``expected``.
    """
    path = Path(path)
    where = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SourceNotFoundError(where, f"does not exist; expected {expected}") from None
    except IsADirectoryError:
        raise NotATemplateError(where, f"is a folder; expected {expected}") from None
    except OSError as exc:
        raise NotATemplateError(where, f"cannot be read ({exc.strerror or exc}); expected {expected}") from None
    if not data.strip():
        raise NotATemplateError(where, f"is empty; expected {expected}")
    if b"\x00" in data[:65536]:
        raise NotATemplateError(where, f"is a binary file; expected {expected}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotATemplateError(
            where, f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); expected {expected}"
        ) from None
    if path.suffix.lower() == ".json":
        return _template_from_json(where, text, expected)
    if not has_jinja_syntax(text):
        raise NotATemplateError(where, f"has no Jinja syntax ({{{{ }}}} or {{% %}}); expected {expected}")
    return text


def _template_from_json(where: str, text: str, expected: str) -> str:
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise NotATemplateError(where, f"is not valid JSON ({exc}); expected {expected}") from None
    found = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(found, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("tool_use") or named.get("default")
    if not isinstance(found, str) or not has_jinja_syntax(found):
        raise NotATemplateError(where, f"is JSON without a chat_template; expected {expected}")
    return found


def resolve_template(tokenizer: Any, chat_template: str | os.PathLike[str] | None) -> tuple[str, str | None]:
    """Template text and, when it came from a file or a named template, the name of that source.

    ``chat_template`` is None (the tokenizer's own template), a path (``os.PathLike``: always a file,
    never text), one of the tokenizer's named templates, Jinja text, or a string naming an existing
    file. A string with no Jinja syntax that is none of those raises a
    :class:`~tmpl.errors.TemplateSourceError` (:class:`~tmpl.errors.SourceNotFoundError` when it
    looks like a path: a template suffix or a path separator); it is never rendered as text.
    """
    if chat_template is None:
        text = getattr(tokenizer, "chat_template", None)
        if isinstance(text, dict):
            text = text.get("tool_use") or text.get("default")
        if not text:
            raise TmplError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; pass chat_template="
            )
        return text, None
    if isinstance(chat_template, os.PathLike):
        path = Path(chat_template)
        return read_template_file(path), path.stem
    if not isinstance(chat_template, str):
        raise TypeError(f"chat_template must be template text, a file path or None, not {type(chat_template).__name__}")
    named = getattr(tokenizer, "chat_template", None)
    if isinstance(named, dict) and chat_template in named:
        return named[chat_template], chat_template
    if has_jinja_syntax(chat_template):
        return chat_template, None
    path = Path(chat_template)
    if _exists(path):
        return read_template_file(path), path.stem
    if looks_like_path(chat_template):
        raise SourceNotFoundError(chat_template, f"does not exist; expected {_TEMPLATE_FILE}")
    known = f" nor one of the tokenizer's named templates ({', '.join(named)})" if isinstance(named, dict) else ""
    shown = chat_template if len(chat_template) <= 60 else chat_template[:59] + "…"
    raise TemplateSourceError(
        repr(shown), f"is neither Jinja template text (no {{{{ }}}} or {{% %}}) nor an existing file{known}"
    )


def hub_settings(timeout: float | None = None, retries: int | None = None) -> tuple[float, int]:
    """Seconds to wait for the hub per try, and how many more tries: the arguments, else
    ``TMPL_HUB_TIMEOUT`` / ``TMPL_HUB_RETRIES``, else 5 s and 1."""

    def env(name: str, cast: type[float] | type[int], default: float) -> float:
        raw = os.environ.get(name, "").strip()
        if not raw:
            return default
        try:
            value = cast(raw)
        except ValueError:
            value = -1
        if value < 0 or (cast is float and value == 0):
            kind = "a number of seconds > 0" if cast is float else "a whole number >= 0"
            raise TemplateSourceError(f"{name}={raw!r}", f"expected {kind}") from None
        return value

    t = env(HUB_TIMEOUT_ENV, float, DEFAULT_HUB_TIMEOUT) if timeout is None else timeout
    r = env(HUB_RETRIES_ENV, int, DEFAULT_HUB_RETRIES) if retries is None else retries
    if not t > 0 or r < 0:
        raise ValueError(f"hub timeout must be > 0 and retries >= 0, not {t!r} and {r!r}")
    return float(t), int(r)


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _probe_hub(endpoint: str, timeout: float, outcome: list[str | None]) -> None:
    """One try: appends None when the endpoint answers (an HTTP error status is an answer), else why not."""
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout):
            outcome.append(None)
    except urllib.error.HTTPError:
        outcome.append(None)
    except urllib.error.URLError as exc:
        outcome.append(str(exc.reason))
    except (OSError, ValueError) as exc:
        outcome.append(f"{type(exc).__name__}: {exc}")


def hub_unreachable(timeout: float, retries: int) -> str | None:
    """None when the hub's endpoint (``HF_ENDPOINT``) answers within ``timeout`` seconds in one of
    ``1 + retries`` tries; else why not. Each try runs on a daemon thread, so that a slow name lookup
    cannot stretch it past ``timeout``."""
    endpoint = _hub_endpoint()
    why = "no answer"
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(0.5, timeout))
        outcome: list[str | None] = []
        thread = threading.Thread(target=_probe_hub, args=(endpoint, timeout, outcome), daemon=True)
        thread.start()
        thread.join(timeout)
        if not outcome:
            why = f"no answer in {timeout:g} s"
            continue
        if outcome[0] is None:
            return None
        why = outcome[0]
    return f"{endpoint} unreachable after {retries + 1} {'try' if retries == 0 else 'tries'}: {why}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def tokenizer_folder(path: str | os.PathLike[str], expected: str = _TOKENIZER_DIR) -> Path:
    """``path`` when it is a folder with tokenizer files (:data:`TOKENIZER_FILES`); else
    :class:`~tmpl.errors.SourceNotFoundError` or :class:`~tmpl.errors.NotATemplateError`, naming the
    path (and, for a folder of tokenizer folders, the ones inside it)."""
    raw = str(path)
    folder = Path(raw)
    if not _exists(folder):
        raise SourceNotFoundError(raw, f"does not exist; expected {expected}")
    if not folder.is_dir():
        raise NotATemplateError(raw, f"is a file; expected {expected}")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        inside = sorted(
            d.name for d in folder.iterdir() if d.is_dir() and any((d / f).is_file() for f in TOKENIZER_FILES)
        )
        more = f" and {len(inside) - 12} more" if len(inside) > 12 else ""
        hint = f" (tokenizer folders inside it: {', '.join(inside[:12])}{more})"
        raise NotATemplateError(
            raw, f"is a folder without tokenizer files; expected {expected}" + (hint if inside else "")
        )
    return folder


def load_tokenizer(
    path_or_id: str | os.PathLike[str], *, hub_timeout: float | None = None, hub_retries: int | None = None
) -> Any:
    """The tokenizer of a local folder, or of a hub id (``owner/name``) where that is no local path.

    A path that does not exist (and is no hub id) raises :class:`~tmpl.errors.SourceNotFoundError`;
    a file, or a folder without tokenizer files, :class:`~tmpl.errors.NotATemplateError`. A hub id is
    loaded from the hub when it answers within ``hub_timeout`` seconds (see :func:`hub_settings`),
    else from the local hub cache; neither: :class:`~tmpl.errors.HubUnreachableError`, within seconds
    (the hub client alone retries for ~50 s). ``HF_HUB_OFFLINE=1`` skips the hub: the cache only.
    """
    raw = str(path_or_id)
    path = Path(raw)
    if _exists(path):
        from transformers import AutoTokenizer

        folder = tokenizer_folder(path, _TOKENIZER_FOLDER)
        try:
            return AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError, KeyError) as exc:
            raise NotATemplateError(raw, f"its tokenizer files cannot be loaded ({_first_line(exc)})") from exc
    if not isinstance(path_or_id, str) or not is_hub_id(raw):
        raise SourceNotFoundError(raw, f"does not exist; expected {_TOKENIZER_FOLDER}")
    local = f"or pass a local folder with its tokenizer files instead (e.g. ./{path.name})"
    if _hub_offline():
        offline = HubUnreachableError(
            raw,
            "is no local folder, and HF_HUB_OFFLINE=1 is set and it is not in the local hub cache: "
            f"download it where the hub is reachable, {local}",
        )
        return _from_cache(raw, offline)
    timeout, retries = hub_settings(hub_timeout, hub_retries)
    why = hub_unreachable(timeout, retries)
    if why is None:
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(raw)
        except (OSError, ValueError) as exc:
            raise TemplateSourceError(raw, f"cannot be loaded from the hub ({_first_line(exc)})") from exc
    unreachable = HubUnreachableError(
        raw,
        f"is no local folder, is not in the local hub cache, and the hub did not answer ({why}); "
        f"set HF_HUB_OFFLINE=1 to stop asking it, wait longer ({HUB_TIMEOUT_ENV}=SECONDS), {local}",
        timeout=timeout,
    )
    return _from_cache(raw, unreachable)


def _from_cache(repo: str, missing: HubUnreachableError) -> Any:
    """The tokenizer of ``repo`` from the local hub cache only, or ``missing`` raised. Whether the cache
    holds it is asked first (cheap), so that a miss fails without importing transformers (seconds)."""
    from huggingface_hub import try_to_load_from_cache

    if not any(isinstance(try_to_load_from_cache(repo, f), str) for f in ("tokenizer_config.json", "tokenizer.json")):
        raise missing
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(repo, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise missing from exc

"""Training-safe chat templates shipped with tmpl.

Each shipped template is a ``.jinja`` file with a ``.json`` metadata file next to it. The
checkout keeps them in ``templates/`` at the repository root; the wheel and an editable install put
them in this package's folder (``tmpl/templates/``, see setup.py), where they are read. A variant
renders the last turn and the generation prompt exactly as the model's own template does,
keeps earlier turns the way the model generated them (so a conversation's render only grows
when the conversation grows), and marks what the assistant generates with
``{% generation %}`` so that ``return_assistant_tokens_mask=True`` works. See
``docs/templates.md`` for what each one changes.

>>> import tmpl
>>> {"qwen3", "qwen2.5", "llama-3", "gpt-oss", "gemma-4"} <= {t.name for t in tmpl.templates.available()}
True
>>> tmpl.templates.for_family("qwen3").name
'qwen3'
>>> tpl = tmpl.ChatTemplate(tokenizer, chat_template=tmpl.templates.load("qwen3"))  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import TYPE_CHECKING, Any

from ..errors import TemplateMetadataError, UnknownTemplateError

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerFast

__all__ = ["TemplateInfo", "available", "for_family", "info", "load", "synthetic_tokenizer"]

#: Keys every ``<name>.json`` must have, with their types.
REQUIRED_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "family": str,
    "base_template": str,
    "description": str,
    "bos_token": (str, type(None)),
    "eos_token": (str, type(None)),
    "special_tokens": list,
    "changes": list,
}


@dataclass(frozen=True)
class TemplateInfo:
    """What one shipped template is: its name, the family it is for, and what it changes.

    ``path`` is the ``.jinja`` file (a ``Traversable``; a plain ``Path`` in a source checkout).
    ``base_template`` names the upstream template it mirrors (a family folder of tmpl's test
    tokenizers); ``base_file`` is that template's file there (``file#key`` for a JSON key).
    ``special_tokens`` lists every marker the template writes that is an added token of the
    family's tokenizer; ``non_special_tokens`` is the subset added with ``special=False``.
    ``named_tokens``: the tokens the family's tokenizer exposes by name (``image_token``,
    ``boi_token``, ...: what its processor reads), as ``(name, token)`` pairs.

    >>> t = info("qwen3")
    >>> t.family, "<think>" in t.special_tokens
    ('qwen3', True)
    """

    name: str
    family: str
    description: str
    changes: tuple[str, ...]
    path: Traversable
    base_template: str
    bos_token: str | None
    eos_token: str | None
    special_tokens: tuple[str, ...]
    non_special_tokens: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    base_file: str = ""
    named_tokens: tuple[tuple[str, str], ...] = ()

    def text(self) -> str:
        """The template's Jinja text."""
        return str(self.path.read_text(encoding="utf-8"))


def shipped_dir() -> Traversable:
    """Where the shipped templates are: this package's own folder (``tmpl/templates/``, installed
    there from the repository's ``templates/`` by setup.py)."""
    return resources.files(__name__)


def _parse(meta_file: Traversable, jinja_file: Traversable) -> TemplateInfo:
    where = str(meta_file)
    try:
        meta: Any = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TemplateMetadataError(where, f"cannot read the metadata ({exc})") from exc
    if not isinstance(meta, dict):
        raise TemplateMetadataError(where, "the metadata is not a JSON object")
    for key, kind in REQUIRED_KEYS.items():
        if key not in meta:
            raise TemplateMetadataError(where, f"missing key {key!r}")
        if not isinstance(meta[key], kind):
            raise TemplateMetadataError(where, f"{key!r} has type {type(meta[key]).__name__}")
    for key in ("special_tokens", "changes", "non_special_tokens", "aliases"):
        if not all(isinstance(x, str) and x for x in meta.get(key, [])):
            raise TemplateMetadataError(where, f"{key!r} must be a list of non-empty strings")
    stem = jinja_file.name.removesuffix(".jinja")
    if meta["name"] != stem:
        raise TemplateMetadataError(where, f"'name' is {meta['name']!r} but the template file is {jinja_file.name!r}")
    named = meta.get("named_tokens", {})
    if not isinstance(named, dict) or not all(
        isinstance(k, str) and k.endswith("_token") and isinstance(v, str) and v for k, v in named.items()
    ):
        raise TemplateMetadataError(where, "'named_tokens' must map names ending in '_token' to non-empty tokens")
    stray = set(meta.get("non_special_tokens", [])) - set(meta["special_tokens"])
    if stray:
        raise TemplateMetadataError(where, f"non_special_tokens not listed in special_tokens: {sorted(stray)}")
    return TemplateInfo(
        name=meta["name"],
        family=meta["family"],
        description=meta["description"],
        changes=tuple(meta["changes"]),
        path=jinja_file,
        base_template=meta["base_template"],
        bos_token=meta["bos_token"],
        eos_token=meta["eos_token"],
        special_tokens=tuple(meta["special_tokens"]),
        non_special_tokens=tuple(meta.get("non_special_tokens", ())),
        aliases=tuple(meta.get("aliases", ())),
        base_file=str(meta.get("base_file", "")),
        named_tokens=tuple(sorted(named.items())),
    )


@functools.lru_cache(maxsize=None)
def _catalog() -> dict[str, TemplateInfo]:
    folder = shipped_dir()
    found: dict[str, TemplateInfo] = {}
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".jinja"):
            continue
        meta = folder / (entry.name.removesuffix(".jinja") + ".json")
        if not meta.is_file():
            raise TemplateMetadataError(str(meta), f"the shipped template {entry.name!r} has no metadata file")
        parsed = _parse(meta, entry)
        found[parsed.name] = parsed
    return found


def available() -> list[TemplateInfo]:
    """Every shipped template, sorted by name.

    >>> "qwen3" in [t.name for t in available()]
    True
    """
    return list(_catalog().values())


def info(name: str) -> TemplateInfo:
    """The metadata of the shipped template ``name``.

    Raises :class:`~tmpl.errors.UnknownTemplateError` (listing the names that exist) when
    there is none.

    >>> info("gpt-oss").eos_token
    '<|return|>'
    """
    catalog = _catalog()
    if name not in catalog:
        raise UnknownTemplateError(name, sorted(catalog))
    return catalog[name]


def load(name: str) -> str:
    """The Jinja text of the shipped template ``name`` (for ``chat_template=``).

    >>> "{% generation %}" in load("qwen2.5")
    True
    """
    return info(name).text()


def _family_key(family: str) -> str:
    return family.strip().rstrip("/").lower()


def for_family(family: str) -> TemplateInfo | None:
    """The shipped template for a model family, or None when tmpl ships none for it.

    ``family`` is matched, case-insensitively, against each template's family (the folder
    names of tmpl's test tokenizers, e.g. ``"qwen2.5-instruct"``), name and aliases; a path
    or hub id is matched as a whole and by its last component.

    >>> for_family("llama-3.2-instruct").name
    'llama-3'
    >>> for_family("/models/Qwen2.5-Instruct").name
    'qwen2.5'
    >>> for_family("gemma-2-it") is None
    True
    """
    wanted = _family_key(family)
    candidates = {wanted, wanted.rsplit("/", 1)[-1]}
    for t in _catalog().values():
        names = {_family_key(n) for n in (t.family, t.name, *t.aliases)}
        if candidates & names:
            return t
    return None


def synthetic_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """An offline tokenizer that renders the shipped template ``name`` exactly as the family's
    real tokenizer would, built from the metadata alone.

    It is a byte-level BPE with no merges (every byte is one token) plus the template's
    markers as added tokens (``special`` as in the real tokenizer), with ``bos_token``,
    ``eos_token`` and ``chat_template`` set. Token IDs differ from the real tokenizer's; the
    rendered text and the markers being single tokens do not. Used by the offline
    compatibility matrix.

    >>> tok = synthetic_tokenizer("qwen3")
    >>> tok.convert_ids_to_tokens(tok.encode("<|im_end|>", add_special_tokens=False))
    ['<|im_end|>']
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = info(name)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    non_special = set(t.non_special_tokens)
    named = dict(t.named_tokens)  # a processor reads these by name (Gemma 4's image_token, boi_token, ...)
    markers = list(dict.fromkeys([*(x for x in (t.bos_token, t.eos_token) if x), *t.special_tokens, *named.values()]))
    backend.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in markers if m not in non_special])
    backend.add_tokens([AddedToken(m, special=False, normalized=False) for m in markers if m in non_special])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=t.bos_token,
        eos_token=t.eos_token,
        chat_template=t.text(),
        name_or_path=f"tmpl-synthetic-{t.name}",
        model_max_length=1 << 30,
        pad_token=named.pop("pad_token", None),
        **({"extra_special_tokens": named} if named else {}),
    )

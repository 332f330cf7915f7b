"""Every catalog template in TMPL_TEST_DATA: exact against full renders, or a documented error.

A template whose full tool conversation cannot be rendered by transformers must get a
documented error from tmpl. One that renders must give an exact suffix (checked against the
full render, for 1-3 calls and hard contents, over two tool rounds), unless tmpl raises a
documented error saying why it cannot (never a wrong suffix, never an undocumented crash).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

import tmpl
from tmpl.suffix import clear_caches

from .conftest import DATA, catalog
from .contract import (
    HARD_CONTENTS,
    HISTORIES,
    NoStopToken,
    assistant_turn,
    check_turn,
    renders_tool_turn,
    tool_results,
)

DOCUMENTED = (
    tmpl.errors.UnsupportedTemplateError,
    tmpl.errors.SpliceError,
    tmpl.errors.TemplateRenderError,
    tmpl.errors.MessageError,
)
ENTRIES = catalog()
CONTENTS = list(HARD_CONTENTS.values())


@functools.lru_cache(maxsize=None)
def _host(folder: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DATA / folder))


def _template(entry: dict) -> tmpl.ChatTemplate:
    host = DATA / entry["host_tokenizer"]
    if not host.is_dir():
        pytest.skip(f"host tokenizer {entry['host_tokenizer']!r} is not in TMPL_TEST_DATA")
    path = DATA / entry["template"]
    return tmpl.ChatTemplate(_host(entry["host_tokenizer"]), path.read_text(encoding="utf-8"), name=path.name)


@pytest.mark.skipif(not ENTRIES, reason=f"no templates/catalog.json under TMPL_TEST_DATA={DATA}")
@pytest.mark.parametrize("entry", ENTRIES, ids=[str(Path(e["template"]).relative_to("templates")) for e in ENTRIES])
def test_catalog_template_exact_or_documented_error(twin, entry):
    clear_caches()
    tpl = _template(entry)
    outcomes = []
    for k in (1, 2, 3):
        for hname in ("user", "system"):
            history = list(HISTORIES[hname])
            assistant = assistant_turn(k)
            results = tool_results(assistant, [CONTENTS[(k + i) % len(CONTENTS)] for i in range(k)])
            if not renders_tool_turn(tpl, history, assistant, results):
                with pytest.raises(DOCUMENTED):
                    tpl.prompt_ids(history)
                    tpl.suffix_ids(results, completion_ids=[0], history=history)
                outcomes.append("no full render")
                continue
            try:
                check_turn(tpl, history, assistant, results)
                # a second round on top of the first, for history-dependent templates
                history += [assistant] + results
                nxt = assistant_turn(1, round_=1)
                check_turn(tpl, history, nxt, tool_results(nxt, ["second round"]), round_=1)
                outcomes.append("exact")
            except DOCUMENTED as exc:
                assert exc.args and str(exc), "errors must say what and where"
                outcomes.append(type(exc).__name__)
            except NoStopToken:
                # the turn cannot end on a token of this tokenizer: tmpl must refuse, not guess
                with pytest.raises(DOCUMENTED):
                    tpl.suffix_ids(results, completion_ids=[0], history=history)
                outcomes.append("refused: no stop token")
    assert outcomes

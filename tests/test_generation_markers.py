"""``{% generation %}`` markers of ``tmpl fix`` cover exactly what the model generated (issue 21, item 5).

Ground truth is tmpl's own trajectory, built the way the rollout builds it: the prompt before the first
assistant turn, each assistant turn as the model generated it (its render when last, after the generation
prompt, through its first stop token: ``add_completion``, mask 1), then the template's suffix up to the
next assistant turn's generation prompt (mask 0; after the last turn, the rest of the full render). On the
search's conversations (other seeds than the fixer decided on), transformers'
``return_assistant_tokens_mask`` of the fixed template must equal that loss mask token by token: no role
header the generation prompt already holds, nothing after the stop token. Where the fixer adds no
markers, its notes must say why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tmpl
from tmpl.errors import TemplateFixError
from tmpl.report import SAFE_WITH, UNSAFE, check
from tmpl.report.fix.rewrite import has_generation_markers
from tmpl.report.search import space_for
from tmpl.report.space import SPACE_TOOLS, generate, messages_of

from .conftest import catalog, template_under_test
from .fixes import fixed

FAMILIES = ("qwen3", "mistral-nemo-instruct-2407", "qwen2.5-instruct", "llama-3.2-instruct")
ENTRIES = catalog()
KEYS = list(FAMILIES) + [e["template"] for e in ENTRIES]
#: the search's conversations the masks are compared on (the fixer decides on seed 0)
SEEDS, CASES = (1, 2), 12


def _template(key: str) -> tmpl.ChatTemplate:
    tpl = template_under_test(key)
    if key not in FAMILIES and check(tpl).verdicts["tool_loop"].level not in (UNSAFE, SAFE_WITH):
        pytest.skip("tool loop already SAFE: the catalog's fixes are made where it is not")
    return tpl


def _render(tpl: tmpl.ChatTemplate, messages: list[dict], gen: bool, kwargs: dict) -> list[int]:
    return tpl.codec.encode(tpl.renderer.text(messages, tools=SPACE_TOOLS, add_generation_prompt=gen, **kwargs))


def trajectory_of(tpl: tmpl.ChatTemplate, messages: list[dict], kwargs: dict) -> tmpl.Trajectory | None:
    """The rollout's trajectory of ``messages`` (None when the conversation has no assistant turn or the
    template refuses it)."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        return None
    try:
        full = _render(tpl, messages, False, kwargs)
        traj = tmpl.Trajectory(_render(tpl, messages[: turns[0]], True, kwargs), max_length=len(full) + 8)
        for j, i in enumerate(turns):
            prompt, own = _render(tpl, messages[:i], True, kwargs), _render(tpl, messages[: i + 1], False, kwargs)
            assert own[: len(prompt)] == prompt, "the generation prompt is a prefix of the turn's render"
            stop = next(t for t in range(len(prompt), len(own)) if own[t] in tpl.stop_token_ids)
            completion = own[len(prompt) : stop + 1]
            traj.add_completion(completion, [0.0] * len(completion))
            longer = _render(tpl, messages[: turns[j + 1]], True, kwargs) if j + 1 < len(turns) else full
            so_far = [*traj.prompt_ids, *traj.completion_ids]
            assert longer[: len(so_far)] == so_far, "the suffix continues the stream"
            if len(longer) > len(so_far):
                traj.add_suffix(longer[len(so_far) :])
    except tmpl.errors.TemplateRenderError:
        return None
    assert [*traj.prompt_ids, *traj.completion_ids] == full
    return traj


def _conversations(tpl: tmpl.ChatTemplate):
    space = space_for(tpl).space
    for seed in SEEDS:
        for spec in generate(space, seed=seed, n=CASES):
            yield messages_of(spec, space), dict(spec.kwargs)


def _fix(key: str) -> tmpl.report.FixResult | TemplateFixError:
    _template(key)  # skips a catalog template whose tool loop is already SAFE
    return fixed(key)  # made once per process, shared with tests/test_fix.py


@pytest.mark.parametrize("key", KEYS, ids=[Path(k).name for k in KEYS])
def test_assistant_mask_of_the_fix_is_the_trajectory_loss_mask(key):
    result = _fix(key)
    if isinstance(result, TemplateFixError):
        pytest.skip(f"refused: {result.reason[:120]}")
    fixed = result.template
    if not has_generation_markers(fixed.template):
        why = [n for n in result.notes if n.startswith("no {% generation %} markers added: ")]
        assert why and len(why[0]) > len("no {% generation %} markers added: ") + 10, result.notes
        return
    compared = turns = 0
    for messages, kwargs in _conversations(fixed):
        traj = trajectory_of(fixed, messages, kwargs)
        if traj is None:
            continue
        out = fixed.tokenizer.apply_chat_template(
            messages,
            tools=SPACE_TOOLS,
            chat_template=fixed.template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            **{**fixed.template_kwargs, **kwargs},
        )
        ids = list(out["input_ids"])
        want = [0] * len(traj.prompt_ids) + [int(m) for m in traj.mask]
        assert ids == [*traj.prompt_ids, *traj.completion_ids]
        got = [int(m) for m in out["assistant_masks"]]
        if got != want:
            at = next(t for t in range(len(got)) if got[t] != want[t])
            raise AssertionError(
                f"{key} {kwargs}: the mask {'marks' if got[at] else 'leaves out'} "
                f"{fixed.codec.decode(ids[at : at + 8])!r} after {fixed.codec.decode(ids[max(0, at - 8) : at])!r}"
                f" ({[m['role'] for m in messages]})"
            )
        compared += 1
        turns += sum(m["role"] == "assistant" for m in messages)
    assert compared >= 10 and turns >= 20, (compared, turns)
    assert any(p.name == "assistant mask" and p.ok and "exactly" in p.detail for p in result.proof)


def test_families_get_exact_markers_or_none_with_the_reason():
    """Qwen3, Mistral Nemo and Llama 3.2 get markers that leave out the turn header and the separator after
    the stop token (the proof says "exactly"); Qwen2.5 gets none: whether the generation prompt's newline
    is written by the content's statement or by the first call's depends on the content, and the note
    names the statement."""
    for key in ("qwen3", "mistral-nemo-instruct-2407", "llama-3.2-instruct"):
        result = _fix(key)
        assert not isinstance(result, TemplateFixError), result
        step = next(p for p in result.proof if p.name == "assistant mask")
        assert step.ok and "exactly" in step.detail and "header" not in step.detail, step
    qwen3 = _fix("qwen3")
    assert not isinstance(qwen3, TemplateFixError)
    # '<|im_end|>\n' is split after the stop token; the header statement after '<|im_start|>assistant\n'
    # (after '</think>\n\n' when thinking is off)
    assert "{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}" in qwen3.source
    assert "enable_thinking is defined and enable_thinking == false" in qwen3.source
    llama = _fix("llama-3.2-instruct")
    assert not isinstance(llama, TemplateFixError)
    assert "{%- if message.role == 'assistant' %}" in llama.source  # one statement writes every role's turn
    qwen25 = _fix("qwen2.5-instruct")
    assert not isinstance(qwen25, TemplateFixError), qwen25
    assert not has_generation_markers(qwen25.source)
    assert any(n.startswith("no {% generation %} markers added: line ") for n in qwen25.notes), qwen25.notes

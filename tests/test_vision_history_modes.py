"""History modes with images (issue 36): ``Rollout(vision_template, history="template")`` and ``edit_history``.

A scripted model answers; a hook plays the user. Conversation: the user sends image A, the model
answers; the user sends image B, the model answers; then a compacting hook drops the first exchange
(image A's message) and the user sends image C. Oracle everywhere: the processor's own
``apply_chat_template(messages sent, add_generation_prompt=True, tokenize=True, return_dict=True)``
(images expanded by the processor, arrays computed by it), never tmpl's render. Checked: every request's
prompt IDs and the model inputs rebuilt from the images it carries, the images handed to the engine
(in placeholder order), where sequences merge and branch, each sequence's own images against the
processor's render of that sequence's messages, and every sampled token in exactly one loss mask.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

import tmpl
from tmpl.backends.scripted import Scripted
from tmpl.episode import BranchKind
from tmpl.rollout.codes import EndCode
from tmpl.trajectory.images import batch_model_inputs, has_images

from . import test_vision_rollout as tvr
from .test_vision import assert_same_inputs, image

#: Qwen2.5-VL (Qwen3.5-4B template, thinking off) and Gemma 4 (ollama e2b). Not Gemma 3: a Rollout on its
#: template crashes in append mode too, without tools (NoToolParserError from the completion reader)
NAMES = [tvr.QWEN, "gemma-4/ollama-e2b"]


@cache
def setup(name: str) -> tuple[Any, Any, dict[str, Any]]:
    return tvr.setup(name)


def truth(name: str, messages: list[dict[str, Any]], gen: bool = True) -> dict[str, np.ndarray]:
    processor, _, kwargs = setup(name)
    out = processor.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_tensors="np", add_generation_prompt=gen, **kwargs
    )
    return {k: np.asarray(v) for k, v in out.items()}


def images_of(messages: list[dict[str, Any]]) -> list[Any]:
    return [p["image"] for m in messages if isinstance(m["content"], list) for p in m["content"] if "image" in p]


def user(img: Any, text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": text}]}


IMAGES = {"A": (60, 45, 1), "B": (33, 70, 2), "C": (52, 52, 3)}


def pictures() -> dict[str, Any]:
    return {k: image(*v) for k, v in IMAGES.items()}


class Compact:
    """The user: after answer 0 sends image B; after answer 1 drops the first exchange (image A's message
    and its answer) and sends image C; then stops. ``sent[t]``: the messages turn t's prompt renders."""

    def __init__(self, imgs: dict[str, Any], first: list[dict[str, Any]], *, swap: bool = False) -> None:
        self.imgs = imgs
        self.swap = swap
        self.sent: list[list[dict[str, Any]]] = [first]

    def __call__(self, messages: list[dict[str, Any]], ctx: Any) -> Any:
        if not ctx.answered:
            return None
        if ctx.turn == 0:
            out = messages + [user(self.imgs["B"], "And this one?")]
        elif ctx.turn == 1 and self.swap:  # image A replaced by one of its size: the same token IDs
            other = self.imgs["A"].copy()
            other.putpixel((3, 3), (1, 2, 3))
            out = [user(other, messages[0]["content"][1]["text"])] + messages[1:] + [user(self.imgs["C"], "Last.")]
        elif ctx.turn == 1:
            ctx.label = "compaction"
            out = messages[2:] + [user(self.imgs["C"], "Last.")]
        else:
            return None
        self.sent.append(out)
        return out


class Model:
    """Answers each prompt with the tokens the processor's render has for ``Picture <t>.`` after it, and
    checks the request against the processor's render of the messages the turn sent."""

    def __init__(self, name: str, hook: Compact) -> None:
        self.name = name
        self.hook = hook
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []
        self.errors: list[str] = []

    def __call__(self, request: Any) -> list[int]:
        turn = int(request.request_id.split("-")[2])
        messages = self.hook.sent[turn]
        want = truth(self.name, messages)
        ids = want["input_ids"][0].tolist()
        prompt = list(request.prompt_ids)
        self.prompts.append(prompt)
        try:
            assert prompt == ids, f"turn {turn}: the prompt differs from the processor's full render"
            assert request.images is not None
            assert_same_inputs(request.images.model_inputs(prompt), want, f"turn {turn}")
            sent = request.image_sources or []
            assert sent == images_of(messages), f"turn {turn}: the engine got other images"
        except AssertionError as exc:
            self.errors.append(str(exc))
        _, vt, _ = setup(self.name)
        assistant = {"role": "assistant", "content": f"Picture {turn}."}
        alone = truth(self.name, messages + [assistant], gen=False)["input_ids"][0].tolist()
        end = next(t for t in range(len(ids), len(alone)) if alone[t] in vt.stop_token_ids)
        self.sampled.append(alone[len(ids) : end + 1])
        return self.sampled[-1]


def rollout_of(
    name: str, *, swap: bool = False, max_length: int = 20000, **kwargs: Any
) -> tuple[tmpl.RolloutResult, Model, Compact]:
    _, vt, _ = setup(name)
    imgs = pictures()
    first = [user(imgs["A"], "What is in this picture?")]
    hook = Compact(imgs, first, swap=swap)
    model = Model(name, hook)
    rollout = tmpl.Rollout(
        vt, Scripted(model), max_turns=4, max_length=max_length, progress=False, edit_history=hook, **kwargs
    )
    (r,) = rollout.run([first])
    return r, model, hook


def check_trained_once(r: tmpl.RolloutResult, model: Model) -> None:
    """Each sampled token is in exactly one sequence's loss mask, and every sequence is what its calls'
    engines were sent plus what they sampled."""
    seqs = r.sequences
    assert sum(int(s.mask.sum()) for s in seqs) == sum(len(ids) for ids in model.sampled)
    for s in seqs:
        for span in s.spans:
            turn = int(span.call.split("-")[1])
            assert s.ids[span.start : span.end].tolist() == model.sampled[turn]
            assert s.mask[span.start : span.end].all()
            assert s.ids[: span.start].tolist() == model.prompts[turn]
        outside = np.ones(len(s.ids), dtype=bool)
        for span in s.spans:
            outside[span.start : span.end] = False
        assert not s.mask[outside].any()


def check_sequence_images(name: str, ids: np.ndarray, images: Any, messages: list[dict[str, Any]]) -> None:
    """A sequence and its images rebuild the processor's render of its messages (with its last answer)."""
    want = truth(name, messages, gen=False)
    n = len(ids)
    assert ids.tolist() == want["input_ids"][0].tolist()[:n]
    got = images.model_inputs(ids.tolist())
    for key in want:
        if key in ("input_ids", "attention_mask") or key in images.token_type_keys:
            assert np.array_equal(got[key][0], want[key][0][:n]), key
        else:
            assert np.array_equal(got[key], want[key]), key


@pytest.mark.parametrize("name", NAMES)
def test_a_compacting_hook_branches_and_each_sequence_carries_its_own_images(name: str, tmp_path: Any) -> None:
    r, model, hook = rollout_of(name)
    assert not model.errors, model.errors
    assert r.code is EndCode.FINISHED and r.turns == 3, r.reason
    assert [len(images_of(m)) for m in hook.sent] == [1, 2, 2]  # A; A, B; B, C (A dropped)
    seqs = r.sequences
    # turn 1 continues turn 0's sequence exactly when the processor's render of its messages extends what
    # turn 0 was sent and sampled (Gemma's templates; Qwen3.5's drops the empty think block it prompted with)
    extends = truth(name, hook.sent[1])["input_ids"][0].tolist()[: len(model.prompts[0]) + len(model.sampled[0])]
    merged = extends == model.prompts[0] + model.sampled[0]
    assert merged == (name != tvr.QWEN)
    assert [s.turns for s in seqs] == ([(0, 1), (2,)] if merged else [(0,), (1,), (2,)])
    assert seqs[0].branch.kind == BranchKind.FIRST
    assert all(s.branch.kind == BranchKind.DIVERGED for s in seqs[1:])
    assert seqs[-1].branch.edit == "edit_history: compaction"
    check_trained_once(r, model)
    per = r.sequence_images
    for s, im in zip(seqs, per):  # each sequence: its last call's messages and answer, with their images
        t = s.turns[-1]
        assert im.count == len(images_of(hook.sent[t]))
        check_sequence_images(name, s.ids, im, hook.sent[t] + [{"role": "assistant", "content": f"Picture {t}."}])
    for s, im in zip(seqs, per):  # placeholders are context, never loss positions
        im.check_outside_loss(s.mask)
    # the last branch is the result's trajectory, with the same images
    assert has_images(r.trajectory) and r.images.spans == per[-1].spans
    # rows carry each sequence's images: a batch with both, in order
    rows = r.rows()
    batch = tmpl.trajectory.collate_arrays(rows, pad_id=0)
    assert batch["num_images"].tolist() == [im.count for im in per]
    _, vt, _ = setup(name)
    inputs = batch_model_inputs(batch, image_token_id=vt.image_token_id)
    for key in per[0].arrays:
        assert np.array_equal(inputs[key], np.concatenate([im.arrays[key] for im in per])), key
    # export keeps every sequence's images: read back, the same sequences and model inputs
    path = tmpl.export.to_jsonl([r], tmp_path / "r.jsonl", inline_bytes=4096)
    (back,) = tmpl.export.from_jsonl(path)
    assert len(back.sequences) == len(seqs) and len(list((tmp_path / "r.jsonl.images").iterdir())) > 2
    for s, im, b, im_b in zip(seqs, per, back.sequences, back.sequence_images):
        assert np.array_equal(s.ids, b.ids) and np.array_equal(s.mask, b.mask)
        assert_same_inputs(im_b.model_inputs(b.ids.tolist()), im.model_inputs(s.ids.tolist()), "export")
    (again,) = tmpl.export.from_records(tmpl.export.to_records([r]))  # inline arrays
    assert [im.spans for im in again.sequence_images] == [im.spans for im in per]
    (record,) = tmpl.export.to_records([r])
    bad = record["images"]["sequences"][0]
    bad["spans"] = [[a + 1, b + 1] for a, b in bad["spans"]]  # negative control: misaligned spans are named
    with pytest.raises(tmpl.errors.ExportError, match="images of sequence 0"):
        tmpl.export.from_records([record])


def test_template_mode_with_tool_images_is_one_sequence_equal_to_append_mode() -> None:
    """Tools that return images, template mode (test_vision_rollout's script checks every request
    against the processor): nothing is rewritten, so one sequence, equal to append mode's, same images."""
    name = tvr.QWEN
    appended, _, _ = tvr.run(name)
    rendered, scripts, _ = tvr.run(name, history="template")
    for a, r, script in zip(appended, rendered, scripts):
        assert script.checked == 3 and r.code is EndCode.FINISHED, r.reason
        assert r.tool_calls == 3 and len(r.sequences) == 1
        (seq,) = r.sequences
        (want,) = a.sequences
        assert np.array_equal(seq.ids, want.ids) and np.array_equal(seq.mask, want.mask)
        (im,) = r.sequence_images
        (im_a,) = a.sequence_images
        assert im.count == 4 and im.spans == im_a.spans
        assert_same_inputs(im.model_inputs(seq.ids.tolist()), im_a.model_inputs(want.ids.tolist()), "template")
        final = tvr.truth(name, script.history, gen=False)
        for key in ("pixel_values", "image_grid_thw"):
            assert np.array_equal(im.arrays[key], final[key]), key


def test_a_tool_image_dropped_by_a_hook_leaves_later_prompts() -> None:
    """A window hook that drops the chart tool's image after turn 1: turn 2's prompt is the processor's
    render without it (checked by the script), the engine gets the remaining images, and a branch."""
    name = tvr.QWEN
    _, vt, _ = setup(name)
    script = tvr.Script(name, image(60, 45, seed=1))
    sent: list[list[dict[str, Any]]] = [script.history[:2]]

    def window(messages: list[dict[str, Any]], ctx: Any) -> Any:
        if ctx.turn != 1 or ctx.answered:
            return None
        ctx.label = "window"
        first_tool = next(i for i, m in enumerate(messages) if m["role"] == "tool")
        out = [dict(m) for m in messages]
        out[first_tool] = {**out[first_tool], "content": "[chart omitted]"}
        sent.append(out)
        return out

    seen: list[tuple[list[int], list[Any]]] = []
    sampled: list[list[int]] = []

    def policy(request: Any) -> list[int]:
        seen.append((list(request.prompt_ids), list(request.image_sources or [])))
        sampled.append(answer(request))
        return sampled[-1]

    def answer(request: Any) -> list[int]:
        turn = int(request.request_id.split("-")[2])
        if turn == 2:  # the script's own history still holds the chart: render what the hook sent
            want = tvr.truth(name, sent[-1])
            assert list(request.prompt_ids) == want["input_ids"][0].tolist()
            assert_same_inputs(request.images.model_inputs(list(request.prompt_ids)), want, "turn 2")
            script.checked += 1
            assistant = script.assistant(turn)
            alone = tvr.truth(name, sent[-1] + [assistant], gen=False)["input_ids"][0].tolist()
            n = len(request.prompt_ids)
            end = next(t for t in range(n, len(alone)) if alone[t] in vt.stop_token_ids)
            return alone[n : end + 1]
        return script(request)

    rollout = tmpl.Rollout(
        vt, Scripted(policy), tools=tvr.TOOLS, max_turns=4, max_length=20000, progress=False, edit_history=window
    )
    (r,) = rollout.run([script.history[:2]])
    assert r.code is EndCode.FINISHED and script.checked == 3, r.reason
    assert [len(s) for _, s in seen] == [1, 2, 3]  # user; user, chart; user, page, chart (first chart dropped)
    assert seen[2][1] == images_of(sent[-1])
    seqs = r.sequences
    assert [s.turns for s in seqs] == [(0, 1), (2,)] and seqs[1].branch.edit == "edit_history: window"
    assert [im.count for im in r.sequence_images] == [2, 3]
    assert sum(int(s.mask.sum()) for s in seqs) == sum(len(ids) for ids in sampled)
    for s in seqs:
        for span in s.spans:
            assert s.ids[span.start : span.end].tolist() == sampled[int(span.call.split("-")[1])]


def test_an_edit_that_swaps_pixels_under_the_same_ids_branches_named() -> None:
    """Image A replaced by another of its size: the prompt's IDs extend the sequence, its pixels do not.
    One sequence cannot hold both images, so the call starts a branch, labelled with the image; each
    sequence keeps the images its calls were sent. (Gemma 4: its render keeps turn 1's prompt, so turn
    2's IDs extend the sequence; Qwen3.5's drops the empty think block, and the IDs branch anyway.)"""
    name = "gemma-4/ollama-e2b"
    r, model, hook = rollout_of(name, swap=True)
    assert not model.errors, model.errors  # the engine got the swapped image (checked against the render)
    assert r.code is EndCode.FINISHED and r.turns == 3, r.reason
    # control: the IDs of the swapped render extend turn 1's sequence (only the pixels differ)
    ids = truth(name, hook.sent[2])["input_ids"][0].tolist()
    assert ids[: len(model.prompts[1]) + len(model.sampled[1])] == model.prompts[1] + model.sampled[1]
    seqs = r.sequences
    assert [s.turns for s in seqs] == [(0, 1), (2,)]
    branch = seqs[1].branch
    assert branch.kind == BranchKind.DIVERGED and branch.against == 0 and branch.token == len(seqs[0].ids)
    assert branch.edit == "edit_history; image 0 (history[0].content[0]) has other pixels than in sequence 0"
    check_trained_once(r, model)
    per = r.sequence_images
    check_sequence_images(name, seqs[0].ids, per[0], hook.sent[1] + [{"role": "assistant", "content": "Picture 1."}])
    check_sequence_images(name, seqs[1].ids, per[1], hook.sent[2] + [{"role": "assistant", "content": "Picture 2."}])
    assert not np.array_equal(per[0].arrays["pixel_values"][:1], per[1].arrays["pixel_values"][:1])
    # exported and read back: the call is kept apart again (its IDs alone would merge it), same images
    (record,) = tmpl.export.to_records([r])
    (back,) = tmpl.export.from_records([record])
    assert [s.turns for s in back.sequences] == [(0, 1), (2,)] and back.sequences[1].branch.edit == branch.edit
    for s, im, b, im_b in zip(seqs, per, back.sequences, back.sequence_images):
        assert np.array_equal(s.ids, b.ids) and np.array_equal(s.mask, b.mask)
        assert_same_inputs(im_b.model_inputs(b.ids.tolist()), im.model_inputs(s.ids.tolist()), "export")
    del record["episode"]["apart"]  # control: replayed by IDs alone, the calls merge into one sequence
    with pytest.raises(tmpl.errors.ExportError, match=r"images of 2 sequence\(s\), but the record holds 1"):
        tmpl.export.from_records([record])


def test_template_mode_takes_a_vision_template() -> None:
    _, vt, _ = setup(tvr.QWEN)
    rollout = tmpl.Rollout(vt, Scripted(lambda req: []), history="template", progress=False)
    assert rollout.vision is vt and rollout._rendered


class Echo:
    """A user whose image message's text ends with what the model answers (``Reply OK.`` / ``OK.``)."""

    def __init__(self, name: str, imgs: dict[str, Any]) -> None:
        self.name = name
        self.imgs = imgs
        self.sent: list[list[dict[str, Any]]] = [[user(imgs["A"], "Reply OK.")]]
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    def hook(self, messages: list[dict[str, Any]], ctx: Any) -> Any:
        if ctx.turn == 0:
            self.sent.append(messages + [user(self.imgs["B"], "Again: reply OK.")])
            return self.sent[-1]
        return None

    def __call__(self, request: Any) -> list[int]:
        turn = int(request.request_id.split("-")[2])
        ids = truth(self.name, self.sent[turn])["input_ids"][0].tolist()
        self.prompts.append(list(request.prompt_ids))
        _, vt, _ = setup(self.name)
        alone = truth(self.name, self.sent[turn] + [{"role": "assistant", "content": "OK."}], gen=False)
        full = alone["input_ids"][0].tolist()
        end = next(t for t in range(len(ids), len(full)) if full[t] in vt.stop_token_ids)
        self.sampled.append(full[len(ids) : end + 1])
        return self.sampled[-1]


@pytest.mark.parametrize("name", NAMES)
def test_an_answer_the_user_message_also_ends_with_is_spliced_where_the_answer_is(name: str) -> None:
    """The bytes of the sampled ``OK.`` + turn close also occur at the end of the user's text part (before
    the answer): the splice must put the sampled IDs at the answer, not inside the user's message."""
    _, vt, _ = setup(name)
    echo = Echo(name, pictures())
    rollout = tmpl.Rollout(vt, Scripted(echo), max_turns=3, progress=False, edit_history=echo.hook)
    (r,) = rollout.run([echo.sent[0]])
    assert r.code is EndCode.FINISHED and r.turns == 2, r.reason
    for t, prompt in enumerate(echo.prompts):
        assert prompt == truth(name, echo.sent[t])["input_ids"][0].tolist(), f"turn {t}"
    kept = [k for k in r.kept[0] if k.size]
    assert kept and echo.prompts[1][kept[0].at : kept[0].at + kept[0].size] == echo.sampled[0]


def test_an_image_that_does_not_fit_the_budget_is_left_out_whole_and_named() -> None:
    """Gemma 4 (turn 1 continues turn 0's sequence): a budget that ends inside image B's placeholders. The
    sample is TRUNCATED before the image, named; what it holds rebuilds (its images whole)."""
    name = "gemma-4/ollama-e2b"
    _, vt, _ = setup(name)
    _, model, hook = rollout_of(name)
    want = truth(name, hook.sent[1])["input_ids"][0].tolist()
    b_start, b_end = tmpl.vision.placeholder_runs(want, vt.image_token_id)[1]
    assert b_start > len(model.prompts[0]) + len(model.sampled[0])
    r, cut_model, _ = rollout_of(name, max_length=b_start + 3)
    assert r.code is EndCode.BUDGET_CUT and r.status is tmpl.Status.TRUNCATED, r.reason
    assert "image history[2].content[0]" in r.reason and "do not fit whole" in r.reason
    seq = r.prompt_ids.tolist() + r.completion_ids.tolist()
    assert seq == want[:b_start]  # up to the image, the processor's render; no placeholder of it
    assert r.images.count == 1 and r.trajectory.model_inputs()["input_ids"][0].tolist() == seq
    (s,) = r.sequences
    assert s.turns == (0,) and s.ids.tolist() == cut_model.prompts[0] + cut_model.sampled[0]
    assert [im.count for im in r.sequence_images] == [1]
    check_sequence_images(
        name, s.ids, r.sequence_images[0], hook.sent[0] + [{"role": "assistant", "content": "Picture 0."}]
    )


def test_streamed_template_mode_with_images_equals_run() -> None:
    name = "gemma-4/ollama-e2b"
    _, vt, _ = setup(name)
    r, _, _ = rollout_of(name)
    imgs = pictures()
    first = [user(imgs["A"], "What is in this picture?")]
    hook = Compact(imgs, first)
    model = Model(name, hook)
    rollout = tmpl.Rollout(vt, Scripted(model), max_turns=4, max_length=20000, progress=False, edit_history=hook)
    ((b,),) = list(rollout.stream_sync([first]))
    assert not model.errors and b.code is EndCode.FINISHED, b.reason
    assert [s.turns for s in b.sequences] == [s.turns for s in r.sequences]
    for s, im, t, im_t in zip(r.sequences, r.sequence_images, b.sequences, b.sequence_images):
        assert np.array_equal(s.ids, t.ids) and np.array_equal(s.mask, t.mask)
        assert_same_inputs(im_t.model_inputs(t.ids.tolist()), im.model_inputs(s.ids.tolist()), "stream")


def test_episode_calls_kept_apart_from_a_sequence_they_extend() -> None:
    """``Episode.add_call(apart=...)``: the call continues the longest other sequence it extends, or branches
    against the one kept apart (its whole length in common)."""
    from tmpl.episode import Call, Episode

    ep = Episode()
    assert ep.add_call(Call([1, 2], [3], [-0.1], id="a")) == 0
    assert ep.add_call(Call([1, 2, 3, 4], [5], [-0.2], id="b"), apart={0}) == 1
    s0, s1 = ep.sequences
    assert s1.ids.tolist() == [1, 2, 3, 4, 5] and s1.mask.tolist() == [0, 0, 0, 0, 1]
    assert (s1.branch.kind, s1.branch.against, s1.branch.token, s1.branch.got) == (BranchKind.DIVERGED, 0, 3, 4)
    # kept apart from sequence 1 (the longest it extends), it continues sequence 0 (also a prefix)
    assert ep.add_call(Call([1, 2, 3, 4, 5, 6], [7], [-0.3], id="c"), apart={1}) == 0
    assert ep.sequences[0].ids.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert ep.add_call(Call([1, 2, 3, 4, 5, 6, 7, 8], [9], [-0.4], id="d")) == 0  # nothing apart: the longest

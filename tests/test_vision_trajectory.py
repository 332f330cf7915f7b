"""Trajectories carrying image inputs (issue 24, item 2): ImageTrajectory, collate, export, pickles.

Ground truth is the processor's own full render of the whole conversation
(``processor.apply_chat_template(..., tokenize=True, return_dict=True)``), as in tests/test_vision.py,
whose processors, images and conversation these tests reuse. Every rebuilt model input (from the
trajectory, from a pickle, from JSONL with arrays inline or in side files, from a Dataset, from a
collated batch) is compared with that render, key by key and array by array.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pytest

import tmpl
from tmpl.errors import CollateError, ExportError, TrajectoryError
from tmpl.trajectory.images import (
    ImageTrajectory,
    batch_model_inputs,
    has_images,
    image_trajectory_class,
)

from .test_vision import TOOLS, assert_same_inputs, conversation, image, processor_render, setup

NAME = "qwen2.5-vl/qwen2.5-tok/Qwen3.5-4B"  # prefix-stable: the whole sequence is the render
GEMMA = "gemma-4/ollama-e2b"  # prefix-stable, another processor family (image_position_ids, no grid)


def rollout_sample(
    name: str, user_size: tuple[int, int], tool_sizes: list[tuple[int, int]], *, max_length: int | None = None
) -> tuple[Any, dict[str, np.ndarray], list[int]]:
    """A trajectory as a rollout builds it (prompt with an image, a completion, a tool suffix with
    images) and the processor's full render of the same conversation."""
    processor, vt, kwargs = setup(name)
    history, assistant, results = conversation(
        image(*user_size), [image(w, h, seed=10 + k) for k, (w, h) in enumerate(tool_sizes)]
    )
    full = processor_render(processor, history + [assistant] + results, kwargs, add_generation_prompt=True)
    full_ids = full["input_ids"][0].tolist()
    prompt = vt.prompt(history, tools=TOOLS)
    assert full_ids[: len(prompt.ids)] == prompt.ids
    end = next(i for i in range(len(prompt.ids), len(full_ids)) if full_ids[i] in vt.stop_token_ids)
    completion = full_ids[len(prompt.ids) : end + 1]
    suffix = vt.suffix_ids(results, completion_ids=completion, tools=TOOLS, history=history)
    traj = ImageTrajectory(
        prompt.ids, max_length or len(full_ids) + 16, vocab_size=len(vt.chat.tokenizer), images=prompt.images
    )
    traj.add_completion(completion, [-0.25] * len(completion), message=2)
    traj.add_suffix(suffix.ids, message=3, images=suffix.images)
    return traj, full, full_ids


@pytest.mark.parametrize("name", [NAME, GEMMA])
def test_trajectory_carries_images_aligned_and_outside_the_loss(name: str) -> None:
    traj, full, full_ids = rollout_sample(name, (90, 60), [(200, 120), (64, 64)])
    assert isinstance(traj, tmpl.Trajectory) and has_images(traj)
    assert traj.prompt_ids.tolist() + traj.completion_ids.tolist() == full_ids
    assert traj.images.count == 3
    assert_same_inputs(traj.model_inputs(), full, name)
    # placeholders are prompt or suffix tokens: never in the mask (checked on the real mask)
    traj.images.check_outside_loss(traj.mask, offset=traj.prompt_length)
    assert traj.mask[traj.images.spans[-1][0] - traj.prompt_length] == 0
    bad = traj.mask.copy()
    bad[traj.images.spans[1][1] - 1 - traj.prompt_length] = 1  # negative control
    with pytest.raises(TrajectoryError, match="in the loss mask"):
        traj.images.check_outside_loss(bad, offset=traj.prompt_length)


def test_prompt_images_must_match_the_prompt() -> None:
    _, vt, _ = setup(NAME)
    history, _, _ = conversation(image(60, 60), [])
    prompt = vt.prompt(history, tools=TOOLS)
    with pytest.raises(TrajectoryError, match="prompt images"):
        ImageTrajectory(prompt.ids[:-3], 4096, images=prompt.images.shifted(1), sample_id="s1")
    with pytest.raises(TrajectoryError, match="image_token_id"):
        ImageTrajectory(prompt.ids, 4096)


def test_budget_never_cuts_an_image_in_two() -> None:
    traj, full, full_ids = rollout_sample(NAME, (60, 60), [(28, 28), (300, 300)])
    spans = traj.images.spans
    # a budget that ends inside the second tool image's placeholders
    limit = spans[2][0] + 5
    cut, _, _ = rollout_sample(NAME, (60, 60), [(28, 28), (300, 300)], max_length=limit)
    assert cut.status is tmpl.Status.TRUNCATED and "placeholders of image tool_messages[1].content[1]" in cut.reason
    assert cut.images.count == 2 and cut.images.spans == spans[:2]
    seq = cut.prompt_ids.tolist() + cut.completion_ids.tolist()
    assert seq == full_ids[: spans[2][0]]  # up to the first placeholder of the image that did not fit
    assert cut.tokens_cut == len(full_ids) - spans[2][0]  # the rest of the suffix, counted as cut
    inputs = cut.model_inputs()  # still buildable: the images it holds are whole
    grid = full["image_grid_thw"]
    assert np.array_equal(inputs["image_grid_thw"], grid[:2])
    rows = int(np.prod(grid[0]) + np.prod(grid[1]))
    assert np.array_equal(inputs["pixel_values"], full["pixel_values"][:rows])


def test_pickle_keeps_images_on_both_twins(twin: Any) -> None:
    traj, full, _ = rollout_sample(NAME, (50, 70), [(120, 80)])
    assert isinstance(traj, twin.builder.Trajectory)
    again = pickle.loads(pickle.dumps(traj))
    assert type(again) is image_trajectory_class(twin.builder.Trajectory)
    assert again.images.spans == traj.images.spans
    assert_same_inputs(again.model_inputs(), full, NAME)
    again.reset()  # a retry drops the suffix images, keeps the prompt's
    assert again.images.count == 1 and again.completion_length == 0


def results_of(trajectories: list[Any]) -> list[tmpl.RolloutResult]:
    return [
        tmpl.RolloutResult(
            index=k, sample=0, trajectory=t, messages=[], turns=1, tool_calls=1, tool_failures=0, finish_reason="stop"
        )
        for k, t in enumerate(trajectories)
    ]


def test_export_jsonl_inline_and_by_reference(tmp_path: Any) -> None:
    small, full_small, _ = rollout_sample(NAME, (28, 28), [(28, 28)])
    large, full_large, _ = rollout_sample(NAME, (300, 200), [(640, 480)])
    text = tmpl.Trajectory([1, 2, 3], max_length=8)
    text.add_completion([4], [-0.5])
    results = results_of([small, large, text])
    assert results[0].images is not None and results[2].images is None
    path = tmp_path / "out" / "rollouts.jsonl"
    path.parent.mkdir()
    limit = small.images.arrays["pixel_values"].nbytes  # the small sample's arrays stay inline
    assert large.images.arrays["pixel_values"].nbytes > limit > large.images.arrays["image_grid_thw"].nbytes
    tmpl.export.to_jsonl(results, path, inline_bytes=limit)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    small_arrays = records[0]["images"]["arrays"]
    large_arrays = records[1]["images"]["arrays"]
    assert all("b64" in a for a in small_arrays.values())  # at the limit: inline
    assert "file" in large_arrays["pixel_values"] and "b64" in large_arrays["image_grid_thw"]
    side = path.parent / large_arrays["pixel_values"]["file"]
    assert side.is_file() and side.parent.name == "rollouts.jsonl.images"
    assert records[2]["images"] is None
    back = tmpl.export.from_jsonl(path)
    assert_same_inputs(back[0].trajectory.model_inputs(), full_small, "small")
    assert_same_inputs(back[1].trajectory.model_inputs(), full_large, "large")
    assert back[1].images.spans == large.images.spans and back[1].images.parts == large.images.parts
    assert not has_images(back[2].trajectory)
    # the whole folder moves: files are named relative to the JSONL
    moved = tmp_path / "moved"
    path.parent.rename(moved)
    assert_same_inputs(tmpl.export.from_jsonl(moved / "rollouts.jsonl")[1].trajectory.model_inputs(), full_large, "m")
    # a missing side file is named
    (moved / large_arrays["pixel_values"]["file"]).unlink()
    with pytest.raises(ExportError, match=r"rollouts.jsonl:2.*pixel_values"):
        tmpl.export.from_jsonl(moved / "rollouts.jsonl")


def test_records_and_dataset_round_trip() -> None:
    traj, full, _ = rollout_sample(GEMMA, (70, 50), [(100, 100)])
    records = tmpl.export.to_records(results_of([traj]))
    assert "file" not in json.dumps(records[0]["images"])  # no folder given: everything inline
    assert_same_inputs(tmpl.export.from_records(records)[0].trajectory.model_inputs(), full, GEMMA)
    pytest.importorskip("datasets")
    ds = tmpl.export.to_dataset(results_of([traj]))
    assert_same_inputs(tmpl.export.from_dataset(ds)[0].trajectory.model_inputs(), full, GEMMA)


def test_collate_and_rebuild_the_batch() -> None:
    a, full_a, ids_a = rollout_sample(NAME, (90, 60), [(200, 120)])
    b, full_b, ids_b = rollout_sample(NAME, (40, 120), [(64, 64), (150, 90)])
    _, vt, _ = setup(NAME)
    plain = tmpl.Trajectory(ids_a[:5], max_length=64)  # a text-only row in the same batch
    plain.add_completion([ids_a[5]], [-0.1])
    batch = tmpl.trajectory.collate_arrays([a, plain, b], pad_id=0)
    assert batch["num_images"].tolist() == [2, 0, 3]
    for key in ("pixel_values", "image_grid_thw"):
        assert np.array_equal(batch[key], np.concatenate([full_a[key], full_b[key]]))
    out = batch_model_inputs(batch, vt.image_token_id)
    for row, full in ((0, full_a), (2, full_b)):
        keep = out["attention_mask"][row] == 1
        assert out["input_ids"][row][keep].tolist() == full["input_ids"][0].tolist()
        assert np.array_equal(out["mm_token_type_ids"][row][keep], full["mm_token_type_ids"][0])
    assert not out["mm_token_type_ids"][1].any()
    # results collate the same way; torch tensors carry the image keys
    torch = pytest.importorskip("torch")
    tensors = tmpl.collate(results_of([a, plain, b]), pad_id=0)
    assert torch.equal(tensors["pixel_values"], torch.from_numpy(batch["pixel_values"]))
    assert tensors["num_images"].tolist() == [2, 0, 3]
    again = batch_model_inputs(tensors, vt.image_token_id)
    assert np.array_equal(again["input_ids"], out["input_ids"])
    # a row whose placeholders and num_images disagree is refused
    broken = dict(batch, num_images=np.array([1, 0, 3]))
    with pytest.raises(CollateError, match="num_images"):
        batch_model_inputs(broken, vt.image_token_id)


def test_collate_refuses_images_of_two_processors() -> None:
    a, _, _ = rollout_sample(NAME, (60, 60), [(60, 60)])
    g, _, _ = rollout_sample(GEMMA, (60, 60), [(60, 60)])
    with pytest.raises(CollateError, match="another processor"):
        tmpl.trajectory.collate_arrays([a, g], pad_id=0)


def test_text_only_collate_is_unchanged() -> None:
    t = tmpl.Trajectory([1, 2], max_length=8)
    t.add_completion([3], [-0.5])
    assert list(tmpl.trajectory.collate_arrays([t], pad_id=0)) == list(tmpl.trajectory.batch.BATCH_KEYS)


def test_doctests() -> None:
    import doctest

    import tmpl.trajectory.images

    result = doctest.testmod(tmpl.trajectory.images)
    assert result.attempted > 0 and result.failed == 0

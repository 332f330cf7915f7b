"""The images column of ``tmpl check`` / ``tmpl matrix`` (issue 24, item 7), on the real VL templates
of the catalog and the processors tests/test_vision.py builds. The check's ground truth is the
processor's own full render; its verdicts here agree with tests/test_vision.py's, and a negative
control shows it catches a suffix that differs.
"""

from __future__ import annotations

from typing import Any

import pytest

import tmpl
from tmpl.report.matrix import Row, row_line, to_markdown
from tmpl.report.multimodal import check_images, image_placeholder
from tmpl.report.report import build_report

from .test_vision import _template, _tokenizer

pytest.importorskip("PIL.Image")
pytest.importorskip("transformers")

QWEN35 = "templates/llama.cpp/Qwen3.5-4B.jinja"


def chat(folder: str, template: str, **kwargs: Any) -> tmpl.ChatTemplate:
    return tmpl.ChatTemplate(_tokenizer(folder), _template(template), name=template.rsplit("/", 1)[-1], **kwargs)


def test_qwen_vl_template_is_exact_with_qwen25_vl_processor() -> None:
    tpl = chat("qwen2.5-instruct", QWEN35, enable_thinking=False)
    assert image_placeholder(tpl) == "<|vision_start|><|image_pad|><|vision_end|>"
    found = check_images(tpl)
    assert found is not None and found.processor is not None and found.processor.startswith("Qwen2_5_VLProcessor")
    assert found.label == "placeholders stable, suffix exact (Qwen2_5_VLProcessor)"
    assert found.notes == []  # prefix-stable, as tests/test_vision.py found with this tokenizer and kwargs


def test_thinking_template_suffix_exact_but_not_prefix_stable() -> None:
    found = check_images(chat("qwen3", QWEN35))
    assert found is not None and found.label.startswith("placeholders stable, suffix exact")
    assert found.notes and "not prefix-stable" in found.notes[0]


def test_negative_control_a_wrong_suffix_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from tmpl.vision import VisionIds, VisionTemplate

    real = VisionTemplate.suffix_ids

    def one_token_short(self: Any, *args: Any, **kwargs: Any) -> VisionIds:
        out = real(self, *args, **kwargs)
        return VisionIds(out.ids[:-1], out.images)

    monkeypatch.setattr(VisionTemplate, "suffix_ids", one_token_short)
    found = check_images(chat("qwen2.5-instruct", QWEN35, enable_thinking=False))
    assert found is not None and found.suffix.level == "UNSAFE" and "differs" in found.suffix.reason


def test_gemma4_template_that_drops_tool_images_is_unsupported() -> None:
    found = check_images(chat("gemma-4-it", "templates/llama.cpp/google-gemma-4-31B-it.jinja"))
    assert found is not None and found.placeholders.level == "SAFE"
    assert found.suffix.level == "UNSUPPORTED" and "drops images in tool results" in found.suffix.reason
    exact = check_images(chat("gemma-4-it", "templates/ollama/gemma4_e2b_chat_template.jinja"))
    assert exact is not None and exact.label == "placeholders stable, suffix exact (Gemma4Processor)"


def test_unproven_says_why() -> None:
    mistral = check_images(
        chat("mistral-nemo-instruct-2407", "templates/llama.cpp/Mistral-Small-3.2-24B-Instruct-2506.jinja")
    )
    assert mistral is not None and mistral.placeholder == "[IMG]"
    assert mistral.label.startswith("UNPROVEN (no processor buildable here for the placeholder '[IMG]'")
    no_token = check_images(chat("llama-3.2-instruct", QWEN35, enable_thinking=False))
    assert no_token is not None and no_token.label.startswith("UNPROVEN (the tokenizer has no <|image_pad|>")


def test_text_templates_have_no_images_column(tokenizer_of: Any) -> None:
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="qwen2.5")
    assert image_placeholder(tpl) is None and check_images(tpl) is None
    report = build_report(tpl)
    assert report.images is None and "## Images" not in report.to_markdown()
    from tmpl.report.matrix import COLUMNS

    cells = [c.strip() for c in to_markdown([Row("qwen2.5", "test", report)]).splitlines()[-1].strip("|").split(" | ")]
    assert cells[COLUMNS.index("images")] == "-"


def test_report_and_matrix_show_the_images_check() -> None:
    tpl = chat("qwen2.5-instruct", QWEN35, enable_thinking=False)
    report = build_report(tpl)
    assert report.images is not None and report.images.label.startswith("placeholders stable")
    text = report.to_markdown()
    assert "## Images" in text and "- suffix of a tool result with an image: SAFE" in text
    assert report.to_dict()["images"]["label"] == report.images.label
    row = Row(tpl.name, "test", report)
    assert "| placeholders stable, suffix exact (Qwen2_5_VLProcessor) |" in to_markdown([row])
    assert row_line(row).endswith("; images placeholders stable, suffix exact (Qwen2_5_VLProcessor)")

"""Parser detection: render dummy calls, recognise the format by reading them back.

The expected parser of each template is written from the format its render shows (see the
issue's list of formats); "vocabulary" means the template renders no call and the parser is
chosen from the tokenizer's added tokens; None means no parser applies.
"""

from __future__ import annotations

import pytest

import tmpl
from tmpl.errors import NoToolParserError, UnknownParserError
from tmpl.toolcalls import PARSERS, detect, get_parser, parse_completion, parser_for

from .toolcalls_data import chat_template, template_ids

R, V = "render", "vocabulary"

EXPECTED: dict[str, tuple[str | None, str]] = {
    # families (their own templates)
    "qwen2.5-instruct": ("hermes", R),
    "qwen3": ("hermes", R),
    "llama-3.2-instruct": ("llama3_json", R),
    "gemma-2-it": (None, "none"),
    "gemma-3-it": (None, "none"),
    "gemma-4-it": ("gemma4", R),
    "mistral-nemo-instruct-2407": ("mistral", R),
    "phi-3-mini-4k-instruct": (None, "none"),
    "phi-4-mini-instruct": ("phi4", V),  # calls are written into content; <|tool_call|> tokens exist
    "deepseek-v3": ("deepseek_v3", V),  # V3's template renders calls only with content None
    "gpt-oss": ("harmony", R),
    # catalog: Hermes / Qwen JSON in <tool_call>
    "llama.cpp/Bielik-11B-v3.0-Instruct.jinja": ("hermes", R),
    "llama.cpp/MiMo-VL.jinja": ("hermes", R),
    "llama.cpp/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ("hermes", R),
    "llama.cpp/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("hermes", R),
    "llama.cpp/Qwen-QwQ-32B.jinja": ("hermes", R),
    "llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja": ("hermes", R),
    "llama.cpp/Qwen-Qwen3-0.6B.jinja": ("hermes", R),
    "llama.cpp/Reka-Edge.jinja": ("hermes", R),
    "llama.cpp/ibm-granite-granite-4.1.jinja": ("hermes", R),
    "mistral.rs/nousresearch_hermes2_pro_tool_use.jinja": ("hermes", R),
    "mistral.rs/nousresearch_hermes3_tool_use.jinja": ("hermes", R),
    "onnxruntime-extensions/Qwen3-later-revision.jinja": ("hermes", R),
    # Qwen3-Coder / Qwen3.5 XML
    "llama.cpp/Qwen3-Coder.jinja": ("qwen3_xml", R),
    "llama.cpp/Qwen3.5-4B.jinja": ("qwen3_xml", R),
    "llama.cpp/StepFun3.5-Flash.jinja": ("qwen3_xml", R),
    "ollama/nemotron35_chat_template.jinja": ("qwen3_xml", R),
    "ollama/nemotron3nano_chat_template.jinja": ("qwen3_xml", R),
    "ollama/qwen38_chat_template.jinja": ("qwen3_xml", R),
    # GLM-4 arg_key / arg_value
    "llama.cpp/GLM-4.6.jinja": ("glm4", R),
    "llama.cpp/Spark2.5.jinja": ("glm4", R),
    "llama.cpp/inclusionai-ling-3.0-flash.jinja": ("glm4", R),
    "llama.cpp/poolside-Laguna-S-2.1.jinja": ("glm4", R),
    "llama.cpp/poolside-Laguna-XS-2.1.jinja": ("glm4", R),
    "llama.cpp/poolside-Laguna-XS.2.jinja": ("glm4", R),
    "ollama/laguna_v2_chat_template.jinja": ("glm4", R),
    "ollama/laguna_v8_chat_template.jinja": ("glm4", R),
    # Llama 3.x bare JSON
    "llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja": ("llama3_json", R),
    "llama.cpp/meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3_json", R),
    "llama.cpp/fireworks-ai-llama-3-firefunction-v2.jinja": ("llama3_json", V),
    "mistral.rs/llama3.jinja": ("llama3_json", V),
    "npm-lenml/meta-llama-3-instruct.jinja": ("llama3_json", V),
    # Mistral [TOOL_CALLS]
    "llama.cpp/Mistral-Small-3.2-24B-Instruct-2506.jinja": ("mistral", R),
    "llama.cpp/mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral", R),
    "llama.cpp/unsloth-mistral-Devstral-Small-2507.jinja": ("mistral", R),
    "mistral.rs/mistral_nemo_tool_call.jinja": ("mistral", R),
    "mistral.rs/mistral_small_tool_call.jinja": ("mistral", R),
    "npm-lenml/mistral-nemo-2407-early-revision.jinja": ("mistral", R),
    "mistral.rs/mistral.jinja": ("mistral", V),
    "onnxruntime-extensions/nvidia-Mistral-NeMo-Minitron.jinja": ("mistral", V),
    # Gemma 4
    "llama.cpp/google-gemma-4-31B-it.jinja": ("gemma4", R),
    "ollama/gemma4_31b_chat_template.jinja": ("gemma4", R),
    "ollama/gemma4_e2b_chat_template.jinja": ("gemma4", R),
    "onnxruntime-extensions/google-gemma-4.jinja": ("gemma4", R),
    # gpt-oss harmony
    "llama.cpp/openai-gpt-oss-120b.jinja": ("harmony", R),
    "onnxruntime-extensions/openai-gpt-oss-20b-2025-08.jinja": ("harmony", V),  # its tool render raises
    # DeepSeek
    "llama.cpp/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("deepseek_v3", R),
    "llama.cpp/deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek_v3", R),
    "mistral.rs/deepseek_tool_call.jinja": ("deepseek_v3", R),
    "llama.cpp/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": ("deepseek_v3", V),
    "llama.cpp/llama-cpp-deepseek-r1.jinja": ("deepseek_v3", V),
    "onnxruntime-extensions/deepseek-ai-DeepSeek-R1-Distill-Qwen.jinja": ("deepseek_v3", V),
    # XML invoke (DeepSeek V4 DSML, MiniCPM5)
    "llama.cpp/deepseek-ai-DeepSeek-V4-Flash-0731.jinja": ("xml_invoke", R),
    "llama.cpp/deepseek-ai-DeepSeek-V4.jinja": ("xml_invoke", R),
    "llama.cpp/openbmb-MiniCPM5-1B.jinja": ("xml_invoke", R),
    # other formats
    "llama.cpp/moonshotai-Kimi-K2.jinja": ("kimi_k2", R),
    "llama.cpp/LFM2.5-8B-A1B.jinja": ("pythonic", R),
    "llama.cpp/meetkai-functionary-medium-v3.1.jinja": ("functionary", R),
    "llama.cpp/meetkai-functionary-medium-v3.2.jinja": ("functionary_v3", R),  # arguments rendered from JSON text
    "llama.cpp/Apriel-1.6-15b-Thinker-fixed.jinja": ("tool_calls_tag", R),
    "llama.cpp/unsloth-Apriel-1.5.jinja": ("tool_calls_tag", R),
    "llama.cpp/MiniMax-M1.jinja": ("tool_calls_tag", R),
    "llama.cpp/NVIDIA-Nemotron-Nano-v2.jinja": ("nemotron", R),
    "onnxruntime-extensions/microsoft-Phi-4-mini-instruct.jinja": ("phi4", V),
    "onnxruntime-extensions/microsoft-Phi-4-mini-reasoning.jinja": ("phi4", V),
    "onnxruntime-extensions/microsoft-Phi-4-multimodal-instruct.jinja": ("phi4", V),
    "onnxruntime-extensions/microsoft-phi-4.jinja": ("phi4", V),
    # formats no parser reads (their renders are recognised as calls, so no vocabulary guess)
    "llama.cpp/GigaChat3-10B-A1.8B.jinja": (None, "none"),
    "llama.cpp/GigaChat3.1-10B-A1.8B.jinja": (None, "none"),
    "llama.cpp/MiniMax-M3.jinja": (None, "none"),
    "llama.cpp/muse-glimmer.jinja": (None, "none"),
    "ollama/glimmer_chat_template.jinja": (None, "none"),
    # no calls rendered: Gemma 2/3 and Phi-3 tokenizers have no call tokens
    "llama.cpp/google-gemma-2-2b-it.jinja": (None, "none"),
    "mistral.rs/gemma3n.jinja": (None, "none"),
    "onnxruntime-extensions/google-gemma-2-it.jinja": (None, "none"),
    "llama.cpp/microsoft-Phi-3.5-mini-instruct.jinja": (None, "none"),
    "mistral.rs/phi3.5.jinja": (None, "none"),
    "mistral.rs/phi3.jinja": (None, "none"),
    "onnxruntime-extensions/microsoft-Phi-3-medium-instruct.jinja": (None, "none"),
    "onnxruntime-extensions/microsoft-Phi-3-mini-128k-instruct.jinja": (None, "none"),
    "onnxruntime-extensions/microsoft-Phi-3-vision-128k-instruct.jinja": (None, "none"),
    # no calls rendered on the qwen3 host, whose vocabulary has <tool_call> (SmolLM3 really is Hermes)
    "llama.cpp/HuggingFaceTB-SmolLM3-3B.jinja": ("hermes", V),
    "onnxruntime-extensions/HuggingFaceTB-SmolLM3-3B.jinja": ("hermes", V),
    "mistral.rs/smollm3.jinja": ("hermes", V),
    "llama.cpp/Kimi-K2-Instruct.jinja": ("hermes", V),
    "llama.cpp/Kimi-K2-Thinking.jinja": ("hermes", V),
    "llama.cpp/LFM2-8B-A1B.jinja": ("hermes", V),
    "llama.cpp/LFM2.5-Instruct.jinja": ("hermes", V),
    "llama.cpp/ibm-granite-granite-3.3-2B-Instruct.jinja": ("hermes", V),
    "llama.cpp/llama-cpp-rwkv-world.jinja": ("hermes", V),
    "mistral.rs/chatml.jinja": ("hermes", V),
    "mistral.rs/default.jinja": ("hermes", V),
    "mistral.rs/idefics3.jinja": ("hermes", V),
    "mistral.rs/llama2.jinja": ("hermes", V),
    "mistral.rs/vicuna.jinja": ("hermes", V),
    "onnxruntime-extensions/THUDM-chatglm3-6b.jinja": ("hermes", V),
    # host tokenizer (command-r-plus) not in the data: skipped
    "llama.cpp/Cohere2MoE.jinja": (None, "none"),
    "llama.cpp/CohereForAI-c4ai-command-r-plus-tool_use.jinja": (None, "none"),
}


@pytest.mark.parametrize("key", template_ids())
def test_detected_parser(key):
    assert key in EXPECTED, f"no expectation for {key}: add one to EXPECTED"
    tpl = chat_template(key)
    found = detect(tpl)
    assert (found.parser, found.how) == EXPECTED[key], found.detail
    if found.how == "render":
        assert found.parser in found.candidates and found.calls in (1, 2)


def test_detection_is_cached_per_fingerprint():
    tpl = chat_template("qwen3")
    detect(tpl)
    before = tpl.renders
    again = tmpl.ChatTemplate(tpl.tokenizer, tpl.template, name="again")
    assert detect(again).parser == "hermes"
    assert again.renders == 0 and tpl.renders == before


def test_no_parser_is_a_typed_error_and_forcing_works():
    tpl = chat_template("gemma-3-it")
    with pytest.raises(NoToolParserError, match="parser="):
        parse_completion(tpl, [1, 2, 3])
    with pytest.raises(NoToolParserError):
        parser_for(tpl)
    forced = parse_completion(tpl, tpl.codec.encode('{"name": "f", "parameters": {"x": 1}}'), parser="llama3_json")
    assert [(c.name, c.arguments) for c in forced.tool_calls] == [("f", {"x": 1})]


def test_unknown_parser_name_and_text_input_are_rejected():
    tpl = chat_template("qwen3")
    with pytest.raises(UnknownParserError, match="hermes"):
        parse_completion(tpl, [1], parser="hermez")
    with pytest.raises(TypeError, match="token IDs"):
        parse_completion(tpl, "<tool_call>")
    assert set(PARSERS) >= {"hermes", "qwen3_xml", "llama3_json", "mistral", "gemma4", "harmony", "deepseek_v3", "glm4"}
    assert get_parser("hermes", tpl.codec) is parser_for(tpl)


def test_reasoning_key_is_probed():
    assert detect(chat_template("qwen3")).reasoning_key == "reasoning_content"
    assert detect(chat_template("qwen2.5-instruct")).reasoning_key is None


def test_template_reasoning_delimiters_are_probed():
    """Apriel writes reasoning first and ends it with [BEGIN FINAL RESPONSE], not <think>."""
    tpl = chat_template("llama.cpp/Apriel-1.6-15b-Thinker-fixed.jinja")
    assert detect(tpl).think == ("", "[BEGIN FINAL RESPONSE]")
    assert detect(chat_template("qwen3")).think is None  # <think>...</think> is the format's own
    text = (
        'I could call <tool_calls>[{"name": "get_time", "arguments": {}}]</tool_calls> but no.\n'
        '[BEGIN FINAL RESPONSE]\nSure.<tool_calls>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_calls>'
    )
    parsed = parse_completion(tpl, tpl.codec.encode(text))
    assert [c.name for c in parsed.tool_calls] == ["get_weather"]
    assert "get_time" in parsed.reasoning and parsed.content == "Sure."

"""Every parser on hand-written completions with the malformations seen in training.

Completions are tokenized with the real tokenizers, so delimiters that are special tokens are
special tokens here too. Expected calls are the ones written into each completion.
"""

from __future__ import annotations

import os

import pytest

from tmpl.toolcalls import ParseError, ToolCall, get_parser, new_call_id, parse_completion

from .toolcalls_data import TOOLS, chat_template

QWEN = "qwen3"
CODER = "llama.cpp/Qwen3-Coder.jinja"
QWEN35 = "llama.cpp/Qwen3.5-4B.jinja"
LLAMA = "llama-3.2-instruct"
NEMO = "mistral-nemo-instruct-2407"
GEMMA = "gemma-4-it"
OSS = "gpt-oss"
DSV31 = "llama.cpp/deepseek-ai-DeepSeek-V3.1.jinja"
GLM = "llama.cpp/GLM-4.6.jinja"


def parse(key: str, text: str, *, parser: str | None = None, tools=None):
    tpl = chat_template(key)
    return parse_completion(tpl, tpl.codec.encode(text), parser=parser, tools=tools)


def calls(parsed) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in parsed.tool_calls]


def kinds(parsed) -> list[str]:
    return [e.kind for e in parsed.errors]


# -- Hermes / Qwen ------------------------------------------------------------------------------


def test_hermes_whitespace_heavy_json():
    p = parse(
        QWEN,
        '<tool_call>\n  {\n   "name" :  "get_weather" ,\n\t"arguments" : {  "city" :"Paris"  }  }  \n</tool_call><|im_end|>',
    )
    assert calls(p) == [("get_weather", {"city": "Paris"})] and not p.errors
    assert p.tool_calls[0].repairs == () and p.content == ""


def test_hermes_single_quotes_and_python_literals():
    p = parse(
        QWEN,
        "<tool_call>{'name': 'get_weather', 'arguments': {'city': 'Paris', 'metric': True, 'x': None,}}</tool_call>",
    )
    assert calls(p) == [("get_weather", {"city": "Paris", "metric": True, "x": None})]
    assert "python literal" in p.tool_calls[0].repairs


def test_hermes_missing_close_tag_before_turn_end_is_forgiven():
    p = parse(QWEN, 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n<|im_end|>')
    assert calls(p) == [("get_time", {})]
    assert "missing close tag" in p.tool_calls[0].repairs
    assert p.content == "Let me check."


def test_hermes_completion_cut_inside_a_call_is_truncated_not_run():
    p = parse(QWEN, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    assert calls(p) == [] and kinds(p) == ["truncated"]
    # even a complete object is not run when the completion was cut before the close tag
    p = parse(QWEN, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert calls(p) == [] and kinds(p) == ["truncated"]


def test_hermes_two_calls_glued_together():
    one_tag = '<tool_call>{"name": "a", "arguments": {"x": 1}}{"name": "b", "arguments": {}}</tool_call>'
    assert calls(parse(QWEN, one_tag)) == [("a", {"x": 1}), ("b", {})]
    tags = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    assert calls(parse(QWEN, tags)) == [("a", {}), ("b", {})]
    in_list = '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": [1]}}]</tool_call>'
    p = parse(QWEN, in_list)
    assert calls(p) == [("a", {}), ("b", {"y": [1]})] and p.content == ""


def test_hermes_calls_inside_think_are_reasoning_never_calls():
    p = parse(
        QWEN,
        '<think>\nMaybe <tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>? No.\n</think>\n\nDone.<|im_end|>',
    )
    assert calls(p) == [] and not p.errors
    assert "rm_rf" in p.reasoning and p.content == "Done."


def test_reasoning_opened_by_the_prompt_and_unclosed_reasoning():
    # Qwen3.5's generation prompt ends with <think>: the completion starts inside reasoning
    p = parse(
        QWEN35,
        "call <tool_call>\n<function=rm_rf>\n</function>\n</tool_call> maybe\n</think>\n\n"
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call><|im_end|>",
    )
    assert calls(p) == [("get_time", {})] and "rm_rf" in p.reasoning
    # reasoning cut off before </think>: nothing in it is a call
    p = parse(QWEN, '<think>I will call <tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    assert calls(p) == [] and not p.errors and "get_time" in p.reasoning


def test_delimiter_text_written_as_ordinary_tokens_is_not_a_call():
    tpl = chat_template(QWEN)
    enc = tpl.codec.encode
    ids = (
        enc("Write ")
        + enc("<tool")
        + enc("_call>")
        + enc('{"name": "get_time", "arguments": {}}')
        + enc("</tool")
        + enc("_call>")
    )
    assert tpl.codec.added_by_text["<tool_call>"] not in ids
    p = parse_completion(tpl, ids)
    assert calls(p) == [] and not p.errors
    assert "<tool_call>" in p.content


def test_hermes_argument_spellings():
    p = parse(QWEN, '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>')
    assert calls(p) == [("get_weather", {"city": "Paris"})] and "json in a string" in p.tool_calls[0].repairs
    p = parse(QWEN, '<tool_call>{"name": "get_weather", "parameters": {"city": "Paris"}}}</tool_call>')
    assert calls(p) == [("get_weather", {"city": "Paris"})] and "trailing text" in p.tool_calls[0].repairs
    p = parse(
        QWEN,
        '<tool_call>{"name": "get_weather", "arguments": {"days": "3", "metric": "false"}}</tool_call>',
        tools=TOOLS,
    )
    assert calls(p) == [("get_weather", {"days": 3, "metric": False})]
    assert "coerced days to integer" in p.tool_calls[0].repairs


def test_hermes_unreadable_calls_are_errors_in_order():
    p = parse(
        QWEN,
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>not json at all</tool_call>\n'
        '<tool_call>{"arguments": {"x": 1}}</tool_call>\n<tool_call>{"name": "bad name!", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": [1]}</tool_call>',
    )
    assert calls(p) == [("a", {})]
    assert kinds(p) == ["bad_json", "missing_name", "malformed", "bad_json"]
    assert [type(x) for x in p.items] == [ToolCall, ParseError, ParseError, ParseError, ParseError]
    assert "not json at all" in p.errors[0].raw and p.content == ""


def test_ids_as_numpy_and_torch():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    tpl = chat_template(QWEN)
    ids = tpl.codec.encode('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    for array in (np.array(ids), torch.tensor(ids)):
        assert calls(parse_completion(tpl, array)) == [("get_time", {})]


def test_call_records_ids_spans_and_message():
    tpl = chat_template(QWEN)
    ids = tpl.codec.encode('Sure.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>')
    p = parse_completion(tpl, ids)
    call = p.tool_calls[0]
    assert call.id_generated and len(call.id) == 9 and call.id.isalnum()
    a, b = call.token_span
    assert tpl.codec.decode(ids[a:b]) == call.raw == '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    msg = p.to_message()
    assert msg == {
        "role": "assistant",
        "content": "Sure.",
        "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "get_time", "arguments": {}}}],
    }
    assert parse(QWEN, "<think>hm</think>ok").to_message() == {
        "role": "assistant",
        "content": "ok",
        "reasoning_content": "hm",
    }


# -- Qwen3-Coder / Qwen3.5 XML -------------------------------------------------------------------


def test_qwen_xml_multiline_values_and_schema_types():
    text = (
        "<tool_call>\n<function=search>\n<parameter=query>\nline one\nline two\n</parameter>\n"
        '<parameter=filters>\n{"n": 2}\n</parameter>\n</function>\n</tool_call><|im_end|>'
    )
    p = parse(CODER, text, tools=TOOLS)
    assert calls(p) == [("search", {"query": "line one\nline two", "filters": {"n": 2}})]
    # a string parameter stays text even when it looks like a number
    p = parse(
        CODER,
        "<tool_call>\n<function=search>\n<parameter=query>\n42\n</parameter>\n</function>\n</tool_call>",
        tools=TOOLS,
    )
    assert calls(p) == [("search", {"query": "42"})]


def test_qwen_xml_missing_closes():
    p = parse(
        CODER,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n3\n</function>\n</tool_call>",
        tools=TOOLS,
    )
    assert calls(p) == [("get_weather", {"city": "Paris", "days": 3})]
    assert "missing </parameter>" in p.tool_calls[0].repairs
    p = parse(CODER, "<tool_call>\n<function=get_time>\n<|im_end|>")
    assert calls(p) == [("get_time", {})] and "missing </function>" in p.tool_calls[0].repairs
    p = parse(CODER, "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar")
    assert calls(p) == [] and kinds(p) == ["truncated"]
    p = parse(CODER, '<tool_call>\n{"name": "get_time"}\n</tool_call>')
    assert calls(p) == [] and kinds(p) == ["malformed"]


# -- Llama 3.x -------------------------------------------------------------------------------


def test_llama_bare_json_and_python_tag():
    p = parse(LLAMA, '\n{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>')
    assert calls(p) == [("get_weather", {"city": "Paris"})] and p.content == ""
    p = parse(LLAMA, '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}<|eom_id|>')
    assert calls(p) == [("a", {}), ("b", {"x": 1})]
    p = parse(LLAMA, '<|python_tag|>brave_search.call(query="weather in Paris")<|eom_id|>')
    assert calls(p) == [("brave_search", {"query": "weather in Paris"})]


def test_llama_text_mentioning_json_is_content():
    p = parse(LLAMA, 'You could send {"name": "get_time", "parameters": {}} to the API.<|eot_id|>')
    assert calls(p) == [] and not p.errors and p.content.startswith("You could send")
    p = parse(LLAMA, '{"name": "get_weather", "parameters": {"city": Paris}}<|eot_id|>')
    assert calls(p) == [] and kinds(p) == ["bad_json"]
    p = parse(LLAMA, '{"name": "get_weather", "parameters": {"city": "Pa')
    assert calls(p) == [] and kinds(p) == ["truncated"]


# -- Mistral -------------------------------------------------------------------------------------


def test_mistral_json_list_with_ids_and_content():
    p = parse(
        NEMO,
        'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1B2c3D4e"}, '
        '{"name": "get_time", "arguments": {}, "id": "Z9y8X7w6v"}]</s>',
    )
    assert calls(p) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert [c.id for c in p.tool_calls] == ["a1B2c3D4e", "Z9y8X7w6v"] and p.content == "Checking."


def test_mistral_named_forms_and_glued_calls():
    p = parse(NEMO, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}</s>')
    assert calls(p) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    p = parse(NEMO, '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}</s>')
    assert calls(p) == [("get_weather", {"city": "Paris"})] and p.tool_calls[0].id == "a1B2c3D4e"
    p = parse(NEMO, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}get_time[ARGS]{}</s>')
    assert calls(p) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    p = parse(NEMO, "[TOOL_CALLS][{'name': 'get_time', 'arguments': {}}]</s>")
    assert calls(p) == [("get_time", {})] and "python literal" in p.tool_calls[0].repairs


def test_mistral_malformed_and_truncated():
    p = parse(NEMO, "[TOOL_CALLS]I cannot do that</s>")
    assert calls(p) == [] and kinds(p) == ["malformed"]
    p = parse(NEMO, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"ci')
    assert calls(p) == [] and kinds(p) == ["truncated"]


# -- Gemma 4 -------------------------------------------------------------------------------------


def test_gemma4_values():
    text = (
        '<|tool_call>call:search{filters:{lang:<|"|>fr<|"|>,n:2},query:<|"|>a "quoted", {braced} text<|"|>,'
        'tags:[<|"|>a<|"|>,<|"|>b c<|"|>]}<tool_call|><|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:3,'
        "metric:false,ratio:-0.5}<tool_call|><|tool_response>"
    )
    p = parse(GEMMA, text)
    assert calls(p) == [
        ("search", {"filters": {"lang": "fr", "n": 2}, "query": 'a "quoted", {braced} text', "tags": ["a", "b c"]}),
        ("get_weather", {"city": "Oslo", "days": 3, "metric": False, "ratio": -0.5}),
    ]
    assert p.content == ""


def test_gemma4_thinking_channel_missing_close_and_glued():
    p = parse(
        GEMMA,
        "<|channel>thought\nI could <|tool_call>call:rm_rf{}<tool_call|>\n<channel|>"
        "<|tool_call>call:get_time{}<tool_call|>Done.<turn|>",
    )
    assert calls(p) == [("get_time", {})] and "rm_rf" in p.reasoning and p.content == "Done."
    assert not p.reasoning.startswith("thought")
    p = parse(GEMMA, "<|tool_call>call:get_time{}<turn|>")
    assert calls(p) == [("get_time", {})] and "missing close tag" in p.tool_calls[0].repairs
    p = parse(GEMMA, "<|tool_call>call:a{}call:b{x:1}<tool_call|>")
    assert calls(p) == [("a", {}), ("b", {"x": 1})]


def test_gemma4_malformed_and_truncated():
    p = parse(GEMMA, "<|tool_call>call:get_weather{city:}<tool_call|>")
    assert calls(p) == [] and kinds(p) == ["bad_json"] and p.errors[0].name == "get_weather"
    p = parse(GEMMA, "<|tool_call>get_weather{}<tool_call|>")
    assert kinds(p) == ["malformed"]
    p = parse(GEMMA, '<|tool_call>call:get_weather{city:<|"|>Os')
    assert calls(p) == [] and kinds(p) == ["truncated"]


# -- gpt-oss harmony -----------------------------------------------------------------------------


def test_harmony_template_and_model_forms():
    template_form = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
    model_form = (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    )
    for text in (template_form, model_form):
        p = parse(OSS, text)
        assert calls(p) == [("get_weather", {"city": "Paris"})] and not p.errors
    assert parse(OSS, model_form).reasoning == "Need weather."


def test_harmony_analysis_channel_is_never_a_call():
    p = parse(
        OSS,
        "<|channel|>analysis to=functions.rm_rf<|message|>{}<|end|><|start|>assistant<|channel|>final"
        "<|message|>All done.<|return|>",
    )
    assert calls(p) == [] and not p.errors
    assert p.content == "All done." and p.reasoning == "{}"


def test_harmony_missing_call_token_and_truncation():
    p = parse(OSS, "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}")
    assert calls(p) == [("get_time", {})] and p.tool_calls[0].repairs == ("no <|call|> after the arguments",)
    p = parse(OSS, '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa')
    assert calls(p) == [] and kinds(p) == ["truncated"]
    p = parse(OSS, "<|channel|>commentary to=functions.get_weather <|constrain|>js")
    assert kinds(p) == ["truncated"]


# -- DeepSeek ------------------------------------------------------------------------------------


def test_deepseek_v3_and_v31_forms():
    v3 = (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n'
        "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    )
    v31 = (
        'Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
        "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    )
    for text in (v3, v31):
        p = parse(DSV31, text)
        assert calls(p) == [("get_weather", {"city": "Paris"}), ("get_time", {})] and not p.errors
    assert parse(DSV31, v31).content == "Sure."
    # DeepSeek V3's own template renders no call; its tokens pick the parser
    p = parse("deepseek-v3", v3)
    assert calls(p) == [("get_weather", {"city": "Paris"}), ("get_time", {})]


def test_deepseek_think_missing_end_and_malformed():
    p = parse(
        DSV31,
        "<think>try <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>rm_rf<｜tool▁sep｜>{}<｜tool▁call▁end｜></think>"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
    )
    assert calls(p) == [("get_time", {})] and "rm_rf" in p.reasoning
    assert "missing close tag" in p.tool_calls[0].repairs
    p = parse(DSV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time{}<｜tool▁call▁end｜><｜end▁of▁sentence｜>")
    assert kinds(p) == ["malformed"]
    p = parse(DSV31, '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Pa')
    assert kinds(p) == ["truncated"]


# -- GLM-4 -------------------------------------------------------------------------------------


def test_glm4_pairs_missing_value_close_and_think():
    text = (
        "<think>maybe <tool_call>rm_rf</tool_call></think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        '<arg_value>Paris, "FR"</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>'
    )
    p = parse(GLM, text, tools=TOOLS)
    assert calls(p) == [("get_weather", {"city": 'Paris, "FR"', "days": 3})] and "rm_rf" in p.reasoning
    p = parse(GLM, "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>cats\n</tool_call>", tools=TOOLS)
    assert calls(p) == [("search", {"query": "cats"})] and "missing </arg_value>" in p.tool_calls[0].repairs
    p = parse(GLM, "<tool_call>search\n<arg_key>query</arg_key>cats</tool_call>")
    assert kinds(p) == ["malformed"]


# -- the other formats ---------------------------------------------------------------------------


def test_kimi_pythonic_functionary_and_tagged_kin():
    p = parse(
        "llama.cpp/moonshotai-Kimi-K2.jinja",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    )
    assert calls(p) == [("get_weather", {"city": "Paris"})] and p.tool_calls[0].id == "functions.get_weather:0"
    p = parse(
        "llama.cpp/LFM2.5-8B-A1B.jinja",
        "<|tool_call_start|>[get_weather(city='Paris', days=2), get_time()]<|tool_call_end|>",
    )
    assert calls(p) == [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]
    p = parse("llama.cpp/LFM2.5-8B-A1B.jinja", "<|tool_call_start|>[get_weather(__import__('os'))]<|tool_call_end|>")
    assert calls(p) == [] and kinds(p) == ["bad_json"]
    p = parse(
        "llama.cpp/meetkai-functionary-medium-v3.1.jinja",
        '<function=get_weather>{"city": "Paris"}</function><|eom_id|>',
    )
    assert calls(p) == [("get_weather", {"city": "Paris"})]
    p = parse("llama.cpp/unsloth-Apriel-1.5.jinja", '<tool_calls>[{"name": "get_time", "arguments": {}}]</tool_calls>')
    assert calls(p) == [("get_time", {})]
    p = parse("llama.cpp/NVIDIA-Nemotron-Nano-v2.jinja", '<TOOLCALL>[{"name": "get_time", "arguments": {}}]</TOOLCALL>')
    assert calls(p) == [("get_time", {})]
    p = parse("phi-4-mini-instruct", '<|tool_call|>[{"name": "get_time", "arguments": {}}]<|/tool_call|><|end|>')
    assert calls(p) == [("get_time", {})]


def test_functionary_v3_segments():
    key = "llama.cpp/meetkai-functionary-medium-v3.2.jinja"
    p = parse(key, 'all\nSure, checking.>>>get_weather\n{"city": "Paris"}>>>get_time\n{}<|eot_id|>')
    assert calls(p) == [("get_weather", {"city": "Paris"}), ("get_time", {})] and p.content == "Sure, checking."
    p = parse(key, "all\nNo tools needed.<|eot_id|>")
    assert (calls(p), p.content) == ([], "No tools needed.")
    p = parse(key, "get_weather\n{'city': <|eot_id|>")
    assert calls(p) == [] and kinds(p) == ["bad_json"]


def test_xml_invoke_dsml_and_minicpm():
    v4 = "llama.cpp/deepseek-ai-DeepSeek-V4.jinja"
    text = (
        'Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">42</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
    )
    p = parse(v4, text)
    assert calls(p) == [("get_weather", {"city": "42", "days": 3})] and p.content == "Sure."
    p = parse(v4, '<｜DSML｜invoke name="get_time">\n<｜end▁of▁sentence｜>')
    assert calls(p) == [("get_time", {})] and p.tool_calls[0].repairs == ("missing </｜DSML｜invoke>",)
    p = parse(v4, '<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Par')
    assert calls(p) == [] and kinds(p) == ["truncated"]
    cpm = "llama.cpp/openbmb-MiniCPM5-1B.jinja"
    p = parse(
        cpm,
        '<function name="search"><param name="query"><![CDATA[a<b & c]]></param>'
        "<param name=\"filters\">{'n': 2}</param></function><|im_end|>",
        tools=TOOLS,
    )
    assert calls(p) == [("search", {"query": "a<b & c", "filters": {"n": 2}})]


def test_every_parser_reads_plain_content_as_content():
    for key in (QWEN, CODER, LLAMA, NEMO, GEMMA, DSV31, GLM):
        tpl = chat_template(key)
        ids = tpl.codec.encode("The weather in Paris is sunny.")
        p = parse_completion(tpl, ids)
        assert (p.content, p.tool_calls, p.errors) == ("The weather in Paris is sunny.", (), ()), key
    p = parse(OSS, "<|channel|>final<|message|>The weather in Paris is sunny.<|return|>")
    assert (p.content, p.tool_calls) == ("The weather in Paris is sunny.", ())


@pytest.mark.parametrize("name", ["hermes", "mistral", "gemma4", "harmony", "deepseek_v3"])
def test_parsers_on_both_twins(name, twin):
    samples = {
        "hermes": (QWEN, '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><|im_end|>'),
        "mistral": (NEMO, '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]</s>'),
        "gemma4": (GEMMA, "<|tool_call>call:get_time{}<tool_call|>"),
        "harmony": (OSS, " to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>"),
        "deepseek_v3": (
            DSV31,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
        ),
    }
    key, text = samples[name]
    tpl = chat_template(key)
    p = get_parser(name, tpl.codec).parse(tpl.codec.encode(text))
    assert calls(p) == [("get_time", {})] and not p.errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the platform cannot fork")
def test_generated_call_ids_are_distinct_and_a_forked_worker_does_not_repeat_them():
    ids = {new_call_id() for _ in range(20_000)}
    assert len(ids) == 20_000 and all(len(i) == 9 and i.isalnum() for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id after the fork
        os.write(write, new_call_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    assert len(child) == 9 and child != new_call_id()  # without a reseed the two would be the same


@pytest.mark.parametrize("family", ["qwen3", "gpt-oss", "llama-3.2-instruct"])
def test_the_rollouts_reader_parses_as_parse_completion(family):
    """``CompletionReader`` (the rollout's parser, looked up once) answers what parse_completion does,
    the template's reasoning key included."""
    import dataclasses

    from tmpl.toolcalls.api import CompletionReader

    tpl = chat_template(family)
    read = CompletionReader(tpl)
    texts = {
        "qwen3": '<think>\nweather first\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": "2"}}\n</tool_call><|im_end|>',
        "gpt-oss": '<|channel|>analysis<|message|>weather first<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        "llama-3.2-instruct": '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
    }
    ids = tpl.codec.encode(texts[family])

    def blank(parsed):
        calls = tuple(dataclasses.replace(c, id="") for c in parsed.tool_calls)
        return dataclasses.replace(parsed, tool_calls=calls, items=calls)

    got, expected = read(ids, tools=TOOLS), parse_completion(tpl, ids, tools=TOOLS)
    assert blank(got) == blank(expected) and [c.name for c in got.tool_calls] == ["get_weather"]
    assert got.reasoning_key == expected.reasoning_key
    with pytest.raises(TypeError):
        read("text")

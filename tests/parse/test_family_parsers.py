"""Family parsers: reasoning, single and parallel calls, malformed calls kept as content,
finish_reason rules (``tool_calls`` only for parsed calls with a normal stop; ``length`` wins)."""

# ruff: noqa: E501  (literal model outputs, kept on one line each)
from __future__ import annotations

import json

import pytest
from helpers.support import tokenizer_dir

from tito.render import TemplateRenderer, build_renderer
from tito.render.families import family_module
from tito.types.messages import ParsedCompletion

FIXTURES = {"chatml": "smollm2", "qwen3": "qwen3"}
_CACHE: dict[str, TemplateRenderer] = {}


def get(family: str) -> TemplateRenderer:
    if family not in _CACHE:
        fixture = getattr(family_module(family), "FIXTURE", None) or FIXTURES.get(family)
        _CACHE[family] = build_renderer(
            family, tokenizer_dir(fixture) if fixture else "standin")
    return _CACHE[family]


def call(name: str, args: dict, cid: str = "call_1") -> dict:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


# A completion text whose tool call is malformed (broken JSON / broken markup), per family;
# decoding it must keep the text in content and give no call.
MALFORMED = {
    "qwen3_thinking": 'done\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {oops}\n</tool_call>',
    "qwen35": "<think>\nr\n</think>\n\n<tool_call>\n<function=f>\nno parameters here\n</function>\n</tool_call>",
    "nemotron3": "r\n</think>\n<tool_call>\n<function=f>\ngarbage\n</function>\n</tool_call>\n",
    "glm47": "r</think><tool_call><arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
    "deepseek_v31": "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{not json<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "deepseek_v32": 'r</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="n" string="false">{bad</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
    "deepseek_v4": 'r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\nstray\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    "kimi_k2": "<think>r</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{nope<|tool_call_end|><|tool_calls_section_end|>",
    "minimax_m2": 'r\n</think>\n\n<minimax:tool_call>\n<invoke name="f">\nstray text\n</invoke>\n</minimax:tool_call>',
    "llama3": '{"name": "f", "parameters": {"a": }',
    "gpt_oss": "<|channel|>analysis<|message|>r<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{broken",
    "mistral": '[TOOL_CALLS][{"name": "f", "arguments": {oops}]',
    "minimax_m25": 'r\n</think>\n\n<minimax:tool_call>\n<invoke name="f">\nstray text\n</invoke>\n</minimax:tool_call>',
    "minimax_m3": '<mm:think>r</mm:think>]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="f">]<]minimax[>[<a>1]<]minimax[>[</b>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>',
    "gemma4": 'r\n<channel|><|tool_call>call:f{a:<|"|>unterminated}<tool_call|>',
    "qwen38": "r\n</think>\n\n<tool_call>\n<function=f>\nno parameters here\n</function>\n</tool_call>",
    "qwen36": "r\n</think>\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\nstray\n</function>\n</tool_call>",
    "nemotron35": "r</think>\n<tool_call>\n<function=f>\ngarbage\n</function>\n</tool_call>\n",
    "glm5": "r</think><tool_call><arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
    "kimi_k25": "r</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{nope<|tool_call_end|><|tool_calls_section_end|>",
    "kimi_k3": 'r<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument key="n" type="number"<|sep|>many<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>',
    "deepseek_v41": 'r</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="f">\n<｜DSML｜ parameter name="n" string="false">{bad</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>',
    "inkling": '<|content_thinking|>r<|end_message|><|message_model|>f<|content_invoke_tool_json|>{"name":"f","args":{oops}<|end_message|>',
}


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.slow) if f in ("qwen35", "gpt_oss") else f
    for f in sorted(MALFORMED)])  # the two long templates: about a second each
def test_malformed_call_is_kept_as_content(family: str) -> None:
    r = get(family)
    ids = r.tokenizer.encode(MALFORMED[family])
    parsed = r.parse(ids, "stop")
    assert parsed.tool_calls == []
    assert parsed.finish_reason == "stop"
    assert parsed.content  # the broken call text is returned, never dropped
    marker = {"gpt_oss": "{broken", "llama3": '"f"', "mistral": "oops",
              "glm47": "<arg_key>k", "glm5": "<arg_key>k"}.get(family, "f")
    assert marker in parsed.content


PARALLEL = {"role": "assistant", "content": "", "reasoning_content": "two calls",
            "tool_calls": [call("get_weather", {"city": "Paris"}, "call_a"),
                           call("calculator", {"expression": "1+1", "n": 3}, "call_b")]}


@pytest.mark.parametrize("family", sorted(MALFORMED))
def test_parallel_calls_and_finish_reasons(family: str) -> None:
    r = get(family)
    kwargs = {r.spec.thinking_kwarg: True} if r.spec.thinking_kwarg else None
    ids = r.render_completion(PARALLEL, template_kwargs=kwargs)
    parsed = r.parse(ids, "stop")
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
           for c in parsed.tool_calls]
    assert got == [("get_weather", {"city": "Paris"}),
                   ("calculator", {"expression": "1+1", "n": 3})]
    assert parsed.finish_reason == "tool_calls"
    assert all(c["type"] == "function" and c["id"] for c in parsed.tool_calls)
    if r.spec.reasoning:
        assert parsed.reasoning_content == "two calls"
    # length wins over tool_calls; abort is reported as such.
    assert r.parse(ids, "length").finish_reason == "length"
    assert r.parse(ids, "abort").finish_reason == "abort"
    # A call cut by length is not a call: its text stays in content.
    cut = r.parse(ids[: len(ids) // 2 + 3], "length")
    assert cut.finish_reason == "length"


@pytest.mark.parametrize("family", ["qwen35", "glm47", "deepseek_v4", "nemotron3",
                                    "qwen38",
                                    "qwen36",
                                    "nemotron35",
                                    ])
def test_thinking_opened_by_prompt(family: str) -> None:
    r = get(family)
    tok = r.tokenizer
    on = r.parse(tok.encode("reason\n</think>\n\nanswer"), "stop")
    assert (on.reasoning_content, on.content) == ("reason", "answer")
    off = r.parse(tok.encode("just an answer"), "stop")  # thinking-off prompt closed it
    assert off.reasoning_content is None and off.content == "just an answer"
    cut = r.parse(tok.encode("still thinking"), "length")
    assert cut.reasoning_content == "still thinking" and cut.content == ""


@pytest.mark.parametrize(("family", "literals"), [("nemotron3", True), ("nemotron35", True),
                                                  ("qwen38", False)])
def test_xml_parameters_printed_as_python_literals_read_back_typed(family: str,
                                                                    literals: bool) -> None:
    """Templates that print values with Jinja's ``string`` filter write ``True``/``None``:
    their parser reads them back as a boolean and null (the others keep the string)."""
    parser = build_renderer(family, "standin").parser
    text = ("<tool_call>\n<function=f>\n<parameter=flag>\nTrue\n</parameter>\n"
            "<parameter=none>\nNone\n</parameter>\n<parameter=word>\nTrue story\n</parameter>\n"
            "</function>\n</tool_call>")
    _, calls = parser.extract_calls(text)  # type: ignore[attr-defined]
    args = json.loads(calls[0]["function"]["arguments"])
    expected = {"flag": True, "none": None} if literals else {"flag": "True", "none": "None"}
    assert args == {**expected, "word": "True story"}
def _inkling(text: str, finish: str = "stop") -> ParsedCompletion:
    r = get("inkling")
    return r.parse(r.tokenizer.encode(text), finish)


def test_inkling_reassembles_one_message_from_model_messages() -> None:
    parsed = _inkling(
        "<|content_thinking|> a <|end_message|><|message_model|><|content_text|>One.\n"
        "<|end_message|><|message_model|>calc<|content_invoke_tool_json|>"
        '{"name":"calc","args":{"x":[1,{"y":null}]}}<|end_message|>'
        "<|message_model|><|content_text|>Two.<|end_message|><|content_model_end_sampling|>")
    assert parsed.reasoning_content == " a "  # bodies are kept exactly
    assert parsed.content == "One.\n\nTwo."  # text messages joined with a newline
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [
        {"x": [1, {"y": None}]}]
    assert parsed.finish_reason == "tool_calls"


@pytest.mark.parametrize("text", [
    'f<|content_invoke_tool_json|>{"name":"g","args":{}}<|end_message|>',  # names differ
    'f<|content_invoke_tool_json|>{"name":"f","args":"{}"}<|end_message|>',  # args a string
    "<|content_xml|><x/><|end_message|>",  # a kind a model message does not carry
])
def test_inkling_unreadable_model_message_stays_verbatim(text: str) -> None:
    parsed = _inkling(text + "<|content_model_end_sampling|>")
    assert parsed.tool_calls == [] and parsed.content == "<|message_model|>" + text


def test_inkling_cut_completions() -> None:
    cut = _inkling("<|content_thinking|>half a tho", "length")
    assert (cut.reasoning_content, cut.content, cut.finish_reason) == (
        "half a tho", "", "length")
    # cut inside a call: the partial call is kept (with its opener), never dropped
    cut = _inkling('<|content_text|>Hi<|end_message|><|message_model|>get_wea', "length")
    assert cut.content == "Hi\n<|message_model|>get_wea" and cut.tool_calls == []
    # an opener just generated: nothing of that message yet
    assert _inkling("<|content_text|>Hi<|end_message|><|message_model|>", "length").content \
        == "Hi"

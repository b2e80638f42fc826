"""Every family: the verifier passes on its pool (token level over the fixture tokenizer, or
over the family's documented stand-in), junction rules, allowed roles, stop ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.support import TOKENIZERS, tokenizer_dir

from tito.render import TemplateRenderer, build_renderer
from tito.render.families import FAMILIES, family_module
from tito.render.template import render_template
from tito.render.verify import verify_renderer
from tito.types.errors import BadRequest

CANONICAL = sorted({m for m in FAMILIES.values() if m != "default"})


def renderer_for(family: str) -> TemplateRenderer:
    module = family_module(family)
    fixture = getattr(module, "FIXTURE", None) or {"chatml": "smollm2", "qwen3": "qwen3"}.get(
        family)
    if fixture is None:
        return build_renderer(family, "standin")
    return build_renderer(family, tokenizer_dir(fixture))


_CACHE: dict[str, TemplateRenderer] = {}


def get(family: str) -> TemplateRenderer:
    if family not in _CACHE:
        _CACHE[family] = renderer_for(family)
    return _CACHE[family]


SLOW_TO_VERIFY = {"qwen35", "gpt_oss", "mistral",
                  "qwen38", "qwen36",  # fast over their stand-in: test_families_qwen38_nemotron35
                  }
"""About a second each (long templates): verified in the slow tier."""


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.slow) if f in SLOW_TO_VERIFY else f for f in CANONICAL])
def test_family_passes_the_verifier(family: str) -> None:
    report = verify_renderer(get(family))
    failures = [c for c in report.cases if not c.passed]
    assert report.passed, failures[:3]
    checks = report.checks()
    assert set(checks) == {"text_prefix", "token_prefix", "parse_round_trip"}
    assert report.roles_exercised >= {"tool", "user", "assistant"}
    assert report.roles_exercised >= set(get(family).allowed_append_roles)


CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _bridge_text(family: str, assistant: dict, appended: list[dict], *, cut: bool = False
                 ) -> tuple[int, str, list[int]]:
    r = get(family)
    completion = r.render_completion(assistant, tools=TOOLS)
    last = completion[-2] if cut else completion[-1]
    bridge = r.bridge(assistant, last, appended, tools=TOOLS)
    return bridge.drop, r.tokenizer.decode(bridge.ids), completion


def test_glm_drops_the_stop_token_that_opens_the_next_message() -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    drop, text, completion = _bridge_text("glm47", call,
                                          [{"role": "tool", "tool_call_id": "call_1",
                                            "content": "sunny"}])
    tok = get("glm47").tokenizer
    assert tok.decode(completion[-1:]) == "<|observation|>"
    assert drop == 1 and text.startswith("<|observation|><tool_response>sunny")
    # A failed call followed by a user message: the stored <|observation|> is still dropped.
    drop, text, _ = _bridge_text("glm47", call, [{"role": "user", "content": "retry"}])
    assert drop == 1 and text.startswith("<|user|>retry") and text.endswith("<|assistant|><think>")
    plain = {"role": "assistant", "content": "hi"}
    drop, text, completion = _bridge_text("glm47", plain, [{"role": "user", "content": "x"}])
    assert tok.decode(completion[-1:]) == "<|user|>" and drop == 1
    assert get("glm47").max_trailing_trim == 1


def test_gpt_oss_return_becomes_end_in_history() -> None:
    final = {"role": "assistant", "content": "Hi.", "reasoning_content": "greet"}
    drop, text, completion = _bridge_text("gpt_oss", final, [{"role": "user", "content": "x"}])
    tok = get("gpt_oss").tokenizer
    assert tok.decode(completion[-1:]) == "<|return|>"
    assert drop == 1 and text.startswith("<|end|><|start|>user<|message|>x<|end|>")
    call = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    drop, text, completion = _bridge_text("gpt_oss", call,
                                          [{"role": "tool", "tool_call_id": "call_1",
                                            "content": "sunny"}])
    assert tok.decode(completion[-1:]) == "<|call|>" and drop == 0
    assert text.startswith("<|start|>functions.get_weather to=assistant")


@pytest.mark.parametrize("family,junction", [("qwen35", "\n"), ("nemotron3", "\n"),
                                             ("minimax_m2", "\n"), ("kimi_k2", ""),
                                             ("llama3", ""), ("mistral", ""),
                                             ("deepseek_v4", ""),
                                             ("minimax_m25", "\n"),
                                             ("minimax_m3", "\n"),
                                             ("gemma4", "\n"),
                                             ("qwen38", "\n"),
                                             ("qwen36", "\n"),
                                             ("nemotron35", "\n"),
                                             ("deepseek_v41", ""),
                                             ("inkling", "")])
def test_junction_and_cut_turns(family: str, junction: str) -> None:
    plain = {"role": "assistant", "content": "Hello there"}
    drop, text, _ = _bridge_text(family, plain, [{"role": "user", "content": "next"}])
    assert drop == 0 and text.startswith(junction) and "next" in text
    r = get(family)
    # A turn cut by length: the bridge closes it with the family's stop text first.
    drop, text, _ = _bridge_text(family, plain, [{"role": "user", "content": "next"}], cut=True)
    assert drop == 0 and text.startswith(r.stop_texts[0] + junction)


@pytest.mark.parametrize("family", ["qwen35", "deepseek_v31", "deepseek_v32", "deepseek_v4",
                                    "minimax_m2",
                                    "minimax_m25",
                                    "minimax_m3",
                                    "qwen38",
                                    "qwen36",
                                    "deepseek_v41",
                                    ])
def test_system_append_is_rejected_naming_family_and_role(family: str) -> None:
    r = get(family)
    assert "system" not in r.allowed_append_roles
    with pytest.raises(BadRequest, match=rf"family '{family}' cannot append .* role 'system'"):
        r.bridge({"role": "assistant", "content": "x"}, None,
                 [{"role": "system", "content": "late"}, {"role": "user", "content": "y"}])


def test_mistral_maps_call_ids_to_nine_alphanumerics() -> None:
    r = get("mistral")
    msgs = [{"role": "user", "content": "w?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    text = r.render_text(msgs, tools=TOOLS)
    ids = [m for m in text.split('"') if len(m) == 9 and m.isalnum() and m != "arguments"]
    assert len(ids) == 2 and ids[0] == ids[1]
    parsed = r.parse(r.render_completion(msgs[1], tools=TOOLS), "stop")
    assert len(parsed.tool_calls[0]["id"]) == 9 and parsed.tool_calls[0]["id"].isalnum()


def test_kimi_keeps_model_call_ids() -> None:
    r = get("kimi_k2")
    message = {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [
        {**CALL, "id": "functions.get_weather:7"}]}
    parsed = r.parse(r.render_completion(message, tools=TOOLS), "stop")
    assert parsed.tool_calls[0]["id"] == "functions.get_weather:7"


def test_deepseek_v32_template_reproduces_the_golden_encoder_output() -> None:
    folder = TOKENIZERS / "deepseek-v3.2"
    if not folder.is_dir():
        pytest.skip(f"needs {folder}")
    data = json.loads((folder / "encoding_test_input.json").read_text())
    golden = (folder / "encoding_test_output.txt").read_text()
    from tito.render.base import normalize_messages
    from tito.render.families import bundled_template

    text = render_template(bundled_template("deepseek_v32.jinja"),
                           normalize_messages(data["messages"]), tools=data["tools"],
                           kwargs={"thinking": True},
                           special_tokens={"bos_token": "<｜begin▁of▁sentence｜>"})
    assert text == golden.rstrip("\n")
    # The family pins drop_thinking=False: history reasoning is kept (append-only).
    r = get("deepseek_v32")
    kept = r.render_text(data["messages"], tools=data["tools"],
                         template_kwargs={"thinking": True})
    assert len(kept) > len(text) and kept.startswith(text[:200])


@pytest.mark.slow
def test_original_templates_fail_the_verifier(tmp_path: Path) -> None:
    """The verifier can fail: shipped templates that drop history reasoning do."""
    report = verify_renderer(build_renderer("default", tokenizer_dir("qwen3")))
    assert not report.passed
    assert any(c.check == "text_prefix" and not c.passed for c in report.cases)
    path = tmp_path / "t.jinja"
    path.write_text((tokenizer_dir("qwen3-thinking-2507") / "chat_template.jinja").read_text())
    report = verify_renderer(build_renderer("default", tokenizer_dir("qwen3"),
                                            chat_template=path))
    assert not report.passed


def test_families_declare_stop_tokens_in_their_tokenizers() -> None:
    for family in CANONICAL:
        r = get(family)
        assert r.stop_ids and all(r.tokenizer.id_to_token(i) is not None for i in r.stop_ids)
        report = r.capability_report()
        assert report["family"] == r.family and report["renderer_source"] == "tito"


# -- inkling ------------------------------------------------------------------------------
INKLING_FIXTURE = TOKENIZERS / "inkling" / "chat_template_miles-patched.jinja"


def test_inkling_bundled_template_is_the_fixture_byte_for_byte() -> None:
    if not INKLING_FIXTURE.is_file():
        pytest.skip(f"needs {INKLING_FIXTURE}")
    from tito.render.families import bundled_template

    bundled = bundled_template("inkling.jinja")
    header, _, body = bundled.partition("-#}\n")
    assert header.startswith("{#-") and body == INKLING_FIXTURE.read_text()


def test_inkling_one_assistant_message_is_several_model_messages() -> None:
    r = get("inkling")
    message = {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two.",
               "tool_calls": [CALL, {**CALL, "id": "call_2", "function": {
                   "name": "get_weather", "arguments": json.dumps({"city": "東京"})}}]}
    ids = r.render_completion(message, tools=TOOLS)
    assert r.tokenizer.decode(ids) == (
        "<|content_thinking|>Two.<|end_message|>"
        "<|message_model|><|content_text|>Checking both.<|end_message|>"
        '<|message_model|>get_weather<|content_invoke_tool_json|>{"name":"get_weather",'
        '"args":{"city":"Paris"}}<|end_message|>'
        '<|message_model|>get_weather<|content_invoke_tool_json|>{"name":"get_weather",'
        '"args":{"city":"東京"}}<|end_message|><|content_model_end_sampling|>')
    parsed = r.parse(ids, "stop")
    assert (parsed.content, parsed.reasoning_content) == ("Checking both.", "Two.")
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [
        {"city": "Paris"}, {"city": "東京"}]
    # the parsed message renders back to the same ids (the round trip is exact)
    again = {"role": "assistant", "content": parsed.content,
             "reasoning_content": parsed.reasoning_content, "tool_calls": parsed.tool_calls}
    assert r.render_completion(again, tools=TOOLS) == ids
    # a tool result is named after its call; the bridge follows the stop token directly
    drop, text, _ = _bridge_text("inkling", message, [
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}])
    assert drop == 0
    assert text == "<|message_tool|>get_weather<|content_text|>sunny<|end_message|>" \
        "<|message_model|>"


@pytest.mark.parametrize("effort,level", [("none", "0"), ("minimal", "0.1"), ("low", "0.2"),
                                          ("medium", "0.7"), ("high", "0.9"),
                                          ("xhigh", "0.99")])
def test_inkling_reasoning_effort_is_a_system_message(effort: str, level: str) -> None:
    r = get("inkling")
    kwargs = r.effort_kwargs(effort)
    text = r.render_text([{"role": "system", "content": "S"}, {"role": "user", "content": "q"}],
                         template_kwargs=kwargs, add_generation_prompt=True)
    assert text == ("<|message_system|><|content_text|>S<|end_message|><|message_system|>"
                    f"<|content_text|>Thinking effort level: {level}<|end_message|>"
                    "<|message_user|><|content_text|>q<|end_message|><|message_model|>")
    report = verify_renderer(r, kwargs=kwargs)
    assert report.passed, [c for c in report.cases if not c.passed][:3]


def test_inkling_anthropic_thinking_sets_the_effort_level() -> None:
    r = get("inkling")
    assert r.thinking_switch_kwargs(False) == {"reasoning_effort": "none"}
    assert r.thinking_switch_kwargs(True) == {"reasoning_effort": "high"}
    assert r.effort_kwargs("xhigh") == {"reasoning_effort": "max"}
    assert get("qwen3").thinking_switch_kwargs(False) == {"enable_thinking": False}
    assert get("kimi_k2").thinking_switch_kwargs(False) == {}


# -- deepseek_v41 -------------------------------------------------------------------------
def test_deepseek_v41_is_v4_with_the_v41_tag_spelling() -> None:
    v4, v41 = get("deepseek_v4"), get("deepseek_v41")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "w?"},
                {"role": "assistant", "content": "", "reasoning_content": "r",
                 "tool_calls": [CALL, {**CALL, "id": "c2", "function": {
                     "name": "calc", "arguments": json.dumps({"n": 3, "x": [1]})}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    for kwargs in ({"thinking": True}, {"thinking": False}):
        old = v4.render_text(messages, tools=TOOLS, template_kwargs=kwargs,
                             add_generation_prompt=True)
        new = v41.render_text(messages, tools=TOOLS, template_kwargs=kwargs,
                              add_generation_prompt=True)
        assert "<｜DSML｜ calls>" in new and "｜DSML｜tool_calls" not in new
        respelled = old.replace("｜DSML｜tool_calls", "｜DSML｜ calls")
        for tag in ("invoke", "parameter"):
            respelled = respelled.replace(f"｜DSML｜{tag}", f"｜DSML｜ {tag}")
        assert new == respelled
    # V4's parser does not read V4.1's calls (they stay in content) and vice versa
    ids = v41.render_completion(messages[2], tools=TOOLS, template_kwargs={"thinking": True})
    assert len(v41.parse(ids, "stop").tool_calls) == 2
    assert v4.parse(ids, "stop").tool_calls == []


def test_deepseek_v41_over_the_v4_tokenizer_passes_the_verifier() -> None:
    folder = TOKENIZERS / "deepseek-v4"
    if not folder.is_dir():
        pytest.skip(f"needs {folder}")
    r = build_renderer("deepseek_v41", folder)
    report = verify_renderer(r)
    assert report.passed, [c for c in report.cases if not c.passed][:3]
    dsml = r.tokenizer.require_id("｜DSML｜")  # one id, as in V4's tags; the space is BPE
    assert dsml in r.tokenizer.encode("<｜DSML｜ calls>")
    for special in ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"):
        assert r.tokenizer.encode(special) == [r.tokenizer.require_id(special)]

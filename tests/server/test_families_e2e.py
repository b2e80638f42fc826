"""End to end per family: `tito serve` + `tito mock-engine` processes, a 6-turn tool-calling
trajectory through the real openai SDK, the TITO chain checked on the ids the engine got,
and 0 strict mismatches in the collected sample. GLM runs over its documented stand-in
tokenizer (the real one is not available offline). Families of the second wave also run a
tool-calling session through each API (Chat Completions, Responses, Messages: the real
openai and anthropic SDKs) with each API's thinking switch, in process over a real mock
engine."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from helpers.inproc import asgi_client, gateway_over_mock_engine, new_session, openai_for
from helpers.support import (
    Proc,
    assert_tito_chain,
    engine_log,
    start_gateway,
    start_mock,
    tokenizer_dir,
)

from tito.render import build_renderer
from tito.render.families import family_module
from tito.render.families.loaders import load_any, write_standin
from tito.render.verify import verify_renderer
from tito.samples import decode_samples
from tito.server.app import create_app
from tito.server.gateway import Gateway

pytestmark = pytest.mark.slow  # two processes per family

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "calculator", "description": "Math.",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}},
]
STRICT = ("special_token_count", "special_token_type", "non_assistant_text")
FAMILIES = {"qwen3": "qwen3", "glm47": None, "deepseek_v4": "deepseek-v4",
            "llama3": "llama-3.1", "gpt_oss": "gpt-oss",
            "minimax_m25": None,
            "minimax_m3": None,
            "gemma4": None,
            "qwen38": "qwen3.5",
            "qwen36": "qwen3.5",
            "nemotron35": None,
            "glm5": None,
            "kimi_k25": None,
            "kimi_k3": None,
            "deepseek_v41": None,
            "inkling": None,
            }


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[str, Proc, Proc]]:
    family = request.param
    if FAMILIES[family] is None:
        module = family_module(family)
        folder = write_standin(tmp_path_factory.mktemp(f"standin-{family}"), family,
                               module.STANDIN, module.STANDIN_EOS)
    else:
        folder = tokenizer_dir(FAMILIES[family])
    engine = start_mock(folder, family)
    try:
        gateway = start_gateway(engine.url, folder, family, "--strict-template")
    except Exception:
        engine.stop()
        raise
    try:
        yield family, engine, gateway
    finally:
        gateway.stop()
        engine.stop()


def _session(url: str) -> tuple[str, openai.OpenAI]:
    sid = httpx.post(url + "/sessions").json()["session_id"]
    return sid, openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x", max_retries=0)


def _answer_calls(msg: Any, contents: list[str]) -> list[dict[str, Any]]:
    """One tool message per call; the last call gets the last directive text."""
    calls = msg.tool_calls
    last = len(calls) - 1
    return [{"role": "tool", "tool_call_id": call.id,
             "content": contents[-1] if i == last else contents[min(i, len(contents) - 1)]}
            for i, call in enumerate(calls)]


def test_six_turn_tool_trajectory_zero_strict_mismatches(stack: tuple[str, Proc, Proc]) -> None:
    family, engine, gateway = stack
    health = httpx.get(gateway.url + "/health").json()
    assert health["family"] == family
    assert health["capabilities"]["append_only_verified"] is True
    roles = set(health["capabilities"]["allowed_append_roles"])
    sid, client = _session(gateway.url)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": 'THINK weather first\nCALL get_weather {"city": "Paris"}'},
    ]

    def turn() -> Any:
        r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        return r

    r = turn()  # 1: one call
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages.append({"role": "tool", "tool_call_id": call.id, "content":
                     'CALL calculator {"expression": "2+2"}\nCALL get_weather {"city": "Oslo"}'})
    r = turn()  # 2: parallel calls (harmony stops at the first <|call|>)
    names = [c.function.name for c in r.choices[0].message.tool_calls]
    assert names[0] == "calculator" and len(names) == (1 if family == "gpt_oss" else 2)
    messages += _answer_calls(r.choices[0].message, ["4", "SAY It is 4, and sunny."])
    r = turn()  # 3: plain answer after tool results
    assert r.choices[0].message.content == "It is 4, and sunny."
    assert r.choices[0].finish_reason == "stop"
    messages.append({"role": "user", "content": "THINK follow up\nSAY Anything else?"})
    r = turn()  # 4: user follow-up
    assert r.choices[0].message.content == "Anything else?"
    if "system" in roles:
        messages.append({"role": "system", "content": "Reminder: be brief."})
    messages.append({"role": "user", "content": 'CALL calculator {"expression": "6*7"}'})
    r = turn()  # 5: a call after a (system +) user append
    assert r.choices[0].finish_reason == "tool_calls"
    messages += _answer_calls(r.choices[0].message, ["SAY 42."])
    r = turn()  # 6: final answer
    assert r.choices[0].message.content == "42."

    log = [e for e in httpx.get(engine.url + "/mock/requests").json()
           if e["rid"].startswith(sid)]
    assert len(log) == 6
    trim = health["capabilities"]["max_trailing_trim"]
    for prev, cur in itertools.pairwise(log):
        stored = prev["input_ids"] + prev["output_ids"]
        stored = stored[: len(stored) - trim]
        assert cur["input_ids"][: len(stored)] == stored, "TITO invariant broken"
    resp = httpx.post(f"{gateway.url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    sample = decode_samples(resp.content).samples[0]
    final = log[-1]["input_ids"] + log[-1]["output_ids"]
    assert sample.tokens.tolist() == final
    mismatches = sample.metadata["tito_session_mismatch"]
    assert not [m for m in mismatches if m["type"] in STRICT], mismatches


def test_disallowed_role_is_400_naming_family(stack: tuple[str, Proc, Proc]) -> None:
    family, _engine, gateway = stack
    roles = set(httpx.get(gateway.url + "/health").json()["capabilities"]
                ["allowed_append_roles"])
    if "system" in roles:
        pytest.skip(f"{family} appends every role")
    _sid, client = _session(gateway.url)
    first = [{"role": "user", "content": "SAY hi"}]
    r = client.chat.completions.create(model="m", messages=first)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=[
            *first, r.choices[0].message.model_dump(exclude_none=True),
            {"role": "system", "content": "late system"}, {"role": "user", "content": "x"}])
    assert family in err.value.body["message"] and "'system'" in err.value.body["message"]


def test_standin_folder_loads(tmp_path: Path) -> None:
    module = family_module("glm47")
    folder = write_standin(tmp_path, "glm47", module.STANDIN, module.STANDIN_EOS)
    from tito.render import build_renderer

    renderer = build_renderer("glm47", folder)
    assert renderer.tokenizer.encode("<|observation|>") == [
        renderer.tokenizer.require_id("<|observation|>")]


PROMPT_CHECKED = {
    "minimax_m25",
    "minimax_m3",
    "gemma4",
}
"""Families also driven through the Responses and Messages APIs here, with each API's
thinking switch (the others are covered by tests/server/responses and anthropic)."""
WEATHER_RESPONSES = {"type": "function", "name": "get_weather", "description": "Weather.",
                     "parameters": TOOLS[0]["function"]["parameters"], "strict": False}
WEATHER_ANTHROPIC = {"name": "get_weather", "description": "Weather.",
                     "input_schema": TOOLS[0]["function"]["parameters"]}
OFF_PROMPT = {"minimax_m3": "]~b]ai\n</mm:think>", "gemma4": "<|turn>model\n"}
ON_PROMPT = {"minimax_m3": "]~b]ai\n<mm:think>", "gemma4": "<|turn>model\n<|channel>thought\n",
             "minimax_m25": "]~b]ai\n<think>\n"}


def _chain_holds(engine: Proc, gateway: Proc, sid: str, turns: int) -> list[dict[str, Any]]:
    """The session's engine requests: ``turns`` of them, each extending the last, and its
    sample equal to the last one with no strict mismatch."""
    log = [e for e in httpx.get(engine.url + "/mock/requests").json()
           if e["rid"].startswith(sid)]
    assert len(log) == turns
    trim = httpx.get(gateway.url + "/health").json()["capabilities"]["max_trailing_trim"]
    for prev, cur in itertools.pairwise(log):
        stored = prev["input_ids"] + prev["output_ids"]
        assert cur["input_ids"][: len(stored) - trim] == stored[: len(stored) - trim]
    resp = httpx.post(f"{gateway.url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    sample = decode_samples(resp.content).samples[0]
    assert sample.tokens.tolist() == log[-1]["input_ids"] + log[-1]["output_ids"]
    mismatches = sample.metadata["tito_session_mismatch"]
    assert not [m for m in mismatches if m["type"] in STRICT], mismatches
    return log


def _prompt_text(family: str, ids: list[int]) -> str:
    from tito.render import build_renderer

    return build_renderer(family, "standin").tokenizer.decode(ids)
RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"],
                    "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"], "strict": False}
                   for t in TOOLS]


@pytest.mark.parametrize("stack", sorted(PROMPT_CHECKED), indirect=True)
def test_responses_session_thinking_prompt(stack: tuple[str, Proc, Proc]) -> None:
    family, engine, gateway = stack
    sid, client = _session(gateway.url)
    first = client.responses.create(
        model="m", tools=[WEATHER_RESPONSES], reasoning={"effort": "high"},
        input=[{"role": "user", "content": 'THINK plan\nCALL get_weather {"city": "Paris"}'}])
    calls = [i for i in first.output if i.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}]
    assert any(i.type == "reasoning" for i in first.output)
    second = client.responses.create(
        model="m", tools=[WEATHER_RESPONSES], reasoning={"effort": "high"},
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "THINK done\nSAY Sunny."}])
    assert second.output_text == "Sunny."
    log = _chain_holds(engine, gateway, sid, 2)
    assert _prompt_text(family, log[0]["input_ids"]).endswith(ON_PROMPT[family])


@pytest.mark.parametrize("stack", sorted(PROMPT_CHECKED), indirect=True)
def test_messages_session_with_anthropic_thinking(stack: tuple[str, Proc, Proc]) -> None:
    family, engine, gateway = stack
    import anthropic

    sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
    client = anthropic.Anthropic(base_url=f"{gateway.url}/sessions/{sid}", api_key="x",
                                 max_retries=0)
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": 'THINK plan\nCALL get_weather {"city": "Oslo"}'}]
    first = client.messages.create(model="m", max_tokens=256, tools=[WEATHER_ANTHROPIC],
                                   thinking=thinking, messages=messages)  # type: ignore[arg-type]
    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    assert [b.input for b in uses] == [{"city": "Oslo"}]
    assert [b.thinking for b in first.content if b.type == "thinking"] == ["plan"]
    messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                               "content": "THINK cold\nSAY Cold."}]}]
    second = client.messages.create(model="m", max_tokens=256, tools=[WEATHER_ANTHROPIC],
                                    thinking=thinking, messages=messages)  # type: ignore[arg-type]
    assert [b.text for b in second.content if b.type == "text"] == ["Cold."]
    log = _chain_holds(engine, gateway, sid, 2)
    assert _prompt_text(family, log[0]["input_ids"]).endswith(ON_PROMPT[family])


@pytest.mark.parametrize("stack", sorted(OFF_PROMPT), indirect=True)
def test_chat_reasoning_effort_none_switches_thinking_off(stack: tuple[str, Proc, Proc]
                                                         ) -> None:
    family, engine, gateway = stack
    sid, client = _session(gateway.url)
    r = client.chat.completions.create(model="m", reasoning_effort="none", messages=[
        {"role": "user", "content": "THINK never shown\nSAY Plain."}])
    assert r.choices[0].message.content == "Plain."
    assert not getattr(r.choices[0].message, "reasoning_content", None)
    log = _chain_holds(engine, gateway, sid, 1)
    assert _prompt_text(family, log[0]["input_ids"]).endswith(OFF_PROMPT[family])
    sid, client = _session(gateway.url)
    effort: Any = {"effort": "low"}
    first = client.responses.create(
        model="m", instructions="You are a weather bot.", tools=RESPONSES_TOOLS,
        reasoning=effort, input='THINK weather first\nCALL get_weather {"city": "Paris"}\n'
                                'CALL calculator {"expression": "2+2"}')
    calls = [i for i in first.output if i.type == "function_call"]
    names = ["get_weather"] if family == "gpt_oss" else ["get_weather", "calculator"]
    assert [c.name for c in calls] == names  # harmony stops at the first <|call|>
    reasoning = httpx.get(gateway.url + "/health").json()["capabilities"]["reasoning"]
    assert any(i.type == "reasoning" for i in first.output) is reasoning
    outputs = ["sunny", "4"][: len(calls)]
    outputs[-1] += "\nSAY Sunny; 4."
    second = client.responses.create(
        model="m", tools=RESPONSES_TOOLS, reasoning=effort, previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": c.call_id, "output": out}
               for c, out in zip(calls, outputs, strict=True)])
    assert second.output_text == "Sunny; 4."
    third = client.responses.create(
        model="m", tools=RESPONSES_TOOLS, reasoning=effort, previous_response_id=second.id,
        input="THINK again\nSAY Bye.")
    assert third.output_text == "Bye." and third.status == "completed"
    log = _chain_holds(engine, gateway, sid, 3)
    if family == "qwen38":  # reasoning.effort low: the template's low-effort instruction
        prompt = load_any(tokenizer_dir("qwen3.5")).decode(log[0]["input_ids"])
        assert prompt.startswith("<|im_start|>system\nReasoning effort is set to low.")


def test_messages_session_with_thinking(stack: tuple[str, Proc, Proc]) -> None:
    _family, engine, gateway = stack
    sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
    client = anthropic.Anthropic(base_url=f"{gateway.url}/sessions/{sid}", api_key="x",
                                 max_retries=0)
    tools: Any = [{"name": t["function"]["name"], "description": t["function"]["description"],
                   "input_schema": t["function"]["parameters"]} for t in TOOLS]
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    history: list[Any] = [{"role": "user", "content":
                           'THINK which city\nCALL get_weather {"city": "Oslo"}'}]
    first = client.messages.create(model="m", max_tokens=256, system="You are a weather bot.",
                                   tools=tools, thinking=thinking, messages=history)
    assert first.stop_reason == "tool_use"
    kinds = [b.type for b in first.content]
    reasoning = httpx.get(gateway.url + "/health").json()["capabilities"]["reasoning"]
    assert (kinds[0] == "thinking") is reasoning and "tool_use" in kinds
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.input == {"city": "Oslo"}
    history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                  for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": "snow\nSAY Snowing in Oslo."}]}]
    second = client.messages.create(model="m", max_tokens=256, system="You are a weather bot.",
                                    tools=tools, thinking=thinking, messages=history)
    assert second.stop_reason == "end_turn"
    assert second.content[-1].type == "text" and second.content[-1].text == "Snowing in Oslo."
    _chain_holds(engine, gateway, sid, 2)
THREE_APIS = [
    "glm5",
    "kimi_k25",
    "kimi_k3",
]
"""Families run through all three APIs in process (their stand-in tokenizers)."""
FIRST = 'THINK weather first\nCALL get_weather {"city": "Paris"}'


def _anthropic_for(gateway: Gateway, sid: str) -> anthropic.AsyncAnthropic:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=create_app(gateway)),
                              base_url="http://127.0.0.1", timeout=30)
    return anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1/sessions/{sid}", api_key="x",
                                    max_retries=0, http_client=http)


async def _checked(http: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    """The session's records, once its sample shows no strict mismatch."""
    resp = await http.post(f"/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    mismatches = decode_samples(resp.content).samples[0].metadata["tito_session_mismatch"]
    assert not [m for m in mismatches if m["type"] in STRICT], mismatches
    records: list[dict[str, Any]] = (await http.get(f"/sessions/{sid}")).json()["records"]
    return records


async def _chat(http: httpx.AsyncClient, kwarg: str) -> None:
    """Chat Completions, ``reasoning_effort`` low (thinking on): call, answer, follow-up."""
    sid = await new_session(http)
    client = openai_for(http, sid)
    messages: list[Any] = [{"role": "system", "content": "Weather bot."},
                           {"role": "user", "content": FIRST}]
    first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                 reasoning_effort="low")
    msg = first.choices[0].message.model_dump(exclude_none=True)
    assert first.choices[0].finish_reason == "tool_calls"
    assert msg["reasoning_content"] == "weather first"
    call = msg["tool_calls"][0]
    messages += [msg, {"role": "tool", "tool_call_id": call["id"], "content": "SAY Sunny."}]
    second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                  reasoning_effort="low")
    assert second.choices[0].message.content == "Sunny."
    records = await _checked(http, sid)
    assert [r["chat_template_kwargs"][kwarg] for r in records] == [True, True]


async def _responses(http: httpx.AsyncClient, kwarg: str) -> None:
    """Responses, ``reasoning.effort`` none (thinking off): call, then the answer."""
    sid = await new_session(http)
    client = openai_for(http, sid)
    tools: Any = [{"type": "function", **t["function"]} for t in TOOLS]
    first_input: list[Any] = [{"role": "user", "content": FIRST}]
    first = await client.responses.create(model="m", input=first_input, tools=tools,
                                          reasoning={"effort": "none"})
    assert [i.type for i in first.output] == ["function_call"]  # no reasoning item
    echoed = [item.model_dump(exclude_none=True) for item in first.output]
    async with client.responses.stream(model="m", tools=tools, reasoning={
        "effort": "none"}, input=[*first_input, *echoed, {
            "type": "function_call_output", "call_id": first.output[0].call_id,  # type: ignore[union-attr]
            "output": "SAY Cold and windy."}]) as events:  # streamed: the answer as text
        deltas = [e async for e in events]
        second = await events.get_final_response()
    assert second.output_text == "Cold and windy."
    assert [i.type for i in second.output] == ["message"]
    assert not [e.type for e in deltas if "reasoning" in e.type]  # nothing streamed as such
    assert "".join(e.delta for e in deltas if e.type == "response.output_text.delta") == \
        "Cold and windy."
    records = await _checked(http, sid)
    assert [r["chat_template_kwargs"][kwarg] for r in records] == [False, False]


async def _messages(gateway: Gateway, http: httpx.AsyncClient, kwarg: str) -> None:
    """Messages, ``thinking`` enabled: tool_use (after a thinking block), then the answer."""
    sid = await new_session(http)
    client = _anthropic_for(gateway, sid)
    tools: Any = [{"name": t["function"]["name"], "description": t["function"]["description"],
                   "input_schema": t["function"]["parameters"]} for t in TOOLS]
    history: list[Any] = [{"role": "user", "content": FIRST}]
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    async with client.messages.stream(model="m", max_tokens=256, tools=tools,
                                      messages=history, thinking=thinking) as events:
        first = await events.get_final_message()  # streamed: markers held back
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert first.content[0].thinking == "weather first"  # type: ignore[union-attr]
    assert first.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]
    use = first.content[-1]
    history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                  for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,  # type: ignore[union-attr]
                                              "content": "SAY Windy."}]}]
    second = await client.messages.create(model="m", max_tokens=256, tools=tools,
                                          messages=history, thinking=thinking)
    assert second.stop_reason == "end_turn" and second.content[-1].text == "Windy."  # type: ignore[union-attr]
    records = await _checked(http, sid)
    assert [r["chat_template_kwargs"][kwarg] for r in records] == [True, True]


@pytest.mark.parametrize("family", THREE_APIS)
async def test_a_session_through_each_api(family: str, tmp_path: Path) -> None:
    module = family_module(family)
    folder = write_standin(tmp_path, family, module.STANDIN, module.STANDIN_EOS)
    renderer = build_renderer(family, folder)
    kwarg = renderer.spec.thinking_kwarg
    assert kwarg is not None
    check = verify_renderer(renderer).summary()
    async with gateway_over_mock_engine(folder, renderer, check, timeout=30, family=family,
                                        token_latency_ms=1.0) as gateway, \
            asgi_client(gateway) as http:
        health = (await http.get("/health")).json()
        assert health["capabilities"]["append_only_verified"] is True
        assert health["capabilities"]["pinned_kwargs"] == renderer.spec.pinned_kwargs
        await _chat(http, kwarg)
        await _responses(http, kwarg)
        await _messages(gateway, http, kwarg)
        if family == "kimi_k3":
            await _k3_refusal(http)


async def _k3_refusal(http: httpx.AsyncClient) -> None:
    """kimi_k3: a kwarg that adds a trailing system message is a 400 that leaves the session
    as it was; the effort reaches the template's ``thinking_effort``."""
    sid = await new_session(http)
    client = openai_for(http, sid)
    first: list[Any] = [{"role": "user", "content": "SAY Hi."}]
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="m", messages=first, extra_body={
            "chat_template_kwargs": {"tool_choice": "required"}})
    assert err.value.code == "template_kwarg_not_append_only"
    assert (await http.get(f"/sessions/{sid}")).json()["records"] == []
    reply = await client.chat.completions.create(model="m", messages=first,
                                                 reasoning_effort="xhigh")
    following = [*first, reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "SAY Bye."}]
    with pytest.raises(openai.BadRequestError) as err:  # the effort is the session's
        await client.chat.completions.create(model="m", messages=following,
                                             reasoning_effort="low")
    assert err.value.code == "render_changed"
    again = await client.chat.completions.create(model="m", messages=following,
                                                 reasoning_effort="xhigh")
    assert again.choices[0].message.content == "Bye."
    records = await _checked(http, sid)
    assert [r["chat_template_kwargs"] for r in records] == \
        [{"thinking": True, "thinking_effort": "max"}] * 2


# -- the three APIs with each family's effort -------------------------------------------
EFFORT_FAMILIES = {
    "deepseek_v41",
    "inkling",
}
"""Families whose sessions also run through Responses and Messages here (one per line)."""
EFFORT_IN_PROMPT = {
    "inkling": {"low": "Thinking effort level: 0.2", "xhigh": "Thinking effort level: 0.99",
                "disabled": "Thinking effort level: 0<"},
    "deepseek_v41": {"low": "<｜Assistant｜><think>", "xhigh": "Reasoning Effort: Absolute",
                     "disabled": "<｜Assistant｜></think>"},
}
"""What each API's thinking setting puts in the family's prompt."""
PARIS = {"city": "Paris"}


def _first_prompt(family: str, engine: Proc, sid: str) -> str:
    tokenizer = build_renderer(family, "standin").tokenizer
    return str(tokenizer.decode(engine_log(engine.url, sid)[0]["input_ids"]))


def _effort_sample(family: str, engine: Proc, gateway: Proc, sid: str, turns: int) -> None:
    """The session's prompts extend each other and its sample has 0 strict mismatches."""
    log = engine_log(engine.url, sid)
    assert len(log) == turns
    assert_tito_chain(log)
    resp = httpx.post(f"{gateway.url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    sample = decode_samples(resp.content).samples[0]
    assert sample.tokens.tolist() == log[-1]["input_ids"] + log[-1]["output_ids"]
    mismatches = sample.metadata["tito_session_mismatch"]
    assert not [m for m in mismatches if m["type"] in STRICT], (family, mismatches)


def _effort_chat(family: str, engine: Proc, gateway: Proc) -> None:
    sid, client = _session(gateway.url)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"THINK plan\nCALL get_weather {json.dumps(PARIS)}"}]
    text, reasoning, calls = "", "", {}
    for chunk in client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                reasoning_effort="low", stream=True):
        delta: Any = chunk.choices[0].delta if chunk.choices else None
        text += (delta and delta.content) or ""
        reasoning += (delta and getattr(delta, "reasoning_content", None)) or ""
        for part in (delta and delta.tool_calls) or []:
            call = calls.setdefault(part.index, {"id": part.id, "type": "function",
                                                 "function": {"name": "", "arguments": ""}})
            call["function"]["name"] += part.function.name or ""
            call["function"]["arguments"] += part.function.arguments or ""
    assert (text, reasoning) == ("", "plan")  # the family's markers never streamed
    (call,) = calls.values()
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == PARIS
    messages += [{"role": "assistant", "content": None, "reasoning_content": reasoning,
                  "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"], "content": "SAY Sunny."}]
    r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                       reasoning_effort="low")
    assert r.choices[0].message.content == "Sunny."
    assert EFFORT_IN_PROMPT[family]["low"] in _first_prompt(family, engine, sid)
    _effort_sample(family, engine, gateway, sid, 2)


def _effort_responses(family: str, engine: Proc, gateway: Proc) -> None:
    sid, client = _session(gateway.url)
    tools: Any = [{"type": "function", "name": t["function"]["name"],
                   "parameters": t["function"]["parameters"]} for t in TOOLS]
    first: list[Any] = [{"role": "user", "content": "THINK plan\nCALL get_weather "
                         f"{json.dumps(PARIS)}\nCALL calculator {{\"expression\": \"1+1\"}}"}]
    reply = client.responses.create(model="m", input=first, tools=tools,
                                    reasoning={"effort": "xhigh"})
    kinds = [item.type for item in reply.output]
    assert kinds == ["reasoning", "function_call", "function_call"], kinds
    calls = [item for item in reply.output if item.type == "function_call"]
    echoed = [item.model_dump(exclude_none=True) for item in reply.output]
    second = client.responses.create(model="m", tools=tools, reasoning={"effort": "xhigh"},
                                     input=[*first, *echoed, *(
                                         {"type": "function_call_output", "call_id": c.call_id,
                                          "output": "SAY done"} for c in calls)])
    assert second.output_text == "done"
    assert EFFORT_IN_PROMPT[family]["xhigh"] in _first_prompt(family, engine, sid)
    _effort_sample(family, engine, gateway, sid, 2)


def _effort_messages(family: str, engine: Proc, gateway: Proc) -> None:
    sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
    client = anthropic.Anthropic(base_url=f"{gateway.url}/sessions/{sid}", api_key="x",
                                 max_retries=0)
    tools: Any = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                  for t in TOOLS]
    history: list[Any] = [{"role": "user", "content": f"CALL get_weather {json.dumps(PARIS)}"}]
    reply = client.messages.create(model="m", max_tokens=256, messages=history, tools=tools,
                                   thinking={"type": "disabled"})
    use = next(b for b in reply.content if b.type == "tool_use")
    assert reply.stop_reason == "tool_use" and use.input == PARIS
    history += [{"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": "SAY Done."}]}]
    reply = client.messages.create(model="m", max_tokens=256, messages=history, tools=tools,
                                   thinking={"type": "disabled"})
    assert [b.text for b in reply.content if b.type == "text"] == ["Done."]
    assert EFFORT_IN_PROMPT[family]["disabled"] in _first_prompt(family, engine, sid)
    _effort_sample(family, engine, gateway, sid, 2)


@pytest.mark.parametrize("stack", sorted(EFFORT_FAMILIES), indirect=True)
def test_effort_sessions_through_chat_responses_and_messages(stack: tuple[str, Proc, Proc]) -> None:
    family, engine, gateway = stack
    _effort_chat(family, engine, gateway)
    _effort_responses(family, engine, gateway)
    _effort_messages(family, engine, gateway)


@pytest.mark.parametrize("stack", ["inkling"], indirect=True)
def test_inkling_refuses_a_later_turn_that_changes_the_effort(
        stack: tuple[str, Proc, Proc]) -> None:
    """The effort is a system message in the first turn: changing it later would change
    the history, so a v1 session refuses it (400) and stays as it was."""
    family, engine, gateway = stack
    sid, client = _session(gateway.url)
    first = [{"role": "user", "content": "SAY hi"}]
    r = client.chat.completions.create(model="m", messages=first, reasoning_effort="low")
    follow = [*first, r.choices[0].message.model_dump(exclude_none=True),
              {"role": "user", "content": "SAY again"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=follow, reasoning_effort="high")
    assert err.value.code == "render_changed" and "reasoning_effort" in str(err.value)
    assert len(httpx.get(f"{gateway.url}/sessions/{sid}").json()["records"]) == 1
    again = client.chat.completions.create(model="m", messages=follow, reasoning_effort="low")
    assert again.choices[0].message.content == "again"
    # a turn that leaves the effort out keeps the session's: no false mismatch in the sample
    last = client.chat.completions.create(model="m", messages=[
        *follow, again.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "SAY done"}])
    assert last.choices[0].message.content == "done"
    records = httpx.get(f"{gateway.url}/sessions/{sid}").json()["records"]
    assert records[-1]["chat_template_kwargs"] == {"reasoning_effort": "low"}
    _effort_sample(family, engine, gateway, sid, 3)

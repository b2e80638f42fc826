"""End to end per family: `tito serve` + `tito mock-engine` processes, a 6-turn tool-calling
trajectory through the real openai SDK, the TITO chain checked on the ids the engine got,
and 0 strict mismatches in the collected sample. GLM runs over its documented stand-in
tokenizer (the real one is not available offline)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
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
from tito.render.families.loaders import write_standin
from tito.samples import decode_samples

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
            "deepseek_v41": None,
            "inkling": None}


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


# -- the three APIs -----------------------------------------------------------------------
THREE_APIS = {
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
WEATHER = {"city": "Paris"}


def _prompt(family: str, engine: Proc, sid: str) -> str:
    tokenizer = build_renderer(family, "standin").tokenizer
    return str(tokenizer.decode(engine_log(engine.url, sid)[0]["input_ids"]))


def _checked_sample(family: str, engine: Proc, gateway: Proc, sid: str, turns: int) -> None:
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


def _chat(family: str, engine: Proc, gateway: Proc) -> None:
    sid, client = _session(gateway.url)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"THINK plan\nCALL get_weather {json.dumps(WEATHER)}"}]
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
    assert json.loads(call["function"]["arguments"]) == WEATHER
    messages += [{"role": "assistant", "content": None, "reasoning_content": reasoning,
                  "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"], "content": "SAY Sunny."}]
    r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                       reasoning_effort="low")
    assert r.choices[0].message.content == "Sunny."
    assert EFFORT_IN_PROMPT[family]["low"] in _prompt(family, engine, sid)
    _checked_sample(family, engine, gateway, sid, 2)


def _responses(family: str, engine: Proc, gateway: Proc) -> None:
    sid, client = _session(gateway.url)
    tools: Any = [{"type": "function", "name": t["function"]["name"],
                   "parameters": t["function"]["parameters"]} for t in TOOLS]
    first: list[Any] = [{"role": "user", "content": "THINK plan\nCALL get_weather "
                         f"{json.dumps(WEATHER)}\nCALL calculator {{\"expression\": \"1+1\"}}"}]
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
    assert EFFORT_IN_PROMPT[family]["xhigh"] in _prompt(family, engine, sid)
    _checked_sample(family, engine, gateway, sid, 2)


def _messages(family: str, engine: Proc, gateway: Proc) -> None:
    sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
    client = anthropic.Anthropic(base_url=f"{gateway.url}/sessions/{sid}", api_key="x",
                                 max_retries=0)
    tools: Any = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                  for t in TOOLS]
    history: list[Any] = [{"role": "user", "content": f"CALL get_weather {json.dumps(WEATHER)}"}]
    reply = client.messages.create(model="m", max_tokens=256, messages=history, tools=tools,
                                   thinking={"type": "disabled"})
    use = next(b for b in reply.content if b.type == "tool_use")
    assert reply.stop_reason == "tool_use" and use.input == WEATHER
    history += [{"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": "SAY Done."}]}]
    reply = client.messages.create(model="m", max_tokens=256, messages=history, tools=tools,
                                   thinking={"type": "disabled"})
    assert [b.text for b in reply.content if b.type == "text"] == ["Done."]
    assert EFFORT_IN_PROMPT[family]["disabled"] in _prompt(family, engine, sid)
    _checked_sample(family, engine, gateway, sid, 2)


def test_sessions_through_chat_responses_and_messages(stack: tuple[str, Proc, Proc]) -> None:
    family, engine, gateway = stack
    if family not in THREE_APIS:
        pytest.skip(f"{family}: its three-API sessions run in the API test modules")
    _chat(family, engine, gateway)
    _responses(family, engine, gateway)
    _messages(family, engine, gateway)


def test_inkling_refuses_a_later_turn_that_changes_the_effort(
        stack: tuple[str, Proc, Proc]) -> None:
    """The effort is a system message in the first turn: changing it later would change
    the history, so a v1 session refuses it (400) and stays as it was."""
    family, engine, gateway = stack
    if family != "inkling":
        pytest.skip("inkling only")
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
    _checked_sample(family, engine, gateway, sid, 3)

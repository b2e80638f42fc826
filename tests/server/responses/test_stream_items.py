"""Responses streaming and the items a client echoes back (real ``tito serve`` + ``tito
mock-engine``, the real ``openai`` SDK).

A client that rebuilds each turn from the stream events (Codex, LangChain: the items of
``response.output_item.done``, in the order they arrive) and one that echoes the
response's ``output`` send the same history: the samples are byte for byte the same and
carry no strict mismatch, also when the model thinks nothing before a call (the empty
reasoning item is streamed first, as the response lists it). Whatever the order of a
turn's echoed items, its reasoning folds into that turn.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import openai
import pytest
from helpers.scripted import WEATHER_TOOLS
from helpers.support import assert_tito_chain, engine_log, new_session

from tito.samples import decode_samples
from tito.samples.sample import Sample, samples_identical
from tito.types.mismatch import STRICT_TYPES

TOOLS = [{"type": "function", "name": t["function"]["name"],
          "description": t["function"]["description"],
          "parameters": t["function"]["parameters"], "strict": False}
         for t in WEATHER_TOOLS]
TURNS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": 'Weather?\nCALL get_weather {"city": "Paris"}'}],
    [{"type": "function_call_output", "output": "sunny\nSAY Sunny in Paris."}],
    [{"role": "user", "content": 'And two more?\nCALL get_weather {"city": "Oslo"}\n'
                                 'CALL get_weather {"city": "Rome"}'}],
    [{"type": "function_call_output", "output": "snow"},
     {"type": "function_call_output", "output": "warm\nTHINK compare them\nSAY Done."}],
    [{"role": "user", "content": "THINK one more\nCALL get_weather {\"city\": \"Bern\"}"}],
    [{"type": "function_call_output", "output": "fog\nSAY Bye."}],
]
"""Calls without reasoning (one, then two parallel), a text answer, and a call after
reasoning. A ``function_call_output`` without ``call_id`` answers the previous turn's
calls in order."""


def client_for(url: str, sid: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x",
                              max_retries=0)


def samples_of(url: str, sid: str) -> list[Sample]:
    resp = httpx.post(f"{url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    return decode_samples(resp.content).samples


def comparable(sample: Sample) -> Sample:
    """Less what differs between two sessions of one gateway."""
    metadata = {k: v for k, v in sample.metadata.items()
                if k not in ("session_id", "lifecycle")}
    return dataclasses.replace(sample, metadata=metadata, prefix_cache_info=None)


async def streamed_turn(client: openai.AsyncOpenAI, history: list[Any]
                        ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One streamed turn: (the items of ``response.output_item.done`` in arrival order,
    the ``response.completed`` response)."""
    items: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    stream = await client.responses.create(model="m", input=history, tools=TOOLS,  # type: ignore[arg-type]
                                           stream=True)
    async for event in stream:
        if event.type == "response.output_item.done":
            assert event.output_index == len(items)  # announced in the order it is sent
            items.append(event.item.model_dump(exclude_none=True))
        elif event.type == "response.completed":
            final = event.response.model_dump(exclude_none=True)
    return items, final


async def run(client: openai.AsyncOpenAI, *, stream: bool) -> list[list[dict[str, Any]]]:
    """:data:`TURNS`, the history rebuilt from the stream events (``stream``) or from each
    response's ``output``; the output items of every turn."""
    history: list[Any] = []
    outputs: list[list[dict[str, Any]]] = []
    for new in TURNS:
        calls = [i for i in (outputs[-1] if outputs else []) if i["type"] == "function_call"]
        history += [{**item, "call_id": calls[i]["call_id"]}
                    if item.get("type") == "function_call_output" else item
                    for i, item in enumerate(new)]
        if stream:
            items, final = await streamed_turn(client, history)
            assert items == final["output"]  # item for item, ids included
        else:
            reply = await client.responses.create(model="m", input=history, tools=TOOLS)  # type: ignore[arg-type]
            items = [item.model_dump(exclude_none=True) for item in reply.output]
        history += items
        outputs.append(items)
    return outputs


async def test_stream_rebuilt_history_gives_the_same_samples(stack: Any) -> None:
    engine, gateway = stack
    plain_sid, streamed_sid = new_session(gateway.url), new_session(gateway.url)
    plain = await run(client_for(gateway.url, plain_sid), stream=False)
    streamed = await run(client_for(gateway.url, streamed_sid), stream=True)
    assert [[i["type"] for i in turn] for turn in streamed] == \
        [[i["type"] for i in turn] for turn in plain]
    assert [i["type"] for i in plain[0]] == ["reasoning", "function_call"]
    assert plain[0][0]["summary"] == []  # nothing thought: the empty reasoning item first
    for sid in (plain_sid, streamed_sid):
        records = httpx.get(f"{gateway.url}/sessions/{sid}").json()["records"]
        assert [r["rolled_back"] for r in records] == [0] * len(TURNS)
        assert_tito_chain(engine_log(engine.url, sid))
    (a,), (b,) = samples_of(gateway.url, plain_sid), samples_of(gateway.url, streamed_sid)
    assert samples_identical(comparable(a), comparable(b))
    for sample in (a, b):
        assert [m for m in sample.metadata["tito_session_mismatch"]
                if m["type"] in STRICT_TYPES] == []


CALL_ONLY = 'THINK hm\nCALL get_weather {"city": "Paris"}'
TEXT_AND_CALL = 'THINK hm\nSAY Let me look.\nCALL get_weather {"city": "Paris"}'


@pytest.mark.parametrize(("text", "order"), [
    (CALL_ONLY, ["reasoning", "function_call"]),
    (CALL_ONLY, ["function_call", "reasoning"]),
    (TEXT_AND_CALL, ["message", "reasoning", "function_call"]),
    (TEXT_AND_CALL, ["message", "function_call", "reasoning"]),
    (TEXT_AND_CALL, ["reasoning", "message", "function_call"]),
])
async def test_echoed_reasoning_folds_into_its_turn(stack: Any, text: str,
                                                    order: list[str]) -> None:
    """The first turn's items echoed in any order: one assistant message, the one the
    session stored, so the second turn extends the first (nothing rolled back)."""
    _, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    first_input = [{"role": "user", "content": text}]
    first = await client.responses.create(model="m", input=first_input, tools=TOOLS)  # type: ignore[arg-type]
    by_type = {item.type: item.model_dump(exclude_none=True) for item in first.output}
    assert sorted(by_type) == sorted(order)
    second = await client.responses.create(model="m", tools=TOOLS, input=[  # type: ignore[arg-type]
        *first_input, *(by_type[kind] for kind in order),
        {"type": "function_call_output", "call_id": by_type["function_call"]["call_id"],
         "output": "SAY ok"}])
    assert second.output_text == "ok"
    state = httpx.get(f"{gateway.url}/sessions/{sid}",
                      params={"include_messages": "true"}).json()
    assert [r["rolled_back"] for r in state["records"]] == [0, 0]
    assert [m["role"] for m in state["messages"]] == ["user", "assistant", "tool", "assistant"]


@pytest.mark.parametrize("text", ["Go on.\nLONG 40", "Go on.\nSAY a b c d e f g h i j k l",
                                  "SAY"])
async def test_every_streamed_turn_lists_the_responses_items(stack: Any, text: str) -> None:
    """Cut by the length limit, or a turn with nothing to say: the items of
    ``response.output_item.done`` are the final response's output."""
    _, gateway = stack
    client = client_for(gateway.url, new_session(gateway.url))
    items: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    stream = await client.responses.create(model="m", input=text, max_output_tokens=8,
                                           stream=True)
    async for event in stream:
        if event.type == "response.output_item.done":
            assert event.output_index == len(items)
            items.append(event.item.model_dump(exclude_none=True))
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response.model_dump(exclude_none=True)
    assert items == final["output"] and items

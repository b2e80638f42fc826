"""Idempotent streamed turns, on all three doors, v1 and v2, with real processes (the mock
engine and ``tito serve``): a retried stream — the SDKs' own retry after a connection
dropped once the turn was committed, or the same ``Idempotency-Key`` — replays the
committed turn in the API's own events; one engine request per key, the same sample as a
turn sent once; a retry that arrives while the turn runs waits for it; a v2 session
tracks every concurrent turn."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from helpers.dropping_proxy import DROP_AFTER, FORWARD, DroppingProxy, Exchange
from helpers.support import Proc, bare_sample, engine_log, start_gateway

from tito.samples.sample import samples_identical

pytestmark = pytest.mark.slow  # real processes per case (fast tier: under a minute)

DOORS = {"chat": "/v1/chat/completions", "messages": "/v1/messages",
         "responses": "/v1/responses"}


@pytest.fixture(scope="module")
def v2_gateway(qwen3_stack: tuple[Proc, Proc], qwen3_dir: Path) -> Iterator[Proc]:
    engine, _ = qwen3_stack
    gateway = start_gateway(engine.url, qwen3_dir, "qwen3", "--session-version", "v2")
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(params=["v1", "v2"])
def gateways(request: pytest.FixtureRequest, stack: tuple[Proc, Proc]) -> tuple[Proc, Proc]:
    """(mock engine, gateway of that session version); the engine's log cleared."""
    engine, v1 = stack
    return (engine, v1) if request.param == "v1" else \
        (engine, request.getfixturevalue("v2_gateway"))


def body_of(door: str, text: str, **extra: Any) -> dict[str, Any]:
    if door == "responses":
        return {"model": "m", "input": text, **extra}
    body = {"model": "m", "messages": [{"role": "user", "content": text}], **extra}
    return {**body, "max_tokens": 64} if door == "messages" else body


def events_of(sse: str) -> list[dict[str, Any]]:
    """The JSON events of a stream (Chat's chunks, typed ``chunk``)."""
    out = []
    for line in sse.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            event = orjson.loads(line[6:])
            out.append(event if "type" in event else {"type": "chunk", **event})
    return out


def shape(events: list[dict[str, Any]]) -> list[str]:
    """The event types, runs of one type counted once (deltas are cut differently)."""
    types = [e["type"] for e in events]
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def summary(door: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What a streamed turn said: its response id, text and ending."""
    if door == "chat":
        return {"id": {e["id"] for e in events},
                "text": "".join(c["delta"].get("content") or "" for e in events
                                for c in e["choices"]),
                "finish": [c["finish_reason"] for e in events for c in e["choices"]
                           if c["finish_reason"]]}
    if door == "messages":
        return {"id": events[0]["message"]["id"],
                "text": "".join(e["delta"].get("text", "") for e in events
                                if e["type"] == "content_block_delta"),
                "finish": [e["delta"]["stop_reason"] for e in events
                           if e["type"] == "message_delta"]}
    (done,) = [e["response"] for e in events if e["type"] == "response.completed"]
    return {"id": done["id"], "output": done["output"], "usage": done["usage"],
            "text": "".join(e["delta"] for e in events
                            if e["type"] == "response.output_text.delta")}


async def stream_turn(http: httpx.AsyncClient, url: str, door: str, body: dict[str, Any],
                      **headers: str) -> tuple[int, list[dict[str, Any]]]:
    async with http.stream("POST", url + DOORS[door], json={**body, "stream": True},
                           headers=headers) as resp:
        text = (await resp.aread()).decode()
    return resp.status_code, events_of(text) if resp.status_code == 200 else []


async def same_sample_as_once(gateway: Proc, sid: str, door: str, text: str) -> bool:
    """Whether ``sid``'s sample is bit for bit that of a session that ran the same turn
    once, unstreamed, directly."""
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        once = (await http.post("/sessions")).json()["session_id"]
        resp = await http.post(f"/sessions/{once}{DOORS[door]}", json=body_of(door, text))
        assert resp.status_code == 200, resp.text
    return samples_identical(await asyncio.to_thread(bare_sample, gateway.url, sid),
                             await asyncio.to_thread(bare_sample, gateway.url, once))


def new_sid(gateway: Proc) -> str:
    return str(httpx.post(gateway.url + "/sessions").json()["session_id"])


# -- the SDKs' own retry of a stream whose answer was lost ---------------------------------
def drop_first_turn(exchange: Exchange, proxy: list[DroppingProxy]) -> str:
    """The first turn request is run, then its answer dropped with the connection."""
    turns = [e for e in proxy[0].exchanges if e.path.endswith(tuple(DOORS.values()))]
    return DROP_AFTER if exchange.path.endswith(tuple(DOORS.values())) and not turns \
        else FORWARD


async def sdk_stream(door: str, base: str, text: str) -> dict[str, Any]:
    """A streamed turn through the real SDK (max_retries=2): its summary."""
    if door == "messages":
        claude = anthropic.AsyncAnthropic(base_url=base, api_key="x", max_retries=2)
        async with claude:
            stream = await claude.messages.create(model="m", max_tokens=64, stream=True,
                                                  messages=[{"role": "user", "content": text}])
            events = [e.model_dump() async for e in stream]
        return summary(door, events)
    sdk = openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=2)
    async with sdk:
        if door == "chat":
            chat = await sdk.chat.completions.create(
                model="m", stream=True, messages=[{"role": "user", "content": text}])
            events = [{"type": "chunk", **c.model_dump()} async for c in chat]
        else:
            responses = await sdk.responses.create(model="m", input=text, stream=True)
            events = [e.model_dump() async for e in responses]
    return summary(door, events)


@pytest.mark.parametrize("door", list(DOORS))
async def test_an_sdk_retry_of_a_lost_stream_replays_the_committed_turn(
        gateways: tuple[Proc, Proc], door: str) -> None:
    engine, gateway = gateways
    text = f"SAY streamed through {door}"
    holder: list[DroppingProxy] = []
    async with DroppingProxy(gateway.url, lambda e: drop_first_turn(e, holder)) as proxy:
        holder.append(proxy)
        sid = new_sid(gateway)
        got = await sdk_stream(door, f"{proxy.url}/sessions/{sid}", text)
    first, retry = [e for e in proxy.exchanges if e.method == "POST"]
    assert (first.action, retry.action) == (DROP_AFTER, FORWARD)
    assert retry.headers["x-stainless-retry-count"] == "1"
    assert got["text"] == f"streamed through {door}"
    # one generation: the retry got the committed turn, as its own API streams it
    assert len(engine_log(engine.url, sid)) == 1
    assert await same_sample_as_once(gateway, sid, door, text)
    metrics = httpx.get(gateway.url + "/metrics").text
    assert "tito_idempotent_replays_total 0" not in metrics


# -- Idempotency-Key -----------------------------------------------------------------------
@pytest.mark.parametrize("door", list(DOORS))
async def test_an_idempotency_key_replays_a_stream(gateways: tuple[Proc, Proc],
                                                   door: str) -> None:
    engine, gateway = gateways
    sid = new_sid(gateway)
    url = f"{gateway.url}/sessions/{sid}"
    text = 'CALL lookup {"q": "tito"}'
    body = body_of(door, text)
    async with httpx.AsyncClient() as http:
        status, first = await stream_turn(http, url, door, body, **{"idempotency-key": "k"})
        again_status, again = await stream_turn(http, url, door, body,
                                                **{"idempotency-key": "k"})
        # the same key with another body is refused, and changes nothing
        other, _ = await stream_turn(http, url, door, body_of(door, "SAY x"),
                                     **{"idempotency-key": "k"})
    assert status == again_status == 200 and other == 422
    assert summary(door, again) == summary(door, first)
    assert shape(again) == shape(first)  # the API's own events, in the same order
    assert len(engine_log(engine.url, sid)) == 1
    assert await same_sample_as_once(gateway, sid, door, text)


# -- a retry while the turn runs; v2's concurrent turns -------------------------------------
async def held_turns(http: httpx.AsyncClient) -> int:
    metrics = (await http.get("/metrics")).text
    lines = [x for x in metrics.splitlines() if x.startswith("tito_turns_held_total ")]
    return int(float(lines[0].split()[1])) if lines else 0  # exported from the first


async def until_held(http: httpx.AsyncClient, n: int) -> None:
    """Until ``n`` turns are held by the paused engine (planned, registered, waiting)."""
    while await held_turns(http) < n:
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("door", ["chat", *(pytest.param(d, marks=pytest.mark.slow)
                                             for d in ("messages", "responses"))])
async def test_a_stream_retry_waits_for_the_running_turn(gateways: tuple[Proc, Proc],
                                                         door: str) -> None:
    engine, gateway = gateways
    sid = new_sid(gateway)
    url = f"{gateway.url}/sessions/{sid}"
    body = body_of(door, "SAY waited for")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
        held = await held_turns(http)
        assert (await http.post("/pause_generation", json={})).status_code == 200
        try:
            first = asyncio.create_task(stream_turn(http, url, door, body,
                                                    **{"x-stainless-retry-count": "0"}))
            await until_held(http, held + 1)
            retry = asyncio.create_task(stream_turn(http, url, door, body,
                                                    **{"x-stainless-retry-count": "1"}))
            await asyncio.sleep(0.2)
            assert not retry.done()  # waiting for the first, not refused (409)
            assert await held_turns(http) == held + 1  # and not a second turn
        finally:
            assert (await http.post("/continue_generation", json={})).status_code == 200
        (status, a), (again, b) = await first, await retry
    assert status == again == 200 and summary(door, a) == summary(door, b)
    assert len(engine_log(engine.url, sid)) == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_v2_tracks_every_concurrent_turn(qwen3_stack: tuple[Proc, Proc],
                                               v2_gateway: Proc, stream: bool) -> None:
    """Three branches run at once, each with its key: each retry (while they run, and
    after) gets its own branch's answer; three engine requests in all."""
    engine, _ = qwen3_stack
    sid = new_sid(v2_gateway)
    url = f"{v2_gateway.url}/sessions/{sid}"
    bodies = [body_of("chat", f"SAY branch {i}") for i in range(3)]

    async def send(http: httpx.AsyncClient, i: int) -> Any:
        key = {"idempotency-key": f"branch-{i}"}
        if stream:
            status, events = await stream_turn(http, url, "chat", bodies[i], **key)
            assert status == 200
            return summary("chat", events)
        resp = await http.post(url + DOORS["chat"], json=bodies[i], headers=key)
        assert resp.status_code == 200, resp.text
        return resp.json()

    async with httpx.AsyncClient(base_url=v2_gateway.url, timeout=60) as http:
        held = await held_turns(http)
        assert (await http.post("/pause_generation", json={})).status_code == 200
        try:
            firsts = [asyncio.create_task(send(http, i)) for i in range(3)]
            await until_held(http, held + 3)
            retries = [asyncio.create_task(send(http, i)) for i in range(3)]
            await asyncio.sleep(0.2)
            assert not any(t.done() for t in retries)
        finally:
            assert (await http.post("/continue_generation", json={})).status_code == 200
        answers = await asyncio.gather(*firsts)
        assert await asyncio.gather(*retries) == answers
        assert [await send(http, i) for i in range(3)] == answers  # remembered, all three
    texts = [a["text"] if stream else a["choices"][0]["message"]["content"]
             for a in answers]
    assert texts == [f"branch {i}" for i in range(3)]
    assert len(engine_log(engine.url, sid)) == 3

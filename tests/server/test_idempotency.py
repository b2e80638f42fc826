"""Idempotent retries: an SDK retry or a repeated Idempotency-Key gets the answer of the
turn it repeats (waiting for it if it still runs); nothing is generated twice."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import new_session

from tito.net import AppServer, bind_tcp
from tito.server.app import create_app
from tito.server.idempotency import RetryKey, TurnReplies
from tito.types.errors import EngineError

BODY = {"messages": [{"role": "user", "content": "hello"}]}
RETRY = {"x-stainless-retry-count": "1"}


async def post(http: httpx.AsyncClient, sid: str, body: dict[str, Any] = BODY,
               **headers: str) -> httpx.Response:
    return await http.post(f"/sessions/{sid}/v1/chat/completions", json=body,
                           headers=headers)


async def turns(http: httpx.AsyncClient, sid: str) -> int:
    return int((await http.get(f"/sessions/{sid}")).json()["metadata"]["num_turns"])


async def test_sdk_retry_of_an_answered_turn_gets_the_same_answer(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script("first", "second")
    sid = await new_session(client)
    first = await post(client, sid)
    again = await post(client, sid, **RETRY)
    assert again.status_code == 200 and again.json() == first.json()
    assert len(engine.calls) == 1 and await turns(client, sid) == 1
    # the same body without the retry header is a new request (a retry of the turn by the
    # agent itself): it is generated again, rolling the turn back
    fresh = await post(client, sid)
    assert fresh.json()["choices"][0]["message"]["content"] == "second"
    assert len(engine.calls) == 2 and await turns(client, sid) == 1
    metrics = (await client.get("/metrics")).text
    assert "tito_idempotent_replays_total 1" in metrics


async def test_idempotency_key(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    sid = await new_session(client)
    first = await post(client, sid, **{"idempotency-key": "k1"})
    again = await post(client, sid, **{"idempotency-key": "k1"})
    assert again.json() == first.json() and len(engine.calls) == 1
    other = await post(client, sid, {"messages": [{"role": "user", "content": "else"}]},
                       **{"idempotency-key": "k1"})
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"


async def test_a_retry_of_a_running_turn_waits_for_it(client: httpx.AsyncClient,
                                                      engine: FakeEngine) -> None:
    sid = await new_session(client)
    engine.gate = asyncio.Event()
    first = asyncio.create_task(post(client, sid))
    while not engine.calls:
        await asyncio.sleep(0.001)
    retry = asyncio.create_task(post(client, sid, **RETRY))
    other = await post(client, sid, {"messages": [{"role": "user", "content": "x"}]})
    assert other.status_code == 409  # not a retry: the session is busy
    await asyncio.sleep(0.01)
    assert not retry.done()
    engine.gate.set()
    a, b = await first, await retry
    assert a.status_code == b.status_code == 200 and a.json() == b.json()
    assert len(engine.calls) == 1 and await turns(client, sid) == 1


async def test_a_retry_of_a_failed_turn_runs_again(client: httpx.AsyncClient,
                                                   engine: FakeEngine) -> None:
    sid = await new_session(client)
    engine.script(EngineError("down"), "recovered")
    assert (await post(client, sid)).status_code == 502
    again = await post(client, sid, **RETRY)
    assert again.json()["choices"][0]["message"]["content"] == "recovered"
    assert len(engine.calls) == 2 and await turns(client, sid) == 1


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
async def test_sdk_timeout_and_retry_end_to_end(make_gateway: Any, stream: bool) -> None:
    """The real openai SDK times out on a slow turn and retries: the first request is
    aborted on the engine (its client left), the retry is served — no 409."""
    gateway = make_gateway()
    engine: FakeEngine = gateway.engine
    engine.gate = asyncio.Event()
    server = AppServer(create_app(gateway), bind_tcp("127.0.0.1", 0))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
        sdk = openai.AsyncOpenAI(base_url=f"{server.url}/sessions/{sid}/v1", api_key="x",
                                 max_retries=1, timeout=0.5)

        async def open_gate_on_retry() -> None:
            while len(engine.calls) < 2:
                await asyncio.sleep(0.01)
            assert engine.gate is not None
            engine.gate.set()

        opener = asyncio.create_task(open_gate_on_retry())
        reply = await sdk.chat.completions.create(model="m", stream=stream,
                                                  messages=BODY["messages"])  # type: ignore
        if stream:
            chunks = [c async for c in reply]  # type: ignore[union-attr]
            assert "".join(c.choices[0].delta.content or "" for c in chunks
                           if c.choices) == "ok"
        else:
            assert reply.choices[0].message.content == "ok"  # type: ignore[union-attr]
        await opener
        assert engine.aborted == [engine.calls[0].rid]
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert await turns(http, sid) == 1
        await sdk.close()
    finally:
        await server.stop()


def retry_key(body: bytes, key: str | None = None, sdk_retry: bool = False) -> RetryKey:
    return RetryKey(key, (len(body), "/r", hash(body)), sdk_retry)


async def test_a_retry_waiting_for_a_cancelled_turn_runs_anew() -> None:
    """The turn it waits for is cancelled (its client left): the retry gets None (run it
    as a new turn), not the other request's cancellation."""
    replies = TurnReplies()
    first = retry_key(b"a", "k")
    running = replies.start(first)
    waiting = asyncio.create_task(replies.replay(retry_key(b"a", "k")))
    await asyncio.sleep(0)
    replies.finish(first, running, None, asyncio.CancelledError())
    assert await waiting is None and replies.running == []


async def test_every_concurrent_turn_is_tracked_and_remembered() -> None:
    """Three turns at once (a v2 session): each retry waits for its own, and all three
    answers are remembered after; a v1 session (one at a time) remembers its last."""
    replies = TurnReplies()
    keys = [retry_key(b"%d" % i, f"k{i}") for i in range(3)]
    futures = [replies.start(k) for k in keys]
    waiting = [asyncio.create_task(replies.replay(retry_key(b"%d" % i, f"k{i}")))
               for i in range(3)]
    for i in (2, 0, 1):
        replies.finish(keys[i], futures[i], f"answer {i}", None)
    assert await asyncio.gather(*waiting) == ["answer 0", "answer 1", "answer 2"]
    assert [await replies.replay(k) for k in keys] == ["answer 0", "answer 1", "answer 2"]
    one = TurnReplies()
    for i in range(3):
        one.finish(keys[i], one.start(keys[i]), f"answer {i}", None)
    assert [await one.replay(k) for k in keys] == [None, None, "answer 2"]

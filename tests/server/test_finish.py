"""The reference framework's newer session contract on the gateway: ``POST /sessions``
options (sampling defaults, ``evaluation``), the finish lifecycle (finish -> samples with
the snapshot id -> delete), ``input_ids`` refused, ``X-Miles-Idempotency-Key`` and
``X-Miles-Generation-Id``. Bad input is a 4xx that leaves the session as it was."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from helpers.fakes import FakeEngine
from helpers.inproc import new_session

from tito.samples import decode_samples

BODY = {"messages": [{"role": "user", "content": "hello"}]}


async def chat(http: httpx.AsyncClient, sid: str, body: dict[str, Any] = BODY,
               **headers: str) -> httpx.Response:
    return await http.post(f"/sessions/{sid}/v1/chat/completions", json=body,
                           headers=headers)


async def view(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    return dict((await http.get(f"/sessions/{sid}")).json()["metadata"])


async def test_session_sampling_defaults_fill_only_what_a_request_leaves_out(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    resp = await client.post("/sessions", json={"temperature": 0.3, "top_p": 0.9,
                                                "top_k": 20, "evaluation": True})
    assert resp.status_code == 200
    created = resp.json()
    assert created["evaluation"] is True
    assert created["sampling_defaults"] == {"temperature": 0.3, "top_p": 0.9, "top_k": 20}
    sid = created["session_id"]
    await chat(client, sid)
    params = engine.calls[-1].params
    assert (params.temperature, params.top_p, params.top_k) == (0.3, 0.9, 20)
    await chat(client, sid, {**BODY, "temperature": 1.5, "top_k": 5})
    params = engine.calls[-1].params
    assert (params.temperature, params.top_p, params.top_k) == (1.5, 0.9, 5)
    meta = await view(client, sid)
    assert meta["evaluation"] is True and meta["sampling_defaults"]["top_k"] == 20


async def test_a_bad_session_body_is_a_400_and_creates_nothing(
        client: httpx.AsyncClient) -> None:
    before = (await client.get("/health")).json()["sessions"]
    for body in ({"temperature": 3}, {"top_k": 0}, {"evaluation": "yes"}, {"seed": 1}, [1]):
        resp = await client.post("/sessions", json=body)
        assert resp.status_code == 400, body
        assert resp.json()["error"]["code"] == "invalid_request"
    assert (await client.get("/health")).json()["sessions"] == before
    plain = await client.post("/sessions")  # no body: the older contract
    assert plain.status_code == 200 and set(plain.json()) == {"session_id"}


async def test_input_ids_from_the_client_are_refused(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    sid = await new_session(client)
    resp = await chat(client, sid, {**BODY, "input_ids": [1, 2, 3]})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "gateway_owned_field"
    assert engine.calls == [] and (await view(client, sid))["num_turns"] == 0


async def test_finish_then_samples_then_delete(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    sid = await new_session(client)
    turn = await chat(client, sid)
    assert turn.headers["x-miles-generation-id"] == turn.json()["id"]
    old = await client.post(f"/sessions/{sid}/samples", json={})  # the older lifecycle
    finished = await client.post(f"/sessions/{sid}/finish",
                                 json={"producer_finished": True, "timeout": 5})
    assert finished.status_code == 200
    reply = finished.json()
    assert reply["complete"] is True and reply["unfinished_requests"] == 0
    assert reply["snapshot_id"].startswith("snap_") and reply["num_turns"] == 1
    again = await client.post(f"/sessions/{sid}/finish",
                              json={"producer_finished": True, "timeout": 5})
    assert again.json() == reply  # idempotent
    conflict = await client.post(f"/sessions/{sid}/finish", json={"timeout": 1})
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "finish_conflict"

    refused = await chat(client, sid, {"messages": [*BODY["messages"],
                                                    turn.json()["choices"][0]["message"],
                                                    {"role": "user", "content": "more"}]})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "session_finished"

    body = {"snapshot_id": reply["snapshot_id"], "max_seq_len": 4096, "metadata": {"r": 1}}
    first = await client.post(f"/sessions/{sid}/samples", json=body)
    assert first.status_code == 200
    decoded = decode_samples(first.content)
    assert decoded.empty_reason is None and len(decoded.samples) == 1
    before = decode_samples(old.content).samples[0]
    assert decoded.samples[0].tokens.tolist() == before.tokens.tolist()
    retry = await client.post(f"/sessions/{sid}/samples", json=body)
    assert retry.content == first.content  # the first export, kept
    other = await client.post(f"/sessions/{sid}/samples", json={**body, "max_seq_len": 8})
    assert other.status_code == 409 and other.json()["error"]["code"] == "export_conflict"
    unknown = await client.post(f"/sessions/{sid}/samples", json={"snapshot_id": "snap_x"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "unknown_snapshot"
    assert (await client.delete(f"/sessions/{sid}")).status_code == 204


async def test_a_bad_finish_is_a_400_and_leaves_the_session_open(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    sid = await new_session(client)
    for body in ({"timeout": 91}, {"timeout": -1}, {"producer_finished": 1}, {"x": 1}):
        resp = await client.post(f"/sessions/{sid}/finish", json=body)
        assert resp.status_code == 400, body
    assert "finish" not in await view(client, sid)
    assert (await chat(client, sid)).status_code == 200  # still admits turns
    missing = await client.post("/sessions/nope/finish", json={})
    assert missing.status_code == 404


async def test_an_unfinished_producer_gives_an_incomplete_snapshot(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    sid = await new_session(client)
    await chat(client, sid)
    reply = (await client.post(f"/sessions/{sid}/finish",
                               json={"producer_finished": False})).json()
    assert reply["complete"] is False
    got = await client.post(f"/sessions/{sid}/samples",
                            json={"snapshot_id": reply["snapshot_id"]})
    decoded = decode_samples(got.content)
    assert decoded.samples == [] and decoded.empty_reason == "incomplete"


async def test_finish_waits_for_admitted_turns_and_times_out_on_late_ones(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    sid = await new_session(client)
    engine.gate = asyncio.Event()
    running = asyncio.create_task(chat(client, sid))
    while not engine.calls:
        await asyncio.sleep(0.01)
    finishing = asyncio.create_task(client.post(f"/sessions/{sid}/finish", json={}))
    await asyncio.sleep(0.05)
    assert not finishing.done()  # waiting for the admitted turn
    engine.gate.set()
    assert (await running).status_code == 200
    reply = (await finishing).json()
    assert reply["complete"] is True and reply["num_turns"] == 1

    late = await new_session(client)
    engine.gate = asyncio.Event()
    hung = asyncio.create_task(chat(client, late))
    while len(engine.calls) < 2:
        await asyncio.sleep(0.01)
    timed_out = (await client.post(f"/sessions/{late}/finish", json={"timeout": 0})).json()
    assert timed_out["complete"] is False and timed_out["unfinished_requests"] == 1
    engine.gate.set()
    await hung
    got = await client.post(f"/sessions/{late}/samples",
                            json={"snapshot_id": timed_out["snapshot_id"]})
    assert decode_samples(got.content).empty_reason == "incomplete"


async def test_x_miles_idempotency_key_replays_even_after_finish(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    sid = await new_session(client)
    key = {"x-miles-idempotency-key": "gen-1"}
    first = await chat(client, sid, **key)
    await client.post(f"/sessions/{sid}/finish", json={})
    again = await chat(client, sid, **key)
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["x-miles-generation-id"] == first.headers["x-miles-generation-id"]
    assert len(engine.calls) == 1


async def test_a_streamed_reply_names_its_generation(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    sid = await new_session(client)
    async with client.stream("POST", f"/sessions/{sid}/v1/chat/completions",
                             json={**BODY, "stream": True}) as resp:
        assert resp.status_code == 200
        generation = resp.headers["x-miles-generation-id"]
        text = "".join([chunk async for chunk in resp.aiter_text()])
    assert f'"id":"{generation}"' in text.replace(" ", "")

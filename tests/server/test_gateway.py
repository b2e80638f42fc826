"""The gateway service directly (no HTTP): turns, clamping, deletion mid-turn, samples."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers.fakes import FakeEngine

from tito.samples import decode_samples
from tito.server.gateway import Gateway
from tito.server.samples import samples_payload
from tito.types.engine import SamplingParams
from tito.types.errors import BadRequest, EngineError
from tito.types.messages import TurnRequest

USER = [{"role": "user", "content": "hello"}]


def fake(gateway: Gateway) -> FakeEngine:
    assert isinstance(gateway.engine, FakeEngine)
    return gateway.engine


async def test_turns_commit_and_extend_the_snapshot(gateway: Gateway) -> None:
    session = gateway.store.create()
    fake(gateway).script("one", "two")
    first = await gateway.run_turn(session, TurnRequest(list(USER)), SamplingParams())
    assert first.parsed.content == "one" and first.record is not None
    history = [*USER, first.parsed.to_message(), {"role": "user", "content": "more"}]
    second = await gateway.run_turn(session, TurnRequest(history), SamplingParams())
    calls = fake(gateway).calls
    assert calls[1].input_ids[: first.record.checkpoint_len] == \
        [*calls[0].input_ids, *first.result.output_ids]
    assert second.prompt_tokens == len(calls[1].input_ids)
    assert session.num_tokens == second.prompt_tokens + len(second.result.output_ids)
    assert gateway.metrics.counters["turns_total"] == 2


async def test_max_tokens_is_clamped_to_max_seq_len(make_gateway: Any) -> None:
    gateway: Gateway = make_gateway(max_seq_len=40)
    session = gateway.store.create()
    outcome = await gateway.run_turn(session, TurnRequest(list(USER)),
                                     SamplingParams(max_new_tokens=1000))
    assert fake(gateway).calls[0].params.max_new_tokens == 40 - outcome.prompt_tokens
    with pytest.raises(BadRequest, match="--max-seq-len") as info:
        await gateway.run_turn(gateway.store.create(),
                               TurnRequest([{"role": "user", "content": "word " * 60}]),
                               SamplingParams())
    assert info.value.code == "context_length_exceeded"


async def test_engine_failure_releases_the_session(gateway: Gateway) -> None:
    session = gateway.store.create()
    fake(gateway).script(EngineError("down"))
    with pytest.raises(EngineError):
        await gateway.run_turn(session, TurnRequest(list(USER)), SamplingParams())
    assert not session.in_flight and session.records == [] and session.messages == []
    outcome = await gateway.run_turn(session, TurnRequest(list(USER)), SamplingParams())
    assert outcome.record is not None and len(session.records) == 1


async def test_session_deleted_during_the_turn_gets_its_reply_and_stores_nothing(
        gateway: Gateway) -> None:
    session = gateway.store.create()
    engine = fake(gateway)
    engine.gate = asyncio.Event()
    turn = asyncio.create_task(gateway.run_turn(session, TurnRequest(list(USER)),
                                                SamplingParams()))
    while not engine.calls:
        await asyncio.sleep(0.001)
    during = decode_samples(await samples_payload(gateway, session, None, None))
    assert during.samples == [] and during.empty_reason == "no_records"
    assert during.session_metadata["turn_in_progress"] is True
    gateway.store.delete(session.session_id)
    engine.gate.set()
    outcome = await turn
    assert outcome.parsed.content == "ok" and outcome.record is None
    assert session.records == [] and not session.in_flight


async def test_samples_payload_carries_session_metadata(gateway: Gateway) -> None:
    session = gateway.store.create()
    await gateway.run_turn(session, TurnRequest(list(USER)), SamplingParams())
    decoded = decode_samples(await samples_payload(gateway, session, None, {"task": "t1"}))
    [sample] = decoded.samples
    assert sample.metadata["task"] == "t1" and sample.weight_versions == ["w0"]
    assert decoded.session_metadata["num_turns"] == 1
    assert decoded.session_metadata["tito_session_mismatch"] == []

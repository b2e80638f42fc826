"""A failed turn leaves the session exactly as it was: failures injected at every step of
``Gateway.run_turn`` (engine, output check, parse, record, snapshot allocation), for a
first turn, an extension and a retry that rolls back — then the session still works."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers.fakes import FakeEngine

from tito.server.gateway import Gateway
from tito.session import Session, TreeSession, turns
from tito.session.idbuffer import IdBuffer
from tito.types.engine import GenerateResult, SamplingParams
from tito.types.errors import EngineError, TitoError
from tito.types.messages import TurnRequest


class Injected(Exception):
    pass


def state(session: Any) -> Any:
    contexts = getattr(session, "contexts", None)
    if contexts is not None:  # a session of agent contexts: each context, routing facts
        return [(key, ctx.info, ctx.turns, ctx.claims, ctx.tool_claims, ctx.has_tools,
                 copy.deepcopy(ctx.openings), state(ctx.session))
                for key, ctx in contexts.items()]
    if isinstance(session, TreeSession):
        return ([(n.id, n.parent, copy.deepcopy(n.delta), n.record.output_ids.tolist(),
                  list(n.children)) for n in session.nodes], session.active_leaf,
                session.snapshot.view().tolist(), session.in_flight, session._reserved)
    return (copy.deepcopy(session.messages), list(session.checkpoint_ends),
            [(r.turn, r.bridge_ids.tolist(), r.output_ids.tolist(), r.logprobs.tolist())
             for r in session.records],
            session.snapshot.view().tolist(), copy.deepcopy(session.tools), session.in_flight)


def bad_reply(mp: pytest.MonkeyPatch, engine: FakeEngine, **changes: Any) -> None:
    """The engine answers a reply with ``changes`` applied to a valid result."""
    original = engine.generate

    async def generate(*args: Any, **kwargs: Any) -> GenerateResult:
        result = await original(*args, **kwargs)
        for key, value in changes.items():
            setattr(result, key, value(result) if callable(value) else value)
        return result

    mp.setattr(engine, "generate", generate)


def raising(*_: Any, **__: Any) -> Any:
    raise Injected("injected")


STEPS: dict[str, Callable[[pytest.MonkeyPatch, Gateway], None]] = {
    "context_length": lambda mp, gw: mp.setattr(gw.engine, "context_length", raising),
    "generate": lambda mp, gw: gw.engine.script(EngineError("down")),  # type: ignore[attr-defined]
    "id_over_int32": lambda mp, gw: bad_reply(mp, gw.engine, output_ids=lambda r: [
        *r.output_ids[:-1], 2**31]),
    "id_out_of_vocab": lambda mp, gw: bad_reply(mp, gw.engine, output_ids=lambda r: [
        *r.output_ids[:-1], gw.vocab_size]),
    "negative_id": lambda mp, gw: bad_reply(mp, gw.engine, output_ids=lambda r: [
        -1, *r.output_ids[1:]]),
    "float_ids": lambda mp, gw: bad_reply(mp, gw.engine, output_ids=lambda r: [
        float(i) for i in r.output_ids]),
    "nan_logprob": lambda mp, gw: bad_reply(mp, gw.engine, logprobs=lambda r: [
        float("nan"), *r.logprobs[1:]]),
    "huge_logprob": lambda mp, gw: bad_reply(mp, gw.engine, logprobs=lambda r: [
        1e300, *r.logprobs[1:]]),
    "parse": lambda mp, gw: mp.setattr(gw.renderer, "parse", raising),
    "record": lambda mp, gw: mp.setattr(turns, "TurnRecord", raising),
    "snapshot_grow": lambda mp, gw: mp.setattr(IdBuffer, "reserve", raising),
    "snapshot_new": lambda mp, gw: mp.setattr(turns, "IdBuffer", raising),
}

USER = {"role": "user", "content": "hello"}


async def history(gateway: Gateway, session: Session, turns: int) -> list[Any]:
    messages: list[Any] = [USER]
    for n in range(turns):
        outcome = await gateway.run_turn(session, TurnRequest(list(messages)),
                                         SamplingParams())
        messages += [outcome.parsed.to_message(), {"role": "user", "content": f"more {n}"}]
    return messages


SCENARIOS = {
    "first_turn": (0, lambda m: m),
    "extension": (2, lambda m: m),
    "retry": (2, lambda m: [*m[:-3], {"role": "user", "content": "again"}]),
}


CASES = [(step, scenario, version) for version in ("v1", "v2")
         for scenario in sorted(SCENARIOS) for step in sorted(STEPS)
         if not (step == "snapshot_new" and scenario == "extension")]
"""Every step of every scenario, but a new snapshot of an extension: an extension grows
the stored buffer in place (``snapshot_grow``)."""


@pytest.mark.parametrize(("step", "scenario", "version"), CASES)
async def test_failure_at_every_step_leaves_the_session_unchanged(
        make_gateway: Any, monkeypatch: pytest.MonkeyPatch, step: str, scenario: str,
        version: str) -> None:
    gateway: Gateway = make_gateway(session_version=version)
    session = gateway.store.create()
    turns, request_of = SCENARIOS[scenario]
    messages = request_of(await history(gateway, session, turns))
    before = state(session)
    with monkeypatch.context() as mp:
        STEPS[step](mp, gateway)
        with pytest.raises((Injected, TitoError)) as info:
            await gateway.run_turn(session, TurnRequest(list(messages)), SamplingParams())
    if isinstance(info.value, EngineError) and step not in ("generate",):
        assert info.value.code == "engine_protocol_error"
    assert state(session) == before
    # and the session still works: the same request now succeeds and extends it
    outcome = await gateway.run_turn(session, TurnRequest(list(messages)), SamplingParams())
    assert outcome.record is not None and not session.in_flight
    ids = session.agent_context("main").snapshot.view()  # type: ignore[attr-defined]
    assert np.array_equal(ids[-len(outcome.record.output_ids):], outcome.record.output_ids)

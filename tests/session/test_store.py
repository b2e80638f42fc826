"""The session store: cap, idle TTL, deletion; and the cap as the HTTP 429 it becomes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.inproc import asgi_client, new_session

from tito.render import build_renderer
from tito.session.linear import LinearSession
from tito.session.matchers import strict
from tito.session.store import SessionStore
from tito.types.errors import Gone, NotFound, OverCapacity


@pytest.fixture(scope="module")
def store_factory(qwen3_dir: Path) -> Any:
    renderer = build_renderer("qwen3", qwen3_dir)

    def make(max_sessions: int = 3, idle_ttl: float = 60.0) -> SessionStore:
        return SessionStore(lambda sid: LinearSession(sid, renderer, strict),
                            max_sessions=max_sessions, idle_ttl=idle_ttl)

    return make


def test_cap_refuses_a_new_session_unless_one_is_idle(store_factory: Any) -> None:
    store = store_factory(max_sessions=2, idle_ttl=60.0)
    a, b = store.create(), store.create()
    with pytest.raises(OverCapacity, match=r"--max-sessions 2") as info:
        store.create()
    assert info.value.code == "too_many_sessions"
    assert len(store) == 2
    a.last_active -= 120  # idle past the TTL: creating evicts it and succeeds
    c = store.create()
    assert len(store) == 2 and store.expired_total == 1
    assert a.closed and not b.closed and store.get(c.session_id) is c
    with pytest.raises(Gone, match="expired after 60 s idle"):
        store.get(a.session_id)


def test_ttl_eviction_spares_sessions_with_a_turn_in_flight(store_factory: Any) -> None:
    store = store_factory(idle_ttl=10.0)
    idle, busy, fresh = store.create(), store.create(), store.create()
    now = idle.last_active + 11
    busy.last_active = idle.last_active
    busy.in_flight = True
    fresh.last_active = now - 1
    assert store.evict_idle(now=now) == 1
    assert [s.session_id for s in store.values()] == [busy.session_id, fresh.session_id]
    busy.in_flight = False
    assert store.evict_idle(now=now) == 1 and store.expired_total == 2


def test_delete_closes_and_forgets(store_factory: Any) -> None:
    store = store_factory()
    session = store.create()
    store.delete(session.session_id)
    assert session.closed and len(store) == 0
    with pytest.raises(Gone, match=f"{session.session_id} was deleted"):
        store.delete(session.session_id)
    with pytest.raises(NotFound, match="session not found"):
        store.get("f" * 32)


def test_tombstones_are_bounded(store_factory: Any) -> None:
    store = store_factory(max_sessions=10)
    store.max_tombstones = 2
    ids = [store.create().session_id for _ in range(3)]
    for sid in ids:
        store.delete(sid)
    with pytest.raises(NotFound):  # the oldest tombstone was dropped
        store.get(ids[0])
    for sid in ids[1:]:
        with pytest.raises(Gone):
            store.get(sid)


async def test_cap_is_429_over_http(make_gateway: Any) -> None:
    async with asgi_client(make_gateway(max_sessions=1)) as http:
        await new_session(http)
        resp = await http.post("/sessions")
        assert resp.status_code == 429
        assert resp.json()["error"]["code"] == "too_many_sessions"
        assert resp.json()["error"]["type"] == "rate_limit_error"

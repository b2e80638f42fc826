"""The keep-alive race, reproduced deterministically: a proxy in front of the real gateway
closes a client's *reused* pooled connection when the next request arrives, as a server
closing it as idle at that moment would. The tracer sends create, collect and delete again
(they never reached the gateway); a plain client fails; a request that failed on a fresh
connection is not resent."""

from __future__ import annotations

import httpx
import pytest
from helpers.dropping_proxy import DROP_BEFORE, FORWARD, DroppingProxy, Exchange
from helpers.support import Proc

from tito.client.tracer import SessionTracer


def reused(exchange: Exchange) -> str:
    """Every request on a reused connection meets a connection the server closed."""
    return DROP_BEFORE if exchange.index > 0 else FORWARD


async def one_turn(url: str) -> None:
    async with httpx.AsyncClient() as http:
        resp = await http.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "SAY hi"}]})
        assert resp.status_code == 200, resp.text


async def test_the_tracer_resends_requests_a_closed_pooled_connection_failed(
        stack: tuple[Proc, Proc]) -> None:
    _, gateway = stack
    async with DroppingProxy(gateway.url, reused) as proxy, \
            SessionTracer(proxy.url) as tracer:
        session = await tracer.create()  # connection 0, its first request
        await one_turn(f"{gateway.url}/sessions/{session.session_id}")
        samples = await tracer.collect(session)  # reuses connection 0: closed, resent
        (sample,) = samples.samples
        assert sample.status == "completed" and sample.response_length > 0
        assert [(e.method, e.path.rsplit("/", 1)[-1], e.index, e.action)
                for e in proxy.exchanges] == [
            ("POST", "sessions", 0, FORWARD),
            ("POST", "samples", 1, DROP_BEFORE), ("POST", "samples", 0, FORWARD),
            ("DELETE", session.session_id, 1, DROP_BEFORE),
            ("DELETE", session.session_id, 0, FORWARD)]
    # the DELETE got through too: the session is gone
    assert httpx.get(f"{gateway.url}/sessions/{session.session_id}").status_code == 410


async def test_without_the_retry_the_same_race_fails(stack: tuple[Proc, Proc]) -> None:
    """The control: a plain httpx client on the same proxy meets the closed connection."""
    _, gateway = stack
    async with DroppingProxy(gateway.url, reused) as proxy, \
            httpx.AsyncClient(base_url=proxy.url) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await http.get(f"/sessions/{sid}")
        assert (await http.delete(f"/sessions/{sid}")).status_code == 204  # a fresh one


async def test_a_fresh_connection_that_fails_is_not_resent(stack: tuple[Proc, Proc]) -> None:
    """Closed on a connection opened for it, the request may have run: the collect is an
    ABORTED sample, as before, and nothing is sent twice."""
    _, gateway = stack

    def first_collect(exchange: Exchange) -> str:
        collects = [e for e in proxy.exchanges if e.path.endswith("/samples")]
        return DROP_BEFORE if exchange.path.endswith("/samples") and not collects else \
            FORWARD

    no_pool = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
    async with DroppingProxy(gateway.url, first_collect) as proxy, no_pool, \
            SessionTracer(proxy.url, client=no_pool) as tracer:
        session = await tracer.create()
        (sample,) = (await tracer.collect(session)).samples
        assert sample.status == "aborted"
        assert "disconnected" in sample.metadata["aborted_reason"]
        assert [e.action for e in proxy.exchanges if e.path.endswith("/samples")] == [
            DROP_BEFORE]

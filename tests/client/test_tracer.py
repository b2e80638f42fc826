"""The tracer over several gateway workers when one of them is down: new sessions go
around it, a collection waits for it (real gateway, a port that refuses connections)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tito.client.tracer import SessionTracer, TracedSession


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A URL whose port refuses connections (bound, never listening)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


async def test_new_sessions_go_around_a_dead_worker(qwen3_stack: Any, dead_url: str) -> None:
    _, gateway = qwen3_stack
    async with SessionTracer([dead_url, gateway.url]) as tracer:
        hashed_to_dead = [k for k in range(40) if tracer.place(k) == dead_url]
        assert hashed_to_dead  # some keys would have gone to the dead worker
        sessions = [await tracer.create(key=k) for k in range(10)]
        assert all(s.base_url.startswith(gateway.url + "/sessions/") for s in sessions)
        for session in sessions:
            await tracer.delete(session)


async def test_when_every_worker_is_down_the_error_is_raised(dead_url: str) -> None:
    async with SessionTracer([dead_url, dead_url + "/"]) as tracer:
        with pytest.raises(httpx.ConnectError):
            await tracer.create(key=1)


@pytest.mark.slow  # waits for a worker to come back
async def test_a_collection_waits_for_its_worker_then_names_it(qwen3_stack: Any,
                                                               dead_url: str) -> None:
    _, gateway = qwen3_stack
    sid = "0" * 30 + "00"
    async with SessionTracer([dead_url, gateway.url], worker_wait=1.0) as tracer:
        decoded = await tracer.collect(TracedSession(sid, f"{dead_url}/sessions/{sid}"))
        [sample] = decoded.samples
        assert sample.status == "aborted"
        reason = sample.metadata["aborted_reason"]
        assert reason.startswith("collect failed: ConnectError") and "stayed down for 1s" in reason
        with pytest.raises(httpx.ConnectError, match="stayed down"):
            await tracer.collect(TracedSession(sid, f"{dead_url}/sessions/{sid}"),
                                 abort_on_transport_error=False)
    async with SessionTracer(dead_url) as lone:  # one gateway: nothing restarts it
        assert lone.worker_wait == 0.0

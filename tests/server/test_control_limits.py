"""Engine control routes take small bodies (413 over 64 KiB) and a short printable
``new_version`` (400 otherwise); a refused update leaves the engine's version as it was.
Over a real socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from helpers.fakes import FakeEngine

from tito.net import AppServer, bind_tcp
from tito.server.app import create_app
from tito.server.gateway import Gateway
from tito.server.sessions import CONTROL_BODY_BYTES, MAX_WEIGHT_VERSION_CHARS


@pytest.fixture
async def served(make_gateway: Any) -> AsyncIterator[tuple[httpx.AsyncClient, FakeEngine]]:
    gateway: Gateway = make_gateway()
    assert isinstance(gateway.engine, FakeEngine)
    server = AppServer(create_app(gateway), bind_tcp("127.0.0.1", 0))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            yield http, gateway.engine
    finally:
        await server.stop()


async def test_weight_version_length(served: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    http, engine = served
    longest = "v" * MAX_WEIGHT_VERSION_CHARS
    ok = await http.post("/update_weight_version", json={"new_version": longest})
    assert ok.status_code == 200 and ok.json() == {"success": True, "new_version": longest}
    assert engine.weight_version == longest
    for bad, words in ((longest + "v", f"over the limit of {MAX_WEIGHT_VERSION_CHARS}"),
                       ("v1\nv2", "control character"), ("", "new_version")):
        resp = await http.post("/update_weight_version", json={"new_version": bad})
        assert resp.status_code == 400, bad
        error = resp.json()["error"]
        assert error["code"] == "invalid_request" and words in error["message"]
    assert engine.weight_version == longest  # unchanged by the refusals


@pytest.mark.parametrize("path", ["/update_weight_version", "/pause", "/continue"])
async def test_control_bodies_are_small(served: tuple[httpx.AsyncClient, FakeEngine],
                                        path: str) -> None:
    http, engine = served
    padding = "x" * CONTROL_BODY_BYTES
    resp = await http.post(path, json={"new_version": "v9", "padding": padding})
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "payload_too_large"
    assert f"limit of {CONTROL_BODY_BYTES}" in resp.json()["error"]["message"]
    assert engine.weight_version == "w0"
    assert (await http.get("/health")).json()["paused"] is None

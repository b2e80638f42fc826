"""Engine faults end to end: the gateway (real app, real SGLang client) in front of the
real mock engine, whose FAULT directive injects each failure over HTTP. The agent gets the
documented status, the session is unchanged, and the same turn then succeeds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.inproc import asgi_client, new_session

from tito.config import ServerConfig
from tito.engines.mock import MockConfig, MockEngine, MockModel
from tito.engines.sglang import SGLangEngine
from tito.net import AppServer, bind_tcp
from tito.render.base import TemplateRenderer
from tito.server.gateway import Gateway


@pytest.fixture
async def stack(qwen3_dir: Path, qwen3_renderer: TemplateRenderer,
                qwen3_self_check: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    mock = MockEngine(MockConfig(tokenizer_dir=str(qwen3_dir), family="qwen3"),
                      MockModel(qwen3_renderer))
    server = AppServer(mock.app(), bind_tcp("127.0.0.1", 0))
    await server.start()
    config = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                          engine_url=server.url, engine_timeout=0.5)
    gateway = Gateway(config, qwen3_renderer, SGLangEngine(server.url, timeout=0.5),
                      self_check=qwen3_self_check)
    try:
        async with asgi_client(gateway) as http:
            yield http
    finally:
        await gateway.engine.close()
        await server.stop()


FAULTS = {
    "reset": (502, "engine_error"),
    "reset:partial": (502, "engine_error"),
    "malformed_json": (502, "engine_protocol_error"),
    "wrong_types": (502, "engine_protocol_error"),
    "bad_ids": (502, "engine_protocol_error"),
    "bad_ids:vocab": (502, "engine_protocol_error"),
    "bad_ids:int32": (502, "engine_protocol_error"),
    "bad_logprob": (502, "engine_protocol_error"),
    "bad_logprob:nan": (502, "engine_protocol_error"),
    "empty": (502, "engine_protocol_error"),
    "http_500": (502, "engine_error"),
    "slow:2": (504, "engine_timeout"),
}


async def state(http: httpx.AsyncClient, sid: str) -> Any:
    body = (await http.get(f"/sessions/{sid}", params={"include_ids": "1",
                                                      "include_messages": "1"})).json()
    body["metadata"].pop("last_active")
    for rec in body["records"]:
        rec.pop("e2e_latency")
    return body


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_fault_gives_its_status_and_leaves_the_session_retryable(
        stack: httpx.AsyncClient, fault: str) -> None:
    status, code = FAULTS[fault]
    sid = await new_session(stack)
    url = f"/sessions/{sid}/v1/chat/completions"
    first = [{"role": "user", "content": "SAY hello"}]
    ok = await stack.post(url, json={"messages": first})
    assert ok.status_code == 200, ok.text
    before = await state(stack, sid)
    turn = [*first, ok.json()["choices"][0]["message"]]
    faulty = [*turn, {"role": "user", "content": f"FAULT {fault}\nSAY fine"}]
    resp = await stack.post(url, json={"messages": faulty})
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code
    assert await state(stack, sid) == before
    healthy = [*turn, {"role": "user", "content": "SAY fine"}]
    again = await stack.post(url, json={"messages": healthy})
    assert again.status_code == 200, again.text
    assert (await state(stack, sid))["metadata"]["num_turns"] == 2

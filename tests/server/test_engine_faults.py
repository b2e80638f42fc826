"""Engine faults end to end: the gateway (real app, real SGLang client) in front of the
real mock engine, whose FAULT directive injects each failure over HTTP. The agent gets the
documented status, the session is unchanged, and the same turn then succeeds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.inproc import new_session, over_mock_engine

from tito.render.base import TemplateRenderer

pytestmark = pytest.mark.slow  # real faults and their delays


@pytest.fixture
async def stack(qwen3_dir: Path, qwen3_renderer: TemplateRenderer,
                qwen3_self_check: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    async with over_mock_engine(qwen3_dir, qwen3_renderer, qwen3_self_check,
                                timeout=0.5) as http:
        yield http


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

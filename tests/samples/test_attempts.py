"""``non_positive_attempts`` (v2 postprocessor): the generations the agent names as
failed become ``non_positive_advantage_spans`` over each kept sample's response, from
the gateway's completion spans; loss mask and reward are train_once's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from helpers.inproc import asgi_client, new_session

from tito.samples import decode_samples
from tito.server.gateway import Gateway

HOOK = "tito.samples.attempts:non_positive_attempts"
Q = {"role": "user", "content": "hello"}


async def turn(http: httpx.AsyncClient, sid: str, messages: list[dict[str, Any]]
               ) -> dict[str, Any]:
    resp = await http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": messages})
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def test_failed_attempts_get_spans_and_keep_their_mask(
        make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway(session_version="v2", sample_postprocessor=HOOK)
    gateway.engine.script("first try", "second", "third")  # type: ignore[attr-defined]
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        first = await turn(http, sid, [Q])
        reply = first["choices"][0]["message"]
        second = await turn(http, sid, [Q, reply, {"role": "user", "content": "again"}])
        missing = await http.post(f"/sessions/{sid}/samples", json={"metadata": {}})
        assert missing.status_code == 422 and "non_positive_advantage_response_ids" in \
            missing.json()["error"]["message"]
        unknown = await http.post(f"/sessions/{sid}/samples", json={"metadata": {
            "non_positive_advantage_response_ids": ["chatcmpl-nope"]}})
        assert unknown.status_code == 422
        got = await http.post(f"/sessions/{sid}/samples", json={"metadata": {
            "non_positive_advantage_response_ids": [first["id"]],
            "non_positive_advantage_spans": [[0, 999]]}})  # the agent's value is replaced
        assert got.status_code == 200
    (sample,) = decode_samples(got.content).samples
    spans = sample.metadata["non_positive_advantage_spans"]
    leaf = sample.metadata["leaf"]
    (node, start, end) = leaf["completion_spans"][0]
    assert node == leaf["path_node_ids"][0]
    prompt = len(sample.tokens) - sample.response_length
    assert spans == [[start - prompt, end - prompt]] and spans[0][0] == 0
    assert sample.loss_mask is not None and sample.loss_mask[: spans[0][1]].all()
    assert second["id"] == leaf["response_id"]

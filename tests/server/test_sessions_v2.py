"""v2 tree sessions over HTTP (the real app in-process, the openai SDK): concurrent
siblings, deep divergence accepted, the truncation and node-cap rules, the view's tree,
and the samples route with default and custom hooks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import asgi_client, new_session, openai_for

from tito.samples import decode_samples
from tito.server.gateway import Gateway

Message = dict[str, Any]


def user(text: str) -> Message:
    return {"role": "user", "content": text}


async def chat(http: httpx.AsyncClient, sid: str, messages: list[Message],
               **body: Any) -> httpx.Response:
    return await http.post(f"/sessions/{sid}/v1/chat/completions",
                           json={"messages": messages, **body})


async def extend(http: httpx.AsyncClient, sid: str, messages: list[Message]) -> Message:
    resp = await chat(http, sid, messages)
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["choices"][0]["message"])


async def tree(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    resp = await http.get(f"/sessions/{sid}")
    assert resp.status_code == 200
    return dict(resp.json()["metadata"]["tree"])


@pytest.fixture
def v2(make_gateway: Callable[..., Gateway]) -> Callable[..., Gateway]:
    return lambda **config: make_gateway(session_version="v2", **config)


async def test_concurrent_requests_commit_as_siblings(v2: Callable[..., Gateway]) -> None:
    gateway = v2()
    engine: FakeEngine = gateway.engine  # type: ignore[assignment]
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        a0 = await extend(http, sid, [user("start")])
        engine.gate = asyncio.Event()
        sdk = openai_for(http, sid)
        messages: Any = [user("start"), a0, user("go")]
        calls = [asyncio.create_task(sdk.chat.completions.create(model="m", messages=messages))
                 for _ in range(3)]
        while len(engine.calls) < 4:  # all three reached the engine: none was refused
            await asyncio.sleep(0.01)
        engine.gate.set()
        replies = await asyncio.gather(*calls)
        assert len({r.id for r in replies}) == 3
        view = await tree(http, sid)
    assert [n["parent"] for n in view["nodes"]] == [None, 0, 0, 0]
    assert {n["response_id"] for n in view["nodes"][1:]} == {r.id for r in replies}
    assert [leaf["node_id"] for leaf in view["leaves"]] == [1, 2, 3]


async def test_deep_divergence_is_200_and_keeps_both_lines(v2: Callable[..., Gateway]
                                                           ) -> None:
    async with asgi_client(v2()) as http:
        sid = await new_session(http)
        messages: list[Message] = [user("u0")]
        for k in range(3):
            messages += [await extend(http, sid, messages), user(f"u{k + 1}")]
        resp = await chat(http, sid, [user("u0"), user("a different story")])
        assert resp.status_code == 200, resp.text
        view = (await http.get(f"/sessions/{sid}")).json()
        samples = await http.post(f"/sessions/{sid}/samples")
    assert view["metadata"]["num_turns"] == len(view["records"]) == 1  # the active path
    assert [n["parent"] for n in view["metadata"]["tree"]["nodes"]] == [None, 0, 1, None]
    decoded = decode_samples(samples.content)
    # the abandoned 3-turn line is data: kept (deeper first), the new root too
    assert [s.metadata["leaf"]["path_node_ids"] for s in decoded.samples] == [[0, 1, 2], [3]]
    assert decoded.session_metadata["tree"]["active_leaf"] == 3


async def test_truncated_generation_cannot_be_extended_under_refuse(
        v2: Callable[..., Gateway]) -> None:
    async with asgi_client(v2(after_length_cut="refuse")) as http:
        sid = await new_session(http)
        resp = await chat(http, sid, [user("u0")], max_tokens=2)
        a0 = resp.json()["choices"][0]["message"]
        assert resp.json()["choices"][0]["finish_reason"] == "length"
        before = (await http.get(f"/sessions/{sid}")).json()
        blocked = await chat(http, sid, [user("u0"), a0, user("go on")])
        assert blocked.status_code == 409, blocked.text
        assert blocked.json()["error"]["code"] == "truncated_generation"
        assert "branch before the cut" in blocked.json()["error"]["message"]
        assert (await http.get(f"/sessions/{sid}")).json() == before  # nothing moved
        assert (await chat(http, sid, [user("u0")])).status_code == 200  # before the cut


async def test_node_cap_is_checked_before_the_engine(v2: Callable[..., Gateway]) -> None:
    gateway = v2(max_nodes=2)
    engine: FakeEngine = gateway.engine  # type: ignore[assignment]
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        await extend(http, sid, [user("a")])
        await extend(http, sid, [user("a"), user("b")])  # the same conversation: a root
        calls = len(engine.calls)
        sdk = openai_for(http, sid)
        with pytest.raises(openai.ConflictError) as err:
            await sdk.chat.completions.create(model="m", messages=[user("a"), user("c")])
        assert len(engine.calls) == calls
    body: Any = err.value.body
    assert body["code"] == "node_cap_reached"
    assert "not replaying history verbatim" in body["message"]


async def test_failed_engine_call_leaves_the_tree_as_it_was(v2: Callable[..., Gateway]
                                                            ) -> None:
    from tito.types.errors import EngineError

    gateway = v2()
    engine: FakeEngine = gateway.engine  # type: ignore[assignment]
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        a0 = await extend(http, sid, [user("u0")])
        before = (await http.get(f"/sessions/{sid}", params={"include_ids": "1"})).json()
        engine.script(EngineError("down"))
        assert (await chat(http, sid, [user("u0"), a0, user("u1")])).status_code == 502
        after = (await http.get(f"/sessions/{sid}", params={"include_ids": "1"})).json()
    assert after == before


async def test_custom_picker_keeps_retries(v2: Callable[..., Gateway]) -> None:
    async with asgi_client(v2(sample_picker="helpers.v2_hooks:keep_all")) as http:
        sid = await new_session(http)
        a0 = await extend(http, sid, [user("u0")])
        await extend(http, sid, [user("u0"), a0, user("u1")])
        await extend(http, sid, [user("u0"), a0, user("u1")])  # a retry: a sibling
        resp = await http.post(f"/sessions/{sid}/samples", json={"metadata": {"reward": 1}})
    samples = decode_samples(resp.content).samples
    assert [s.metadata["leaf"]["node_id"] for s in samples] == [2, 1]
    assert all(s.reward == 1.0 for s in samples)
    later, earlier = samples
    assert earlier.metadata["leaf"]["path_node_ids"][0] == 0
    # node 0's completion trains once, in the earliest leaf's sample
    (node0, a, b), _ = earlier.metadata["leaf"]["completion_spans"]
    assert node0 == 0
    p = later.prompt_length
    assert later.loss_mask is not None and earlier.loss_mask is not None
    assert later.loss_mask[a - p : b - p].sum() == 0
    assert earlier.loss_mask[a - p : b - p].all()


@pytest.mark.parametrize(("picker", "message"), [
    ("helpers.v2_hooks:broken", "picker=helpers.v2_hooks:broken, "
                                "postprocessor=tito.samples.tree:train_once): RuntimeError: "
                                "picker bug"),
    ("helpers.v2_hooks:copies", "must return a subset of its input samples"),
])
async def test_hook_failures_are_422(v2: Callable[..., Gateway], picker: str,
                                     message: str) -> None:
    async with asgi_client(v2(sample_picker=picker)) as http:
        sid = await new_session(http)
        await extend(http, sid, [user("u0")])
        resp = await http.post(f"/sessions/{sid}/samples")
        assert resp.status_code == 422, resp.text
        assert message in resp.json()["error"]["message"]
        assert (await http.get(f"/sessions/{sid}")).json()["metadata"]["num_turns"] == 1


async def test_empty_tree_has_no_records(v2: Callable[..., Gateway]) -> None:
    async with asgi_client(v2()) as http:
        sid = await new_session(http)
        resp = await http.post(f"/sessions/{sid}/samples")
    decoded = decode_samples(resp.content)
    assert decoded.samples == [] and decoded.empty_reason == "no_records"
    assert decoded.session_metadata["tree"] == {"active_leaf": None, "nodes": [],
                                                "leaves": []}


async def test_compaction_and_a_sub_agent_grow_the_forest(v2: Callable[..., Gateway]
                                                          ) -> None:
    """A harness that rewrites an old assistant message (compaction), and a sub-agent that
    shares nothing with the main conversation: both are served, both are samples (the
    sub-agent in an agent context of its own, design §5.5)."""
    async with asgi_client(v2()) as http:
        sid = await new_session(http)
        history: list[Message] = [user("u0")]
        for k in range(2):
            history += [await extend(http, sid, history), user(f"u{k + 1}")]
        compacted = [history[0], {"role": "assistant", "content": "(summary of a0)"},
                     *history[2:]]
        await extend(http, sid, compacted)
        await extend(http, sid, [user("sub-agent task")])
        resp = await http.post(f"/sessions/{sid}/samples")
    decoded = decode_samples(resp.content)
    nodes = decoded.session_metadata["tree"]["nodes"]
    assert [n["parent"] for n in nodes] == [None, 0, None]
    contexts = decoded.session_metadata["contexts"]
    assert [(c["context_id"], c["role"], c["parent_agent_id"]) for c in contexts] == \
        [("main", "main", None), ("agent-1", "subagent", "main")]
    assert sorted((s.metadata["context_id"], s.metadata["leaf"]["node_id"])
                  for s in decoded.samples) == [("agent-1", 0), ("main", 1), ("main", 2)]


async def test_sdk_retry_of_an_answered_turn_replays_it(v2: Callable[..., Gateway]) -> None:
    """An SDK retry (same body, ``x-stainless-retry-count``) gets the committed answer: no
    sibling is grown for it."""
    gateway = v2()
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        body = {"messages": [user("u0")]}
        first = await http.post(f"/sessions/{sid}/v1/chat/completions", json=body)
        again = await http.post(f"/sessions/{sid}/v1/chat/completions", json=body,
                                headers={"x-stainless-retry-count": "1"})
        assert again.json() == first.json()
        assert len((await tree(http, sid))["nodes"]) == 1

"""The reference framework's explicit contexts and generation links, through real HTTP
(httpx on the gateway app, over the real mock engine on 127.0.0.1): ``POST
/sessions/<id>/contexts`` (idempotent; 4xx in OpenAI's shape, the reference's under
``--compat miles``), ``X-Miles-Derived-From-Context-Id`` (lineage in the samples),
``X-Miles-Previous-Response-Id`` (v2: the node a turn attaches under), ``X-Miles-Retry-Of``
and ``X-Miles-Supersedes`` (marked in the tree and records; the ``exclude_superseded``
postprocessor masks a superseded generation). A refused request never reaches the engine
and leaves the session as it was."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.inproc import new_session, over_mock_engine
from helpers.support import Proc, start_gateway

from tito.render.base import TemplateRenderer
from tito.samples import decode_samples

HI = [{"role": "user", "content": "hi"}]
MAIN = {"X-Miles-Agent-Run-Id": "main", "X-Miles-Context-Id": "main-1"}
Gateway = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def gateway(qwen3_dir: Path, qwen3_renderer: TemplateRenderer,
            qwen3_self_check: dict[str, Any]) -> Gateway:
    def make(**config: Any) -> AbstractAsyncContextManager[httpx.AsyncClient]:
        return over_mock_engine(qwen3_dir, qwen3_renderer, qwen3_self_check, timeout=30,
                                **config)
    return make


async def chat(http: httpx.AsyncClient, sid: str, messages: list[Any],
               headers: dict[str, str] | None = None) -> httpx.Response:
    return await http.post(f"/sessions/{sid}/v1/chat/completions",
                           json={"messages": messages, "max_tokens": 8}, headers=headers)


async def meta(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    resp = await http.get(f"/sessions/{sid}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["metadata"])


def nodes_of(metadata: dict[str, Any], context: str) -> list[dict[str, Any]]:
    entry = next(c for c in metadata["contexts"] if c["context_id"] == context)
    return list(entry["tree"]["nodes"])


def reply_of(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["choices"][0]["message"])


async def test_register_a_context_is_idempotent_and_refuses_a_changed_identity(
        gateway: Gateway) -> None:
    async with gateway(session_version="v2") as http:
        sid = await new_session(http)
        url = f"/sessions/{sid}/contexts"
        body = {"agent_run_id": "main", "context_id": "main-1"}
        first = await http.post(url, json=body)
        assert first.status_code == 200, first.text
        assert first.json()["created"] is True
        assert first.json()["context"] == {**body, "role": "main", "source": "header"}
        again = await http.post(url, json=body)
        assert again.status_code == 200 and again.json()["created"] is False
        child = {"agent_run_id": "rev", "context_id": "rev-1",
                 "parent_agent_run_id": "main", "parent_tool_call_id": "call_1"}
        assert (await http.post(url, json=child)).json()["context"]["role"] == "subagent"
        conflict = await http.post(url, json={**body, "agent_run_id": "other"})
        assert conflict.status_code == 409
        assert conflict.json()["error"]["code"] == "context_conflict"
        for bad in ({"context_id": "x"}, {**body, "extra": 1}, {**body, "context_id": "a b"},
                    {"agent_run_id": "z", "context_id": "z", "parent_agent_run_id": "z"},
                    {"agent_run_id": "z", "context_id": "z", "parent_tool_call_id": "c"}, [1]):
            resp = await http.post(url, json=bad)
            assert resp.status_code == 400, bad
            assert resp.json()["error"]["code"] == "invalid_request"
        orphan = await http.post(url, json={"agent_run_id": "o", "context_id": "o",
                                            "parent_agent_run_id": "ghost"})
        assert orphan.status_code == 400
        assert orphan.json()["error"]["code"] == "unknown_parent_agent"
        listed = (await meta(http, sid))["contexts"]
        assert [c["context_id"] for c in listed] == ["main-1", "rev-1"]
        assert all(c["num_turns"] == 0 for c in listed)
        missing = await http.post("/sessions/nope/contexts", json=body)
        assert missing.status_code == 404
        # a registered context serves its first turn under the same identity
        assert (await chat(http, sid, HI, MAIN)).status_code == 200
        assert nodes_of(await meta(http, sid), "main-1")[0]["parent"] is None
        await http.post(f"/sessions/{sid}/finish", json={"timeout": 5})
        closed = await http.post(url, json={"agent_run_id": "n", "context_id": "n"})
        assert closed.status_code == 409
        assert closed.json()["error"]["code"] == "session_finished"


async def test_register_errors_in_the_reference_shape_under_compat_miles(
        gateway: Gateway) -> None:
    async with gateway(session_version="v2", compat="miles") as http:
        sid = await new_session(http)
        url = f"/sessions/{sid}/contexts"
        assert (await http.post(url, json={"agent_run_id": "a", "context_id": "a"})
                ).status_code == 200
        conflict = await http.post(url, json={"agent_run_id": "b", "context_id": "a"})
        assert conflict.status_code == 409
        assert isinstance(conflict.json()["error"], str)
        assert "identity never changes" in conflict.json()["error"]
        bad = await http.post(url, json={"context_id": "x"})
        assert bad.status_code == 400 and isinstance(bad.json()["error"], str)


async def test_previous_response_pins_the_node_and_bad_ones_are_409(
        gateway: Gateway) -> None:
    async with gateway(session_version="v2") as http:
        sid = await new_session(http)
        first = await chat(http, sid, HI, MAIN)
        gid = first.headers["x-miles-generation-id"]
        twin = await chat(http, sid, HI, MAIN)  # the same prompt again: another root
        assert reply_of(twin) == reply_of(first)  # the mock answers a prompt alike
        grown = [*HI, reply_of(first), {"role": "user", "content": "next"}]
        before = await meta(http, sid)
        refusals = [({**MAIN, "X-Miles-Previous-Response-Id": "missing"}, grown,
                     "unknown_generation"),
                    ({**MAIN, "X-Miles-Previous-Response-Id": gid}, HI,
                     "previous_response_mismatch"),
                    ({"X-Miles-Agent-Run-Id": "other", "X-Miles-Context-Id": "other",
                      "X-Miles-Previous-Response-Id": gid}, grown,
                     "generation_context_mismatch")]
        for headers, messages, code in refusals:
            resp = await chat(http, sid, messages, headers)
            assert resp.status_code == 409, resp.text
            assert resp.json()["error"]["code"] == code
        bare = await chat(http, sid, grown, {"X-Miles-Previous-Response-Id": gid})
        assert bare.status_code == 400  # needs an explicit agent context
        assert await meta(http, sid) == before  # nothing changed, no engine call
        # without the link the tie goes to the latest root; with it, to the one named
        pinned = await chat(http, sid, grown, {**MAIN, "X-Miles-Previous-Response-Id": gid})
        assert pinned.status_code == 200, pinned.text
        latest = await chat(http, sid, grown, MAIN)
        nodes = nodes_of(await meta(http, sid), "main-1")
        assert [n["parent"] for n in nodes] == [None, None, 0, 1]
        assert nodes[2]["previous_response_id"] == gid
        assert latest.headers["x-miles-generation-id"] == nodes[3]["response_id"]


async def test_retry_of_and_supersedes_are_marked_and_can_exclude_a_generation(
        gateway: Gateway) -> None:
    postprocessor = "tito.samples.superseded:exclude_superseded"
    async with gateway(session_version="v2", sample_postprocessor=postprocessor) as http:
        sid = await new_session(http)
        first = await chat(http, sid, HI)
        g0 = first.headers["x-miles-generation-id"]
        grown = [*HI, reply_of(first), {"role": "user", "content": "next"}]
        g1 = (await chat(http, sid, grown)).headers["x-miles-generation-id"]
        other = await chat(http, sid, HI, {"X-Miles-Retry-Of": "nope"})
        assert other.status_code == 409
        assert other.json()["error"]["code"] == "unknown_generation"
        key = {"X-Miles-Idempotency-Key": "k1"}
        retry = await chat(http, sid, HI, {**key, "X-Miles-Supersedes": g0,
                                           "X-Miles-Retry-Of": g0})
        assert retry.status_code == 200, retry.text
        g2 = retry.headers["x-miles-generation-id"]
        assert len({g0, g1, g2}) == 3
        reused = await chat(http, sid, HI, {**key, "X-Miles-Supersedes": g1})
        assert reused.status_code == 422  # the same key with other links
        nodes = (await meta(http, sid))["tree"]["nodes"]
        assert nodes[2]["retry_of"] == g0 and nodes[2]["supersedes"] == g0
        assert "retry_of" not in nodes[0]
        payload = await http.post(f"/sessions/{sid}/samples", json={})
        decoded = decode_samples(payload.content)
        assert decoded.session_metadata["selection"]["excluded_generation_ids"] == [g0]
        by_leaf = {s.metadata["leaf"]["node_id"]: s for s in decoded.samples}
        assert sorted(by_leaf) == [1, 2]
        deep = by_leaf[1]
        spans = {n: (start - deep.prompt_length, end - deep.prompt_length)
                 for n, start, end in deep.metadata["leaf"]["completion_spans"]}
        mask = deep.loss_mask
        assert mask is not None
        assert not mask[max(spans[0][0], 0):spans[0][1]].any()  # superseded: context only
        assert mask[spans[1][0]:spans[1][1]].all()


async def test_a_derived_context_carries_its_source_in_the_samples(
        gateway: Gateway) -> None:
    async with gateway() as http:  # v1: each context is a path of its own
        sid = await new_session(http)
        first = await chat(http, sid, HI, MAIN)
        compacted = {"X-Miles-Agent-Run-Id": "main", "X-Miles-Context-Id": "main-2",
                     "X-Miles-Derived-From-Context-Id": "main-1"}
        summary = [{"role": "user", "content": "summary of: " + str(reply_of(first)["content"])}]
        assert (await chat(http, sid, summary, compacted)).status_code == 200
        foreign = await chat(http, sid, HI, {"X-Miles-Agent-Run-Id": "rev",
                                             "X-Miles-Context-Id": "rev-1",
                                             "X-Miles-Derived-From-Context-Id": "main-1"})
        assert foreign.status_code == 409
        assert foreign.json()["error"]["code"] == "context_conflict"
        samples = decode_samples((await http.post(f"/sessions/{sid}/samples",
                                                  json={})).content).samples
        lineage = {s.metadata["context_id"]: s.metadata for s in samples}
        assert lineage["main-2"]["derived_from_context_id"] == "main-1"
        assert "derived_from_context_id" not in lineage["main-1"]
        records = (await http.get(f"/sessions/{sid}?context=main-2&include_requests=1")
                   ).json()["records"]
        assert records[0]["generation_id"] is not None


async def test_v1_links_stay_in_their_context_path(gateway: Gateway) -> None:
    async with gateway() as http:
        sid = await new_session(http)
        first = await chat(http, sid, HI, MAIN)
        gid = first.headers["x-miles-generation-id"]
        grown = [*HI, reply_of(first), {"role": "user", "content": "next"}]
        ok = await chat(http, sid, grown, {**MAIN, "X-Miles-Previous-Response-Id": gid})
        assert ok.status_code == 200, ok.text
        retried = await chat(http, sid, grown, {**MAIN, "X-Miles-Retry-Of":
                                                ok.headers["x-miles-generation-id"]})
        assert retried.status_code == 200, retried.text
        records = (await http.get(f"/sessions/{sid}?context=main-1")).json()["records"]
        assert records[1]["retry_of"] == ok.headers["x-miles-generation-id"]
        assert "retry_of" not in records[0]
        gone = await chat(http, sid, HI, {**MAIN, "X-Miles-Supersedes":
                                          ok.headers["x-miles-generation-id"]})
        assert gone.status_code == 409  # rolled back: no longer on the path
        assert gone.json()["error"]["code"] == "unknown_generation"




@pytest.mark.slow
def test_an_instrumented_agent_run_against_tito_serve(qwen3_stack: tuple[Proc, Proc],
                                                      qwen3_dir: Path) -> None:
    """The reference framework's instrumented flow against real ``tito serve`` processes
    (v2, the ``exclude_superseded`` postprocessor): register the contexts, generate with
    identity, idempotency and link headers, finish, export the snapshot, delete."""
    engine, _ = qwen3_stack
    server = start_gateway(engine.url, qwen3_dir, "qwen3", "--session-version", "v2",
                           "--sample-postprocessor",
                           "tito.samples.superseded:exclude_superseded")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            sid = http.post("/sessions").json()["session_id"]
            base = f"/sessions/{sid}"
            child = {"agent_run_id": "rev", "context_id": "rev-1",
                     "parent_agent_run_id": "main"}
            for body in ({"agent_run_id": "main", "context_id": "main-1"}, child):
                assert http.post(f"{base}/contexts", json=body).status_code == 200
            rev = {"X-Miles-Agent-Run-Id": "rev", "X-Miles-Context-Id": "rev-1",
                   "X-Miles-Parent-Agent-Run-Id": "main"}
            url = f"{base}/v1/chat/completions"
            body = {"messages": HI, "max_tokens": 8}
            first = http.post(url, json=body, headers={**MAIN, "X-Miles-Idempotency-Key": "a"})
            again = http.post(url, json=body, headers={**MAIN, "X-Miles-Idempotency-Key": "a"})
            assert again.content == first.content  # a delivery retry: the same generation
            g0 = first.headers["x-miles-generation-id"]
            side = http.post(url, json=body, headers=rev)
            assert side.status_code == 200
            grown = {**body, "messages": [*HI, reply_of(first),
                                          {"role": "user", "content": "next"}]}
            assert http.post(url, json=grown, headers={
                **MAIN, "X-Miles-Previous-Response-Id": g0}).status_code == 200
            replaced = http.post(url, json=body, headers={**MAIN, "X-Miles-Supersedes": g0})
            assert replaced.status_code == 200
            snap = http.post(f"{base}/finish", json={"timeout": 10}).json()
            assert snap["complete"] is True
            export = {"snapshot_id": snap["snapshot_id"], "max_seq_len": 4096}
            payload = http.post(f"{base}/samples", json=export)
            assert http.post(f"{base}/samples", json=export).content == payload.content
            decoded = decode_samples(payload.content)
            assert decoded.session_metadata["selection"]["excluded_generation_ids"] == [g0]
            contexts = {s.metadata["context_id"] for s in decoded.samples}
            assert contexts == {"main-1", "rev-1"}
            assert http.delete(base).status_code == 204
    finally:
        server.stop()

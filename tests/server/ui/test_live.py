"""The viewer's JSON (/ui/api) on the real app in-process over the fake engine: the strip
of a tool-calling session (origins, mask, logprobs, turns, blocks, text), paging, the
samples preview against POST /samples, the v2 tree, and the door's rules on /ui."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import asgi_client, new_session
from helpers.scripted import WEATHER_TOOLS

from tito.render.base import TemplateRenderer
from tito.samples import Sample, decode_samples
from tito.server.gateway import Gateway
from tito.server.ui.blocks import BRIDGE, GENERATED, PROMPT, Hints, Segment, find_blocks
from tito.server.ui.strip import MAX_PAGE
from tito.server.ui.text import decoder_of, token_texts
from tito.server.ui.views import leaf_states

Message = dict[str, Any]
KEY = "viewer-key"
TOOLS = WEATHER_TOOLS
CALL = {"role": "assistant", "content": "", "reasoning_content": "I should look it up",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
RESULT = "Sunny, 24 degrees"


async def chat(http: httpx.AsyncClient, sid: str, messages: list[Message]) -> Message:
    resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                           json={"messages": messages, "tools": TOOLS})
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["choices"][0]["message"])


async def tool_session(http: httpx.AsyncClient, engine: FakeEngine) -> str:
    """user → (thinking + tool call) → tool result → answer."""
    engine.script(CALL, "It is sunny in Paris.")
    sid = await new_session(http)
    messages: list[Message] = [{"role": "user", "content": "Weather in Paris?"}]
    messages.append(await chat(http, sid, messages))
    messages.append({"role": "tool", "tool_call_id": messages[-1]["tool_calls"][0]["id"],
                     "content": RESULT})
    await chat(http, sid, messages)
    return sid


async def get(http: httpx.AsyncClient, path: str, **params: Any) -> Any:
    resp = await http.get(path, params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


async def test_strip_of_a_tool_calling_session(client: httpx.AsyncClient, engine: FakeEngine,
                                               qwen3_renderer: TemplateRenderer) -> None:
    sid = await tool_session(client, engine)
    view = await get(client, f"/sessions/{sid}", include_ids="true")
    records = view["records"]
    ids = records[0]["bridge_ids"] + records[0]["output_ids"] + records[1]["bridge_ids"] + \
        records[1]["output_ids"]
    page = await get(client, f"/ui/api/sessions/{sid}/tokens")
    assert page["total"] == len(ids) == view["metadata"]["num_tokens"]
    assert page["ids"] == ids and page["next_offset"] is None
    origin = page["origin"]
    expected = "p" * records[0]["bridge_len"] + "g" * records[0]["output_len"] + \
        "b" * records[1]["bridge_len"] + "g" * records[1]["output_len"]
    assert origin == expected
    # the mask is the sample's: "-" on the prompt, then loss_mask as POST /samples gives it
    (sample,) = decode_samples((await client.post(f"/sessions/{sid}/samples", json={})
                                ).content).samples
    assert page["mask"] == "-" * sample.prompt_length + \
        "".join(str(int(m)) for m in sample.loss_mask)
    assert all((lp == -0.25) == (o == "g") for lp, o in zip(page["logprob"], origin,
                                                            strict=True))
    assert "".join(page["text"]) == qwen3_renderer.tokenizer.decode(ids)
    turns = page["turns"]
    assert [(t["turn"], t["finish_reason"]) for t in turns] == [(0, "stop"), (1, "stop")]
    assert turns[1]["start"] == turns[0]["end"] and turns[1]["end"] == len(ids)
    blocks = [(b["kind"], b["turn"]) for b in page["blocks"]]
    # qwen3 renders an empty thinking block before the second answer
    assert blocks == [("think", 0), ("tool_call", 0), ("tool_result", 1), ("think", 1)]
    think, call, result, _ = page["blocks"]
    assert call["label"] == "tool call: get_weather"
    assert result["label"] == "tool result: get_weather"
    assert set(origin[call["start"]:call["end"]]) == {"g"}
    assert set(origin[result["start"]:result["end"]]) == {"b"}
    assert RESULT in "".join(page["text"][result["start"]:result["end"]])
    assert "".join(page["text"][think["start"]:think["end"]]).startswith("<think>")
    assert think["end"] <= call["start"]
    listed = (await get(client, "/ui/api/sessions"))["sessions"]
    assert [(s["id"], s["turns"], s["tokens"], s["status"]) for s in listed] == \
        [(sid, 2, len(ids), "completed")]
    overview = await get(client, f"/ui/api/sessions/{sid}")
    assert overview["strip"]["origins"] == {"prompt": origin.count("p"),
                                            "bridge": origin.count("b"),
                                            "generated": origin.count("g")}
    assert overview["tree"] is None and overview["version"] == "v1"


async def test_samples_preview_is_what_the_samples_route_returns(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    sid = await tool_session(client, engine)
    preview = await get(client, f"/ui/api/sessions/{sid}/samples")
    payload = decode_samples((await client.post(f"/sessions/{sid}/samples", json={})).content)
    assert preview["empty_reason"] == payload.empty_reason and preview["error"] is None
    (sample,) = payload.samples
    (shown,) = preview["samples"]
    assert (shown["tokens"], shown["prompt_length"], shown["response_length"],
            shown["status"], shown["loss_mask_ones"], shown["num_turns"]) == \
        (len(sample.tokens), sample.prompt_length, sample.response_length, sample.status,
         int(sample.loss_mask.sum()), 2)
    assert shown["mask_coverage"] == pytest.approx(sample.loss_mask.mean())
    assert set(shown["mismatch"]) == {"special_token_count", "special_token_type",
                                      "non_assistant_text", "assistant_text"}
    assert shown["strict_mismatches"] == 0
    assert preview["session"]["turn_in_progress"] is False


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_agent_contexts_one_at_a_time(make_gateway: Callable[..., Gateway],
                                            version: str) -> None:
    """A session with a sub-agent: the summary lists its agent contexts, and ``context``
    shows one (its strip, its tokens, its samples preview)."""
    gateway = make_gateway(session_version=version)
    async with asgi_client(gateway) as http:
        sid = await tool_session(http, gateway.engine)
        sub = await http.post(f"/sessions/{sid}/v1/chat/completions",
                              headers={"X-Tito-Agent-Id": "helper"},
                              json={"messages": [{"role": "user", "content": "help"}]})
        assert sub.status_code == 200
        items = (await get(http, "/ui/api/sessions"))["sessions"]
        assert items[0]["contexts"] == 2
        main = await get(http, f"/ui/api/sessions/{sid}")
        assert main["summary"]["context"] == "main"
        assert [(c["context_id"], c["role"], c["num_turns"])
                for c in main["summary"]["contexts"]] == [("main", "main", 2),
                                                          ("helper", "subagent", 1)]
        shown = await get(http, f"/ui/api/sessions/{sid}", context="helper")
        assert shown["summary"]["context"] == "helper"
        assert shown["strip"]["num_turns"] == 1
        assert shown["strip"]["num_tokens"] < main["strip"]["num_tokens"]
        page = await get(http, f"/ui/api/sessions/{sid}/tokens", context="helper")
        assert page["total"] == shown["strip"]["num_tokens"]
        preview = await get(http, f"/ui/api/sessions/{sid}/samples", context="helper")
        assert [s["num_turns"] for s in preview["samples"]] == [1]
        missing = await http.get(f"/ui/api/sessions/{sid}", params={"context": "ghost"})
        assert missing.status_code == 400
        assert missing.json()["error"]["code"] == "unknown_context"


async def test_pages(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    sid = await tool_session(client, engine)
    whole = await get(client, f"/ui/api/sessions/{sid}/tokens")
    pieces: list[int] = []
    offset: int | None = 0
    while offset is not None:
        page = await get(client, f"/ui/api/sessions/{sid}/tokens", offset=offset, limit=7)
        assert len(page["ids"]) <= 7 and len(page["origin"]) == len(page["ids"])
        pieces += page["ids"]
        offset = page["next_offset"]
    assert pieces == whole["ids"]
    tail = await get(client, f"/ui/api/sessions/{sid}/tokens", offset=whole["total"])
    assert tail["ids"] == [] and tail["next_offset"] is None
    for params in ({"limit": MAX_PAGE + 1}, {"limit": 0}, {"offset": whole["total"] + 1},
                   {"offset": "x"}, {"leaf": 0}):
        resp = await client.get(f"/ui/api/sessions/{sid}/tokens", params=params)
        assert resp.status_code == 400, params
        assert resp.json()["error"]["type"] == "invalid_request_error"


async def test_unknown_and_deleted_sessions(client: httpx.AsyncClient,
                                            engine: FakeEngine) -> None:
    for path in ("", "/tokens", "/samples"):
        resp = await client.get(f"/ui/api/sessions/{'0' * 32}{path}")
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "session_not_found"
    sid = await tool_session(client, engine)
    assert (await client.delete(f"/sessions/{sid}")).status_code == 204
    assert (await client.get(f"/ui/api/sessions/{sid}/tokens")).status_code == 410
    assert (await get(client, "/ui/api/sessions"))["sessions"] == []
    assert (await client.get("/ui/static/../app.py")).status_code == 404
    assert (await client.get("/ui/static/secret.txt")).json()["error"]["code"] == \
        "unknown_route"


async def test_page_and_assets(client: httpx.AsyncClient) -> None:
    for path in ("/ui", "/ui/"):
        page = await client.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert "/ui/static/app.js" in page.text
        assert "://" not in page.text  # nothing is loaded from the network
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        asset = await client.get(f"/ui/static/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
        assert "://" not in asset.text


async def test_tree_of_a_v2_session_with_a_retry(make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway(session_version="v2")
    engine: FakeEngine = gateway.engine  # type: ignore[assignment]
    engine.script("first", "second", "second again")
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        start: list[Message] = [{"role": "user", "content": "start"}]
        first = await chat(http, sid, start)
        history = [*start, first, {"role": "user", "content": "go on"}]
        await chat(http, sid, history)
        await chat(http, sid, history)  # the retry: a sibling of node 1
        overview = await get(http, f"/ui/api/sessions/{sid}")
        nodes = {n["id"]: n for n in overview["tree"]["nodes"]}
        assert [(n["parent"], n["leaf"], n.get("state")) for n in nodes.values()] == \
            [(None, False, None), (0, True, "dropped"), (0, True, "kept")]
        assert overview["leaf"] == 2 and overview["tree"]["active_leaf"] == 2
        preview = await get(http, f"/ui/api/sessions/{sid}/samples")
        assert [s["leaf"] for s in preview["samples"]] == [2]
        kept = await get(http, f"/ui/api/sessions/{sid}/tokens", leaf=2)
        dropped = await get(http, f"/ui/api/sessions/{sid}/tokens", leaf=1)
        root = await get(http, f"/ui/api/sessions/{sid}/tokens", leaf=0)
        assert [t["node_id"] for t in kept["turns"]] == [0, 2]
        assert [t["node_id"] for t in dropped["turns"]] == [0, 1]
        assert kept["ids"][:root["total"]] == dropped["ids"][:root["total"]] == root["ids"]
        assert kept["ids"] != dropped["ids"]
        # the mask is each leaf's sample's; an inner node's path has no sample
        assert "1" in kept["mask"] and "1" in dropped["mask"] and set(root["mask"]) == {"x"}
        resp = await http.get(f"/ui/api/sessions/{sid}/tokens", params={"leaf": 3})
        assert resp.status_code == 400 and "no node 3" in resp.json()["error"]["message"]
        listed = (await get(http, "/ui/api/sessions"))["sessions"][0]
        assert (listed["version"], listed["nodes"], listed["leaves"]) == ("v2", 3, 2)


@pytest.mark.parametrize("path", ["/ui", "/ui/api/sessions", "/ui/static/app.js"])
async def test_host_rule(client: httpx.AsyncClient, path: str) -> None:
    resp = await client.get(path, headers={"host": "evil.example"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "host_not_allowed"
    resp = await client.get(path, headers={"origin": "https://evil.example"})
    assert resp.status_code == 403


async def test_api_key_rules(make_gateway: Callable[..., Gateway]) -> None:
    async with asgi_client(make_gateway(api_key=KEY)) as http:
        sid = (await http.post("/sessions", headers={"x-api-key": KEY})).json()["session_id"]
        for path in ("/ui", "/ui/api/sessions", f"/ui/api/sessions/{sid}/tokens",
                     "/ui/static/app.js"):
            resp = await http.get(path)
            assert resp.status_code == 401, path
            assert resp.json()["error"]["code"] == "invalid_api_key"
        # a browser opening the page gets the form that sets the cookie
        form = await http.get("/ui/", headers={"accept": "text/html,*/*"})
        assert form.status_code == 401 and form.headers["content-type"].startswith("text/html")
        assert "tito_api_key" in form.text and "SameSite=Strict" in form.text
        assert "refused" not in form.text
        for headers in ({"authorization": f"Bearer {KEY}"}, {"x-api-key": KEY},
                        {"cookie": f"tito_api_key={KEY}"}):
            assert (await http.get("/ui/api/sessions", headers=headers)).json()[
                "sessions"][0]["id"] == sid
            assert (await http.get("/ui/", headers=headers)).status_code == 200
        quoted = await http.get("/ui/api/sessions", headers={"cookie": "a=b; tito_api_key="
                                                             "viewer%2Dkey"})
        assert quoted.status_code == 200
        wrong = await http.get("/ui/", headers={"cookie": "tito_api_key=nope",
                                                "accept": "text/html"})
        assert wrong.status_code == 401 and "refused" in wrong.text
        # the cookie opens nothing but GET/HEAD of the viewer
        cookie = {"cookie": f"tito_api_key={KEY}"}
        assert (await http.get(f"/sessions/{sid}", headers=cookie)).status_code == 401
        assert (await http.post("/sessions", headers=cookie)).status_code == 401
        assert (await http.get("/metrics", headers=cookie)).status_code == 401


async def test_no_ui(make_gateway: Callable[..., Gateway]) -> None:
    async with asgi_client(make_gateway(ui=False)) as http:
        for path in ("/ui", "/ui/", "/ui/api/sessions", "/ui/static/app.js"):
            resp = await http.get(path)
            assert resp.status_code == 404 and resp.json()["error"]["code"] == "unknown_route"


def test_token_texts_split_characters(qwen3_renderer: TemplateRenderer) -> None:
    tokenizer = qwen3_renderer.tokenizer
    text = "naïve 日本語のテキスト 🎉🎉 done\n" * 40
    ids = tokenizer.encode(text)
    texts = token_texts(ids, decoder_of(tokenizer))
    assert len(texts) == len(ids) and "".join(texts) == text
    singles = [tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in s for s in singles)  # the case the incremental decode is for
    assert not any("\ufffd" in t for t in texts)


def test_blocks_without_markers_follow_the_messages() -> None:
    """A thinking block the prompt opened; a call without markers (bare JSON); a tool
    result found by its text."""
    texts = ["plan", "</think>", "\n\n", '{"name": "f"}', "<eos>", "\nresult: ", "42", "\n"]
    segments = [Segment(0, 0, PROMPT, 0),
                Segment(0, 5, GENERATED, 0, Hints(tool_calls=("f",))),
                Segment(5, 8, BRIDGE, 1, Hints(tool_results=(("f", "42"),)))]
    blocks = find_blocks(texts, segments)
    assert [(b["kind"], b["start"], b["end"], b["label"]) for b in blocks] == [
        ("think", 0, 2, "thinking"), ("tool_call", 3, 5, "tool call: f"),
        ("tool_result", 6, 7, "tool result: f")]
    assert np.all(np.diff([b["start"] for b in blocks]) > 0)


def test_leaf_states() -> None:
    """kept / dropped by the picker; trimmed: nothing survived max_seq_len; a cut sample is
    flagged on its leaf."""
    def sample(n: int) -> Sample:
        return Sample(tokens=np.zeros(n, np.int64), response_length=1,
                      loss_mask=np.ones(1, np.uint8), rollout_log_probs=np.zeros(1))

    states = leaf_states([1, 2, 3], {1: 10, 2: 10, 3: 10}, {1: sample(10), 2: sample(7)},
                         kept={2})
    assert states == {1: {"state": "dropped", "trimmed": False},
                      2: {"state": "kept", "trimmed": True},
                      3: {"state": "trimmed", "trimmed": True}}

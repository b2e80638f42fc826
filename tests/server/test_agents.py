"""Agent headers and structured-output signs on the shared turn route (design §5.5): the
three header families, their validation (400 ``invalid_agent_header`` in each API's own
error shape, the session unchanged), and what a structured-output request looks like in
each API."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from helpers.inproc import asgi_client, new_session

from tito.server.agents import agent_ref
from tito.types.errors import BadRequest
from tito.types.messages import AgentRef


def ref(**headers: str) -> AgentRef | None:
    return agent_ref([(k.replace("_", "-").lower().encode(), v.encode())
                      for k, v in headers.items()])


def test_no_agent_header_is_none() -> None:
    assert ref(authorization="Bearer x", x_stainless_retry_count="0") is None


def test_each_family_names_an_agent() -> None:
    assert ref(X_Tito_Agent_Id="a", X_Tito_Parent_Agent_Id="main",
               X_Tito_Parent_Tool_Call_Id="call_1") == AgentRef(
        agent_id="a", parent_agent_id="main", parent_tool_call_id="call_1",
        header="X-Tito-Agent-Id")
    miles = ref(X_Miles_Agent_Run_Id="run", X_Miles_Context_Id="run-1",
                X_Miles_Parent_Agent_Run_Id="p")
    assert miles is not None and (miles.key, miles.agent_id, miles.parent_agent_id) == \
        ("run-1", "run", "p")
    claude = ref(x_claude_code_agent_id="a1b2c3d4e5f6a7b8c")
    assert claude is not None and claude.key == "a1b2c3d4e5f6a7b8c" and \
        claude.parent_agent_id is None
    assert ref(X_Tito_Agent_Id="a", X_Miles_Agent_Run_Id="a") is not None  # agreeing


def test_claude_code_under_a_named_agent_is_its_sub_agent() -> None:
    """A harness names the Claude Code process; its sub-agents add their own id."""
    nested = ref(X_Miles_Agent_Run_Id="trial-7", x_claude_code_agent_id="a1b2c3d4e5f6a7b8c")
    assert nested is not None
    assert (nested.agent_id, nested.parent_agent_id) == ("a1b2c3d4e5f6a7b8c", "trial-7")
    same = ref(X_Tito_Agent_Id="x", x_claude_code_agent_id="x")
    assert same is not None and same.agent_id == "x" and same.parent_agent_id is None


ROOT = "01a24350-0349-79e2-b356-a4c186fca7ce"
SUB = "01a24350-0411-7402-88a3-73ee583d14c9"


def test_codex_threads_are_agents_and_windows_their_contexts() -> None:
    """Codex 0.171's headers (captured in tests/harnesses/fixtures/codex): the root thread,
    its window after a compaction, and a spawned sub-agent thread."""
    root = ref(x_codex_window_id=f"{ROOT}:0", session_id=ROOT, thread_id=ROOT)
    assert root == AgentRef(agent_id=ROOT, context_id=f"{ROOT}:0", header="x-codex-window-id")
    window = ref(x_codex_window_id=f"{ROOT}:1", session_id=ROOT)
    assert window is not None and (window.agent_id, window.key) == (ROOT, f"{ROOT}:1")
    sub = ref(x_codex_window_id=f"{SUB}:0", x_codex_parent_thread_id=ROOT, session_id=ROOT,
              x_openai_subagent="collab_spawn")
    assert sub is not None and (sub.agent_id, sub.key, sub.parent_agent_id) == \
        (SUB, f"{SUB}:0", ROOT)
    assert ref(session_id="any value, even with spaces") is None  # a generic name alone
    assert ref(x_codex_parent_thread_id=ROOT) is None  # no window: nothing named


def test_codex_under_a_named_agent() -> None:
    """A harness names the Codex process: the root thread is that agent (each later window
    a context of it), a sub-agent thread a sub-agent of it."""
    first = ref(X_Tito_Agent_Id="trial-7", x_codex_window_id=f"{ROOT}:0", session_id=ROOT)
    assert first is not None and (first.agent_id, first.key) == ("trial-7", "trial-7")
    later = ref(X_Tito_Agent_Id="trial-7", x_codex_window_id=f"{ROOT}:2", session_id=ROOT)
    assert later is not None and (later.agent_id, later.key) == ("trial-7", "trial-7:2")
    sub = ref(X_Tito_Agent_Id="trial-7", x_codex_window_id=f"{SUB}:0",
              x_codex_parent_thread_id=ROOT, session_id=ROOT)
    assert sub is not None and (sub.agent_id, sub.parent_agent_id) == (SUB, "trial-7")
    nested = ref(X_Tito_Agent_Id="trial-7", x_codex_window_id="t3:0",
                 x_codex_parent_thread_id=SUB, session_id=ROOT)
    assert nested is not None and (nested.agent_id, nested.parent_agent_id) == ("t3", SUB)


@pytest.mark.parametrize(("headers", "named"), [
    ({"x_codex_window_id": "no-window-number"}, "x-codex-window-id"),
    ({"x_codex_window_id": ":0"}, "x-codex-window-id"),
    ({"X_Tito_Agent_Id": "has space"}, "X-Tito-Agent-Id"),
    ({"X_Miles_Context_Id": "x" * 257}, "X-Miles-Context-Id"),
    ({"x_claude_code_agent_id": "caf\u00e9"}, "x-claude-code-agent-id"),
    ({"X_Tito_Parent_Agent_Id": "\x7f"}, "X-Tito-Parent-Agent-Id"),
    ({"X_Tito_Agent_Id": "a", "X_Miles_Agent_Run_Id": "b"}, "X-Miles-Agent-Run-Id"),
    ({"X_Tito_Parent_Agent_Id": "main"}, "X-Tito-Parent-Agent-Id"),
])
def test_malformed_headers_are_400_naming_them(headers: dict[str, str], named: str) -> None:
    raw = [(k.replace("_", "-").lower().encode(), v.encode("utf-8"))
           for k, v in headers.items()]
    with pytest.raises(BadRequest) as err:
        agent_ref(raw)
    assert err.value.code == "invalid_agent_header" and named in err.value.message


# -- on the route ----------------------------------------------------------------------------
async def snapshot(http: httpx.AsyncClient, sid: str) -> Any:
    body = (await http.get(f"/sessions/{sid}", params={"include_ids": "1"})).json()
    body["metadata"].pop("last_active")
    return body


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_a_bad_header_is_400_in_each_apis_shape(make_gateway: Any, version: str) -> None:
    async with asgi_client(make_gateway(session_version=version)) as http:
        sid = await new_session(http)
        msgs = [{"role": "user", "content": "hi"}]
        ok = await http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": msgs})
        assert ok.status_code == 200
        before = await snapshot(http, sid)
        bad = {"X-Tito-Agent-Id": "not valid"}
        chat = await http.post(f"/sessions/{sid}/v1/chat/completions", headers=bad,
                               json={"messages": msgs})
        assert chat.status_code == 400
        assert chat.json()["error"]["code"] == "invalid_agent_header"
        claude = await http.post(f"/sessions/{sid}/v1/messages", headers=bad, json={
            "model": "m", "max_tokens": 8, "messages": msgs})
        assert claude.status_code == 400 and claude.json()["type"] == "error"
        assert "X-Tito-Agent-Id" in claude.json()["error"]["message"]
        ghost = await http.post(f"/sessions/{sid}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "sub"}]},
            headers={"X-Tito-Agent-Id": "sub", "X-Tito-Parent-Agent-Id": "ghost"})
        assert ghost.status_code == 400
        assert ghost.json()["error"]["code"] == "unknown_parent_agent"
        assert "'ghost'" in ghost.json()["error"]["message"]
        assert await snapshot(http, sid) == before


async def test_get_session_shows_one_context(make_gateway: Any) -> None:
    async with asgi_client(make_gateway()) as http:
        sid = await new_session(http)
        await http.post(f"/sessions/{sid}/v1/chat/completions",
                        json={"messages": [{"role": "user", "content": "main"}]})
        sub = await http.post(f"/sessions/{sid}/v1/chat/completions",
                              headers={"X-Tito-Agent-Id": "sub"},
                              json={"messages": [{"role": "user", "content": "sub"}]})
        assert sub.status_code == 200
        whole = (await http.get(f"/sessions/{sid}")).json()
        assert [c["context_id"] for c in whole["metadata"]["contexts"]] == ["main", "sub"]
        part = (await http.get(f"/sessions/{sid}", params={
            "context": "sub", "include_messages": "1"})).json()
        assert part["metadata"]["context_id"] == "sub"
        assert part["messages"][0]["content"] == "sub"
        missing = await http.get(f"/sessions/{sid}", params={"context": "nope"})
        assert missing.status_code == 400
        assert missing.json()["error"]["code"] == "unknown_context"

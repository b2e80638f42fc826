"""The API layer's per-session state (:mod:`tito.server.api_state`): each agent a
request's headers name grows its own last bodies, so agents taking turns on one session
URL (a main agent and its sub-agent) each decode only what is new in their bodies."""

from __future__ import annotations

from typing import Any

from helpers.inproc import asgi_client, new_session

from tito.server.api_state import MAX_AGENT_BODIES, ApiState


def test_each_named_agent_has_its_own_last_bodies() -> None:
    state = ApiState()
    assert state.last_bodies(None) is state
    sub = state.last_bodies("sub")
    assert sub is not state and state.last_bodies("sub") is sub
    for n in range(MAX_AGENT_BODIES - 1):
        state.last_bodies(f"agent-{n}")
    assert state.last_bodies("sub") is sub  # used again: the most recent
    state.last_bodies("one-more")  # past the cap: the oldest (agent-0) is dropped
    assert len(state.named_bodies) == MAX_AGENT_BODIES
    assert "agent-0" not in state.named_bodies and "sub" in state.named_bodies


async def test_agents_taking_turns_keep_their_own_last_body(make_gateway: Any) -> None:
    gateway = make_gateway()
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        url = f"/sessions/{sid}/v1/chat/completions"
        histories: dict[str | None, list[dict[str, Any]]] = {
            None: [{"role": "user", "content": "main task"}],
            "sub": [{"role": "user", "content": "sub task"}]}
        for turn in range(3):
            for agent, history in histories.items():
                headers = {} if agent is None else {"X-Tito-Agent-Id": agent}
                resp = await http.post(url, headers=headers, json={"messages": history})
                assert resp.status_code == 200, resp.text
                reply = resp.json()["choices"][0]["message"]
                history += [{"role": "assistant", "content": reply["content"]},
                            {"role": "user", "content": f"next {turn}"}]
        state = ApiState.of(gateway.session(sid))
        for bodies in (state, state.named_bodies["sub"]):
            last = bodies.chat_body
            assert last is not None and last.parsed.head  # grew with its own agent
            assert last.parsed.misses == 0

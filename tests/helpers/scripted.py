"""Scripted agents for session tests: the conversations v1 is pinned on and v1/v2 parity
is checked with. Their messages carry the mock model's directives (``CALL``, ``SAY``), so
any engine built on it (the mock server, :class:`fakes.ModelEngine`) answers them
deterministically, per prompt.

An agent is an async function of ``chat(messages) -> assistant message`` (a dict as the
OpenAI API returns it); it returns the messages it sent, request by request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

Message = dict[str, Any]
Chat = Callable[[list[Message]], Awaitable[Message]]

WEATHER_TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}]


def history(message: Message) -> Message:
    """The assistant message as an agent replays it (the fields the API returned)."""
    out: Message = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning_content"):
        out["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["function"]["name"],
                          "arguments": c["function"]["arguments"]}}
            for c in message["tool_calls"]
        ]
    return out


def _call(city: str) -> str:
    return "CALL get_weather " + json.dumps({"city": city})


def _tool_result(reply: Message, text: str) -> Message:
    return {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": text}


async def weather_agent(chat: Chat, agent: int) -> list[list[Message]]:
    """Nine requests: two tool calls, a user follow-up, two consecutive retries of one
    turn, a system reminder, an injected assistant note. The tree it grows in v2:
    0←1←2←3, node 3 has children 4, 5, 6 (the retries), 6←7←8."""
    sent: list[list[Message]] = []

    async def send(messages: list[Message]) -> Message:
        sent.append([dict(m) for m in messages])
        return await chat(messages)

    msgs: list[Message] = [
        {"role": "system", "content": f"You are weather bot #{agent}."},
        {"role": "user", "content": f"Weather in Paris? (agent {agent})\n{_call('Paris')}"},
    ]
    r = await send(msgs)                                                  # 0
    msgs += [history(r), _tool_result(r, f"sunny, {20 + agent} C\nSAY It is sunny.")]
    r = await send(msgs)                                                  # 1
    msgs += [history(r), {"role": "user", "content": f"And London?\n{_call('London')}"}]
    r = await send(msgs)                                                  # 2
    msgs += [history(r), _tool_result(r, "rain, 12 C\nSAY Rainy in London.")]
    r = await send(msgs)                                                  # 3
    msgs += [history(r), {"role": "user", "content": "Thanks. Tokyo?\n" + _call("Tokyo")}]
    await send(msgs)                                                      # 4
    await send(msgs)                                                      # 5: retry
    r = await send(msgs)                                                  # 6: retry again
    msgs += [history(r), _tool_result(r, "clear, 18 C\nSAY Clear in Tokyo."),
             {"role": "system", "content": "Reminder: answer in one sentence."}]
    r = await send(msgs)                                                  # 7
    msgs += [history(r), {"role": "assistant", "content": "(note: three cities done)"},
             {"role": "user", "content": f"Bye {agent}.\nSAY Goodbye!"}]
    await send(msgs)                                                      # 8
    return sent


WEATHER_TREE = {"parents": [None, 0, 1, 2, 3, 3, 3, 6, 7], "leaves": [4, 5, 8],
                "active_path": [0, 1, 2, 3, 6, 7, 8]}
"""The v2 tree of :func:`weather_agent`: each node's parent, the leaves in creation order
and the active path after the last request."""


async def first_turn_retry(chat: Chat, agent: int) -> list[list[Message]]:
    """The first turn retried, then the trajectory goes on."""
    msgs: list[Message] = [{"role": "user", "content": f"Hi {agent}\nSAY Hello."}]
    await chat(msgs)
    r = await chat(msgs)
    msgs += [history(r), {"role": "user", "content": "Tell me more.\nSAY More."}]
    await chat(msgs)
    return []


async def length_cut(chat: Chat, agent: int) -> list[list[Message]]:
    """A completion that hits its token limit ends the trajectory."""
    msgs: list[Message] = [{"role": "user", "content": f"Ramble {agent}\nSAY Sure."}]
    r = await chat(msgs)
    msgs += [history(r), {"role": "user", "content": "Go on.\nLONG 40"}]
    await chat(msgs)
    return []

"""The scripted Anthropic Messages conversation the Messages API tests share: a weather
bot that thinks, calls a tool, gets a result (text blocks), sends two text blocks, and
gets an error result; run with the real ``anthropic`` SDK, streamed or not."""

from __future__ import annotations

from typing import Any

import anthropic

from helpers.scripted import WEATHER_TOOLS

TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in WEATHER_TOOLS]
SYSTEM = [{"type": "text", "text": "You are a weather bot."},
          {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]


def claude(url: str, sid: str) -> anthropic.Anthropic:
    """The SDK as Claude-Code-style agents configure it (a beta header the gateway
    accepts and ignores)."""
    return anthropic.Anthropic(base_url=f"{url}/sessions/{sid}", api_key="x", max_retries=0,
                               default_headers={"anthropic-beta":
                                                "interleaved-thinking-2025-05-14"})


def blocks(message: Any) -> list[dict[str, Any]]:
    """The reply's content as an agent sends it back."""
    return [block.model_dump(exclude_none=True) for block in message.content]


USER_TURNS: list[Any] = [
    "Weather in Paris?\nTHINK The user wants the weather.\n"
    'CALL get_weather {"city": "Paris"}',
    "tool:sunny, 21 C\nSAY It is sunny in Paris.",
    [{"type": "text", "text": "And London?"},
     {"type": "text", "text": 'CALL get_weather {"city": "London"}'}],
    "error:timeout\nSAY Sorry, London did not answer.",
]


def run_claude(url: str, sid: str, *, stream: bool = False) -> list[Any]:
    """The scripted conversation through the Messages API (streamed with
    ``client.messages.stream`` when ``stream``); returns the replies."""
    client = claude(url, sid)
    history: list[dict[str, Any]] = []
    replies = []
    for turn in USER_TURNS:
        if isinstance(turn, str) and turn.startswith(("tool:", "error:")):
            kind, _, text = turn.partition(":")
            call = next(b for b in replies[-1].content if b.type == "tool_use")
            content: Any = [{"type": "tool_result", "tool_use_id": call.id,
                             "content": [{"type": "text", "text": text}] if kind == "tool"
                             else text, "is_error": kind == "error"}]
        else:
            content = turn
        history.append({"role": "user", "content": content})
        kwargs: Any = {"model": "claude-x", "max_tokens": 64, "system": SYSTEM,
                       "tools": TOOLS, "messages": history}
        if stream:
            with client.messages.stream(**kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        history.append({"role": "assistant", "content": blocks(reply)})
        replies.append(reply)
    return replies



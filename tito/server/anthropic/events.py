"""Anthropic Messages stream events: ``message_start``, thinking and text blocks with their
deltas as the engine generates, then (the turn committed) ``tool_use`` blocks with
``input_json_delta``, ``message_delta`` (stop reason, usage) and ``message_stop``. An error
after the first byte is an ``error`` event (framed by :func:`tito.server.adapter.framed`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

import orjson

from tito.parse.stream import Delta
from tito.server.anthropic.convert import signature, tool_use_block
from tito.server.anthropic.errors import TYPE
from tito.server.anthropic.models import MessageReply, ToolUseBlock
from tito.server.gateway import TurnOutcome
from tito.server.serving import TurnStream
from tito.types.errors import TitoError


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) \
        + b"\n\n"


class _Blocks:
    """The content blocks of a streamed message: one open at a time, in order."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None
        self.thinking = ""

    def delta(self, kind: str, text: str) -> list[bytes]:
        out = self.switch(kind)
        if kind == "thinking":
            self.thinking += text
            out.append(_event("content_block_delta", {"index": self.index, "delta": {
                "type": "thinking_delta", "thinking": text}}))
        else:
            out.append(_event("content_block_delta", {"index": self.index, "delta": {
                "type": "text_delta", "text": text}}))
        return out

    def switch(self, kind: str | None) -> list[bytes]:
        """Close the open block unless it is of ``kind``; open a ``kind`` block."""
        if self.open == kind and kind is not None:
            return []
        out = self.close()
        if kind is not None:
            self.index += 1
            self.open = kind
            block: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""} \
                if kind == "thinking" else {"type": "text", "text": ""}
            out.append(_event("content_block_start", {"index": self.index,
                                                      "content_block": block}))
        return out

    def close(self) -> list[bytes]:
        out = []
        if self.open == "thinking":
            out.append(_event("content_block_delta", {"index": self.index, "delta": {
                "type": "signature_delta", "signature": signature(self.thinking)}}))
            self.thinking = ""
        if self.open is not None:
            out.append(_event("content_block_stop", {"index": self.index}))
        self.open = None
        return out

    def text(self, delta: Delta) -> list[bytes]:
        out = []
        for kind, text in (("thinking", delta.reasoning), ("text", delta.content)):
            if text:
                out += self.delta(kind, text)
        for call in delta.calls:
            out += self.tool_use(tool_use_block(call))
        return out

    def finish(self, reply: MessageReply) -> list[bytes]:
        """The committed message's stop reason and usage."""
        out = self.close()
        out.append(_event("message_delta", {
            "delta": {"stop_reason": reply["stop_reason"],
                      "stop_sequence": reply["stop_sequence"]},
            "usage": reply["usage"]}))
        out.append(_event("message_stop", {}))
        return out

    def tool_use(self, block: ToolUseBlock) -> list[bytes]:
        out = self.close()
        self.index += 1
        out.append(_event("content_block_start", {"index": self.index, "content_block": {
            "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
        out.append(_event("content_block_delta", {"index": self.index, "delta": {
            "type": "input_json_delta",
            "partial_json": orjson.dumps(block["input"]).decode()}}))
        out.append(_event("content_block_stop", {"index": self.index}))
        return out


async def live_events(stream: TurnStream, parse: Any, response_id: str, model: str,
                      reply: Callable[[TurnOutcome], MessageReply]
                      ) -> AsyncGenerator[bytes, None]:
    """A message as the engine generates it, in the Messages API's stream events."""
    blocks = _Blocks()
    yield _event("message_start", {"message": {
        "id": response_id, "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}})
    async for event in stream.deltas(parse):
        chunks = blocks.text(event) if isinstance(event, Delta) else blocks.finish(reply(event))
        for chunk in chunks:
            yield chunk


def error_event(error: TitoError) -> bytes:
    return _event("error", {"error": {"type": TYPE.get(error.kind, "invalid_request_error"),
                                      "message": f"[{error.code}] {error.message}"}})

"""The Responses API's stream events for a turn as the engine generates it.

``response.created`` and ``response.in_progress`` (the response without output), then the
output items in the order the response lists them: the ``reasoning`` item
(``response.reasoning_summary_text.delta``; an empty one, opened and closed at once, when
the model thought nothing but its message has ``reasoning_content``), the ``message`` item
(``response.output_text.delta``) and one ``function_call`` item per tool call, sent as
soon as the call is complete (``response.function_call_arguments.delta`` with its whole
arguments); each item is opened (``response.output_item.added``, and its part) and closed
(``*.done``, ``response.output_item.done``) before the next one opens, and its
``output_index`` is its place in the response's ``output``. Once the turn is committed:
``response.completed`` (``response.incomplete`` on the length limit) with the whole
response: a client that rebuilds the turn from the ``response.output_item.done`` items
gets that response's ``output``, item for item, ids included. An error after the first
byte is an ``error`` event (framed by :func:`tito.server.adapter.framed`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

import orjson

from tito.parse.stream import Delta
from tito.server.errors import error_type
from tito.server.gateway import TurnOutcome
from tito.server.responses.convert import Spaces, call_item, item_id
from tito.server.responses.models import OutputItem, ResponseBody
from tito.server.serving import TurnStream
from tito.types.errors import TitoError
from tito.types.messages import ParsedCompletion

Parse = Callable[[Any, str], ParsedCompletion]


class ResponseEvents:
    """Numbered events and the output items opened so far."""

    def __init__(self, response_id: str, spaces: Spaces | None = None) -> None:
        self.response_id = response_id
        self.spaces = spaces
        """Flat tool names -> (namespace, name) (:func:`~tito.server.responses.convert.
        call_item`)."""
        self.sequence = 0
        self.index = -1
        self.open: str | None = None
        self.text = ""
        self.sent: set[str] = set()

    def event(self, kind: str, **data: Any) -> bytes:
        payload = orjson.dumps({"type": kind, "sequence_number": self.sequence, **data})
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"

    def delta(self, kind: str, text: str) -> list[bytes]:
        item = item_id(self.response_id, kind)
        if self.open != kind and item in self.sent:
            return []  # reasoning after the text or a call: only the response has it
        out = [] if self.open == kind else self.close() + self._open(kind)
        self.text += text
        if kind == "rs":
            out.append(self.event("response.reasoning_summary_text.delta", item_id=item,
                                  output_index=self.index, summary_index=0, delta=text))
        else:
            out.append(self.event("response.output_text.delta", item_id=item,
                                  output_index=self.index, content_index=0, delta=text,
                                  logprobs=[]))
        return out

    def _open(self, kind: str) -> list[bytes]:
        self.index += 1
        self.open, self.text = kind, ""
        item = item_id(self.response_id, kind)
        self.sent.add(item)
        if kind == "rs":
            return [self.event("response.output_item.added", output_index=self.index,
                               item={"type": "reasoning", "id": item, "summary": []}),
                    self.event("response.reasoning_summary_part.added", item_id=item,
                               output_index=self.index, summary_index=0,
                               part={"type": "summary_text", "text": ""})]
        return [self.event("response.output_item.added", output_index=self.index, item={
                    "type": "message", "id": item, "role": "assistant",
                    "status": "in_progress", "content": []}),
                self.event("response.content_part.added", item_id=item,
                           output_index=self.index, content_index=0,
                           part={"type": "output_text", "text": "", "annotations": []})]

    def close(self, status: str = "completed") -> list[bytes]:
        """Close the open item; ``status``: a message's final status."""
        kind, self.open = self.open, None
        if kind is None:
            return []
        item = item_id(self.response_id, kind)
        if kind == "rs":
            summary = {"type": "summary_text", "text": self.text}
            return [self.event("response.reasoning_summary_text.done", item_id=item,
                               output_index=self.index, summary_index=0, text=self.text),
                    self.event("response.reasoning_summary_part.done", item_id=item,
                               output_index=self.index, summary_index=0, part=summary),
                    self.event("response.output_item.done", output_index=self.index, item={
                        "type": "reasoning", "id": item, "summary": [summary]})]
        part: dict[str, Any] = {"type": "output_text", "text": self.text, "annotations": []}
        return [self.event("response.output_text.done", item_id=item,
                           output_index=self.index, content_index=0, text=self.text,
                           logprobs=[]),
                self.event("response.content_part.done", item_id=item,
                           output_index=self.index, content_index=0, part=part),
                self.event("response.output_item.done", output_index=self.index, item={
                    "type": "message", "id": item, "role": "assistant",
                    "status": status, "content": [part]})]

    def whole(self, item: OutputItem) -> list[bytes]:
        """An item sent at once (opened and closed): an empty reasoning item, or one the
        deltas did not carry."""
        self.index += 1
        self.sent.add(item["id"])
        return [self.event("response.output_item.added", output_index=self.index, item=item),
                self.event("response.output_item.done", output_index=self.index, item=item)]

    def reasoning_first(self) -> list[bytes]:
        """The (empty) reasoning item, before the first text or call, when nothing opened
        it yet."""
        item = item_id(self.response_id, "rs")
        if item in self.sent:
            return []
        return self.close() + self.whole({"type": "reasoning", "id": item, "summary": []})

    def call(self, index: int, call: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        opened = call_item(self.response_id, index, call, self.spaces, done=False)
        done = call_item(self.response_id, index, call, self.spaces)
        self.sent.add(done["id"])
        return [
            *out,
            self.event("response.output_item.added", output_index=self.index, item=opened),
            self.event("response.function_call_arguments.delta", item_id=done["id"],
                       output_index=self.index, delta=done["arguments"]),
            self.event("response.function_call_arguments.done", item_id=done["id"],
                       output_index=self.index, arguments=done["arguments"],
                       name=done["name"]),
            self.event("response.output_item.done", output_index=self.index, item=done)]

    def items(self, delta: Delta) -> list[bytes]:
        out = self.delta("rs", delta.reasoning) if delta.reasoning else []
        if delta.has_reasoning and (delta.content or delta.calls):
            out += self.reasoning_first()
        if delta.content:
            out += self.delta("msg", delta.content)
        for i, call in enumerate(delta.calls, start=delta.first_call):
            out += self.call(i, call)
        return out

    def error(self, error: TitoError) -> bytes:
        """A failure after the first byte: an ``error`` event."""
        return self.event("error", code=error.code, message=error.message, param=None,
                          error_type=error_type(error))

    def finish(self, body: ResponseBody) -> list[bytes]:
        """Close the open item, send the items of the final response the deltas did not
        carry (e.g. the only, empty, message item), then the terminal event with the
        whole response."""
        status = next((item["status"] for item in body["output"]
                       if item["type"] == "message"), "completed")
        out = self.close(status)
        for item in body["output"]:
            if item["id"] not in self.sent:
                out += self.whole(item)
        kind = "response.incomplete" if body["status"] == "incomplete" else \
            "response.completed"
        return [*out, self.event(kind, response=body)]


async def live_events(stream: TurnStream, head: dict[str, Any], parse: Parse,
                      reply: Callable[[TurnOutcome], ResponseBody], events: ResponseEvents
                      ) -> AsyncGenerator[bytes, None]:
    """The stream of one turn; ``head``: the response without output (``in_progress``);
    ``reply``: the final response of the committed outcome."""
    yield events.event("response.created", response=head)
    yield events.event("response.in_progress", response=head)
    async for event in stream.deltas(parse):
        chunks = events.items(event) if isinstance(event, Delta) else \
            events.finish(reply(event))
        for chunk in chunks:
            yield chunk

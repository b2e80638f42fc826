"""Responses items <-> chat messages, and a turn's outcome -> a ``response`` (pure).

The conversion is deterministic, so resending the same history gives byte-identical
message dicts (the session's replay matching compares them, design §5.3):

- a run of ``reasoning``, assistant ``message`` and ``function_call`` items, in that order,
  is ONE assistant message ``{"role", "content", "reasoning_content"?, "tool_calls"?}``:
  the keys, their order and presence are those of
  :meth:`~tito.types.messages.ParsedCompletion.to_message`, so a client that echoes the
  output items of a response back matches the assistant message the session stored. A
  reasoning item that follows any part of the run, or an assistant message that follows
  a message or a call, starts a new one (a response's output is at most one reasoning
  item and one message, then its calls);
- ``function_call_output`` -> ``{"role": "tool", "tool_call_id", "content"}``;
- user/system/developer messages -> ``{"role", "content"}`` (``developer`` read as
  ``system``); content parts are joined with ``""``.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from tito.server.gateway import TurnOutcome
from tito.server.responses.models import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    MessageItem,
    OutputFunctionCall,
    OutputItem,
    ReasoningItem,
    ResponseBody,
    ResponsesRequest,
    TextPart,
)
from tito.types.engine import SamplingParams
from tito.types.errors import BadRequest
from tito.types.messages import Message

REASONING, MESSAGE, CALL = 0, 1, 2
"""The order of the parts of one assistant turn among the input items."""
THINKING_OFF = ("none", "minimal")
"""``reasoning.effort`` values that switch the family's thinking off."""


def text_of(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def reasoning_text(item: ReasoningItem) -> str:
    """The raw reasoning (``content``) when the item has it, else its summary."""
    if item.content:
        return "".join(p.text for p in item.content)
    return "".join(p.text for p in item.summary)


@dataclass
class _Turn:
    """One assistant message being assembled from consecutive items."""

    rank: int = -1
    """The last part added (:data:`REASONING`, :data:`MESSAGE` or :data:`CALL`)."""
    reasoning: str | None = None
    content: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def accepts(self, rank: int) -> bool:
        return rank > self.rank or rank == self.rank == CALL

    def add(self, item: ReasoningItem | MessageItem | FunctionCallItem) -> None:
        if isinstance(item, ReasoningItem):
            self.rank, self.reasoning = REASONING, reasoning_text(item)
        elif isinstance(item, MessageItem):
            self.rank, self.content = MESSAGE, text_of(item.content)
        else:
            self.rank = CALL
            self.calls.append({"id": item.call_id, "type": "function",
                               "function": {"name": item.name, "arguments": item.arguments}})

    def message(self) -> Message:
        """In the key order of ``ParsedCompletion.to_message``."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.calls:
            message["tool_calls"] = self.calls
        return message


def _rank(item: InputItem) -> int | None:
    """The item's place in an assistant turn; None: not part of one."""
    if isinstance(item, ReasoningItem):
        return REASONING
    if isinstance(item, FunctionCallItem):
        return CALL
    if isinstance(item, MessageItem) and item.role == "assistant":
        return MESSAGE
    return None


def chat_messages(items: list[InputItem]) -> list[Message]:
    """Input items -> chat messages (see the module docstring)."""
    out: list[Message] = []
    extend_chat_messages(out, items)
    return out


def extend_chat_messages(out: list[Message], items: list[InputItem],
                         breaks: list[tuple[int, int]] | None = None, first: int = 0
                         ) -> None:
    """Append the chat messages of ``items`` to ``out``, which must end where no assistant
    turn is open (the end of a whole conversion, or one of its breaks). ``breaks``: gets
    ``(first + i, len(out))`` for each place ``i`` (an item, or the end) where no
    assistant turn is open: the conversion of the items from there on, appended to
    ``out[:len]``, continues this one exactly."""
    turn: _Turn | None = None
    for i, item in enumerate(items):
        if turn is None and breaks is not None:
            breaks.append((first + i, len(out)))
        rank = _rank(item)
        if rank is not None:
            assert not isinstance(item, FunctionCallOutputItem)
            if turn is None or not turn.accepts(rank):
                if turn is not None:
                    out.append(turn.message())
                turn = _Turn()
            turn.add(item)
            continue
        if turn is not None:
            out.append(turn.message())
            turn = None
        message = _outside_turn(item)
        if message is not None:
            out.append(message)
    if turn is not None:
        out.append(turn.message())
    elif breaks is not None:
        breaks.append((first + len(items), len(out)))


def _outside_turn(item: InputItem) -> Message | None:
    """The chat message of an item that is not part of an assistant turn."""
    if isinstance(item, FunctionCallOutputItem):
        return {"role": "tool", "tool_call_id": item.call_id, "content": text_of(item.output)}
    if isinstance(item, MessageItem):
        role = "system" if item.role == "developer" else item.role
        return {"role": role, "content": text_of(item.content)}
    return None


def with_instructions(messages: list[Message], instructions: str | None) -> list[Message]:
    """``instructions`` as the leading system message: it replaces the one ``messages``
    starts with, or is inserted before them."""
    if instructions is None:
        return messages
    system: Message = {"role": "system", "content": instructions}
    if messages and messages[0].get("role") == "system":
        return messages if messages[0] == system else [system, *messages[1:]]
    return [system, *messages]


def chat_tools(tools: list[FunctionTool] | None) -> list[dict[str, Any]] | None:
    """Function tools in the Chat Completions shape (``strict`` is not part of it)."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.parameters is not None:
            function["parameters"] = tool.parameters
        out.append({"type": "function", "function": function})
    return out


def template_kwargs(request: ResponsesRequest, thinking_kwarg: str | None
                    ) -> dict[str, Any] | None:
    """``reasoning.effort`` none/minimal switches thinking off where the family can."""
    effort = request.reasoning.effort if request.reasoning is not None else None
    if effort in THINKING_OFF and thinking_kwarg is not None:
        return {thinking_kwarg: False}
    return None


def sampling_params(request: ResponsesRequest, *, default_max_tokens: int) -> SamplingParams:
    """Explicit engine settings (OpenAI's defaults filled in; ``text.format`` as the JSON
    schema of structured output)."""
    return SamplingParams(
        max_new_tokens=request.max_output_tokens or default_max_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=-1, min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0,
        repetition_penalty=1.0, stop=(), stop_token_ids=(), seed=None,
        json_schema=text_format_schema(request.text),
    )


def text_format_schema(text: Any) -> str | None:
    """``text.format`` as a JSON schema (JSON text): ``json_schema`` its ``schema``,
    ``json_object`` any object; None: free text (``text``, or no format)."""
    fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return '{"type": "object"}'
    if kind != "json_schema" or not isinstance(fmt, dict):
        return None
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise BadRequest("text.format.schema must be an object (a JSON schema)")
    return json.dumps(schema, ensure_ascii=False)


# -- outcome -> response -----------------------------------------------------------------
def item_id(response_id: str, kind: str, index: int = 0) -> str:
    """A stable output-item id (``rs_``, ``msg_``, ``fc_``): the streamed items and the
    final response name the same items alike."""
    digest = hashlib.sha256(f"{response_id}/{kind}/{index}".encode()).hexdigest()[:32]
    return f"{kind}_{digest}"


def call_item(response_id: str, index: int, call: dict[str, Any], *,
              done: bool = True) -> OutputFunctionCall:
    """A tool call as a ``function_call`` item (``done=False``: as a stream opens it,
    ``in_progress`` and without its arguments)."""
    function = call["function"]
    return {"type": "function_call", "id": item_id(response_id, "fc", index),
            "call_id": call["id"], "name": function["name"],
            "arguments": function["arguments"] if done else "",
            "status": "completed" if done else "in_progress"}


def output_items(outcome: TurnOutcome, response_id: str) -> list[OutputItem]:
    """The turn's assistant message as output items: its reasoning (whenever the message
    has ``reasoning_content``, even empty), its text, its calls. A turn that produced none
    of these still gets an (empty) message item, so that echoing the output back keeps
    the assistant turn in the history."""
    parsed = outcome.parsed
    incomplete = parsed.finish_reason == "length"
    items: list[OutputItem] = []
    reasoning = parsed.reasoning_content
    if reasoning is not None:  # empty reasoning: no summary part (it echoes back as "")
        items.append({"type": "reasoning", "id": item_id(response_id, "rs"),
                      "summary": [{"type": "summary_text", "text": reasoning}]
                      if reasoning else []})
    if parsed.content or not (items or parsed.tool_calls):
        items.append({"type": "message", "id": item_id(response_id, "msg"),
                      "role": "assistant",
                      "status": "incomplete" if incomplete else "completed",
                      "content": [{"type": "output_text", "text": parsed.content or "",
                                   "annotations": []}]})
    items += [call_item(response_id, i, call) for i, call in enumerate(parsed.tool_calls)]
    return items


def echoed_tools(tools: list[FunctionTool] | None) -> list[dict[str, Any]]:
    return [{"type": "function", "name": t.name, "description": t.description,
             "parameters": t.parameters, "strict": t.strict} for t in tools or ()]


def response_body(outcome: TurnOutcome, request: ResponsesRequest, response_id: str,
                  model: str) -> ResponseBody:
    """The ``response`` of a turn, echoing the request's settings as OpenAI does."""
    finish = outcome.parsed.finish_reason
    generated = len(outcome.result.output_ids)
    body: ResponseBody = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if finish == "length" else
                  "cancelled" if finish == "abort" else "completed",
        "model": model,
        "output": output_items(outcome, response_id),
        "usage": {"input_tokens": outcome.prompt_tokens,
                  "input_tokens_details": {"cached_tokens": outcome.result.cached_tokens,
                                           "cache_write_tokens": 0},
                  "output_tokens": generated,
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": outcome.prompt_tokens + generated},
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
        **echoed_settings(request),  # type: ignore[typeddict-item]
    }
    return body


def response_head(request: ResponsesRequest, response_id: str, model: str
                  ) -> dict[str, Any]:
    """The response as a stream opens it: ``in_progress``, no output, no usage yet."""
    return {"id": response_id, "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "model": model, "output": [], "usage": None,
            "error": None, "incomplete_details": None, **echoed_settings(request)}


def echoed_settings(request: ResponsesRequest) -> dict[str, Any]:
    out: dict[str, Any] = {
        "instructions": request.instructions,
        "previous_response_id": request.previous_response_id,
        "parallel_tool_calls": True if request.parallel_tool_calls is None
        else request.parallel_tool_calls,
        "tool_choice": "auto" if request.tool_choice is None else request.tool_choice,
        "tools": echoed_tools(request.tools),
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "max_output_tokens": request.max_output_tokens,
        "store": True if request.store is None else request.store,
        "metadata": request.metadata or {},
    }
    if request.reasoning is not None:
        out["reasoning"] = {"effort": request.reasoning.effort,
                            "summary": request.reasoning.summary}
    return out

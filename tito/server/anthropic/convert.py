"""Anthropic Messages <-> the session core's chat messages (OpenAI shape).

The conversion is deterministic, so a client that sends its history again produces the
same message dicts and the session's replay matcher sees the turns it stored:

* ``system`` (a string or text blocks) -> one leading ``system`` message; text blocks are
  joined with ``"\\n"``;
* a user message: its ``tool_result`` blocks -> one ``tool`` message each (in order,
  ``is_error: true`` prefixes the result with ``"Error: "``: chat templates have no error
  field, and the model must see that the call failed), then its text blocks -> one
  ``user`` message;
* an assistant message: ``thinking`` -> ``reasoning_content``, text -> ``content``,
  ``tool_use`` -> ``tool_calls`` (``arguments`` = ``json.dumps(input)``, as the gateway
  writes them); ``redacted_thinking`` carries no text and is dropped;
* ``system`` / ``developer`` roles inside ``messages`` (sent by some harness versions) ->
  ``system`` messages at their place, as engines serving this API do.

Images, documents, search results and server tools are refused with a 400 that says so.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from tito.render.base import TemplateRenderer
from tito.server.anthropic.models import (
    ContentBlock,
    CountTokensRequest,
    InputMessage,
    MessageReply,
    MessagesRequest,
    ToolUseBlock,
)
from tito.server.gateway import TurnOutcome
from tito.types.engine import SamplingParams
from tito.types.errors import BadRequest
from tito.types.messages import Message, TurnRequest

UNSUPPORTED_BLOCKS = {
    "image": "images are not supported (the gateway serves text models)",
    "document": "documents are not supported (the gateway serves text models)",
    "search_result": "search_result blocks are not supported",
    "server_tool_use": "server tools are not supported (declare client tools instead)",
    "web_search_tool_result": "server tools are not supported (declare client tools instead)",
    "web_fetch_tool_result": "server tools are not supported (declare client tools instead)",
    "code_execution_tool_result": "server tools are not supported (declare client tools "
                                  "instead)",
    "container_upload": "container uploads are not supported",
    "mcp_tool_use": "MCP connector blocks are not supported (declare client tools instead)",
    "mcp_tool_result": "MCP connector blocks are not supported (declare client tools "
                       "instead)",
}
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
                "abort": "pause_turn"}
"""Chat finish reason -> Anthropic ``stop_reason`` (``stop_sequence`` when a stop
sequence ended the turn). A generation aborted by an engine pause is ``pause_turn``: the
client may send the same request again."""


# -- request -> core ---------------------------------------------------------------------
def turn_request(req: MessagesRequest | CountTokensRequest,
                 renderer: TemplateRenderer) -> TurnRequest:
    messages: list[Message] = []
    system = system_message(req)
    if system is not None:
        messages.append(system)
    for i, message in enumerate(req.messages):
        messages.extend(chat_messages(message, i))
    return TurnRequest(messages=messages, tools=tools_of(req),
                       template_kwargs=thinking_kwargs(req, renderer))


def system_message(req: MessagesRequest | CountTokensRequest) -> Message | None:
    """The leading ``system`` message of ``req.system`` (None: there is none)."""
    system = _system_text(req.system, "system")
    return None if system is None else {"role": "system", "content": system}


def chat_messages(message: InputMessage, index: int) -> list[Message]:
    """The chat messages of ``messages[index]`` (each converts on its own)."""
    where = f"messages.{index}"
    if message.role == "user":
        return _user(message.content, where)
    if message.role == "assistant":
        return [_assistant(message.content, where)]
    if message.role in ("system", "developer"):
        text = _system_text(message.content, where)
        return [{"role": "system", "content": text or ""}]
    raise BadRequest(f"{where}.role: {message.role!r} is not a role of the Messages "
                     "API (user, assistant)")


def sampling_params(req: MessagesRequest) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=req.max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=-1 if req.top_k is None else req.top_k,
        stop=tuple(req.stop_sequences or ()),
    )


def _system_text(value: str | list[dict[str, Any]] | None, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return "\n".join(_text_of(block, f"{where}.{i}") for i, block in enumerate(value))


def _text_of(block: Any, where: str) -> str:
    kind = _kind(block, where)
    if kind != "text":
        raise BadRequest(f"{where}: a {kind!r} block is not allowed here (only text)")
    text = block.get("text")
    if not isinstance(text, str):
        raise BadRequest(f"{where}.text must be a string")
    return text


def _kind(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise BadRequest(f"{where}: a content block must be an object with a string 'type'")
    kind: str = block["type"]
    if kind in UNSUPPORTED_BLOCKS:
        raise BadRequest(f"{where}: {UNSUPPORTED_BLOCKS[kind]}")
    return kind


def _user(content: str | list[dict[str, Any]], where: str) -> list[Message]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[Message] = []
    texts: list[str] = []
    for i, block in enumerate(content):
        at = f"{where}.content.{i}"
        kind = _kind(block, at)
        if kind == "text":
            texts.append(_text_of(block, at))
        elif kind == "tool_result":
            out.append(_tool_result(block, at))
        elif kind in ("thinking", "redacted_thinking", "tool_use"):
            raise BadRequest(f"{at}: a {kind!r} block belongs to an assistant message")
        else:
            raise BadRequest(f"{at}: unknown content block type {kind!r}")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_result(block: dict[str, Any], where: str) -> Message:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise BadRequest(f"{where}.tool_use_id must be a non-empty string")
    content = block.get("content", "")
    if isinstance(content, list):
        text = "\n".join(_text_of(part, f"{where}.content.{i}")
                         for i, part in enumerate(content))
    elif isinstance(content, str):
        text = content
    elif content is None:
        text = ""
    else:
        raise BadRequest(f"{where}.content must be a string or a list of text blocks")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise BadRequest(f"{where}.is_error must be a boolean")
    if is_error and not text.startswith("Error: "):
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _assistant(content: str | list[dict[str, Any]], where: str) -> Message:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        at = f"{where}.content.{i}"
        kind = _kind(block, at)
        if kind == "text":
            texts.append(_text_of(block, at))
        elif kind == "thinking":
            thoughts.append(_thinking_text(block, at))
        elif kind == "redacted_thinking":
            continue  # opaque: nothing a template can render
        elif kind == "tool_use":
            calls.append(_tool_use(block, at))
        elif kind == "tool_result":
            raise BadRequest(f"{at}: a 'tool_result' block belongs to a user message")
        else:
            raise BadRequest(f"{at}: unknown content block type {kind!r}")
    message: Message = {"role": "assistant", "content": "".join(texts) if texts else None}
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _thinking_text(block: dict[str, Any], where: str) -> str:
    thinking = block.get("thinking")
    if not isinstance(thinking, str):
        raise BadRequest(f"{where}.thinking must be a string")
    return thinking


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not isinstance(name, str) or not name:
        raise BadRequest(f"{where}: a tool_use block needs a string 'id' and 'name'")
    if not isinstance(args, dict):
        raise BadRequest(f"{where}.input must be an object")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def tools_of(req: MessagesRequest | CountTokensRequest) -> list[dict[str, Any]] | None:
    """``req.tools`` as chat tools (client tools only)."""
    tools = req.tools
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise BadRequest(f"tools.{i}: server tool {tool.type!r} is not supported "
                             "(declare client tools with name and input_schema)")
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.input_schema or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def thinking_kwargs(req: MessagesRequest | CountTokensRequest,
                    renderer: TemplateRenderer) -> dict[str, Any] | None:
    """``thinking`` -> the family's thinking switch (ignored by families without one)."""
    kwarg = renderer.spec.thinking_kwarg
    if req.thinking is None or kwarg is None:
        return None
    return {kwarg: req.thinking.type != "disabled"}


# -- outcome -> response -----------------------------------------------------------------
def message_reply(outcome: TurnOutcome, model: str, stop_sequences: list[str] | None
                  ) -> MessageReply:
    parsed = outcome.parsed
    content: list[ContentBlock] = []
    if parsed.reasoning_content:
        content.append({"type": "thinking", "thinking": parsed.reasoning_content,
                        "signature": signature(parsed.reasoning_content)})
    if parsed.content:
        content.append({"type": "text", "text": parsed.content})
    content += [tool_use_block(call) for call in parsed.tool_calls]
    stop_reason = STOP_REASONS.get(parsed.finish_reason, "end_turn")
    matched = outcome.result.matched_stop
    stop_sequence = matched if isinstance(matched, str) and matched in (stop_sequences or ()) \
        else None
    if stop_sequence is not None and stop_reason == "end_turn":
        stop_reason = "stop_sequence"
    cached = outcome.result.cached_tokens
    return {
        "id": outcome.response_id or f"msg_{os.urandom(16).hex()}",
        "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason, "stop_sequence": stop_sequence,
        "usage": {"input_tokens": outcome.prompt_tokens - cached,
                  "output_tokens": len(outcome.result.output_ids),
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached},
    }


def tool_use_block(call: dict[str, Any]) -> ToolUseBlock:
    """An OpenAI-shaped tool call as a ``tool_use`` block (``input`` its parsed arguments:
    the gateway writes them as a JSON object)."""
    function = call["function"]
    try:
        args = json.loads(function["arguments"])
    except (TypeError, ValueError):
        args = None
    return {"type": "tool_use", "id": call["id"], "name": function["name"],
            "input": args if isinstance(args, dict) else {}}


def signature(thinking: str) -> str:
    """A stable stand-in for Anthropic's thinking signature (clients must send it back;
    the gateway does not check it)."""
    return "tito-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]

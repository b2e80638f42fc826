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

Tool search (what Claude Code does with many MCP tools): a tool with ``defer_loading: true``
is not rendered with the others; a ``tool_reference`` block inside a ``tool_result``
renders the named tool's definition there, as the chat tool JSON
(``{"type": "function", "function": {...}}``, ``json.dumps`` as Jinja's ``tojson`` writes
it), consecutive references one per line inside ``<tools>`` / ``</tools>`` lines
(:func:`tools_block`), for every family. The definition joins the history where the
reference stands, so the rendered prefix never changes.

Anthropic's hosted tools (a ``type`` other than ``custom``) are left out of the render and
noted, or refused under ``--hosted-tools error``; an ``image`` block (in a user message or
a tool result) is refused, or rendered as a marker under ``--images placeholder``
(:mod:`tito.server.unsupported`). Documents, search results and server-tool blocks are
refused with a 400 that says so.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from tito.render.base import TemplateRenderer
from tito.server.anthropic.models import (
    ContentBlock,
    CountTokensRequest,
    InputMessage,
    MessageReply,
    MessagesRequest,
    ToolDef,
    ToolUseBlock,
)
from tito.server.gateway import TurnOutcome
from tito.server.unsupported import (
    NOTE_HOSTED_TOOLS,
    NOTE_IMAGES,
    hosted_tools_refused,
    image_text,
)
from tito.types.engine import SamplingParams
from tito.types.errors import BadRequest
from tito.types.messages import Message, TurnRequest

UNSUPPORTED_BLOCKS = {
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
CLIENT_TOOL_TYPES = (None, "custom")
"""A tool of another ``type`` is one of Anthropic's hosted tools."""
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
                "abort": "pause_turn"}
"""Chat finish reason -> Anthropic ``stop_reason`` (``stop_sequence`` when a stop
sequence ended the turn). A generation aborted by an engine pause is ``pause_turn``: the
client may send the same request again."""


@dataclass(frozen=True, slots=True)
class ToolSet:
    """A request's ``tools``, as the turn uses them."""

    rendered: list[dict[str, Any]] | None
    """The chat tools the template renders (client tools not deferred); None: none."""
    declared: dict[str, dict[str, Any]]
    """Every client tool by name, deferred ones included (what a tool_reference shows)."""
    hosted: list[str]
    """The hosted tools left out, by type."""


NO_TOOLS = ToolSet(None, {}, [])


@dataclass(slots=True)
class Conversion:
    """What converting messages reads (the image policy, the declared tools) and counts."""

    images: str = "reject"
    """``--images``: ``reject`` or ``placeholder``."""
    declared: dict[str, dict[str, Any]] = field(default_factory=dict)
    replaced: int = 0
    """Images rendered as the marker so far."""


# -- request -> core ---------------------------------------------------------------------
def turn_request(req: MessagesRequest | CountTokensRequest, renderer: TemplateRenderer, *,
                 images: str = "reject", hosted_tools: str = "drop") -> TurnRequest:
    """The core turn of ``req``; ``images`` and ``hosted_tools``: the server's
    ``--images`` and ``--hosted-tools``."""
    messages: list[Message] = []
    system = system_message(req)
    if system is not None:
        messages.append(system)
    tools = tools_of(req, hosted_tools)
    conversion = Conversion(images, tools.declared)
    for i, message in enumerate(req.messages):
        messages.extend(chat_messages(message, i, conversion))
    return TurnRequest(messages=messages, tools=tools.rendered,
                       template_kwargs=thinking_kwargs(req, renderer),
                       notes=turn_notes(tools, conversion.replaced))


def turn_notes(tools: ToolSet, images: int) -> dict[str, Any] | None:
    """What the conversion changed (:attr:`TurnRequest.notes`): hosted tools left out,
    images replaced; None: nothing."""
    notes: dict[str, Any] = {}
    if tools.hosted:
        notes[NOTE_HOSTED_TOOLS] = list(tools.hosted)
    if images:
        notes[NOTE_IMAGES] = images
    return notes or None


def system_message(req: MessagesRequest | CountTokensRequest) -> Message | None:
    """The leading ``system`` message of ``req.system`` (None: there is none)."""
    system = _system_text(req.system, "system")
    return None if system is None else {"role": "system", "content": system}


def chat_messages(message: InputMessage, index: int,
                  conversion: Conversion) -> list[Message]:
    """The chat messages of ``messages[index]`` (each converts on its own, given the
    request's declared tools and the image policy in ``conversion``, which counts the
    images it replaces)."""
    where = f"messages.{index}"
    if message.role == "user":
        return _user(message.content, where, conversion)
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
        json_schema=output_schema(req),
    )


def output_schema(req: MessagesRequest | CountTokensRequest) -> str | None:
    """The structured-output schema as JSON text: ``output_config.format``, else the
    beta's ``output_format``; None: free text."""
    config = req.output_config
    fmt = config.format if config is not None and config.format is not None \
        else req.output_format
    return None if fmt is None else json.dumps(fmt.json_schema, ensure_ascii=False)


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


def _image_or_text(block: Any, where: str, conversion: Conversion) -> str:
    """The text of a text block, or of an image (the marker, or 400 by the policy)."""
    if isinstance(block, dict) and block.get("type") == "image":
        text = image_text(conversion.images, where)
        conversion.replaced += 1
        return text
    return _text_of(block, where)


def _user(content: str | list[dict[str, Any]], where: str,
          conversion: Conversion) -> list[Message]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[Message] = []
    texts: list[str] = []
    for i, block in enumerate(content):
        at = f"{where}.content.{i}"
        kind = _kind(block, at)
        if kind in ("text", "image"):
            texts.append(_image_or_text(block, at, conversion))
        elif kind == "tool_result":
            out.append(_tool_result(block, at, conversion))
        elif kind in ("thinking", "redacted_thinking", "tool_use"):
            raise BadRequest(f"{at}: a {kind!r} block belongs to an assistant message")
        elif kind == "tool_reference":
            raise BadRequest(f"{at}: a 'tool_reference' block belongs inside a tool_result")
        else:
            raise BadRequest(f"{at}: unknown content block type {kind!r}")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_result(block: dict[str, Any], where: str, conversion: Conversion) -> Message:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise BadRequest(f"{where}.tool_use_id must be a non-empty string")
    content = block.get("content", "")
    if isinstance(content, list):
        text = _result_text(content, f"{where}.content", conversion)
    elif isinstance(content, str):
        text = content
    elif content is None:
        text = ""
    else:
        raise BadRequest(f"{where}.content must be a string or a list of content blocks")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise BadRequest(f"{where}.is_error must be a boolean")
    if is_error and not text.startswith("Error: "):
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _result_text(parts: list[Any], where: str, conversion: Conversion) -> str:
    """A tool result's blocks as one text, joined with ``"\\n"``: text blocks, images
    (by the policy), and each run of tool references as one :func:`tools_block`."""
    texts: list[str] = []
    run: list[str] = []  # the tools of consecutive references
    for i, part in enumerate(parts):
        at = f"{where}.{i}"
        if _kind(part, at) == "tool_reference":
            run.append(_referenced_tool(part, at, conversion.declared))
            continue
        if run:
            texts.append(tools_block(run))
            run = []
        texts.append(_image_or_text(part, at, conversion))
    if run:
        texts.append(tools_block(run))
    return "\n".join(texts)


def tools_block(tools: list[str]) -> str:
    """Tool definitions (JSON texts) as a tool result shows them: one per line between
    ``<tools>`` and ``</tools>`` lines, as Hermes-style templates list tools."""
    return "<tools>\n" + "\n".join(tools) + "\n</tools>"


def _referenced_tool(block: dict[str, Any], where: str,
                     declared: dict[str, dict[str, Any]]) -> str:
    """The JSON text of the tool a ``tool_reference`` names (400 when it is not declared)."""
    name = block.get("tool_name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.tool_name must be a non-empty string")
    tool = declared.get(name)
    if tool is None:
        raise BadRequest(f"{where}: tool_reference names {name!r}, which is not a client "
                         "tool declared in tools (a referenced tool must be declared, "
                         "usually with defer_loading: true)")
    return json.dumps(tool, ensure_ascii=False)


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


def tools_of(req: MessagesRequest | CountTokensRequest, hosted_tools: str = "drop"
             ) -> ToolSet:
    """``req.tools`` as the turn uses them: client tools as chat tools (rendered unless
    deferred), hosted ones left out (400 under ``hosted_tools`` ``error``)."""
    if not req.tools:
        return NO_TOOLS
    rendered: list[dict[str, Any]] = []
    declared: dict[str, dict[str, Any]] = {}
    hosted: list[str] = []
    for i, tool in enumerate(req.tools):
        if tool.type not in CLIENT_TOOL_TYPES:
            hosted.append(str(tool.type))
            continue
        chat = chat_tool(tool, i)
        declared[chat["function"]["name"]] = chat
        if not tool.defer_loading:
            rendered.append(chat)
    hosted_tools_refused(hosted_tools, hosted, "tools")
    return ToolSet(rendered or None, declared, hosted)


def chat_tool(tool: ToolDef, index: int) -> dict[str, Any]:
    """A client tool as a chat tool (``{"type": "function", "function": ...}``)."""
    if tool.name is None:
        raise BadRequest(f"tools.{index}.name: a client tool needs a name")
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.input_schema or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def thinking_kwargs(req: MessagesRequest | CountTokensRequest,
                    renderer: TemplateRenderer) -> dict[str, Any] | None:
    """``thinking`` -> the family's thinking switch (its effort level for a family whose
    template has levels and no switch, e.g. inkling; ignored by families with neither)."""
    if req.thinking is None:
        return None
    return renderer.thinking_switch_kwargs(req.thinking.type != "disabled") or None


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

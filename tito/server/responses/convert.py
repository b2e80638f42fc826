"""Responses items <-> chat messages, and a turn's outcome -> a ``response`` (pure).

The conversion is deterministic, so resending the same history gives byte-identical
message dicts (the session's replay matching compares them, design §5.3):

- a run of ``reasoning``, assistant ``message`` and ``function_call`` items is ONE
  assistant message ``{"role", "content", "reasoning_content"?, "tool_calls"?}``: the
  keys, their order and presence are those of
  :meth:`~tito.types.messages.ParsedCompletion.to_message`, so a client that echoes the
  output items of a response back matches the assistant message the session stored. A
  turn holds one reasoning item, wherever it stands among the turn's other items (a
  client that rebuilt the turn from stream events may list it after the calls), one
  message and any number of calls: a second reasoning item starts a new turn, and so
  does an assistant message that follows a message or a call (a reasoning item right
  before such a message opens the message's turn);
- a ``function_call`` of a namespace tool (``namespace`` set) is the call of its flat
  name (:func:`flat_name`), the name the model saw and called;
- ``function_call_output`` -> ``{"role": "tool", "tool_call_id", "content"}``;
- user/system/developer messages -> ``{"role", "content"}`` (``developer`` read as
  ``system``); content parts are joined with ``""``, an ``input_image`` part (a user
  message's, a function call's output) as :data:`~tito.server.unsupported.IMAGE_MARKER`,
  noted (:data:`Images`) for the ``--images`` policy.

Tools: function tools are rendered as they are, the function tools of a ``namespace``
tool under their flat names, and hosted tools (``web_search``, ``file_search``, ``mcp``
...) are left out (:func:`hosted_names`; ``--hosted-tools``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tito.server.gateway import TurnOutcome
from tito.server.responses.models import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    HostedTool,
    ImagePart,
    InputItem,
    MessageItem,
    NamespaceTool,
    OutputFunctionCall,
    OutputItem,
    Part,
    ReasoningItem,
    ResponseBody,
    ResponsesRequest,
    Tool,
)
from tito.server.unsupported import IMAGE_MARKER
from tito.types.engine import SamplingParams
from tito.types.errors import BadRequest
from tito.types.messages import Message

Spaces = Mapping[str, tuple[str, str]]
"""A flat tool name (as the model calls it) -> (namespace, name) of the function tools of
a request's namespace tools."""
SEPARATORS = "_-.:/"
"""A namespace that ends with one of these is joined to its tools' names as it is."""


def flat_name(namespace: str | None, name: str) -> str:
    """The name the model calls a namespace's function tool by: the namespace and the
    name, joined with ``__`` unless the namespace ends with a separator (Codex's MCP
    namespaces, ``mcp__server__``, do)."""
    if not namespace:
        return name
    return namespace + name if namespace[-1] in SEPARATORS else f"{namespace}__{name}"


Images = list[tuple[int, str]]
"""The images a conversion turned into :data:`~tito.server.unsupported.IMAGE_MARKER`: (the
item's index, the part's place, e.g. ``input[3].content[1]``)."""


def text_of(content: str | list[Part], images: Images | None = None, index: int = 0,
            field: str = "content") -> str:
    """The text of ``content``: its parts joined with ``""``, an image as the marker
    (noted in ``images``)."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, ImagePart):
            texts.append(IMAGE_MARKER)
            if images is not None:
                images.append((index, f"input[{index}].{field}[{j}]"))
        else:
            texts.append(part.text)
    return "".join(texts)


def reasoning_text(item: ReasoningItem) -> str:
    """The raw reasoning (``content``) when the item has it, else its summary."""
    if item.content:
        return "".join(p.text for p in item.content)
    return "".join(p.text for p in item.summary)


AssistantItem = ReasoningItem | MessageItem | FunctionCallItem


@dataclass
class _Turn:
    """One assistant message being assembled from consecutive items."""

    reasoning: str | None = None
    content: str | None = None
    has_message: bool = False
    calls: list[dict[str, Any]] = field(default_factory=list)

    def accepts(self, item: AssistantItem, following: InputItem | None) -> bool:
        """Whether ``item`` is part of this turn (``following``: the item after it)."""
        if isinstance(item, ReasoningItem):
            return self.reasoning is None and not _assistant_message(following)
        if isinstance(item, MessageItem):
            return not (self.has_message or self.calls)
        return True

    def add(self, item: AssistantItem) -> None:
        if isinstance(item, ReasoningItem):
            self.reasoning = reasoning_text(item)
        elif isinstance(item, MessageItem):
            self.has_message, self.content = True, text_of(item.content)
        else:
            self.calls.append({"id": item.call_id, "type": "function",
                               "function": {"name": flat_name(item.namespace, item.name),
                                            "arguments": item.arguments}})

    def message(self) -> Message:
        """In the key order of ``ParsedCompletion.to_message``."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.calls:
            message["tool_calls"] = self.calls
        return message


def _assistant_message(item: InputItem | None) -> bool:
    return isinstance(item, MessageItem) and item.role == "assistant"


def _assistant_part(item: InputItem) -> AssistantItem | None:
    """The item when it is part of an assistant turn."""
    if isinstance(item, ReasoningItem | FunctionCallItem) or _assistant_message(item):
        return item  # type: ignore[return-value]
    return None


def chat_messages(items: list[InputItem], images: Images | None = None) -> list[Message]:
    """Input items -> chat messages (see the module docstring); ``images`` gets the
    images turned into markers."""
    out: list[Message] = []
    extend_chat_messages(out, items, images=images)
    return out


def extend_chat_messages(out: list[Message], items: list[InputItem],
                         breaks: list[tuple[int, int]] | None = None, first: int = 0,
                         images: Images | None = None) -> None:
    """Append the chat messages of ``items`` to ``out``, which must end where no assistant
    turn is open (the end of a whole conversion, or one of its breaks). ``breaks``: gets
    ``(first + i, len(out))`` for each place ``i`` (an item, or the end) where no
    assistant turn is open: the conversion of the items from there on, appended to
    ``out[:len]``, continues this one exactly. ``images``: gets the images turned into
    markers (:data:`Images`; item ``i`` is ``first + i``)."""
    turn: _Turn | None = None
    for i, item in enumerate(items):
        if turn is None and breaks is not None:
            breaks.append((first + i, len(out)))
        part = _assistant_part(item)
        if part is not None:
            following = items[i + 1] if i + 1 < len(items) else None
            if turn is None or not turn.accepts(part, following):
                if turn is not None:
                    out.append(turn.message())
                turn = _Turn()
            turn.add(part)
            continue
        if turn is not None:
            out.append(turn.message())
            turn = None
        message = _outside_turn(item, images, first + i)
        if message is not None:
            out.append(message)
    if turn is not None:
        out.append(turn.message())
    elif breaks is not None:
        breaks.append((first + len(items), len(out)))


def _outside_turn(item: InputItem, images: Images | None, index: int) -> Message | None:
    """The chat message of an item that is not part of an assistant turn."""
    if isinstance(item, FunctionCallOutputItem):
        return {"role": "tool", "tool_call_id": item.call_id,
                "content": text_of(item.output, images, index, "output")}
    if isinstance(item, MessageItem):
        role = "system" if item.role == "developer" else item.role
        return {"role": role, "content": text_of(item.content, images, index)}
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


def chat_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """The function tools, and those of each namespace under their flat names, in the Chat
    Completions shape (``strict`` is not part of it); hosted tools are left out. A
    namespace's description opens the description of each of its tools."""
    out = []
    for tool in tools or ():
        if isinstance(tool, FunctionTool):
            out.append(_chat_tool(tool.name, tool.description, tool.parameters))
        elif isinstance(tool, NamespaceTool):
            for member in tool.tools:
                about = "\n\n".join(t for t in (tool.description, member.description) if t)
                out.append(_chat_tool(flat_name(tool.name, member.name), about or None,
                                      member.parameters))
    names = [t["function"]["name"] for t in out]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise BadRequest(f"tools: more than one tool is called {', '.join(twice)} (a "
                         "namespace's tools are called by the namespace and the name "
                         "joined)", code="invalid_request")
    return out or None


def _chat_tool(name: str, description: str | None, parameters: dict[str, Any] | None
               ) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def namespace_spaces(tools: list[Tool] | None) -> Spaces:
    """Flat name -> (namespace, name) of the request's namespace tools."""
    return {flat_name(tool.name, member.name): (tool.name, member.name)
            for tool in tools or () if isinstance(tool, NamespaceTool)
            for member in tool.tools}


def hosted_names(tools: list[Tool] | None) -> list[str]:
    """The request's hosted tools by type (an ``mcp`` tool with its ``server_label``),
    each once, in order."""
    names: list[str] = []
    for tool in tools or ():
        if isinstance(tool, HostedTool):
            label = getattr(tool, "server_label", None)
            name = f"{tool.type}:{label}" if isinstance(label, str) else tool.type
            if name not in names:
                names.append(name)
    return names


def template_kwargs(request: ResponsesRequest, effort_kwargs: Callable[[str], dict[str, Any]]
                    ) -> dict[str, Any] | None:
    """The template kwargs ``reasoning.effort`` sets (``effort_kwargs``: the renderer's
    :meth:`~tito.render.base.TemplateRenderer.effort_kwargs`) under the request's own
    ``chat_template_kwargs``, which win."""
    effort = request.reasoning.effort if request.reasoning is not None else None
    kwargs = {**(effort_kwargs(effort) if effort is not None else {}),
              **(request.chat_template_kwargs or {})}
    return kwargs or None


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


def call_item(response_id: str, index: int, call: dict[str, Any], spaces: Spaces | None,
              *, done: bool = True) -> OutputFunctionCall:
    """A tool call as a ``function_call`` item (``done=False``: as a stream opens it,
    ``in_progress`` and without its arguments); the call of a namespace tool's function
    (``spaces``) names the namespace and the function apart, as Codex expects."""
    function = call["function"]
    item: OutputFunctionCall = {
        "type": "function_call", "id": item_id(response_id, "fc", index),
        "call_id": call["id"], "name": function["name"],
        "arguments": function["arguments"] if done else "",
        "status": "completed" if done else "in_progress"}
    space = spaces.get(function["name"]) if spaces else None
    if space is not None:
        item["namespace"], item["name"] = space
    return item


def output_items(outcome: TurnOutcome, response_id: str, spaces: Spaces | None = None
                 ) -> list[OutputItem]:
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
    items += [call_item(response_id, i, call, spaces)
              for i, call in enumerate(parsed.tool_calls)]
    return items


def echoed_tools(tools: list[Tool] | None) -> list[dict[str, Any]]:
    """The request's tools as the response lists them (a function tool with all its
    fields, others as sent)."""
    return [{"type": "function", "name": t.name, "description": t.description,
             "parameters": t.parameters, "strict": t.strict}
            if isinstance(t, FunctionTool) else t.model_dump(exclude_unset=True)
            for t in tools or ()]


def response_body(outcome: TurnOutcome, request: ResponsesRequest, response_id: str,
                  model: str, reasoning_tokens: int = 0) -> ResponseBody:
    """The ``response`` of a turn, echoing the request's settings as OpenAI does;
    ``reasoning_tokens``: the generated ids of the reasoning."""
    finish = outcome.parsed.finish_reason
    generated = len(outcome.result.output_ids)
    body: ResponseBody = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if finish == "length" else
                  "cancelled" if finish == "abort" else "completed",
        "model": model,
        "output": output_items(outcome, response_id, namespace_spaces(request.tools)),
        "usage": {"input_tokens": outcome.prompt_tokens,
                  "input_tokens_details": {"cached_tokens": outcome.result.cached_tokens,
                                           "cache_write_tokens": 0},
                  "output_tokens": generated,
                  "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
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

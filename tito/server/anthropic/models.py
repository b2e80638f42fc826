"""The Anthropic Messages wire: request models (pydantic v2) and response TypedDicts.

Requests are validated strictly on the fields the gateway uses; unknown top-level fields
(``metadata``, ``service_tier``, ``container`` ...) and ``cache_control`` on any block are
accepted and ignored, as Anthropic-compatible servers do. Content blocks are validated one
by one in :mod:`tito.server.anthropic.convert`, which words what is not supported.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import TypedDict

from tito.server.http import check_depth
from tito.server.owned import RefusesOwnedFields
from tito.server.wire import Wire, describe_validation_error
from tito.types.errors import BadRequest


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class InputMessage(_Open):
    role: str
    content: str | list[Any]


class ToolDef(_Open):
    """A client tool (``name``, ``input_schema``; ``type`` absent or ``custom``) or one of
    Anthropic's hosted tools (any other ``type``: ``web_search_20250305``,
    ``mcp_toolset``...), which need not have a name."""

    name: str | None = Field(default=None, min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    defer_loading: bool | None = None
    """Tool search: left out of the system prompt, shown where a ``tool_reference``
    names it."""


class OutputFormat(_Open):
    """Structured output: the reply's text follows ``schema``."""

    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Open):
    format: OutputFormat | None = None


class ThinkingConfig(_Open):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class ToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(_Open, RefusesOwnedFields):
    messages: list[InputMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    model: str | None = None
    system: str | list[dict[str, Any]] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = Field(default=None, max_length=32)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    stream: bool = False
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    """``format``: structured output; ``effort`` is accepted and ignored."""
    output_format: OutputFormat | None = None
    """The structured-outputs beta's field (``output_config.format`` since)."""


class CountTokensRequest(_Open):
    messages: list[InputMessage] = Field(min_length=1)
    model: str | None = None
    system: str | list[dict[str, Any]] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None


def parse_request(data: Any, model: type[_Open], *, max_depth: int) -> Any:
    """Validate a Messages (or count_tokens) body; a failure is a 400 naming the fields."""
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    check_depth(data, max_depth)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(describe_validation_error(exc)) from None


# -- responses ---------------------------------------------------------------------------
class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


class ThinkingBlock(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: str


class ToolUseBlock(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock


class Usage(TypedDict):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


class MessageReply(TypedDict):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlock]
    stop_reason: str
    stop_sequence: str | None
    usage: Usage


class TokenCount(TypedDict):
    input_tokens: int


class ErrorDetail(TypedDict):
    type: str
    message: str


class ErrorBody(TypedDict):
    """Anthropic's error envelope: ``{"type": "error", "error": {"type", "message"}}``."""

    type: Literal["error"]
    error: ErrorDetail
    request_id: NotRequired[str]


MESSAGE = Wire(MessageReply)
TOKEN_COUNT = Wire(TokenCount)
ERROR_BODY = Wire(ErrorBody)

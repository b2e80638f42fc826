"""The OpenAI Responses wire: request and response models (pydantic v2).

Requests are validated strictly (``true`` is not an integer, ``"yes"`` is not a boolean;
an integer is a valid float) and unknown top-level fields are accepted and ignored, like
the Chat Completions models (:mod:`tito.server.openai.models`). Tools are function tools,
``namespace`` tools (groups of function tools) and hosted tools (:data:`HOSTED_TOOLS`,
validated loosely: they are left out of the render). Input items are the four kinds an
agent sends back and forth: ``message``, ``function_call``, ``function_call_output`` and
``reasoning`` (an item without ``type`` but with a ``role`` is a message, as the SDK
allows); their content parts are text, or images (``--images``). Responses are
TypedDicts that mypy checks where :mod:`tito.server.responses.convert` builds them and
pydantic validates and serializes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from typing_extensions import TypedDict

from tito.server.http import check_depth
from tito.server.owned import RefusesOwnedFields
from tito.server.wire import Wire, describe_validation_error
from tito.types.errors import BadRequest


class _Open(BaseModel):
    """Unknown fields are kept (and ignored); known ones are strictly typed."""

    model_config = ConfigDict(extra="allow", strict=True)


# -- content parts -----------------------------------------------------------------------
TEXT_PARTS = ("input_text", "output_text")
IMAGE_PART = "input_image"
MEDIA_PARTS = ("input_file", "input_audio")


class TextPart(_Open):
    type: Literal["input_text", "output_text"]
    text: str


class ImagePart(_Open):
    """An image (a user message's, a function call's output): the marker text under
    ``--images placeholder``, else 400 ``unsupported_content`` (design §7)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None


Part = TextPart | ImagePart


def check_text_parts(value: Any) -> Any:
    """A list of content parts may hold only text and image parts (a clear 400 for files
    and audio)."""
    if isinstance(value, list):
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind in MEDIA_PARTS:
                raise ValueError(f"content part {i} has type {kind!r}: files and audio are "
                                 "not supported; send text (or image) parts only")
            if kind not in (*TEXT_PARTS, IMAGE_PART):
                raise ValueError(f"content part {i} has type {kind!r}; only input_text, "
                                 "output_text and input_image parts are supported")
    return value


# -- input items -------------------------------------------------------------------------
class MessageItem(_Open):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Part]

    _parts = field_validator("content", mode="before")(check_text_parts)

    @model_validator(mode="after")
    def _no_assistant_image(self) -> MessageItem:
        if self.role == "assistant" and not isinstance(self.content, str) and \
                any(isinstance(part, ImagePart) for part in self.content):
            raise ValueError("an assistant message cannot carry an input_image part")
        return self


class FunctionCallItem(_Open):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    """JSON text, as the Responses API sends it."""
    id: str | None = None
    namespace: str | None = None
    """The namespace tool the function belongs to (the call of its flat name)."""


class FunctionCallOutputItem(_Open):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[Part]

    _parts = field_validator("output", mode="before")(check_text_parts)


class SummaryText(_Open):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Open):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Open):
    type: Literal["reasoning"]
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    id: str | None = None


ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def item_kind(value: Any) -> str | None:
    """The item's ``type``; ``message`` for a typeless item with a ``role``."""
    if isinstance(value, dict):
        kind = value.get("type")
        if kind is None and "role" in value:
            return "message"
        return kind if isinstance(kind, str) else None
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(item_kind),
]


# -- tools and settings ------------------------------------------------------------------
class FunctionTool(_Open):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(_Open):
    """Function tools grouped under a namespace (Codex: MCP servers, sub-agents); the model
    calls each by its flat name, the call names the namespace and the function apart."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[FunctionTool]


class HostedTool(_Open):
    """A tool the provider runs (:data:`HOSTED_TOOLS`): left out of the render."""

    type: str


HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "computer",
                "computer_use", "computer_use_preview", "mcp", "code_interpreter",
                "image_generation", "local_shell", "shell", "apply_patch", "tool_search",
                "programmatic_tool_calling")
"""Tool types OpenAI runs (or has its own call items for), which the gateway cannot offer
to the model; a dated variant (``web_search_2025_08_26``) counts as its type."""


def hosted_type(kind: Any) -> bool:
    return isinstance(kind, str) and any(
        kind == name or kind.startswith(name + "_2") for name in HOSTED_TOOLS)


def tool_kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "hosted" if hosted_type(kind) else kind if isinstance(kind, str) else None


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(tool_kind),
]


class ReasoningConfig(_Open):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(_Open, RefusesOwnedFields):
    input: str | list[Any]
    """A string (one user message) or input items, each validated by :data:`ITEM`."""
    model: str | None = None
    instructions: str | None = None
    tools: list[Tool] | None = None
    """Function, namespace and hosted tools (others are refused before validation)."""
    tool_choice: Any = None
    """Accepted, echoed, not enforced."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = False
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    reasoning: ReasoningConfig | None = None
    text: Any = None
    """Accepted and ignored (output format)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """TITO's extension, as on Chat Completions: template kwargs (they win over what
    ``reasoning.effort`` sets)."""

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be an empty list")
        return value


ITEM: TypeAdapter[InputItem] = TypeAdapter(InputItem)


def parse_item(item: Any, index: int) -> InputItem:
    """One input item, validated (BadRequest naming ``input.<index>`` otherwise)."""
    kind = item_kind(item)
    if kind not in ITEM_TYPES:
        raise BadRequest(f"input item {index} has type {kind!r}, which is not supported "
                         f"(supported: {', '.join(ITEM_TYPES)})", code="unsupported_item")
    try:
        return ITEM.validate_python(item)
    except ValidationError as exc:
        problems = []
        for err in exc.errors()[:8]:
            # the first location step is the union's tag (the item's kind): dropped
            loc = ".".join(str(x) for x in ("input", index, *err["loc"][1:]))
            problems.append(f"{loc}: {err['msg']}")
        raise BadRequest(f"invalid request: {'; '.join(problems)}") from exc


UNSUPPORTED = ("conversation", "prompt")
TOOL_KINDS = ("function", "namespace", "hosted")


def check_tools(tools: Any) -> None:
    """400 ``unsupported_tool`` for a tool the gateway can neither render nor leave out:
    ``custom`` tools (their calls are not function calls), unknown types, and a namespace
    member that is not a function tool."""
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool_kind(tool)
        if kind not in TOOL_KINDS:
            _refuse(f"tools.{i}", kind)
        members = tool.get("tools") if kind == "namespace" else None
        for j, member in enumerate(members if isinstance(members, list) else ()):
            if tool_kind(member) != "function":
                _refuse(f"tools.{i}.tools.{j}", tool_kind(member))


def _refuse(where: str, kind: str | None) -> None:
    raise BadRequest(f"{where} has type {kind!r}, which is not supported: function and "
                     "namespace tools are rendered, hosted tools "
                     f"({', '.join(HOSTED_TOOLS)}) left out", code="unsupported_tool")


def parse_responses_request(data: Any, *, max_depth: int = 64, skip: int = 0
                            ) -> tuple[ResponsesRequest, list[InputItem]]:
    """Validate a Responses request: (the request, its input items; a string input is one
    user message). BadRequest with a readable message otherwise. ``max_depth``: how
    deeply JSON may nest in any field (``--max-json-depth``). ``skip``: how many leading
    input items the caller validated before (:mod:`tito.server.responses.decode`): they
    are neither checked again nor returned (the outcome and the errors are those of
    checking everything)."""
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    given = data.get("input")
    if not (skip and isinstance(given, list) and len(given) >= skip):
        skip = 0
    check_depth({**data, "input": data["input"][skip:]} if skip else data, max_depth)
    for name in UNSUPPORTED:
        if data.get(name) is not None:
            raise BadRequest(f"{name} is not supported on /v1/responses",
                             code="unsupported_parameter")
    check_tools(data.get("tools"))
    try:
        request = ResponsesRequest.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(f"invalid request: {describe_validation_error(exc)}") from exc
    if isinstance(request.input, str):
        items: list[InputItem] = [MessageItem(role="user", content=request.input)]
    else:
        items = [parse_item(item, i) for i, item in enumerate(request.input[skip:],
                                                             start=skip)]
    return request, items


# -- responses ---------------------------------------------------------------------------
class OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]


class OutputMessage(TypedDict):
    type: Literal["message"]
    id: str
    role: Literal["assistant"]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class Summary(TypedDict):
    type: Literal["summary_text"]
    text: str


class OutputReasoning(TypedDict):
    type: Literal["reasoning"]
    id: str
    summary: list[Summary]


class OutputFunctionCall(TypedDict):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]
    namespace: NotRequired[str]
    """The namespace tool of the function (``name`` is then the function's own name)."""


OutputItem = OutputReasoning | OutputMessage | OutputFunctionCall


class InputTokensDetails(TypedDict):
    cached_tokens: int
    cache_write_tokens: int
    """Always 0 (the engine's prefix cache is not written on request); the SDK requires it."""


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class Usage(TypedDict):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(TypedDict):
    reason: Literal["max_output_tokens"]


class ResponseBody(TypedDict):
    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "cancelled"]
    model: str
    output: list[OutputItem]
    usage: Usage
    error: None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    previous_response_id: str | None
    parallel_tool_calls: bool
    tool_choice: Any
    tools: list[dict[str, Any]]
    temperature: float
    top_p: float
    max_output_tokens: int | None
    store: bool
    metadata: dict[str, str]
    reasoning: NotRequired[dict[str, Any]]


RESPONSE = Wire(ResponseBody)

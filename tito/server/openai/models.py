"""The OpenAI Chat Completions wire: request and response models (pydantic v2).

Requests are validated only: the session keeps the client's message dicts as sent, so
replay matching compares what the client really sends. Unknown top-level fields are
accepted and ignored, as OpenAI-compatible servers do; ``logprobs`` (TITO owns the
tokens) is ignored on purpose, and ``input_ids`` is refused by the request model (400
``gateway_owned_field``). Responses are built by
:mod:`tito.server.openai.convert` and :mod:`tito.server.openai.events` as TypedDicts and
serialized by :class:`~tito.server.wire.Wire`.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
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
    """Unknown fields are kept (and ignored); known ones are strictly typed: ``true`` is not
    an integer and ``"yes"`` is not a boolean."""

    model_config = ConfigDict(extra="allow", strict=True)


class FunctionCall(_Open):
    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCall(_Open):
    id: str | None = None
    type: str = "function"
    function: FunctionCall
    index: int | None = None


class TextPart(_Open):
    type: Literal["text"]
    text: str


class ImagePart(_Open):
    """An image in a user or tool message: 400 ``unsupported_content``, or the marker
    under ``--images placeholder`` (:func:`tito.server.openai.convert.image_markers`)."""

    type: Literal["image_url"]
    image_url: dict[str, Any]


IMAGE_ROLES = ("user", "tool")


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ImagePart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _only_text_parts(cls, value: Any) -> Any:
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind not in ("text", "image_url"):
                    raise ValueError(f"content part {i} has type {kind!r}; only text and "
                                     "image_url parts are supported")
        return value

    @model_validator(mode="after")
    def _images_where_allowed(self) -> ChatMessage:
        if self.role not in IMAGE_ROLES and isinstance(self.content, list) and \
                any(isinstance(part, ImagePart) for part in self.content):
            raise ValueError(f"a {self.role} message cannot carry an image_url part "
                             "(only user and tool messages)")
        return self


class FunctionDef(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Open):
    include_usage: bool = False


class JsonSchemaFormat(_Open):
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    """Structured output: ``json_schema`` (its ``schema``), ``json_object`` or ``text``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a json_schema object")
        return self


class ChatCompletionRequest(_Open, RefusesOwnedFields):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None
    reasoning_effort: str | None = None
    """Drives the family's thinking switch and effort level (docs/apis.md); an explicit
    ``chat_template_kwargs`` wins."""
    web_search_options: Any = None
    """OpenAI's hosted web search: left out of the render (``--hosted-tools``)."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_new_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    n: int | None = 1
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    return_meta_info: bool | None = None
    """SGLang's: ``choices[0].meta_info`` in the reply (always under ``--compat miles``)."""

    @field_validator("n")
    @classmethod
    def _one_sample(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only n=1 is supported; run one session per sample")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError("top_k must be -1 (disabled) or at least 1")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 32:
            raise ValueError("at most 32 stop strings")
        return value


class _Envelope(ChatCompletionRequest):
    """The request with its messages left unvalidated (they are checked one by one)."""

    messages: list[Any] = Field(min_length=1)


_MESSAGE = TypeAdapter(ChatMessage)
_ROLES = frozenset(("system", "developer", "user", "assistant", "tool"))
_TEXT_FIELDS = ("content", "name", "tool_call_id", "reasoning_content")


def plain_message_ok(message: Any) -> bool:
    """True only for a message :class:`ChatMessage` accepts, checked without pydantic:
    a known role, text fields that are strings or null, no tool calls (other members are
    kept unchecked, as the model keeps them). False: let the model decide (a list
    content, tool calls, anything else)."""
    if type(message) is not dict or message.get("tool_calls") is not None:
        return False
    role = message.get("role")
    if type(role) is not str or role not in _ROLES:
        return False
    for name in _TEXT_FIELDS:
        value = message.get(name)
        if value is not None and type(value) is not str:
            return False
    return True


def with_messages(request: _Envelope, messages: Any) -> _Envelope:
    """``request.model_copy(update={"messages": messages})``, without the general
    update handling (each turn that reuses a request's validated fields takes one)."""
    if request.__pydantic_private__ is not None:
        return request.model_copy(update={"messages": messages})
    copied = type(request).__new__(type(request))
    extra = request.__pydantic_extra__
    object.__setattr__(copied, "__dict__", {**request.__dict__, "messages": messages})
    object.__setattr__(copied, "__pydantic_extra__", None if extra is None else dict(extra))
    object.__setattr__(copied, "__pydantic_fields_set__",
                       request.__pydantic_fields_set__ | {"messages"})
    object.__setattr__(copied, "__pydantic_private__", None)
    return copied


def validate_chat(data: Any, stored: list[dict[str, Any]] | None = None, *,
                  max_depth: int = 64, same_as: ChatCompletionRequest | None = None,
                  equal_prefix: int = 0, valid_prefix: int = 0
                  ) -> tuple[ChatCompletionRequest, bool]:
    """Validate a chat request: (the request, whether its messages start with ``stored``).

    ``stored``: the session's stored messages (each validated when it was first sent, or
    written by the gateway). A request whose messages start with exactly these is checked
    only for the rest (and the session need not compare them again); any failure re-runs
    the full validation, so the outcome and the error text are the same as validating
    everything. ``max_depth``: how deeply JSON may nest in any field
    (``--max-json-depth``). ``same_as``: a request this call returned for a body whose
    members other than ``messages`` were byte for byte the same as ``data``'s (see
    :mod:`tito.server.growing_body`); they are not validated again. ``equal_prefix``: how
    many leading messages are already known to equal ``stored``'s (not compared again).
    ``valid_prefix``: how many leading messages are known valid (the same objects as in a
    body this call accepted): when the messages do not start with ``stored`` (e.g. a
    client that rewrote its last message), only the others are validated.
    """
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    kwargs = data.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object", code="invalid_template_kwargs")
    messages = data.get("messages")
    count = len(stored or ())
    new: list[Any] | None = None  # the messages past the stored prefix, when there is one
    if count and isinstance(messages, list) and len(messages) >= count and \
            messages[equal_prefix:count] == stored[equal_prefix:]:  # type: ignore[index]
        new = messages[count:]
    if new is None and valid_prefix and isinstance(messages, list) and \
            len(messages) >= valid_prefix:
        new = messages[valid_prefix:]  # the prefix was checked, but is not the stored one
        verified = False
    else:
        verified = new is not None
    # the stored prefix was checked when it was first sent, the other members with same_as
    reuse = new is not None and isinstance(same_as, _Envelope)
    check_depth({"messages": new} if reuse else data if new is None
                else {**data, "messages": new}, max_depth)
    if new is not None:
        try:
            request = with_messages(same_as, messages) \
                if reuse and isinstance(same_as, _Envelope) else _Envelope.model_validate(data)
            for message in new:
                if not plain_message_ok(message):
                    _MESSAGE.validate_python(message)
            return request, verified
        except ValidationError:
            pass  # the full validation below words the error
    try:
        return ChatCompletionRequest.model_validate(data), verified
    except ValidationError as exc:
        raise BadRequest(f"invalid request: {describe_validation_error(exc)}") from exc


# -- responses ---------------------------------------------------------------------------
# TypedDicts: mypy checks every key the serving module writes, and pydantic validates and
# serializes them through the TypeAdapters below without building objects.
class FunctionCallOut(TypedDict):
    name: str
    arguments: str
    """JSON text, as OpenAI sends it."""


class ToolCallOut(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class AssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: NotRequired[str]
    tool_calls: NotRequired[list[ToolCallOut]]


class Choice(TypedDict):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: str
    meta_info: NotRequired[dict[str, Any]]
    """With ``return_meta_info`` or ``--compat miles``: the engine's facts of the turn
    (SGLang's names; replay payloads left out)."""


class PromptTokensDetails(TypedDict):
    cached_tokens: int


class CompletionTokensDetails(TypedDict):
    reasoning_tokens: int
    """The generated ids of the reasoning (through the family's reasoning end token)."""


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: NotRequired[CompletionTokensDetails]
    """Always sent by the gateway."""


class ChatCompletion(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class FunctionCallDelta(TypedDict, total=False):
    name: str
    arguments: str


class ToolCallDelta(TypedDict):
    index: int
    id: NotRequired[str]
    type: NotRequired[Literal["function"]]
    function: FunctionCallDelta


class ChoiceDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: str
    tool_calls: list[ToolCallDelta]


class ChunkChoice(TypedDict):
    index: int
    delta: ChoiceDelta
    logprobs: None
    finish_reason: str | None


class ChatCompletionChunk(TypedDict):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: NotRequired[Usage]


class ModelCard(TypedDict):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None


class ModelList(TypedDict):
    object: Literal["list"]
    data: list[ModelCard]


CHAT_COMPLETION = Wire(ChatCompletion)
CHAT_COMPLETION_CHUNK = Wire(ChatCompletionChunk)
MODEL_LIST = Wire(ModelList)

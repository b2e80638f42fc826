"""Chat Completions <-> the core turn: a request's messages, tools and sampling fields as a
:class:`~tito.types.messages.TurnRequest` and :class:`~tito.types.engine.SamplingParams`,
and a turn's outcome as a ``chat.completion``."""

from __future__ import annotations

import itertools
import json
import operator
import os
import time
from collections.abc import Callable
from typing import Any, cast

from tito.server.gateway import TurnOutcome
from tito.server.openai.models import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    ResponseFormat,
    ToolCallOut,
)
from tito.server.unsupported import NOTE_IMAGES, image_text
from tito.types.engine import SamplingParams
from tito.types.messages import Message, TurnRequest

_ROLE = operator.methodcaller("get", "role")
_CONTENT = operator.methodcaller("get", "content")
JSON_OBJECT = '{"type": "object"}'
"""The schema of ``response_format: {"type": "json_object"}`` (any JSON object)."""


def has_developer(messages: list[Message]) -> bool:
    return "developer" in map(_ROLE, messages)  # C-level: no Python call per message


def session_messages(data: dict[str, Any], developer: bool | None = None) -> list[Message]:
    """The client's messages as sent, with ``developer`` read as ``system``;
    ``developer``: whether any message has that role, when known (else they are scanned)."""
    messages: list[Message] = data["messages"]
    if not (has_developer(messages) if developer is None else developer):
        return messages
    return [{**m, "role": "system"} if m.get("role") == "developer" else m
            for m in messages]


def turn_request(data: dict[str, Any], chat: ChatCompletionRequest,
                 stored_prefix: list[Message] | None = None,
                 developer: bool | None = None, images: str = "reject") -> TurnRequest:
    """``images``: the server's ``--images`` (``image_url`` parts refused, or markers)."""
    # the stored prefix has no image parts (the session keeps their markers): not scanned
    messages, replaced = image_markers(session_messages(data, developer), images,
                                       start=len(stored_prefix or ()))
    return TurnRequest(messages=messages,
                       tools=data.get("tools") or None,
                       template_kwargs=chat.chat_template_kwargs,
                       stored_prefix=stored_prefix,
                       notes={NOTE_IMAGES: replaced} if replaced else None)


def image_markers(messages: list[Message], policy: str, *, start: int = 0
                  ) -> tuple[list[Message], int]:
    """``messages`` with each ``image_url`` part a text part of the marker (400 under
    ``--images reject``), and how many there were. Messages without images stay the same
    objects, and with no content list at all the scan is one C-level pass. ``start``: the
    messages before it are known to have no image part (a session's stored prefix), and
    are not scanned."""
    if list not in map(type, map(_CONTENT, itertools.islice(messages, start, None))):
        return messages, 0
    out: list[Message] = []
    replaced = 0
    for i, message in enumerate(messages):
        content = message.get("content")
        if i >= start and isinstance(content, list) and any(_is_image(p) for p in content):
            parts = []
            for j, part in enumerate(content):
                if _is_image(part):
                    part = {"type": "text", "text": image_text(
                        policy, f"messages[{i}].content[{j}]")}
                    replaced += 1
                parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    return (out, replaced) if replaced else (messages, 0)


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def response_schema(fmt: ResponseFormat | None) -> str | None:
    """``response_format`` as the JSON schema the engine constrains to (None: text)."""
    if fmt is None or fmt.type == "text":
        return None
    schema = fmt.json_schema.json_schema if fmt.json_schema is not None else None
    if fmt.type == "json_object" or schema is None:
        return JSON_OBJECT
    return json.dumps(schema, ensure_ascii=False)


def sampling_params(chat: ChatCompletionRequest, *, default_max_tokens: int) -> SamplingParams:
    """OpenAI sampling fields -> explicit engine settings (OpenAI's defaults filled in)."""
    max_tokens = chat.max_completion_tokens or chat.max_tokens or chat.max_new_tokens
    stop = (chat.stop,) if isinstance(chat.stop, str) else tuple(chat.stop or ())
    return SamplingParams(
        max_new_tokens=max_tokens or default_max_tokens,
        temperature=1.0 if chat.temperature is None else chat.temperature,
        top_p=1.0 if chat.top_p is None else chat.top_p,
        top_k=-1 if chat.top_k is None else chat.top_k,
        min_p=chat.min_p or 0.0,
        frequency_penalty=chat.frequency_penalty or 0.0,
        presence_penalty=chat.presence_penalty or 0.0,
        repetition_penalty=1.0 if chat.repetition_penalty is None else chat.repetition_penalty,
        stop=stop,
        stop_token_ids=tuple(chat.stop_token_ids or ()),
        seed=chat.seed,
        json_schema=response_schema(chat.response_format),
    )


def completion(outcome: TurnOutcome, model: str, reasoning_tokens: int = 0
               ) -> ChatCompletion:
    """The ``chat.completion`` of a turn; ``reasoning_tokens``: the generated ids of the
    reasoning."""
    parsed = outcome.parsed
    message: AssistantMessage = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning_content is not None:
        message["reasoning_content"] = parsed.reasoning_content
    if parsed.tool_calls:
        message["tool_calls"] = cast("list[ToolCallOut]", parsed.tool_calls)
    generated = len(outcome.result.output_ids)
    return {
        "id": outcome.response_id or f"chatcmpl-{os.urandom(16).hex()}",
        "object": "chat.completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": parsed.finish_reason}],
        "usage": {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": generated,
                  "total_tokens": outcome.prompt_tokens + generated,
                  "prompt_tokens_details": {"cached_tokens": outcome.result.cached_tokens},
                  "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}},
    }


# -- reasoning effort and hosted tools -----------------------------------------------------
def with_effort(turn: TurnRequest, chat: ChatCompletionRequest,
                effort_kwargs: Callable[[str], dict[str, Any]]) -> None:
    """``turn`` with what ``reasoning_effort`` sets (``effort_kwargs``: the renderer's
    :meth:`~tito.render.base.TemplateRenderer.effort_kwargs`) under the request's
    ``chat_template_kwargs``, which win."""
    if chat.reasoning_effort is not None:
        turn.template_kwargs = {**effort_kwargs(chat.reasoning_effort),
                                **(chat.chat_template_kwargs or {})} or None


def hosted_names(chat: ChatCompletionRequest) -> list[str]:
    """The hosted tools a chat request asks for (``web_search_options``)."""
    return ["web_search"] if chat.web_search_options is not None else []

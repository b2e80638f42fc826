"""Response bodies on the wire (tito.server.wire.Wire): orjson bytes, and under
``TITO_CHECK_WIRE=1`` (set by conftest.py for the whole suite) a strict check of every
body against its declared type before it is sent."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tito.server import wire
from tito.server.openai.models import CHAT_COMPLETION, ChatCompletion


def completion(content: str) -> ChatCompletion:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "logprobs": None, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                      "prompt_tokens_details": {"cached_tokens": 0}}}


def test_the_suite_checks_every_body() -> None:
    assert wire.CHECK_WIRE


def test_bytes_are_what_pydantic_would_send() -> None:
    body = completion("héllo ✓ \"quoted\" \n 中文 😀")
    assert CHAT_COMPLETION.dump(body) == CHAT_COMPLETION.adapter.dump_json(body)


def test_a_body_of_the_wrong_shape_is_refused_when_checked() -> None:
    body = completion("x")
    body["usage"]["total_tokens"] = "5"  # type: ignore[typeddict-item]
    with pytest.raises(ValidationError, match="total_tokens"):
        CHAT_COMPLETION.dump(body)
    del body["usage"]["total_tokens"]  # type: ignore[misc]
    with pytest.raises(ValidationError, match="total_tokens"):
        CHAT_COMPLETION.dump(body)

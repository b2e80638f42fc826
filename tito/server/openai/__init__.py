"""The OpenAI Chat Completions API on a session (design §7): models, serving, errors."""

from __future__ import annotations

from tito.server.api import Api
from tito.server.openai.errors import error_response, status_of
from tito.server.openai.serving import chat_completions, list_models

API = Api(
    name="openai",
    status_of=status_of,
    error_response=error_response,
    routes=[
        ("/sessions/{session_id}/v1/chat/completions", chat_completions, ["POST"]),
        ("/sessions/{session_id}/v1/models", list_models, ["GET"]),
    ],
)

__all__ = ["API"]

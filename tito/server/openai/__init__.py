"""The OpenAI Chat Completions API on a session (design §7): models, decode, convert,
events, and the adapter that wires them to the shared turn route."""

from __future__ import annotations

from tito.server.adapter import turn_endpoint
from tito.server.api import Api
from tito.server.errors import error_response, status_of
from tito.server.openai.serving import ChatCompletions, list_models

API = Api(
    name="openai",
    status_of=status_of,
    error_response=error_response,
    routes=[
        ("/sessions/{session_id}/v1/chat/completions", turn_endpoint(ChatCompletions()),
         ["POST"]),
        ("/sessions/{session_id}/v1/models", list_models, ["GET"]),
    ],
)

__all__ = ["API"]

"""The Anthropic Messages API on a session (design §7): models, conversion, serving,
errors in Anthropic's envelope."""

from __future__ import annotations

from tito.server.anthropic.errors import error_response, status_of
from tito.server.anthropic.serving import count_tokens, messages
from tito.server.api import Api

API = Api(
    name="anthropic",
    status_of=status_of,
    error_response=error_response,
    routes=[
        ("/sessions/{session_id}/v1/messages", messages, ["POST"]),
        ("/sessions/{session_id}/v1/messages/count_tokens", count_tokens, ["POST"]),
    ],
)

__all__ = ["API"]

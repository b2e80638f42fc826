"""The Anthropic Messages API on a session (design §7): models, decode, convert, events,
errors in Anthropic's envelope, and the adapter that wires them to the shared turn
route."""

from __future__ import annotations

from tito.server.adapter import turn_endpoint
from tito.server.anthropic.errors import error_response, status_of
from tito.server.anthropic.serving import Messages, count_tokens
from tito.server.api import Api

API = Api(
    name="anthropic",
    status_of=status_of,
    error_response=error_response,
    routes=[
        ("/sessions/{session_id}/v1/messages", turn_endpoint(Messages()), ["POST"]),
        ("/sessions/{session_id}/v1/messages/count_tokens", count_tokens, ["POST"]),
    ],
)

__all__ = ["API"]

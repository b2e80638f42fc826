"""The OpenAI Responses API on a session (design §7): models, decode, convert, events,
the responses ``previous_response_id`` continues, and the adapter that wires them to the
shared turn route. Errors use the gateway's (OpenAI's) envelope
(:mod:`tito.server.errors`)."""

from __future__ import annotations

from tito.server.adapter import turn_endpoint
from tito.server.api import Api
from tito.server.errors import error_response, status_of
from tito.server.responses.serving import Responses

API = Api(
    name="responses",
    status_of=status_of,
    error_response=error_response,
    routes=[
        ("/sessions/{session_id}/v1/responses", turn_endpoint(Responses()), ["POST"]),
    ],
)

__all__ = ["API"]

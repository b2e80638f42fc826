"""The OpenAI Responses API on a session (non-streaming): models, conversion, serving.

Errors use OpenAI's envelope (:mod:`tito.server.openai.errors`)."""

from __future__ import annotations

from tito.server.api import Api
from tito.server.openai.errors import error_response, status_of
from tito.server.responses.serving import responses

API = Api(
    name="responses",
    status_of=status_of,
    error_response=error_response,
    routes=[
        ("/sessions/{session_id}/v1/responses", responses, ["POST"]),
    ],
)

__all__ = ["API"]

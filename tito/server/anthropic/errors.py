"""Core error kinds -> Anthropic's error envelope (design §7): the same HTTP statuses as
the OpenAI API, worded as ``{"type": "error", "error": {"type", "message"}}``."""

from __future__ import annotations

from starlette.responses import Response

from tito.server.anthropic.models import ERROR_BODY
from tito.server.errors import TYPE as OPENAI_TYPE
from tito.server.errors import retry_headers, status_of
from tito.types.errors import ErrorKind, TitoError

TYPE: dict[ErrorKind, str] = {
    **{kind: "api_error" if name == "server_error" else name for kind, name in OPENAI_TYPE.items()},
    ErrorKind.TOO_LARGE: "request_too_large",
}
"""Anthropic ``error.type`` of each kind; every other kind is ``invalid_request_error``.
The gateway's ``code`` (e.g. ``rollback_too_deep``) starts the message in brackets."""

__all__ = ["error_response", "status_of"]


def error_response(exc: TitoError, status: int | None = None) -> Response:
    body = ERROR_BODY.dump({"type": "error", "error": {
        "type": TYPE.get(exc.kind, "invalid_request_error"),
        "message": f"[{exc.code}] {exc.message}"}})
    return Response(body, status_code=status or status_of(exc), media_type="application/json",
                    headers=retry_headers(exc))

"""Core error kinds -> HTTP statuses, and the gateway's error envelope (design §7).

Every API answers with the statuses of :data:`STATUS`; the envelope here is OpenAI's
(``{"error": {"message", "type", "code", "param"}}``), used by the Chat Completions and
Responses APIs, the session routes, the viewer and the refusals of the access rules. The
Anthropic Messages API words the same errors in its own envelope
(:mod:`tito.server.anthropic.errors`).
"""

from __future__ import annotations

from starlette.responses import Response
from typing_extensions import TypedDict

from tito.server.wire import Wire
from tito.types.errors import EngineRejected, ErrorKind, TitoError

STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.UNAUTHORIZED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.GONE: 410,
    ErrorKind.MISDIRECTED: 421,
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorKind.METHOD_NOT_ALLOWED: 405,
    ErrorKind.CONFLICT: 409,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNPROCESSABLE: 422,
    ErrorKind.OVER_CAPACITY: 429,
    ErrorKind.INTERNAL: 500,
    ErrorKind.CONFIG: 500,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.ENGINE_FAILED: 502,
    ErrorKind.ENGINE_TIMEOUT: 504,
    ErrorKind.ENGINE_REJECTED: 400,
}
"""HTTP status of each kind (an engine's own 4xx is passed through, see :func:`status_of`)."""

TYPE: dict[ErrorKind, str] = {
    ErrorKind.UNAUTHORIZED: "authentication_error",
    ErrorKind.FORBIDDEN: "permission_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.GONE: "not_found_error",
    ErrorKind.MISDIRECTED: "not_found_error",
    ErrorKind.OVER_CAPACITY: "rate_limit_error",
    ErrorKind.INTERNAL: "server_error",
    ErrorKind.CONFIG: "server_error",
    ErrorKind.UNAVAILABLE: "server_error",
    ErrorKind.ENGINE_FAILED: "server_error",
    ErrorKind.ENGINE_TIMEOUT: "server_error",
}
"""OpenAI ``error.type`` of each kind; every other kind is ``invalid_request_error``."""


class ErrorDetail(TypedDict):
    message: str
    type: str
    code: str
    param: str | None


class ErrorBody(TypedDict):
    """OpenAI's error envelope: ``{"error": {"message", "type", "code", "param"}}``."""

    error: ErrorDetail


ERROR_BODY = Wire(ErrorBody)


def status_of(exc: TitoError) -> int:
    if isinstance(exc, EngineRejected) and 400 <= exc.engine_status < 500:
        return exc.engine_status
    return STATUS[exc.kind]


def error_type(exc: TitoError) -> str:
    """OpenAI's ``error.type`` of ``exc``."""
    return TYPE.get(exc.kind, "invalid_request_error")


def error_body(exc: TitoError) -> bytes:
    """``exc`` in OpenAI's shape: ``{"error": {"message", "type", "code", "param"}}``."""
    return ERROR_BODY.dump({"error": {
        "message": exc.message, "type": error_type(exc), "code": exc.code, "param": None}})


def error_response(exc: TitoError, status: int | None = None) -> Response:
    return Response(error_body(exc), status_code=status or status_of(exc),
                    media_type="application/json")

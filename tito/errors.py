"""Errors shared by the core and the server.

Every error the gateway reports to a client is a :class:`TitoError` carrying an HTTP
status, a machine-readable ``code`` and a human message. The server renders it in the
API's own error shape; the core raises it without knowing about HTTP.
"""

from __future__ import annotations


class TitoError(Exception):
    """Base class: ``status`` is the HTTP status, ``code`` a stable snake_case id."""

    status: int = 500
    code: str = "internal_error"
    type: str = "server_error"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status


class BadRequest(TitoError):
    status = 400
    code = "invalid_request"
    type = "invalid_request_error"


class NotFound(TitoError):
    status = 404
    code = "not_found"
    type = "not_found_error"


class Conflict(TitoError):
    status = 409
    code = "conflict"
    type = "invalid_request_error"


class PayloadTooLarge(TitoError):
    status = 413
    code = "payload_too_large"
    type = "invalid_request_error"


class AssemblyError(TitoError):
    """A deterministic failure while assembling samples (HTTP 422)."""

    status = 422
    code = "assembly_failed"
    type = "invalid_request_error"


class OverCapacity(TitoError):
    status = 429
    code = "over_capacity"
    type = "rate_limit_error"


class TokenizationError(TitoError):
    """The renderer could not produce ids for a request (template or bridge failure)."""

    status = 400
    code = "tokenization_failed"
    type = "invalid_request_error"


class EngineError(TitoError):
    """The inference engine failed or answered something we cannot use (HTTP 502)."""

    status = 502
    code = "engine_error"
    type = "server_error"


class EngineTimeout(EngineError):
    status = 504
    code = "engine_timeout"


class EngineRejected(EngineError):
    """The engine refused the request itself (its own 4xx), e.g. a prompt over its context.

    The status is the engine's; the session is left unchanged so the agent can react.
    """

    code = "engine_rejected"
    type = "invalid_request_error"

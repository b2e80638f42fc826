"""Errors of the core, with a *kind* and no transport.

Every error the gateway reports is a :class:`TitoError`: a :class:`ErrorKind` (what went
wrong, in transport-neutral terms), a stable snake_case ``code`` and a human ``message``.
The core raises them without knowing about HTTP; each API module maps the kind to its own
status and error envelope (``tito/server/errors.py``), and the CLI maps
:attr:`ErrorKind.CONFIG` to exit status 2.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """What kind of failure an error is; the API layer turns it into a status."""

    INVALID_REQUEST = "invalid_request"
    """The request is malformed or asks for something unsupported."""
    UNAUTHORIZED = "unauthorized"
    """No or a wrong API key."""
    FORBIDDEN = "forbidden"
    """A request from a web page of another origin."""
    NOT_FOUND = "not_found"
    GONE = "gone"
    """The session existed and was deleted or expired."""
    MISDIRECTED = "misdirected"
    """The session belongs to another gateway worker (``--workers``)."""
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    """The request is valid but the session's state forbids it now."""
    TOO_LARGE = "too_large"
    UNPROCESSABLE = "unprocessable"
    """A deterministic failure on valid input (e.g. sample assembly)."""
    OVER_CAPACITY = "over_capacity"
    UNAVAILABLE = "unavailable"
    """What the request needs is down for now (another gateway worker, the journal)."""
    ENGINE_FAILED = "engine_failed"
    """The engine failed or answered something unusable."""
    ENGINE_TIMEOUT = "engine_timeout"
    ENGINE_REJECTED = "engine_rejected"
    """The engine refused the request itself (its own 4xx)."""
    CONFIG = "config"
    """A startup configuration error (flags, files); never caused by a request."""
    INTERNAL = "internal"
    """A bug on our side (or in a trusted plug-in such as a custom matcher)."""


class TitoError(Exception):
    """Base class: ``kind`` classifies the failure, ``code`` is a stable snake_case id."""

    kind: ErrorKind = ErrorKind.INTERNAL
    code: str = "internal_error"

    retry_after: int | None = None
    """Seconds after which a retry may succeed (the ``Retry-After`` header), if known."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class BadRequest(TitoError):
    kind = ErrorKind.INVALID_REQUEST
    code = "invalid_request"


class NotFound(TitoError):
    kind = ErrorKind.NOT_FOUND
    code = "not_found"


class Unauthorized(TitoError):
    kind = ErrorKind.UNAUTHORIZED
    code = "invalid_api_key"


class Forbidden(TitoError):
    kind = ErrorKind.FORBIDDEN
    code = "forbidden"


class Gone(TitoError):
    kind = ErrorKind.GONE
    code = "session_gone"


class Misdirected(TitoError):
    """A session id of another gateway worker; the message names the right one (421)."""

    kind = ErrorKind.MISDIRECTED
    code = "wrong_worker"


class WorkerUnavailable(TitoError):
    """A session of another gateway worker that is down now (503 with ``Retry-After``):
    it lives only in that worker (and its journal), so no other worker can serve it."""

    kind = ErrorKind.UNAVAILABLE
    code = "worker_unavailable"
    retry_after = 1


class UnsupportedMediaType(TitoError):
    kind = ErrorKind.UNSUPPORTED_MEDIA_TYPE
    code = "unsupported_media_type"


class MethodNotAllowed(TitoError):
    kind = ErrorKind.METHOD_NOT_ALLOWED
    code = "method_not_allowed"


class Conflict(TitoError):
    kind = ErrorKind.CONFLICT
    code = "conflict"


class PayloadTooLarge(TitoError):
    kind = ErrorKind.TOO_LARGE
    code = "payload_too_large"


class AssemblyError(TitoError):
    """A deterministic failure while assembling samples."""

    kind = ErrorKind.UNPROCESSABLE
    code = "assembly_failed"


class OverCapacity(TitoError):
    kind = ErrorKind.OVER_CAPACITY
    code = "over_capacity"


class TokenizationError(TitoError):
    """The renderer could not produce ids for a request (template or bridge failure)."""

    kind = ErrorKind.INVALID_REQUEST
    code = "tokenization_failed"


class ConfigError(TitoError):
    """Bad startup configuration: a flag, a flag combination, a file (CLI exit 2)."""

    kind = ErrorKind.CONFIG
    code = "invalid_config"


class Unavailable(TitoError):
    """The gateway cannot serve the request now, e.g. its journal can no longer write (503)."""

    kind = ErrorKind.UNAVAILABLE
    code = "unavailable"


class EngineError(TitoError):
    """The inference engine failed or answered something we cannot use."""

    kind = ErrorKind.ENGINE_FAILED
    code = "engine_error"


class EngineUnreachable(EngineError):
    """The engine could not be reached or dropped the connection (a transport failure):
    an engine pool ejects it."""


class EngineRefused(EngineUnreachable):
    """No connection to the engine could be made (refused, no route, unknown host): the
    request never left the gateway, so another engine may run it at once."""


class EngineTimeout(EngineError):
    kind = ErrorKind.ENGINE_TIMEOUT
    code = "engine_timeout"


class EngineRejected(EngineError):
    """The engine refused the request itself (its own 4xx), e.g. a prompt over its context.

    ``engine_status`` is the engine's own status; the session is left unchanged so the
    agent can react.
    """

    kind = ErrorKind.ENGINE_REJECTED
    code = "engine_rejected"

    def __init__(self, message: str, *, engine_status: int = 400,
                 code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.engine_status = engine_status

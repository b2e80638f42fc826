"""``--compat miles``: errors as the reference framework's session server words them
(docs/miles.md#compatibility-mode): ``{"error": "<text>"}``, its texts for the cases its
clients match on, 404 for a deleted session."""

from __future__ import annotations

import re

import orjson
from starlette.responses import Response

from tito.types.errors import ErrorKind, TitoError

_ROLLBACK = re.compile(r"discard_count=(\d+) exceeds the limit of (\d+) .*?stored has (\d+) "
                       r"messages, request has (\d+) messages")


def miles_status(status: int) -> int:
    """The reference's status for ours: a deleted or expired session is 404 there."""
    return 404 if status == 410 else status


def miles_text(error: TitoError, session_id: str | None) -> str:
    """The reference's wording of ``error`` where its clients could match it (an unknown
    or deleted session, a rollback deeper than allowed); else our message."""
    if error.kind is ErrorKind.GONE or error.code == "session_not_found":
        return f"session not found: session_id={session_id}"
    if error.code == "rollback_too_deep":
        found = _ROLLBACK.search(error.message)
        if found is not None:
            discard, limit, stored, sent = found.groups()
            return (f"rollback failed: discard_count={discard} exceeds "
                    f"max_assistant_rollback_steps={limit} (stored has {stored} messages, "
                    f"request has {sent} messages)")
    return error.message


def miles_error_response(error: TitoError, status: int, session_id: str | None) -> Response:
    """``error`` in the reference's envelope: ``{"error": "<text>"}``."""
    body = orjson.dumps({"error": miles_text(error, session_id)})
    headers = None if error.retry_after is None else {"retry-after": str(error.retry_after)}
    return Response(body, status_code=status, media_type="application/json", headers=headers)

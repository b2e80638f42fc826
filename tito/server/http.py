"""HTTP plumbing shared by every API module: JSON responses, bounded request bodies."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from tito.types.errors import BadRequest, PayloadTooLarge


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status,
                    media_type="application/json", headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes (413) without buffering it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit: int, *, allow_empty: bool = False) -> Any:
    body = await read_body(request, limit)
    if not body.strip():
        if allow_empty:
            return {}
        raise BadRequest("request body is empty; expected a JSON object", code="invalid_json")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"invalid JSON body: {exc}", code="invalid_json") from exc

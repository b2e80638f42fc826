"""``JsonReply`` (the unstreamed turn's reply) sends exactly what Starlette's ``Response``
sends for the same body and header: the same ASGI messages, headers in the same order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.responses import Response

from tito.server.adapter import GENERATION_HEADER, GENERATION_RAW
from tito.server.http import JsonReply


def sent(response: Response) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    async def receive() -> dict[str, Any]:
        raise AssertionError("a reply reads nothing")

    asyncio.run(response({"type": "http"}, receive, send))
    return messages


@pytest.mark.parametrize("body", [b"{}", b'{"id":"chatcmpl-1","x":"\xc3\xa9"}', b"x" * 70000])
@pytest.mark.parametrize("value", ["chatcmpl-0123456789abcdef", "msg_1", "resp_\xe9"])
def test_json_reply_is_starlettes_response(body: bytes, value: str) -> None:
    ours = JsonReply(body, GENERATION_RAW, value)
    theirs = Response(body, media_type="application/json", headers={GENERATION_HEADER: value})
    assert sent(ours) == sent(theirs)
    assert ours.raw_headers == theirs.raw_headers
    assert dict(ours.headers) == dict(theirs.headers)
    assert (ours.status_code, ours.body, ours.background) == \
        (theirs.status_code, theirs.body, theirs.background)

"""A tiny logging reverse proxy: it forwards every request to an upstream (the gateway)
unchanged and writes one JSON file per request — method, path, headers, JSON body, the
reply's status and body (SSE text for a stream) — so a test sees exactly what an agent CLI
sends. Used by :mod:`helpers.cli_harness` between Claude Code or Codex and ``tito serve``.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                 "accept-encoding", "content-encoding", "upgrade"})
"""Headers that describe one hop (or a compression the proxy would have to redo)."""
MAX_REPLY_CHARS = 200_000
"""A reply body longer than this is logged cut (with ``reply_truncated``)."""


def _body(raw: bytes) -> Any:
    """The JSON value of a body, else its text (None when empty)."""
    if not raw:
        return None
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


class LoggingProxy:
    """``web.Application`` factory: every route is forwarded to ``upstream``; the log of
    request ``n`` is ``folder/NNNN.json`` (see :func:`read_log`)."""

    def __init__(self, upstream: str, folder: Path,
                 rewrite: Callable[[Any], Any] | None = None,
                 rewrite_reply: Callable[[bytes], bytes] | None = None):
        self.upstream = upstream.rstrip("/")
        self.rewrite = rewrite
        self.rewrite_reply = rewrite_reply
        self.folder = folder
        self.counter = itertools.count()
        self.client: aiohttp.ClientSession | None = None
        folder.mkdir(parents=True, exist_ok=True)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self.client is not None:
            await self.client.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        seq = next(self.counter)
        raw = await request.read()
        entry: dict[str, Any] = {"seq": seq, "t": time.time(), "method": request.method,
                                 "path": request.path_qs, "headers": dict(request.headers),
                                 "body": _body(raw)}
        if self.client is None:
            self.client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                                auto_decompress=False)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        if self.rewrite is not None and isinstance(entry["body"], dict):
            rewritten = self.rewrite(entry["body"])
            if rewritten is not None:
                entry["rewritten"] = True
                raw = json.dumps(rewritten).encode()
        try:
            return await self._relay(request, headers, raw, entry)
        finally:
            entry["t_done"] = time.time()
            (self.folder / f"{seq:04d}.json").write_text(json.dumps(entry, indent=1))

    async def _relay(self, request: web.Request, headers: dict[str, str], raw: bytes,
                     entry: dict[str, Any]) -> web.StreamResponse:
        """Forward, stream the reply back as it comes and log it; a client that goes away
        mid-reply closes the upstream request too (as it would without the proxy), and
        what had come is logged with ``client_disconnected``."""
        assert self.client is not None
        chunks: list[bytes] = []
        try:
            async with self.client.request(request.method, self.upstream + request.path_qs,
                                           headers=headers, data=raw) as up:
                entry["status"] = up.status
                entry["reply_headers"] = dict(up.headers)
                resp = web.StreamResponse(status=up.status, headers={
                    k: v for k, v in up.headers.items() if k.lower() not in HOP})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    chunks.append(chunk)
                    if self.rewrite_reply is not None:
                        chunk = self.rewrite_reply(chunk)
                    await resp.write(chunk)
                await resp.write_eof()
            return resp
        except ConnectionError:
            entry["client_disconnected"] = True
            raise
        finally:
            reply = b"".join(chunks)
            entry["reply_truncated"] = len(reply) > MAX_REPLY_CHARS
            entry["reply"] = _body(reply[:MAX_REPLY_CHARS])


def read_log(folder: Path) -> list[dict[str, Any]]:
    """The proxy's entries in arrival order."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]

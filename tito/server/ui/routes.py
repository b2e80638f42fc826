"""The viewer's HTTP routes over a source (a gateway's live sessions, or a Parquet file):
the page, its static assets, and the JSON it reads. Both sources answer the same shapes,
so the page has one code path.

- ``GET /ui`` (and ``/ui/``): the page; ``GET /ui/static/{file}``: its script and style;
- ``GET /ui/api/source``: what is being viewed;
- ``GET /ui/api/sessions?offset&limit``: the sessions (a file: its rows), paged;
- ``GET /ui/api/sessions/{id}?leaf&context``: one session: summary, v2 tree, strip facts;
- ``GET /ui/api/sessions/{id}/tokens?offset&limit&leaf&context``: a page of the strip (at
  most 16,384 tokens);
- ``GET /ui/api/sessions/{id}/samples?context``: the samples preview.

``context`` picks one agent context of a gateway's session (design §5.5; default: the
main agent's).

An unknown id is 404 in OpenAI's error shape.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from tito.server.http import int_query, json_response
from tito.server.ui.model import SessionModel
from tito.server.ui.strip import DEFAULT_PAGE, MAX_PAGE, page
from tito.types.errors import NotFound

T = TypeVar("T")
MAX_LIST = 1000
STATIC = {"index.html": "text/html; charset=utf-8",
          "app.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class Source(Protocol):
    kind: str

    def describe(self) -> dict[str, Any]: ...

    def sessions(self) -> list[dict[str, Any]]: ...

    async def model(self, session_id: str, context: str | None = None) -> SessionModel: ...

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...


Handler = Callable[[Source, Request], Awaitable[Response]]


@functools.cache
def static_bytes(name: str) -> bytes:
    return (resources.files("tito.server.ui") / "static" / name).read_bytes()


def _context(request: Request) -> str | None:
    return request.query_params.get("context") or None


def _leaf(request: Request) -> int | None:
    if request.query_params.get("leaf") in (None, ""):
        return None
    return int_query(request, "leaf", 0, 0, 1 << 31)


async def index(source: Source, request: Request) -> Response:
    return Response(static_bytes("index.html"), media_type=STATIC["index.html"],
                    headers=PAGE_HEADERS)


async def static_file(source: Source, request: Request) -> Response:
    name = request.path_params["file"]
    if name not in STATIC:
        raise NotFound(f"no viewer file {name!r}", code="unknown_route")
    return Response(static_bytes(name), media_type=STATIC[name],
                    headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


async def source_info(source: Source, request: Request) -> Response:
    return json_response({"source": source.describe(), "page_limit": MAX_PAGE,
                          "default_page": DEFAULT_PAGE})


async def sessions(source: Source, request: Request) -> Response:
    offset = int_query(request, "offset", 0, 0, 1 << 31)
    limit = int_query(request, "limit", 200, 1, MAX_LIST)
    items = source.sessions()
    end = min(len(items), offset + limit)
    return json_response({
        "source": source.describe(), "now": time.time(), "sessions": items[offset:end],
        "page": {"offset": offset, "limit": limit, "total": len(items),
                 "next_offset": end if end < len(items) else None}})


async def session(source: Source, request: Request) -> Response:
    model = await source.model(request.path_params["session_id"], _context(request))
    leaf = _leaf(request)
    model.check_node(leaf)
    traj = await source.run(model.trajectory, leaf)
    return json_response({
        "id": model.id, "version": model.version, "summary": model.summary,
        "tree": model.tree, "leaf": leaf if leaf is not None else
        model.summary.get("default_leaf"), "strip": traj.info,
        "page_limit": MAX_PAGE, "default_page": DEFAULT_PAGE})


async def tokens(source: Source, request: Request) -> Response:
    model = await source.model(request.path_params["session_id"], _context(request))
    leaf = _leaf(request)
    model.check_node(leaf)
    traj = await source.run(model.trajectory, leaf)
    offset = int_query(request, "offset", 0, 0, len(traj))
    limit = int_query(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    return json_response(page(traj, offset, limit))


async def samples(source: Source, request: Request) -> Response:
    model = await source.model(request.path_params["session_id"], _context(request))
    return json_response({"id": model.id, **model.preview})


ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/ui", index, ["GET"]),
    ("/ui/", index, ["GET"]),
    ("/ui/static/{file}", static_file, ["GET"]),
    ("/ui/api/source", source_info, ["GET"]),
    ("/ui/api/sessions", sessions, ["GET"]),
    ("/ui/api/sessions/{session_id}", session, ["GET"]),
    ("/ui/api/sessions/{session_id}/tokens", tokens, ["GET"]),
    ("/ui/api/sessions/{session_id}/samples", samples, ["GET"]),
]

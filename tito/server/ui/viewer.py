"""The stand-alone viewer app of ``tito view``: the same routes and page as the gateway's
``/ui``, over a read-only source, behind the gateway's Host and Origin rules (a page
that rebinds its DNS name to 127.0.0.1 cannot read the file through it)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tito.server.access import OriginRule, allowed_host_names
from tito.server.errors import error_response, status_of
from tito.server.ui.routes import ROUTES, Handler, Source
from tito.types.errors import BadRequest, MethodNotAllowed, NotFound, TitoError

log = logging.getLogger("tito.view")


def _host(value: str) -> str:
    return urlsplit("//" + value).hostname or ""


class HostCheck:
    """Host must name this server (unless ``*``); a request with ``Origin`` must come from
    this server's own origin (scheme, host and port)."""

    def __init__(self, app: ASGIApp, *, hosts: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = OriginRule()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = self.refusal(scope) if scope["type"] == "http" else None
        if error is None:
            await self.app(scope, receive, send)
            return
        await error_response(error, status_of(error))(
            scope, receive, send)

    def refusal(self, scope: Scope) -> TitoError | None:
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"")
        if "*" not in self.hosts and _host(host.decode("latin-1")) not in self.hosts:
            return BadRequest(f"host {host.decode('latin-1')!r} is not allowed",
                              code="host_not_allowed")
        origin = headers.get(b"origin")
        if origin is not None and not self.origins.allows(origin, host,
                                                              scope.get("scheme", "http")):
            return self.origins.refused()
        return None


def _guard(source: Source, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(source, request)
        except TitoError as exc:
            error = exc
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.url.path)
            error = TitoError("internal server error; see the log")
            error.__cause__ = exc
        return error_response(error, status_of(error))

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    text = f"{exc.detail}: {request.method} {request.url.path}"
    error: TitoError = MethodNotAllowed(text) if exc.status_code == 405 else \
        NotFound(text, code="unknown_route")
    return error_response(error, exc.status_code)


async def _health(request: Request) -> Response:
    return JSONResponse({"status": "ok", "viewer": True})


async def _home(request: Request) -> Response:
    return RedirectResponse("/ui/")


def viewer_app(source: Source, *, host: str = "127.0.0.1",
               allowed_hosts: tuple[str, ...] | None = None) -> Starlette:
    routes = [Route(path, _guard(source, handler), methods=methods)
              for path, handler, methods in ROUTES]
    routes += [Route("/health", _health, methods=["GET"]),
               Route("/", _home, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error},
                     middleware=[Middleware(HostCheck,
                                            hosts=allowed_host_names(allowed_hosts, host))])

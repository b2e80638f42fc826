"""The app factory: every API module's routes over one :class:`Gateway` (design §7).

Routes: one sibling package per API (:mod:`tito.server.openai` Chat Completions,
:mod:`tito.server.anthropic` Messages, :mod:`tito.server.responses` Responses: matched
first, they serve every turn), then the session routes (:mod:`tito.server.sessions`), then
the catch-all for unknown paths of a known session. Refusals at the entry
(:mod:`tito.server.entry`) and Starlette's own 404/405 answers use the envelope of the
path's API (:func:`api_of`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from tito.server import anthropic, openai, responses, sessions, ui
from tito.server.api import Api
from tito.server.entry import EntryMiddleware
from tito.server.gateway import Gateway
from tito.types.errors import MethodNotAllowed, NotFound, TitoError

APIS: tuple[Api, ...] = (openai.API, anthropic.API, responses.API, sessions.API, ui.API)
"""In routing order: the per-turn API routes first (Starlette tries routes in order); the
viewer (``/ui``) last, left out with ``--no-ui``."""


def api_of(path: str) -> Api:
    """The API whose error envelope answers for ``path`` (Anthropic's under
    ``/v1/messages``, OpenAI's everywhere else)."""
    return anthropic.API if "/v1/messages" in path else openai.API


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (no route, wrong method) in the path's API envelope."""
    assert isinstance(exc, HTTPException)
    text = f"{exc.detail}: {request.method} {request.url.path}"
    error: TitoError = MethodNotAllowed(text) if exc.status_code == 405 else \
        NotFound(text, code="unknown_route")
    return api_of(request.url.path).error_response(error, exc.status_code)


TURN_APIS: tuple[Api, ...] = (openai.API, anthropic.API, responses.API)
"""The APIs whose POST routes run turns: served by the entry middleware without the router."""


def create_app(gateway: Gateway) -> Starlette:
    by_api = {api.name: api.routes_for(gateway) for api in APIS
              if api is not ui.API or gateway.config.ui}
    routes = [route for api_routes in by_api.values() for route in api_routes]
    routes.append(sessions.API.route(gateway, *sessions.CATCH_ALL))
    turn_routes = [route for api in TURN_APIS for route in by_api[api.name]
                   if route.methods is not None and "POST" in route.methods]

    async def sweep_idle_sessions() -> None:
        period = max(1.0, min(60.0, gateway.store.idle_ttl / 4))
        while True:
            await asyncio.sleep(period)
            gateway.store.evict_idle()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(sweep_idle_sessions())
        try:
            yield
        finally:
            sweeper.cancel()
            gateway.workers.shutdown(wait=False, cancel_futures=True)
            if gateway.journal is not None:
                gateway.journal.close()
            await gateway.engine.close()

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error},
                     middleware=[Middleware(EntryMiddleware, gateway=gateway, api_of=api_of,
                                            turn_routes=turn_routes)],
                     lifespan=lifespan)

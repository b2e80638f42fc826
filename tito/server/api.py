"""What an API module gives the app: its routes and how it words errors (design §7).

Each API (OpenAI Chat Completions in :mod:`tito.server.openai`, Anthropic Messages in
:mod:`tito.server.anthropic`, OpenAI Responses in :mod:`tito.server.responses`) is a
sibling package exposing one :class:`Api`. The app wraps every
endpoint so that any failure leaves in that API's own error envelope, with the status the
API gives the core error's kind, and every response >= 500 is logged once with its cause
chain.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from tito.server.compat import miles_error_response, miles_status
from tito.server.errors import error_response, status_of
from tito.server.http import CLIENT_CLOSED
from tito.types.errors import ErrorKind, TitoError

if TYPE_CHECKING:
    from tito.server.gateway import Gateway

log = logging.getLogger("tito.server")

Endpoint = Callable[["Gateway", Request], Awaitable[Response]]
"""A route handler: the gateway and the request in, a response out; raises TitoError."""


ROUTE_KEY = "tito.route"
"""Where :meth:`Api.guard` leaves the route's path template in the ASGI scope."""


def route_of(request: Request) -> str:
    """The path template of the route serving ``request`` (empty before routing)."""
    return str(request.scope.get(ROUTE_KEY, ""))


@dataclass(frozen=True)
class Api:
    name: str
    status_of: Callable[[TitoError], int]
    """HTTP status of a core error in this API."""
    error_response: Callable[[TitoError, int], Response]
    """The error in this API's envelope, with the given status."""
    routes: list[tuple[str, Endpoint, list[str]]] = field(default_factory=list)
    """``(path, endpoint, methods)``."""

    def route(self, gateway: Gateway, path: str, endpoint: Endpoint,
              methods: list[str]) -> Route:
        return Route(path, self.guard(gateway, endpoint, path), methods=methods)

    def guard(self, gateway: Gateway, endpoint: Endpoint, path: str = ""
              ) -> Callable[[Request], Awaitable[Response]]:
        """``endpoint`` with every failure turned into this API's error response; ``path``:
        the route's template, the ``route`` label of its errors in ``/metrics``."""

        async def guarded(request: Request) -> Response:
            request.scope[ROUTE_KEY] = path
            try:
                return await endpoint(gateway, request)
            except ClientDisconnect:  # during upload or while the turn ran: nobody to answer
                gateway.metrics.inc("client_disconnects_total")
                return Response(status_code=CLIENT_CLOSED)
            except TitoError as exc:
                error = exc
            except Exception as exc:
                error = TitoError("internal server error; see the gateway log")
                error.__cause__ = exc
            return self.fail(gateway, request, error)

        return guarded

    def fail(self, gateway: Gateway, request: Request, error: TitoError) -> Response:
        """Count ``error``, log it when it is a server-side failure, and word it."""
        status = self.status_of(error)
        miles = gateway.config.compat == "miles" and self.name != "anthropic"
        if miles:
            status = miles_status(status)
        gateway.metrics.error(status, error.code, route_of(request))
        if status >= 500 and error.kind is ErrorKind.UNAVAILABLE:  # not a failure here
            log.warning("%s %s -> %d %s: %s", request.method, request.url.path, status,
                        error.code, error.message)
        elif status >= 500:
            log.error("%s %s -> %d %s: %s", request.method, request.url.path, status,
                      error.code, error.message, exc_info=error)
        if miles:  # the reference's envelope (its Anthropic route keeps Anthropic's)
            return miles_error_response(error, status, request.path_params.get("session_id"))
        return self.error_response(error, status)

    def routes_for(self, gateway: Gateway) -> list[Route]:
        return [self.route(gateway, path, endpoint, methods)
                for path, endpoint, methods in self.routes]


DEFAULT_ERRORS = Api(name="gateway", status_of=status_of, error_response=error_response)
"""The gateway's own error envelope (OpenAI's shape), with no routes: for refusals and
routes outside any API."""

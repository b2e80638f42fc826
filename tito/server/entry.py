"""Every request's entry into the app: refused when the access rules say so
(:mod:`tito.server.access`), in the envelope of the path's API and counted in ``/metrics``
(a browser refused the viewer for want of a key gets the login form,
:mod:`tito.server.ui.login`); else served, a turn route without Starlette's router
(:func:`_answer`), anything else by the app.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tito.server.access import AccessRules
from tito.server.api import DEFAULT_ERRORS
from tito.server.ui import login

if TYPE_CHECKING:
    from tito.server.api import Api
    from tito.server.gateway import Gateway


MATCHES_KEPT = 4096
"""Paths whose turn-route match the door remembers (then it starts over)."""


class EntryMiddleware:
    def __init__(self, app: ASGIApp, *, gateway: Gateway,
                 api_of: Callable[[str], Api] = lambda path: DEFAULT_ERRORS,
                 turn_routes: Sequence[Route] = ()) -> None:
        """``api_of(path)``: the API whose error envelope a refusal of ``path`` uses.
        ``turn_routes``: routes served without the router (see :func:`_answer`); each
        must be the first route of the app that fully matches a request it matches."""
        self.app = app
        self.gateway = gateway
        self.api_of = api_of
        self.turn_routes = tuple(turn_routes)
        self.rules = AccessRules(gateway.config)
        self._matched: dict[tuple[str, str], tuple[Route, dict[str, Any]] | None] = {}
        """(path, root path) -> the turn route it matched and its path parameters."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        error = self.rules.refusal(scope)
        if error is None:
            if scope["method"] == "POST" and self.turn_routes:
                route = self._turn_route(scope)
                if route is not None:
                    await _answer(route, scope, receive, send)
                    return
            await self.app(scope, receive, send)
            return
        api = self.api_of(scope["path"])
        status = api.status_of(error)
        self.gateway.metrics.error(status, error.code, "door")  # the route label of refusals
        if status == 401 and login.wants_login_page(scope):
            await login.login_response(scope)(scope, receive, send)
            return
        await api.error_response(error, status)(scope, receive, send)


    def _turn_route(self, scope: Scope) -> Route | None:
        """The first turn route that fully matches ``scope`` (its endpoint and path
        parameters put in ``scope``, as the router does), or None. What
        ``Route.matches`` found for a path is remembered (a session posts to the same
        path every turn): the match depends on the path and the root path only, since
        every turn route takes POST."""
        key = (scope["path"], scope.get("root_path", ""))
        if key in self._matched:
            found = self._matched[key]
        else:
            found = None
            for candidate in self.turn_routes:
                match, child_scope = candidate.matches(scope)
                if match is Match.FULL:
                    found = (candidate, child_scope["path_params"])
                    break
            if len(self._matched) >= MATCHES_KEPT:
                self._matched.clear()
            self._matched[key] = found
        if found is None:
            return None
        route, params = found
        path_params = dict(scope.get("path_params", {}))
        path_params.update(params)
        scope["endpoint"] = route.endpoint
        scope["path_params"] = path_params
        return route


async def _answer(route: Route, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve a request for ``route`` (a :meth:`Api.guard`-ed endpoint, which turns every
    failure into a response) without Starlette's router and exception middleware: the
    turn routes answer every turn, and those layers cost time on every request for
    nothing (no routing error can happen once the route matched)."""
    response = await route.endpoint(Request(scope, receive, send))
    await response(scope, receive, send)

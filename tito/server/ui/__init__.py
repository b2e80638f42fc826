"""The trajectory viewer at ``/ui`` (static page, JSON under ``/ui/api``).

A sessions list, and per session a token strip (every token coloured by origin, with
the loss mask, a logprob heat map, turn boundaries, folded tool calls and results,
thinking), the v2 tree with each leaf's fate, and the samples preview — served by the
gateway over its live sessions (:mod:`.live`) and by ``tito view`` over a
``samples.parquet`` (:mod:`.parquet`, :mod:`.viewer`). Modules: :mod:`.routes` (HTTP),
:mod:`.strip` (the strip and its pages), :mod:`.blocks`, :mod:`.text`, :mod:`.views`
(list entries, tree, preview), :mod:`.model` (per-session cache), :mod:`.login` (the
``--api-key`` cookie). The access rules (Host, Origin, API key) apply to every route;
``tito serve --no-ui`` leaves them out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from tito.server.api import Api, Endpoint
from tito.server.errors import error_response, status_of
from tito.server.ui.live import live_source
from tito.server.ui.routes import ROUTES, Handler

if TYPE_CHECKING:
    from tito.server.gateway import Gateway


def _on_gateway(handler: Handler) -> Endpoint:
    async def endpoint(gateway: Gateway, request: Request) -> Response:
        return await handler(live_source(gateway), request)

    return endpoint


API = Api(
    name="ui",
    status_of=status_of,
    error_response=error_response,
    routes=[(path, _on_gateway(handler), methods) for path, handler, methods in ROUTES],
)
"""The viewer's routes on a gateway (errors in OpenAI's envelope)."""

__all__ = ["API"]

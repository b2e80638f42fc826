"""One turn route for every API (design §3.2): an API is an adapter of a few hooks, and
:func:`turn_endpoint` is the skeleton they share.

The skeleton, for ``POST /sessions/<id>/<the API's path>``:

1. read the agent headers (:mod:`tito.server.agents`: the agent context the turn is
   for); look the session up; read the body (decoded off the event loop when it is big,
   :func:`tito.server.serving.read_turn_body`) with :meth:`TurnAdapter.decode`, against
   the session's stored state (its :class:`~tito.server.api_state.ApiState` and stored
   messages);
2. :meth:`TurnAdapter.prepare`: the core turn (:class:`~tito.types.messages.TurnRequest`,
   :class:`~tito.types.engine.SamplingParams`) and whether it streams; the turn gets the
   agent headers and, without tools, whether it asks for structured output; a
   structured-output schema the engine cannot enforce is noted in the turn
   (:func:`tito.server.unsupported.note_unenforced`);
3. unstreamed: run the turn with idempotent retries and disconnect handling
   (:func:`tito.server.serving.run_api_turn`) and send :meth:`TurnAdapter.reply` as JSON;
   streamed: open the turn's stream with the same idempotent retries (a retry replays the
   committed turn's outcome through the same hook,
   :func:`tito.server.serving.open_turn_stream`; refusals are still ordinary error
   replies) and send
   :meth:`TurnAdapter.events` as server-sent events, framed here: an error after the first
   byte becomes :meth:`TurnAdapter.error_event`, and the engine request is aborted when the
   stream stops early.

A fourth API is one package: request models, ``decode`` (body -> its request, past the
session's last body where it can), ``convert`` (request -> core turn, outcome -> reply) and
``events`` (outcome as stream events), wired by an adapter (see docs/contributing.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from tito.server.agents import request_refs
from tito.server.api import route_of
from tito.server.api_state import ApiState, LastBodies
from tito.server.errors import status_of
from tito.server.gateway import Gateway, TurnOutcome
from tito.server.http import JsonReply, cancel_on_disconnect
from tito.server.serving import (
    SSE_HEADERS,
    TurnStream,
    open_turn_stream,
    read_turn_body,
    run_api_turn,
    sse_response,
)
from tito.server.unsupported import note_unenforced
from tito.session import Session
from tito.types.engine import SamplingParams
from tito.types.errors import TitoError
from tito.types.messages import Message, TurnRequest

JSON = "application/json"
D = TypeVar("D")
"""An API's decoded request."""
B = TypeVar("B")
"""An API's reply body."""


@dataclass(frozen=True, slots=True)
class TurnContext:
    """What a turn's hooks may read: the gateway, the session, its API state, and the
    session's stored messages (a copy taken on the event loop before the body is read)."""

    gateway: Gateway
    session: Session
    state: ApiState
    stored: list[Message]
    bodies: LastBodies
    """The last bodies of the agent the request's headers name (what its body may
    extend)."""


@dataclass(frozen=True, slots=True)
class ApiTurn(Generic[D]):
    """A decoded request as a core turn."""

    request: D
    """The API's validated request."""
    turn: TurnRequest
    params: SamplingParams
    stream: bool
    model: str
    """The model name the reply carries."""
    sent: object
    """The API's validated request model: its sampling fields say which settings the
    client sent (the session's defaults fill the others)."""


@dataclass(frozen=True, slots=True)
class EventStream:
    """A streamed turn in an API's events."""

    events: AsyncGenerator[bytes, None]
    """The events as the engine generates, up to the committed outcome's."""
    error: Callable[[TitoError], bytes]
    """A failure after the first byte, as the API's error event."""
    end: bytes = b""
    """Sent last, after the events or after an error event (b"": nothing)."""


class TurnAdapter(Protocol[D, B]):
    """The hooks of one API's turn route."""

    id_prefix: str
    """Of the response id (``chatcmpl-``, ``msg_``, ``resp_``)."""

    def decode(self, ctx: TurnContext, body: bytes) -> D:
        """Parse and validate ``body`` (BadRequest when it is wrong), past the session's
        last body where it extends it. May run in a worker thread: reads ``ctx`` only,
        writes only ``ctx.state`` (and only once the body is valid)."""
        ...

    def prepare(self, ctx: TurnContext, request: D) -> ApiTurn[D]:
        """The core turn of a decoded request (on the event loop)."""
        ...

    def reply(self, ctx: TurnContext, turn: ApiTurn[D], outcome: TurnOutcome,
              response_id: str) -> B:
        """The API's reply to a finished turn (streamed or not)."""
        ...

    def dump(self, body: B) -> bytes:
        """``body`` as JSON bytes."""
        ...

    def events(self, ctx: TurnContext, turn: ApiTurn[D], stream: TurnStream,
               response_id: str, reply: Callable[[TurnOutcome], B]) -> EventStream:
        """The turn as the API's stream events, as the engine generates (``reply`` gives
        the reply of the committed outcome), and its error event."""
        ...


def turn_endpoint(adapter: TurnAdapter[Any, Any]
                  ) -> Callable[[Gateway, Request], Awaitable[Response]]:
    """The turn route of ``adapter``'s API."""

    async def endpoint(gateway: Gateway, request: Request) -> Response:
        return await serve_turn(adapter, gateway, request)

    return endpoint


async def serve_turn(adapter: TurnAdapter[D, B], gateway: Gateway, request: Request
                     ) -> Response:
    agent, links = request_refs(request.scope["headers"])  # a malformed header: 400 first
    session = gateway.session(request.path_params["session_id"])
    state = ApiState.of(session)
    ctx = TurnContext(gateway, session, state, list(session.messages),
                      state.last_bodies(None if agent is None else agent.key))
    raw, offload, decoded = await read_turn_body(
        gateway, request, lambda body: adapter.decode(ctx, body), ctx.bodies.covered)
    turn = adapter.prepare(ctx, decoded)
    params = session_params(state, turn)
    note_unenforced(gateway.engine, turn.turn, params)
    core = turn.turn
    core.agent = agent
    core.links = links
    if params.json_schema is not None:  # a side request's sign (design §5.5)
        core.structured = True
    response_id = adapter.id_prefix + os.urandom(16).hex()

    def reply(outcome: TurnOutcome) -> B:
        return adapter.reply(ctx, turn, outcome, response_id)

    one_chunk = getattr(adapter, "one_chunk", None)
    if turn.stream and one_chunk is not None and gateway.config.compat == "miles":
        body = await run_api_turn(gateway, request, session, raw, turn.turn, params,
                                  offload=offload, response_id=response_id, build=reply)
        return Response(one_chunk(body), media_type="text/event-stream", headers=SSE_HEADERS)
    if turn.stream:  # a replayed stream is the committed turn's, under its response id
        stream = await cancel_on_disconnect(request, open_turn_stream(
            gateway, request, session, raw, turn.turn, params, offload=offload,
            response_id=response_id, route=route_of(request)))
        response_id = stream.response_id
        events = adapter.events(ctx, turn, stream, response_id, reply)
        sse = sse_response(framed(events, stream))
        sse.headers[GENERATION_HEADER] = response_id
        return sse
    body = await run_api_turn(gateway, request, session, raw, turn.turn, params,
                              offload=offload, response_id=response_id, build=reply)
    answered = body.get("id") if isinstance(body, dict) else None  # a replay: its own id
    return JsonReply(adapter.dump(body), GENERATION_RAW, str(answered or response_id))


GENERATION_HEADER = "x-miles-generation-id"
"""The reply's generation (its response id; a replayed answer keeps the first one's),
as the reference framework names it."""
GENERATION_RAW = GENERATION_HEADER.encode("latin-1")


def session_params(state: ApiState, turn: ApiTurn[Any]) -> SamplingParams:
    """The turn's sampling settings with the session's defaults filled in for the fields
    its request leaves out. (A request that sends a field the gateway owns never gets
    here: its request model refuses it, :mod:`tito.server.owned`.)"""
    options = state.options
    if options is None:
        return turn.params
    return options.fill(turn.params, turn.sent)


async def framed(events: EventStream, stream: TurnStream) -> AsyncIterator[bytes]:
    """The events, then the end of the stream; a failure after the first byte is the
    API's error event (counted and logged as a failed reply would be); a stream stopped
    early (the client left, or an error was sent) aborts the engine request."""
    try:
        async with contextlib.aclosing(events.events) as chunks:
            async for chunk in chunks:
                yield chunk
    except Exception as exc:
        yield events.error(stream.failed(exc, status_of))
    finally:
        await stream.aclose()
    if events.end:
        yield events.end


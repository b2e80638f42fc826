"""The serving steps every API's turn route takes (design §3.2; the route itself is
:mod:`tito.server.adapter`): read a turn's body, run the turn with idempotent retries and
disconnect handling, or open it as a stream of text deltas (with the same retries: a
retried stream replays the committed turn's outcome).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

from tito.parse.base import stable_call_ids
from tito.parse.stream import Delta, DeltaStream, Parse
from tito.server.api_state import ApiState
from tito.server.finish import check_admission
from tito.server.gateway import Gateway, TurnOutcome
from tito.server.http import cancel_on_disconnect, read_body
from tito.server.idempotency import RetryKey, TurnGone, TurnReplies
from tito.session import Session
from tito.types.engine import SamplingParams, StreamChunk
from tito.types.errors import TitoError
from tito.types.messages import ParsedCompletion, TurnRequest

log = logging.getLogger("tito.server")

B = TypeVar("B")
R = TypeVar("R")

OFFLOAD_BYTES = 256 * 1024
"""Request bodies above this size are decoded, validated and rendered off the event loop."""
STREAM_PARSE_EVERY = 4
"""A streamed turn's text is parsed again after this many new ids (or a 16th of the ids
so far, whichever is more)."""


async def read_turn_body(gateway: Gateway, request: Request, decode: Callable[[bytes], R],
                         known: Callable[[bytes], int] | None = None
                         ) -> tuple[bytes, bool, R]:
    """(raw body, offload, decoded): a body with over :data:`OFFLOAD_BYTES` to work on is
    *offloaded*: decoded (and later rendered and parsed) in the worker pool, so it never
    stalls other sessions. ``known``: how many leading bytes of a body the session's last
    body covers (its decode and plan take only what follows: a long conversation that
    grows by a few messages stays on the event loop, which saves the thread hand-offs)."""
    raw = await read_body(request, gateway.config.max_body_bytes)
    offload = len(raw) > OFFLOAD_BYTES and \
        len(raw) - (known(raw) if known is not None else 0) > OFFLOAD_BYTES
    decoded = await gateway.offload(decode, raw) if offload else decode(raw)
    return raw, offload, decoded


async def run_api_turn(gateway: Gateway, request: Request, session: Session, raw: bytes,
                       turn: TurnRequest, params: SamplingParams, *, offload: bool,
                       response_id: str, build: Callable[[TurnOutcome], B]) -> B:
    """Run one turn and return ``build(outcome)``; a retry of the running or the last
    answered turn (``Idempotency-Key``, or an SDK retry of the same body) gets that turn's
    body instead of a second generation. A client that disconnects cancels the turn (the
    engine request is aborted, nothing is stored)."""
    retry = RetryKey.of(request, raw)
    replies = ApiState.of(session).replies
    answer = await replies.replay(retry) if retry.may_repeat else None
    if answer is not None and not isinstance(answer, TurnOutcome):  # not a streamed one
        gateway.metrics.inc("idempotent_replays_total")
        return answer
    check_admission(session)  # a finished session replays its answers, runs no new turn
    running = replies.start(retry)
    try:
        outcome = await cancel_on_disconnect(
            request, gateway.run_turn(session, turn, params, offload=offload,
                                      response_id=response_id))
        body = build(outcome)
    except BaseException as exc:
        replies.finish(retry, running, None, exc)
        raise
    replies.finish(retry, running, body, None)
    return body


# -- streaming ---------------------------------------------------------------------------
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass
class TurnStream:
    """A streamed turn whose first event has arrived: planning and engine refusals were
    raised before any byte was sent (so they are ordinary error replies)."""

    events: AsyncGenerator[StreamChunk | TurnOutcome, None]
    first: StreamChunk | TurnOutcome
    response_id: str
    gateway: Gateway
    route: str = ""
    """The route's path template (the ``route`` label of a failure in ``/metrics``)."""

    async def deltas(self, parse: Parse, every: int = STREAM_PARSE_EVERY
                     ) -> AsyncIterator[Delta | TurnOutcome]:
        """Text deltas and complete tool calls as the engine generates (see
        :mod:`tito.parse.stream`), then the rest of the committed message, then the
        committed outcome."""

        def stable_parse(ids: Sequence[int], finish: str) -> ParsedCompletion:
            return stable_call_ids(parse(ids, finish), self.response_id)

        stream = DeltaStream(stable_parse, every=every)
        event: StreamChunk | TurnOutcome = self.first
        while True:
            if isinstance(event, TurnOutcome):
                rest = stream.finish(event.parsed)
                if rest:
                    yield rest
                if stream.diverged:
                    log.warning("%s: the streamed %s differs from the committed message",
                                event.response_id, " and ".join(stream.diverged))
                yield event
                return
            delta = stream.update(event.output_ids)
            if delta:
                yield delta
            event = await anext(self.events)

    def failed(self, exc: Exception, status_of: Callable[[TitoError], int]) -> TitoError:
        """A failure after the first byte (sent as the API's error event): counted, and
        logged with its cause when it is a server-side one (status >= 500), as a failed
        reply would be."""
        error = exc if isinstance(exc, TitoError) else \
            TitoError("internal server error; see the gateway log")
        if error is not exc:
            error.__cause__ = exc
        status = status_of(error)
        self.gateway.metrics.error(status, error.code, self.route)
        if status >= 500:
            log.error("stream %s -> %d %s: %s", self.response_id, status, error.code,
                      error.message, exc_info=error)
        return error

    async def aclose(self) -> None:
        """Stop early (the client left, or an error was sent): the engine request is
        aborted and the session left as it was, unless the turn was committed."""
        await self.events.aclose()


async def open_turn_stream(gateway: Gateway, request: Request, session: Session, raw: bytes,
                           turn: TurnRequest, params: SamplingParams, *, offload: bool,
                           response_id: str, route: str = "") -> TurnStream:
    """The turn's stream once its first event arrived; a retry of a running or answered
    streamed turn (as :func:`run_api_turn` tells them) is that turn's committed outcome,
    streamed again under its response id (waiting for it while it runs)."""
    retry = RetryKey.of(request, raw)
    replies = ApiState.of(session).replies
    answer = await replies.replay(retry) if retry.may_repeat else None
    if isinstance(answer, TurnOutcome):
        gateway.metrics.inc("idempotent_replays_total")
        return TurnStream(no_events(), answer, answer.response_id or response_id, gateway,
                          route)
    check_admission(session)
    running = replies.start(retry)
    events = tracked(replies, retry, running, gateway.run_turn_stream(
        session, turn, params, offload=offload, response_id=response_id))
    try:
        first = await anext(events)
    except BaseException:
        await events.aclose()
        raise
    return TurnStream(events, first, response_id, gateway, route)


async def tracked(replies: TurnReplies, retry: RetryKey, running: asyncio.Future[Any],
                  events: AsyncGenerator[StreamChunk | TurnOutcome, None]
                  ) -> AsyncGenerator[StreamChunk | TurnOutcome, None]:
    """``events``, with the turn's committed outcome (or its failure, or its stop by a
    client that left) told to ``replies`` as soon as it is known."""
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, TurnOutcome):
                    replies.finish(retry, running, event, None)
                yield event
    except BaseException as exc:
        replies.finish(retry, running, None, exc)
        raise
    if not running.done():
        replies.finish(retry, running, None, TurnGone("the stream ended without an outcome"))


async def no_events() -> AsyncGenerator[StreamChunk | TurnOutcome, None]:
    """The rest of a replayed turn's stream: nothing (its outcome is its first event)."""
    return
    yield  # an async generator


def sse_response(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)

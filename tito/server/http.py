"""HTTP plumbing shared by every API module: JSON responses, bounded request bodies, and
noticing a client that went away while its turn runs."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tito.server.growing_body import GrowingBody, Parsed, parse_growing
from tito.types.errors import BadRequest, PayloadTooLarge

T = TypeVar("T")


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status,
                    media_type="application/json", headers=headers)


class JsonReply(Response):
    """A 200 JSON reply with one extra header: exactly Starlette's
    ``Response(body, media_type="application/json", headers={name: value})`` (its bytes,
    its headers in their order), built without the general header handling (every
    unstreamed turn answers with one)."""

    media_type = "application/json"

    def __init__(self, body: bytes, name: bytes, value: str) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = [(name, value.encode("latin-1")),
                            (b"content-length", str(len(body)).encode("latin-1")),
                            (b"content-type", b"application/json")]


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes (413) without buffering it all;
    :class:`ClientDisconnect` if the client goes away first.

    Read from the ASGI channel directly (Starlette's ``request.stream()`` adds an async
    generator per request); nothing reads the body twice."""
    for name, value in request.scope["headers"]:
        if name == b"content-length":
            if value.isdigit() and int(value) > limit:
                raise PayloadTooLarge(f"request body of {value.decode()} bytes exceeds the "
                                      f"limit of {limit}")
            break
    chunks: list[bytes] = []
    size = 0
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_json(request: Request, limit: int, *, allow_empty: bool = False) -> Any:
    return decode_json(await read_body(request, limit), allow_empty=allow_empty)


def decode_json(body: bytes, *, allow_empty: bool = False,
                parse: Callable[[bytes], Any] = orjson.loads) -> Any:
    """``parse(body)``, its ``orjson`` errors worded as 400 ``invalid_json``."""
    if not body.strip():
        if allow_empty:
            return {}
        raise BadRequest("request body is empty; expected a JSON object", code="invalid_json")
    try:
        return parse(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"invalid JSON body: {exc}", code="invalid_json") from exc


def decode_growing(body: bytes, key: str, previous: GrowingBody | None, *,
                   keep: bool = True, short: bool = False) -> Parsed:
    """:func:`decode_json` of a body whose array member ``key`` grows turn by turn: parsed
    past ``previous`` when it extends it (:func:`~tito.server.growing_body.parse_growing`);
    ``keep`` False: parsed whole, with no state for the next body; ``short``: also past
    all of ``previous`` but its last element (a client that rewrites it)."""
    if not keep:
        return Parsed(decode_json(body), None, 0, False)
    parsed: Parsed = decode_json(body, parse=lambda raw: parse_growing(raw, key, previous,
                                                                   short=short))
    return parsed


_CONTAINERS = (dict, list)


def check_depth(fields: dict[str, Any], limit: int) -> None:
    """BadRequest ``json_too_deep`` when a value of ``fields`` nests JSON deeper than
    ``limit`` levels (the field itself is level 1).

    Deep nesting is refused before anything is stored: stored messages are re-serialized
    later (views, templates, samples metadata) by code with recursion limits of its own.
    One walk over the containers only; scalars cost nothing. Recursive: ``limit`` is at most 512
    (``--max-json-depth``), well inside Python's recursion limit."""

    def walk(item: dict[str, Any] | list[Any], depth: int, key: str) -> None:
        if depth > limit:
            raise BadRequest(f"{key} nests JSON deeper than {limit} levels "
                             "(--max-json-depth)", code="json_too_deep")
        for child in (item.values() if isinstance(item, dict) else item):
            if isinstance(child, _CONTAINERS):
                walk(child, depth + 1, key)

    for key, value in fields.items():
        if isinstance(value, _CONTAINERS):
            walk(value, 1, key)


CLIENT_CLOSED = 499
"""Status recorded for a request whose client went away (nginx's "client closed request");
nobody receives it."""


WATCH_AFTER = 0.05
"""Seconds a turn runs before its connection is watched for a disconnect (a turn that
answers sooner costs two dict operations, not a timer and a task: turns that can outlive
an SDK timeout are the long ones)."""


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise
    :class:`ClientDisconnect` (the work's own cancellation cleanup has run by then).

    Once the turn has run :data:`WATCH_AFTER` seconds (up to 1.5 times that: one timer per
    event loop checks every turn in flight), a watcher task reads the ASGI channel, which
    after the body yields only ``http.disconnect`` — sent when the client's connection
    closes.
    """
    loop = asyncio.get_running_loop()  # once: each lookup is a getpid() system call
    watch = _DisconnectWatch(request, loop)
    pending = _pending_watches(loop)
    pending.add(watch, loop)
    try:
        return await work
    except asyncio.CancelledError:
        if watch.gone:
            raise ClientDisconnect() from None
        raise
    finally:
        pending.discard(watch)
        watch.stop()


class _DisconnectWatch:
    __slots__ = ("gone", "owner", "request", "since", "task")

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.owner = asyncio.current_task(loop)
        self.task: asyncio.Task[None] | None = None
        self.gone = False
        self.since = time.monotonic()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _watch(self) -> None:
        while (await self.request.receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self.owner is not None:
            self.owner.cancel()


class _PendingWatches:
    """The unstarted watches of one event loop, oldest first; while there are any, one
    timer every half :data:`WATCH_AFTER` starts those that are due."""

    def __init__(self) -> None:
        # no reference to the loop: it is the weak key of this object in _PENDING
        self.watches: dict[_DisconnectWatch, None] = {}  # insertion order = age order
        self.timer: asyncio.TimerHandle | None = None

    def add(self, watch: _DisconnectWatch, loop: asyncio.AbstractEventLoop) -> None:
        self.watches[watch] = None
        if self.timer is None:
            self.timer = loop.call_later(WATCH_AFTER / 2, self._sweep)

    def discard(self, watch: _DisconnectWatch) -> None:
        self.watches.pop(watch, None)

    def _sweep(self) -> None:
        due = time.monotonic() - WATCH_AFTER
        started = []
        for watch in self.watches:
            if watch.since > due:
                break
            started.append(watch)
        for watch in started:
            del self.watches[watch]
            watch.start()
        self.timer = asyncio.get_running_loop().call_later(WATCH_AFTER / 2, self._sweep) \
            if self.watches else None


_PENDING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _PendingWatches] = \
    weakref.WeakKeyDictionary()


def _pending_watches(loop: asyncio.AbstractEventLoop) -> _PendingWatches:
    pending = _PENDING.get(loop)
    if pending is None:
        pending = _PENDING[loop] = _PendingWatches()
    return pending


def int_query(request: Request, name: str, default: int, low: int, high: int) -> int:
    """The integer query parameter ``name`` (``default`` when absent); 400 when it is not
    an integer in ``[low, high]``."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise BadRequest(f"query parameter {name} must be in [{low}, {high}], got {value}")
    return value

"""The HTTP transport of the engine clients (SGLang, vLLM; design §8).

One pooled keep-alive aiohttp session per engine URL, orjson bodies, and:

- **the one safe retry**: a request whose *reused* pooled connection turns out closed by
  the engine before any byte of the reply is sent once more on a fresh connection
  (:meth:`HttpTransport.request`, :func:`closed_before_reply`), counted in
  :attr:`HttpTransport.stale_retries`;
- **short probes**: :meth:`HttpTransport.probe` answers within a few seconds whatever the
  generation timeout (600 s by default);
- the error mapping every engine client shares: a transport failure is an
  :class:`EngineUnreachable` (``engine_error``, cause chained), an
  :class:`EngineRefused` when no connection could be made (nothing was sent), a timeout
  an :class:`EngineTimeout`.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
from collections.abc import AsyncIterator
from typing import Protocol

import aiohttp
import orjson
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from tito.types.errors import EngineError, EngineRefused, EngineTimeout, EngineUnreachable

JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY
JSON_HEADERS = {"content-type": "application/json"}
PROBE_TIMEOUT_S = 2.0
"""A probe (``GET /health``) must answer 200 within this (:meth:`HttpTransport.probe`)."""
MODELS_TIMEOUT_S = 10.0
"""``GET /v1/models`` (the context length, the served model) answers within this."""
KEEPALIVE_TIMEOUT_S = 4.0
"""Idle pooled connections are dropped after this: under uvicorn's (SGLang's, vLLM's) 5 s."""


def error_text(body: bytes, limit: int = 500) -> str:
    """The message of an engine's error body (SGLang's two 400 shapes, FastAPI's detail)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")[:limit]
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        err = err.get("message") or err.get("detail") or err
    return str(err)[:limit]


STREAM_READ_BUFSIZE = 1 << 20
"""aiohttp's read buffer of a stream (:meth:`HttpTransport.stream`); it stops reading the
socket past twice this until the reader catches up. aiohttp's default (64 KiB) stopped
and restarted reading (two ``epoll_ctl`` calls and their Python) on almost every network
read of a cumulative SGLang stream, whose chunks are hundreds of KB in a long turn."""

MAX_EVENT_BYTES = 1 << 30
"""Largest server-sent event line accepted from an engine (1 GiB): far above any chunk a
turn can produce (a cumulative SGLang chunk of a 1M-token turn is about 40 MB)."""


class _Reader(Protocol):
    async def readany(self) -> bytes: ...


async def sse_data(content: _Reader, limit: int = MAX_EVENT_BYTES) -> AsyncIterator[bytes]:
    """The ``data:`` payloads of a server-sent event stream, lines of any size (up to
    ``limit`` bytes) in linear total work: each received byte is scanned for the line end
    once and copied into its payload once (aiohttp's own line reader refuses lines over
    its buffer limit, 512 KiB, and re-copies a long line per network read). A line that
    spans network reads is kept as views of them and joined once, its ``data:`` prefix
    and trailing blanks cut from the views: a cumulative SGLang chunk (hundreds of KB,
    many reads, every few tokens) costs one copy of its bytes here. A longer line is an
    ``engine_protocol_error``."""
    parts: list[memoryview] = []  # the current line's pieces before the newest read
    size = 0
    while piece := await content.readany():
        start = 0
        while (end := piece.find(b"\n", start)) != -1:
            if parts:
                parts.append(memoryview(piece)[start:end])
                payload = _joined_payload(parts)
                parts, size = [], 0
            else:
                payload = _data_payload(piece, start, end)
            start = end + 1
            if payload is not None:
                yield payload
        if start < len(piece):
            parts.append(memoryview(piece)[start:])
            size += len(piece) - start
            if size > limit:
                raise EngineError(f"an engine stream event is over {limit} bytes",
                                  code="engine_protocol_error")
    if parts:
        last = _joined_payload(parts)
        if last is not None:
            yield last


def _data_payload(line: bytes, start: int, end: int) -> bytes | None:
    """The payload of the line ``line[start:end]`` when it is a ``data:`` line."""
    start = _payload_start(line, start, end)
    if start < 0:
        return None
    while end > start and line[end - 1] in b" \t\r":
        end -= 1
    return line[start:end]


def _payload_start(line: bytes, start: int, end: int) -> int:
    """Where the payload of the line ``line[start:end]`` starts (-1: not a ``data:``
    line)."""
    while start < end and line[start] in b" \t\r":
        start += 1
    if not line.startswith(b"data:", start, end):
        return -1
    start += 5
    while start < end and line[start] in b" \t":
        start += 1
    return start


_EDGE = 64
"""Bytes at each end of a line read across pieces that :func:`_joined_payload` looks at
for the prefix and the trailing blanks (a line with more blanks than that is joined
whole first)."""


def _joined_payload(parts: list[memoryview]) -> bytes | None:
    """:func:`_data_payload` of the line made of ``parts``, joined once."""
    total = sum(map(len, parts))
    head = _edge(parts, front=True)
    tail = _edge(parts, front=False)
    if total <= 2 * _EDGE:
        return _data_payload(b"".join(parts), 0, total)
    blanks = len(head) - len(head.lstrip(b" \t\r"))
    trail = len(tail) - len(tail.rstrip(b" \t\r"))
    if blanks > _EDGE // 2 or trail == _EDGE:  # blanks over an edge: the plain way
        return _data_payload(b"".join(parts), 0, total)
    cut = _payload_start(head, 0, _EDGE)
    if cut < 0:
        return None
    if cut == _EDGE:
        return _data_payload(b"".join(parts), 0, total)
    return b"".join(_trimmed(parts, cut, trail))


def _edge(parts: list[memoryview], *, front: bool) -> bytes:
    """The first (``front``) or last :data:`_EDGE` bytes of the line made of ``parts``."""
    got: list[bytes] = []
    need = _EDGE
    for part in parts if front else reversed(parts):
        take = part[:need] if front else part[max(0, len(part) - need):]
        got.append(take.tobytes())
        need -= len(take)
        if need <= 0:
            break
    return b"".join(got if front else reversed(got))


def _trimmed(parts: list[memoryview], lead: int, trail: int) -> list[memoryview]:
    """``parts`` without their first ``lead`` and last ``trail`` bytes."""
    out = list(parts)
    while lead:
        if len(out[0]) <= lead:
            lead -= len(out.pop(0))
        else:
            out[0], lead = out[0][lead:], 0
    while trail:
        if len(out[-1]) <= trail:
            trail -= len(out.pop())
        else:
            out[-1], trail = out[-1][:len(out[-1]) - trail], 0
    return out


# -- the stale keep-alive retry --------------------------------------------------------
_STALE_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})
_WRITE_FAILED = "Can not write request body"


def closed_before_reply(exc: BaseException) -> bool:
    """Whether ``exc`` shows the server closed the connection before any byte of a
    response arrived; exactly these:

    - :class:`aiohttp.ServerDisconnectedError` without a partial response (aiohttp passes
      the partly parsed response instead of its default text when some of it came);
    - ``ConnectionResetError`` / ``BrokenPipeError``: aiohttp's "Cannot write to closing
      transport" (:class:`aiohttp.ClientConnectionResetError`; a bare
      ``ConnectionResetError`` before aiohttp 3.10), raised while writing the request;
    - :class:`aiohttp.ClientOSError` with errno ``ECONNRESET`` or ``EPIPE``, and aiohttp's
      "Can not write request body" with one of those errnos or with none (a wrapped
      "Cannot write to closing transport").

    Never a timeout (aiohttp's ServerTimeoutError is a connection error too)."""
    if isinstance(exc, TimeoutError):
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return isinstance(exc.message, str)
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return True
    if isinstance(exc, aiohttp.ClientOSError):
        if exc.errno in _STALE_ERRNOS:
            return True
        return exc.errno is None and str(exc.strerror).startswith(_WRITE_FAILED)
    return False


class _Attempt:
    """One exchange on the pooled session: was its connection reused, did a reply start."""

    __slots__ = ("answered", "reused")

    def __init__(self) -> None:
        self.reused = False
        self.answered = False


_ATTEMPT: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar(
    "tito_engine_attempt", default=None)


class _PoolConnector(aiohttp.TCPConnector):
    """A TCPConnector that tells the running :class:`_Attempt` whether the connection it
    hands out was handed out before (a pooled keep-alive connection). Cheaper than an
    aiohttp TraceConfig, which costs time on every request even with one listener (see
    docs/performance.md, "Figures behind the code")."""

    async def connect(self, req: ClientRequest, traces: list[Trace],
                      timeout: aiohttp.ClientTimeout) -> Connection:
        conn = await super().connect(req, traces, timeout)
        attempt = _ATTEMPT.get()
        proto = conn.protocol
        if attempt is not None and proto is not None:
            # a mark on the connection's protocol object (it has a __dict__): cheaper
            # than a WeakSet of the handed-out ones, and it goes with the connection
            attempt.reused = getattr(proto, "_tito_handed_out", False)
            proto._tito_handed_out = True  # type: ignore[attr-defined]
        return conn


class HttpTransport:
    """Requests to one engine over one pooled keep-alive aiohttp session.

    **Keep-alive.** An idle pooled connection is dropped after ``keepalive_timeout``
    seconds, which must be shorter than the engine's own (uvicorn, the HTTP server of
    SGLang and vLLM, closes idle connections after 5 s). A request written on a connection
    the server has just closed fails ("Server disconnected"), which would be a spurious 502.

    **One safe retry.** A request is sent again, once, on a fresh (unpooled) connection
    when all of these hold: its connection was *reused* from the pool; the failure came
    before the response's status line and headers were parsed; and it is one of the
    errors :func:`closed_before_reply` accepts: :class:`aiohttp.ServerDisconnectedError`
    without a partial response, a ``ConnectionResetError``/``BrokenPipeError`` raised
    while writing the request (aiohttp's "Cannot write to closing transport"), or
    :class:`aiohttp.ClientOSError` with ``ECONNRESET``/``EPIPE`` (including "Can not write
    request body"). Each retry adds one to :attr:`stale_retries`. This is safe because
    such a failure means the engine never ran the request: an idle-closed keep-alive
    connection never received it (the server closed its end first, so our bytes met a
    closed socket), and the engine's HTTP server closes a connection without answering
    only when no request is in progress on it (keep-alive timeout, shutdown); SGLang and
    vLLM do not start a request whose body they did not fully read; an engine that
    crashed after reading it is gone and cannot run the retry. (A server that reads a
    request on a pooled connection and then closes or resets it without a byte of
    response looks the same on the wire and would get it twice; uvicorn does not do
    that, the mock's ``reset`` fault does.) Never retried: a timeout (the engine may be
    running the request), a failure after the response started (headers received, body
    cut), a failure on a fresh connection, a refused connection, any other error, a
    stream (:meth:`stream`).

    ``label`` starts the timeout messages (``engine``, ``vLLM``).
    """

    def __init__(self, url: str, *, timeout: float = 600.0, max_connections: int = 1024,
                 keepalive_timeout: float = KEEPALIVE_TIMEOUT_S, label: str = "engine"
                 ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        """Seconds a request may take in all (``--engine-timeout``), unless told less."""
        self.max_connections = max_connections
        self.keepalive_timeout = keepalive_timeout
        self.label = label
        self.stale_retries = 0
        """Requests sent again on a fresh connection after a stale pooled one failed."""
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """The pooled session (created on first use, in the running event loop)."""
        if self._session is None or self._session.closed:
            connector = _PoolConnector(limit=self.max_connections,
                                       keepalive_timeout=self.keepalive_timeout)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                json_serialize=lambda o: orjson.dumps(o, option=JSON_OPTS).decode(),
            )
        return self._session

    @staticmethod
    async def _exchange(session: aiohttp.ClientSession, method: str, url: str,
                        body: bytes | None, timeout: aiohttp.ClientTimeout,
                        attempt: _Attempt | None, headers: dict[str, str] | None
                        ) -> tuple[int, bytes]:
        if headers is None:
            headers = JSON_HEADERS if body is not None else None
        token = _ATTEMPT.set(attempt)
        try:
            async with session.request(method, url, data=body, headers=headers,
                                       timeout=timeout) as resp:
                if attempt is not None:
                    attempt.answered = True
                return resp.status, await resp.read()
        finally:
            _ATTEMPT.reset(token)

    async def request(self, method: str, path: str, body: bytes | None = None, *,
                      timeout: float | None = None,
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status, body) of one request (JSON ``body`` unless ``headers`` say otherwise)
        within ``timeout`` seconds (default :attr:`timeout`); see the class docstring for
        the retry."""
        seconds = self.timeout if timeout is None else timeout
        limit = aiohttp.ClientTimeout(total=seconds)
        attempt = _Attempt()
        try:
            return await self._exchange(self.session(), method, self.url + path, body,
                                        limit, attempt, headers)
        except TimeoutError as exc:
            raise self.timed_out(path, seconds) from exc
        except (aiohttp.ClientError, OSError) as exc:
            if not (attempt.reused and not attempt.answered and closed_before_reply(exc)):
                raise self.transport_error(path, exc) from exc
            first = f"{type(exc).__name__}: {exc}"
        self.stale_retries += 1
        return await self._retry_fresh(method, path, body, seconds, first, headers)

    async def _retry_fresh(self, method: str, path: str, body: bytes | None,
                           seconds: float, first: str,
                           headers: dict[str, str] | None) -> tuple[int, bytes]:
        """The request again on a new connection of its own (closed afterwards)."""
        limit = aiohttp.ClientTimeout(total=seconds)
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=limit) as fresh:
            try:
                return await self._exchange(fresh, method, self.url + path, body, limit,
                                            None, headers)
            except TimeoutError as exc:
                raise self.timed_out(path, seconds) from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise self.transport_error(
                    path, exc, note=f" (retried on a fresh connection after {first})") from exc

    @contextlib.asynccontextmanager
    async def stream(self, path: str, body: bytes,
                     headers: dict[str, str] | None = None
                     ) -> AsyncIterator[aiohttp.ClientResponse]:
        """``POST path`` on the pooled session, its response read as it arrives; a
        timeout or transport failure while it is open (the body included) is mapped as
        :meth:`request` maps it. Never retried: a stream is not resent."""
        try:
            async with self.session().post(self.url + path, data=body,
                                           headers=headers or JSON_HEADERS,
                                           read_bufsize=STREAM_READ_BUFSIZE) as resp:
                yield resp
        except TimeoutError as exc:
            raise self.timed_out(path, self.timeout) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise self.transport_error(path, exc) from exc

    async def probe(self, path: str = "/health", timeout: float = PROBE_TIMEOUT_S
                    ) -> str | None:
        """None when ``GET path`` answers 200 within ``timeout`` seconds, else a short
        reason (a timeout, the transport failure, or the status and the error body)."""
        try:
            status, body = await self.request("GET", path, timeout=timeout)
        except EngineTimeout:
            return f"no answer from {self.url}{path} within {timeout:g}s"
        except EngineError as exc:
            cause = exc.__cause__
            return f"{type(cause).__name__}: {cause}"[:300] if cause else str(exc)[:300]
        if status != 200:
            return f"{self.url}{path} answered HTTP {status} {error_text(body, 200)}".rstrip()
        return None

    def timed_out(self, path: str, seconds: float) -> EngineTimeout:
        return EngineTimeout(f"{self.label} {self.url}{path} timed out after {seconds}s")

    def transport_error(self, path: str, exc: BaseException, note: str = "") -> EngineError:
        """An :class:`EngineRefused` when no connection was made (nothing was sent: an
        engine pool moves the request at once), else an :class:`EngineUnreachable`."""
        kind = EngineRefused if isinstance(exc, aiohttp.ClientConnectorError) else \
            EngineUnreachable
        return kind(f"engine transport error on {self.url}{path}: "
                    f"{type(exc).__name__}: {exc}{note}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

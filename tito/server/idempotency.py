"""Idempotent retries (design §7): a retried request gets the answer of the turn it
retries instead of a second generation.

A request is a *retry* when it carries an ``Idempotency-Key`` header equal to that of the
turn it repeats, or the OpenAI/Anthropic SDKs' ``x-stainless-retry-count`` above 0 with a
body byte-identical to it. If that turn is still running, the retry waits for it (instead
of 409); if it was answered, the retry gets the same answer again; if it failed, the retry
runs as a new turn. One answered turn per session is remembered (the latest), which is the
only one an SDK retries.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from xxhash import xxh3_128_intdigest

from tito.types.errors import ErrorKind, TitoError


class KeyReused(TitoError):
    """An ``Idempotency-Key`` sent again with a different body (422)."""

    kind = ErrorKind.UNPROCESSABLE
    code = "idempotency_key_reused"


@dataclass(frozen=True, slots=True)
class RetryKey:
    key: str | None
    """The ``Idempotency-Key`` header, if any."""
    digest: tuple[int, str, int]
    """Length of the request body, the route, and the body's 128-bit xxh3 hash (several
    times cheaper than Python's SipHash, and far cheaper than a cryptographic hash; a
    client can only collide its own session's requests)."""
    sdk_retry: bool
    """``x-stainless-retry-count`` > 0: the SDK repeats a request it got no answer to."""

    @classmethod
    def of(cls, request: Request, body: bytes) -> RetryKey:
        key: str | None = None
        count = b"0"
        for name, value in request.scope["headers"]:  # raw ASGI headers: no Headers object
            if name == b"idempotency-key" and key is None:
                key = value.decode("latin-1")
            elif name == b"x-stainless-retry-count":
                count = value.strip()
        return cls(key, (len(body), request.scope["path"], xxh3_128_intdigest(body)),
                   count.isdigit() and int(count) > 0)

    @property
    def may_repeat(self) -> bool:
        """Whether this request can be a retry at all (a key, or an SDK retry)."""
        return self.key is not None or self.sdk_retry

    def repeats(self, other: RetryKey) -> bool:
        """Whether this request retries ``other`` (KeyReused: same key, other body)."""
        if self.key is not None and self.key == other.key:
            if self.digest != other.digest:
                raise KeyReused(f"Idempotency-Key {self.key!r} was used for a request with "
                                "another body")
            return True
        return self.sdk_retry and self.digest == other.digest


@dataclass
class TurnReplies:
    """Per session: the running turn and the last answered one, by their retry keys."""

    running: tuple[RetryKey, asyncio.Future[Any]] | None = None
    answered: tuple[RetryKey, Any] | None = None

    async def replay(self, retry: RetryKey) -> Any | None:
        """The answer ``retry`` should get again (waiting for its turn if it runs), else
        None: run it as a new turn."""
        if self.running is not None and retry.repeats(self.running[0]):
            future = self.running[1]
            try:
                return await asyncio.shield(future)
            except Exception:  # that turn failed: the retry runs as a new one
                return None
        if self.answered is not None and retry.repeats(self.answered[0]):
            return self.answered[1]
        return None

    def start(self, retry: RetryKey) -> asyncio.Future[Any]:
        """The answer-to-be of a request about to run its turn. While another turn runs,
        this one will be refused (409) and is not registered."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.running is None:
            self.running = (retry, future)
        return future

    def finish(self, retry: RetryKey, future: asyncio.Future[Any], answer: Any | None,
               error: BaseException | None) -> None:
        if self.running is not None and self.running[1] is future:
            self.running = None
        if error is not None:
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: no "never retrieved" warning if unawaited
            return
        self.answered = (retry, answer)
        if not future.done():
            future.set_result(answer)

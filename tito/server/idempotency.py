"""Idempotent retries (design §7): a retried request gets the answer of the turn it
retries instead of a second generation.

A request is a *retry* when it carries an ``Idempotency-Key`` header (or the reference
framework's ``X-Miles-Idempotency-Key``) equal to that of the
turn it repeats, or the OpenAI/Anthropic SDKs' ``x-stainless-retry-count`` above 0 with a
body byte-identical to it. If that turn is still running, the retry waits for it (instead
of 409); if it was answered, the retry gets the same answer again (a streamed turn's
answer is its committed outcome, streamed again); if it failed, the retry runs as a new
turn. Every running turn is tracked (a v2 session runs several at once); the answers
remembered are the latest, as many as the most turns the session has run at once (at
most :data:`MAX_ANSWERED`): a v1 session remembers its last answer, the only one an SDK
retries.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from xxhash import xxh3_128_intdigest

from tito.server.agents import LINKS
from tito.types.errors import ErrorKind, TitoError

KEY_HEADERS = (b"idempotency-key", b"x-miles-idempotency-key")
"""The key's headers: ours, and the reference framework's (the same meaning)."""
LINK_HEADERS = frozenset(name.lower().encode() for names in LINKS.values() for name in names)
"""Generation links: part of what a retry must repeat (a key reused with other links is
422 ``idempotency_key_reused``, as with another body)."""
MAX_ANSWERED = 64
"""Answers a session remembers at most (one per turn it has run at once)."""


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
        links = b""
        for name, value in request.scope["headers"]:  # raw ASGI headers: no Headers object
            if name in KEY_HEADERS and key is None:
                key = value.decode("latin-1")
            elif name == b"x-stainless-retry-count":
                count = value.strip()
            elif name in LINK_HEADERS:
                links += b"\n" + name + b":" + value
        digest = xxh3_128_intdigest(body if not links else body + links)
        return cls(key, (len(body), request.scope["path"], digest),
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


class TurnGone(Exception):
    """A running turn that ended without an answer because it was cancelled (its client
    left): a retry waiting for it runs as a new turn."""


@dataclass
class TurnReplies:
    """Per session: the running turns and the last answered ones, by their retry keys."""

    running: list[tuple[RetryKey, asyncio.Future[Any]]] = field(default_factory=list)
    answered: deque[tuple[RetryKey, Any]] = field(default_factory=lambda: deque(maxlen=1))
    """The latest answers, the newest last."""

    async def replay(self, retry: RetryKey) -> Any | None:
        """The answer ``retry`` should get again (waiting for its turn if it runs), else
        None: run it as a new turn."""
        for key, future in list(self.running):
            if retry.repeats(key):
                try:
                    return await asyncio.shield(future)
                except Exception:  # that turn failed: the retry runs as a new one
                    return None
        for key, answer in reversed(self.answered):
            if retry.repeats(key):
                return answer
        return None

    def start(self, retry: RetryKey) -> asyncio.Future[Any]:
        """The answer-to-be of a request about to run its turn (tracked until
        :meth:`finish`, also when the session refuses it: a retry then runs anew)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.running.append((retry, future))
        if len(self.running) > (self.answered.maxlen or 0) and \
                len(self.running) <= MAX_ANSWERED:
            self.answered = deque(self.answered, maxlen=len(self.running))
        return future

    def finish(self, retry: RetryKey, future: asyncio.Future[Any], answer: Any | None,
               error: BaseException | None) -> None:
        """``future``'s turn ended: with ``answer``, or failed with ``error``."""
        self.running = [entry for entry in self.running if entry[1] is not future]
        if error is not None:
            if not future.done():
                future.set_exception(error if isinstance(error, Exception) else
                                     TurnGone(f"the turn ended: {error!r}"))
                future.exception()  # retrieved: no "never retrieved" warning if unawaited
            return
        self.answered.append((retry, answer))
        if not future.done():
            future.set_result(answer)

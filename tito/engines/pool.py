"""Several engines behind one gateway (``--engine-url`` given more than once).

Each session sticks to one engine, where its prefix cache lives: a session's first turn
goes to the least-loaded healthy engine (fewest requests in flight, then fewest
sessions), and its later turns follow it there. An engine whose request fails at the
transport level (refused, reset, timed out) is ejected at once and the session moves to
another engine — its prompt ids are the gateway's, so any engine can continue it (the
new engine's prefix cache is cold; routing replay asks the new engine for the same
rows). When the connection was refused (:class:`EngineRefused`: nothing was sent) the
turn itself moves at once and succeeds there, with no failed turn; any other transport
failure (a reset or a timeout after the request was sent: the engine may have generated)
fails the turn (502 or 504, the session unchanged) and the session's next turn moves.
An ejected engine is probed at most once a second while turns arrive and re-admitted
when it answers. ``--engine-max-inflight N`` caps the requests in flight per engine
(more wait). Aborts go to the engine running the request; pause, continue and weight
versions are sent to every engine. Per-engine load and prefix-cache hits are in
:meth:`EnginePool.stats` (``/health``, ``/metrics``): its URL is the first engine's, its
stale-connection retries the sum over the engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from tito.types.engine import (
    Engine,
    EngineStats,
    GenerateResult,
    MemberStats,
    PauseMode,
    ReplayRequest,
    SamplingParams,
    StreamChunk,
    TokenIds,
    stream_generate,
)
from tito.types.errors import EngineError, EngineRefused, EngineTimeout, EngineUnreachable
from tito.types.placement import session_of

log = logging.getLogger("tito.engines")
PROBE_EVERY_S = 1.0
"""An ejected engine is probed at most this often (while turns arrive)."""
MAX_PLACED = 100_000
"""Session placements remembered (least recently used forgotten first)."""


@dataclass
class Member:
    url: str
    engine: Engine
    slots: asyncio.Semaphore | None = None
    inflight: int = 0
    sessions: int = 0
    up: bool = True
    down_reason: str | None = None
    probe_at: float = 0.0
    requests: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    running: set[str] = field(default_factory=set)


def is_transport_failure(exc: BaseException) -> bool:
    """An engine that did not answer (ejected), not one that answered badly or refused."""
    return isinstance(exc, EngineUnreachable | EngineTimeout)


class EnginePool:
    """An :class:`~tito.types.engine.Engine` over several engines (see the module doc)."""

    name = "pool"
    enforces_json_schema = True  # its members are SGLang and vLLM clients

    def __init__(self, engines: list[tuple[str, Engine]], *,
                 max_inflight: int | None = None) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.members = [Member(url, engine, asyncio.Semaphore(max_inflight)
                               if max_inflight else None) for url, engine in engines]
        self._placed: OrderedDict[str, Member] = OrderedDict()
        self._running: dict[str, Member] = {}
        self.moves = 0
        """Sessions moved to another engine because theirs was ejected."""
        self.refused_moves = 0
        """Requests moved to another engine at once because theirs refused the connection
        (each is also a session move)."""

    # -- placement -------------------------------------------------------------------
    async def _member_for(self, rid: str) -> Member:
        await self._readmit()
        session = session_of(rid)
        member = self._placed.get(session)
        if member is not None and member.up:
            self._placed.move_to_end(session)
            return member
        healthy = [m for m in self.members if m.up]
        if not healthy:
            reasons = "; ".join(f"{m.url}: {m.down_reason}" for m in self.members)
            raise EngineError(f"no engine is up ({reasons})")
        chosen = min(healthy, key=lambda m: (m.inflight, m.sessions))
        if member is not None:
            member.sessions -= 1
            self.moves += 1
        chosen.sessions += 1
        self._placed[session] = chosen
        if len(self._placed) > MAX_PLACED:
            _, forgotten = self._placed.popitem(last=False)
            forgotten.sessions -= 1
        return chosen

    async def _readmit(self) -> None:
        now = time.monotonic()
        due = [m for m in self.members if not m.up and now >= m.probe_at]
        for member in due:
            member.probe_at = now + PROBE_EVERY_S
        if due:
            await asyncio.gather(*(self._probe(m) for m in due))

    async def _probe(self, member: Member) -> None:
        try:
            reason = await asyncio.wait_for(member.engine.probe(), 5.0)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
        member.up, member.down_reason = reason is None, reason

    def _eject(self, member: Member, exc: BaseException) -> None:
        member.failures += 1
        if is_transport_failure(exc):
            member.up = False
            member.down_reason = str(exc)
            member.probe_at = time.monotonic() + PROBE_EVERY_S

    @contextlib.asynccontextmanager
    async def _slot(self, member: Member, rid: str) -> AsyncIterator[None]:
        if member.slots is not None:
            await member.slots.acquire()
        member.inflight += 1
        member.requests += 1
        member.running.add(rid)
        self._running[rid] = member
        try:
            yield
        except EngineError as exc:
            self._eject(member, exc)
            raise
        finally:
            member.inflight -= 1
            member.running.discard(rid)
            self._running.pop(rid, None)
            if member.slots is not None:
                member.slots.release()

    @staticmethod
    def _count(member: Member, result: GenerateResult) -> None:
        member.prompt_tokens += result.prompt_tokens
        member.cached_tokens += result.cached_tokens

    # -- the Engine protocol ---------------------------------------------------------
    async def generate(self, input_ids: TokenIds, params: SamplingParams, rid: str, *,
                       replay: ReplayRequest | None = None) -> GenerateResult:
        while True:
            member = await self._member_for(rid)
            try:
                async with self._slot(member, rid):
                    result = await member.engine.generate(input_ids, params, rid,
                                                          replay=replay)
            except EngineRefused as exc:
                self._move_refused(member, exc)
                continue
            self._count(member, result)
            return result

    async def generate_stream(self, input_ids: TokenIds, params: SamplingParams, rid: str,
                              *, replay: ReplayRequest | None = None
                              ) -> AsyncIterator[StreamChunk]:
        while True:
            member = await self._member_for(rid)
            started = False
            try:
                async with self._slot(member, rid), contextlib.aclosing(stream_generate(
                        member.engine, input_ids, params, rid, replay=replay)) as chunks:
                    async for chunk in chunks:
                        started = True
                        if chunk.result is not None:
                            self._count(member, chunk.result)
                        yield chunk
                return
            except EngineRefused as exc:
                if started:  # (a refusal comes before any chunk; never resend a stream)
                    raise
                self._move_refused(member, exc)

    def _move_refused(self, member: Member, exc: EngineRefused) -> None:
        """After ``member`` refused the connection (ejected by :meth:`_slot`): raise
        ``exc`` when no engine is left, else let the caller place the request again."""
        if not any(m.up for m in self.members):
            raise exc
        self.refused_moves += 1
        log.warning("%s refused the connection (%s); the request moves to another engine",
                    member.url, exc)

    async def abort(self, rid: str) -> None:
        member = self._running.get(rid)
        if member is not None:
            await member.engine.abort(rid)

    async def context_length(self) -> int | None:
        known = [n for n in await asyncio.gather(
            *(m.engine.context_length() for m in self.members if m.up)) if n]
        return min(known) if known else None

    async def pause(self, mode: PauseMode = "retract") -> None:
        await self._broadcast(lambda e: e.pause(mode))

    async def resume(self) -> None:
        await self._broadcast(lambda e: e.resume())

    async def update_weight_version(self, version: str) -> None:
        await self._broadcast(lambda e: e.update_weight_version(version))

    async def _broadcast(self, call: Callable[[Engine], Awaitable[None]]) -> None:
        """``call`` on every engine that is up; the first failure is raised after all
        were tried (an ejected engine is skipped: it is re-admitted later)."""
        results = await asyncio.gather(*(call(m.engine) for m in self.members if m.up),
                                       return_exceptions=True)
        for outcome in results:
            if isinstance(outcome, BaseException):
                raise outcome

    async def health(self) -> bool:
        return await self.probe() is None

    async def probe(self) -> str | None:
        """None while at least one engine answers (each is probed; the down ones are
        re-admitted when they answer), else every engine's reason."""
        await asyncio.gather(*(self._probe(m) for m in self.members))
        if any(m.up for m in self.members):
            return None
        return "; ".join(f"{m.url}: {m.down_reason}" for m in self.members)

    async def close(self) -> None:
        await asyncio.gather(*(m.engine.close() for m in self.members),
                             return_exceptions=True)

    # -- metrics ---------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """The pool as one engine: the first engine's URL (the first ``--engine-url``),
        the stale-connection retries of all of them, and each engine's figures."""
        return EngineStats(
            self.name, self.members[0].url,
            sum(m.engine.stats().stale_retries for m in self.members),
            tuple(MemberStats(m.url, m.up, m.inflight, m.sessions, m.requests, m.failures,
                              m.prompt_tokens, m.cached_tokens) for m in self.members))

    def member_stats(self) -> dict[str, dict[str, float]]:
        """Per engine URL: up, in flight, sessions placed, requests, failures, prompt and
        cached tokens, and the prefix-cache hit rate (``/metrics``)."""
        return {m.url: m.figures() for m in self.stats().members}

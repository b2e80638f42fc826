"""The live sessions of one gateway: creation, lookup, deletion, cap and idle TTL.

A deleted or expired session leaves a *tombstone* (a bounded, oldest-first list of ids),
so a late call is told 410 Gone — its trajectory was collected or expired — rather than
404 for an id that never existed.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tito.session import Session
from tito.types.errors import Gone, NotFound, OverCapacity
from tito.types.placement import new_session_id

MAX_TOMBSTONES = 100_000
"""Ids of deleted/expired sessions remembered (about 10 MB at the cap)."""


class SessionStore:
    def __init__(self, factory: Callable[[str], Session], *, max_sessions: int,
                 idle_ttl: float, max_tombstones: int = MAX_TOMBSTONES,
                 worker: int | None = None) -> None:
        """``worker``: this gateway's index among several (its session ids end with it)."""
        self._factory = factory
        self.worker = worker
        self._sessions: dict[str, Session] = {}
        self._tombstones: OrderedDict[str, str] = OrderedDict()
        self.max_sessions = max_sessions
        self.idle_ttl = idle_ttl
        self.max_tombstones = max_tombstones
        self.expired_total = 0
        self.on_forget: Callable[[str, str], Any] | None = None
        """Called with (id, reason) when a session is deleted or expires (the journal)."""

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self) -> Session:
        if len(self._sessions) >= self.max_sessions:
            self.evict_idle()
        if len(self._sessions) >= self.max_sessions:
            raise OverCapacity(
                f"the gateway holds {len(self._sessions)} sessions, its cap "
                f"(--max-sessions {self.max_sessions}); collect and delete finished sessions",
                code="too_many_sessions",
            )
        session_id = new_session_id(self.worker)
        session = self._factory(session_id)
        self._sessions[session_id] = session
        return session

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.closed:
            reason = self._tombstones.get(session_id)
            if reason is not None:
                raise Gone(f"session {session_id} was {reason}; its trajectory is no longer "
                           "held by the gateway")
            raise NotFound(f"session not found: session_id={session_id}",
                           code="session_not_found")
        return session

    def delete(self, session_id: str) -> Any:
        """Delete; returns what :attr:`on_forget` returned (e.g. a journal write)."""
        self.get(session_id)
        return self._forget(session_id, "deleted")

    def discard(self, session_id: str) -> None:
        """Forget a session that was never handed out (its creation failed)."""
        self._sessions.pop(session_id, None)

    def restore(self, live: dict[str, Session], gone: dict[str, str]) -> None:
        """Sessions and tombstones brought back from a journal (ids unchanged)."""
        self._sessions.update(live)
        for session_id, reason in gone.items():
            self._tombstones[session_id] = reason

    def evict_idle(self, now: float | None = None) -> int:
        """Drop sessions idle for longer than the TTL (never one with a turn in flight)."""
        now = time.time() if now is None else now
        stale = [sid for sid, s in self._sessions.items()
                 if not s.in_flight and now - s.last_active > self.idle_ttl]
        for sid in stale:
            self._forget(sid, f"expired after {self.idle_ttl:g} s idle (--session-ttl)")
        self.expired_total += len(stale)
        return len(stale)

    def _forget(self, session_id: str, reason: str) -> Any:
        self._sessions.pop(session_id).closed = True
        self._tombstones[session_id] = reason
        while len(self._tombstones) > self.max_tombstones:
            self._tombstones.popitem(last=False)
        return None if self.on_forget is None else self.on_forget(session_id, reason)

    def values(self) -> list[Session]:
        return list(self._sessions.values())

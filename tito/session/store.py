"""The live sessions of one gateway: creation, lookup, deletion, cap and idle TTL."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from tito.session.linear import LinearSession
from tito.types.errors import NotFound, OverCapacity


class SessionStore:
    def __init__(self, factory: Callable[[str], LinearSession], *, max_sessions: int,
                 idle_ttl: float) -> None:
        self._factory = factory
        self._sessions: dict[str, LinearSession] = {}
        self.max_sessions = max_sessions
        self.idle_ttl = idle_ttl
        self.expired_total = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self) -> LinearSession:
        if len(self._sessions) >= self.max_sessions:
            self.evict_idle()
        if len(self._sessions) >= self.max_sessions:
            raise OverCapacity(
                f"the gateway holds {len(self._sessions)} sessions, its cap "
                f"(--max-sessions {self.max_sessions}); collect and delete finished sessions",
                code="too_many_sessions",
            )
        session_id = uuid.uuid4().hex
        session = self._factory(session_id)
        self._sessions[session_id] = session
        return session

    def get(self, session_id: str) -> LinearSession:
        session = self._sessions.get(session_id)
        if session is None or session.closed:
            raise NotFound(f"session not found: session_id={session_id}",
                           code="session_not_found")
        return session

    def delete(self, session_id: str) -> None:
        session = self.get(session_id)
        session.closed = True
        del self._sessions[session_id]

    def evict_idle(self, now: float | None = None) -> int:
        """Drop sessions idle for longer than the TTL (never one with a turn in flight)."""
        now = time.time() if now is None else now
        stale = [sid for sid, s in self._sessions.items()
                 if not s.in_flight and now - s.last_active > self.idle_ttl]
        for sid in stale:
            self._sessions.pop(sid).closed = True
        self.expired_total += len(stale)
        return len(stale)

    def values(self) -> list[LinearSession]:
        return list(self._sessions.values())

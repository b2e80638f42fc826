"""The other gateway workers of ``tito serve --workers N``, as one worker sees them.

Each worker checks its peers' ports (a TCP connect, every :data:`CHECK_EVERY_S` seconds
and again on ``/health``): a worker that is down (killed, restarting, loading its
journal) refuses connections, since its socket listens only once it serves. Two things
use the result: ``/health`` says ``degraded`` while a peer is down, and a request for a
down peer's session gets 503 ``worker_unavailable`` (with ``Retry-After``) instead of a
421 that would send the client to a dead port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("tito.server")
CHECK_EVERY_S = 0.5
"""Seconds between two checks of every peer."""
CONNECT_TIMEOUT_S = 1.0
"""A peer that does not accept a connection within this is down."""


def local_address(host: str) -> str:
    """Where to reach a worker listening on ``host`` from the same machine."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


@dataclass
class Peers:
    """Workers 0 .. ``count``-1 on consecutive ports from ``base_port``; ``me`` is ours."""

    host: str
    base_port: int
    count: int
    me: int
    down: dict[int, str] = field(default_factory=dict)
    """Index -> why, for each peer that did not accept a connection at the last check."""
    _task: asyncio.Task[None] | None = None
    _seen: set[int] = field(default_factory=set)
    """Peers that were up at some check."""

    def port(self, index: int) -> int:
        return self.base_port + index

    def url(self, index: int) -> str:
        host = local_address(self.host)
        return f"http://[{host}]:{self.port(index)}" if ":" in host else \
            f"http://{host}:{self.port(index)}"

    def is_down(self, index: int) -> bool:
        return index in self.down

    async def check(self) -> None:
        """Check every peer once (concurrently)."""
        others = [i for i in range(self.count) if i != self.me]
        reasons = await asyncio.gather(*(self._reach(i) for i in others))
        for index, reason in zip(others, reasons, strict=True):
            seen = index in self._seen  # (not logged while the workers first start)
            if reason is None:
                self._seen.add(index)
                if self.down.pop(index, None) is not None and seen:
                    log.warning("worker %d (port %d) is back", index, self.port(index))
            else:
                if index not in self.down and seen:
                    log.warning("worker %d (port %d) is down: %s", index, self.port(index),
                                reason)
                self.down[index] = reason

    async def _reach(self, index: int) -> str | None:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(
                local_address(self.host), self.port(index)), CONNECT_TIMEOUT_S)
        except TimeoutError:
            return f"no connection within {CONNECT_TIMEOUT_S:g}s"
        except OSError as exc:
            return f"{type(exc).__name__}: {exc.strerror or exc}"
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None

    def start(self) -> None:
        """Check the peers in the background until :meth:`stop`."""
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(CHECK_EVERY_S)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def view(self) -> dict[str, Any]:
        """``/health``'s ``workers``: this worker's index, the count, each one's state."""
        return {"index": self.me, "count": self.count,
                "down": [{"index": i, "url": self.url(i), "error": why}
                         for i, why in sorted(self.down.items())]}

"""The journal writer: append frames, make them durable before the client is answered.

Writes are batched: while one ``fsync`` runs, the frames of other sessions queue for the
next one (group commit). A write or ``fsync`` that fails (disk full, quota, EIO) cuts the
file back to its last good frame and stops the journal for good: every later turn,
session creation and deletion is refused with 503 ``journal_unavailable`` (and ``/health``
says ``degraded``) rather than answered and lost. The file is compacted while the gateway
runs, on the writer thread (appends wait meanwhile), once the frames of deleted sessions
outweigh the live ones: disk grows with live data, not with history.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tito.server.api_state import ApiState
from tito.server.journal.frames import FILE, MAGIC, frame, turn_frame
from tito.server.journal.replay import Replayed
from tito.session import Session
from tito.session.turns import TurnCommit
from tito.types.errors import ConfigError, Unavailable

log = logging.getLogger("tito.journal")

COMPACT_MIN_BYTES = 64 << 20
"""The running file is compacted once the frames of deleted sessions exceed both this and
the live sessions' frames."""
Entry = tuple[str, str, int, str]
"""A queued frame: (session id, op, size, a deletion's reason)."""


class Journal:
    """Append frames; :meth:`write` returns once they are on disk (batched fsync)."""

    def __init__(self, directory: str | os.PathLike[str],
                 header: dict[str, Any] | None = None) -> None:
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--journal {str(self.dir)!r}: {exc}") from exc
        self.path = self.dir / FILE
        self.header = header or {"op": "header", "format": 2}
        """What this gateway writes in the header and checks an existing one against."""
        self.compact_min_bytes = COMPACT_MIN_BYTES
        self.failed: str | None = None
        """Why the journal stopped writing (None: it writes)."""
        self.syncs = self.frames_written = self.compactions = 0
        self.size = self.live_bytes = self.gone_bytes = 0
        self.report: Any = None
        """The last start's :class:`tito.server.journal.replay.Report`."""
        self._fd: int | None = None
        self._lock: int | None = None
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tito-journal")
        self._pending: list[bytes] = []
        self._entries: list[Entry] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._seqs: dict[str, int] = {}
        self._index: dict[str, list[tuple[int, int]]] = {}  # the writer thread's
        self._gone: OrderedDict[str, str] = OrderedDict()  # the writer thread's
        self.max_gone = 100_000

    def load(self, new_session: Callable[[str], Session], *,
             max_gone: int = 100_000) -> Replayed:
        """Replay the file (recovering past damage), check its header, and compact it when
        it holds damage, an older format or mostly deleted sessions."""
        from tito.server.journal.lock import take
        from tito.server.journal.startup import load

        self.max_gone = max_gone
        self._lock = take(self.dir)
        try:
            state = load(self, new_session)
        except BaseException:
            self.close()
            raise
        self._seqs = dict(state.seqs)
        for sid in state.gone:
            self._seqs.pop(sid, None)
        return state

    def adopt(self, fd: int, size: int, index: dict[str, list[tuple[int, int]]],
              gone: OrderedDict[str, str]) -> None:
        """Append to ``fd`` (the file is ``size`` bytes, its live frames ``index``)."""
        self._fd, self.size, self._index, self._gone = fd, size, index, gone
        self.live_bytes = sum(s for frames in index.values() for _, s in frames)
        self.gone_bytes = size - self.live_bytes

    # -- writing -------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Unavailable (503 ``journal_unavailable``) once a write has failed."""
        if self.failed is not None:
            raise Unavailable(
                f"the journal ({self.path}) can no longer write ({self.failed}); this gateway "
                "cannot keep new turns, sessions or deletions until it is restarted with "
                "room to write. Every turn answered so far is kept", code="journal_unavailable")

    async def write(self, data: bytes, entry: Entry) -> None:
        """Append ``data`` and wait until it is durable."""
        await asyncio.shield(self.enqueue(data, entry))  # a cancelled caller does not undo it

    def enqueue(self, data: bytes, entry: Entry) -> asyncio.Future[None]:
        """Queue ``data`` for the next batch; the future is done once it is durable."""
        self.check_writable()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(data)
        self._entries.append(entry)
        self._waiters.append(future)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, entries, waiters = b"".join(self._pending), self._entries, self._waiters
            self._pending, self._entries, self._waiters = [], [], []
            try:
                self.check_writable()
                await loop.run_in_executor(self._io, self._append, batch, entries)
            except Exception as exc:
                error = exc if isinstance(exc, Unavailable) else self._fail(exc)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(error)
                continue
            self.syncs += 1
            self.frames_written += len(waiters)
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _fail(self, exc: Exception) -> Unavailable:
        self.failed = f"{type(exc).__name__}: {exc}"
        log.error("journal %s: a write failed (%s); refusing turns, new sessions and "
                  "deletions from now on (503 journal_unavailable)", self.path, self.failed)
        try:
            self.check_writable()
        except Unavailable as error:
            return error
        raise AssertionError("unreachable")

    def _append(self, data: bytes, entries: list[Entry]) -> None:
        """Write a batch, fsync it, index its frames (the writer thread). A failure cuts the
        file back to its last good frame (when the system still lets us)."""
        assert self._fd is not None, "Journal.load() opens the file"
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, self.size)
                os.fsync(self._fd)
            except OSError:
                log.exception("journal %s: cutting back a failed write failed", self.path)
            raise
        self._index_batch(entries)
        if self.size - self.live_bytes > max(self.live_bytes, self.compact_min_bytes) \
                + self.gone_bytes:
            self._compact()

    def _compact(self) -> None:
        """Compact now (the writer thread); a failure leaves the file as it was (the
        batch is durable) and waits for twice as much garbage before trying again."""
        from tito.server.journal.compact import compact

        try:
            compact(self)
        except OSError:
            log.exception("journal %s: compaction failed; the file stays as it is", self.path)
            self.compact_min_bytes = 2 * max(self.compact_min_bytes, self.size)
            (self.dir / (FILE + ".compact")).unlink(missing_ok=True)

    def _index_batch(self, entries: list[Entry]) -> None:
        for sid, op, size, reason in entries:
            if op == "delete":
                self.live_bytes -= sum(s for _, s in self._index.pop(sid, ()))
                self._gone[sid] = reason
                while len(self._gone) > self.max_gone:
                    self._gone.popitem(last=False)
            else:
                self._index.setdefault(sid, []).append((self.size, size))
                self.live_bytes += size
            self.size += size

    # -- what the gateway journals -------------------------------------------------------
    async def created(self, session: Session) -> None:
        sid = session.session_id
        header: dict[str, Any] = {"op": "create", "sid": sid, "ts": session.created_at}
        options = ApiState.of(session).options
        if options is not None:  # POST /sessions's body: the turns' sampling defaults
            header["options"] = options.to_json()
        data = frame(header, seq=0)
        self._seqs[sid] = 1
        await self.write(data, (sid, "create", len(data), ""))

    async def turn(self, session_id: str, turn: TurnCommit) -> None:
        seq = self._seqs.get(session_id, 1)
        data = turn_frame(session_id, turn, seq)
        self._seqs[session_id] = seq + 1
        await self.write(data, (session_id, "turn", len(data), ""))

    async def session_event(self, session_id: str, header: dict[str, Any]) -> None:
        """A session's frame besides its turns (``finish``, ``export``), numbered as its
        turns are."""
        seq = self._seqs.get(session_id, 1)
        data = frame({**header, "sid": session_id}, seq=seq)
        self._seqs[session_id] = seq + 1
        await self.write(data, (session_id, str(header["op"]), len(data), ""))

    def deleted(self, session_id: str, reason: str) -> asyncio.Future[None] | None:
        """Journal a deletion or expiry (None: the journal has failed; the session is gone
        from memory only)."""
        self._seqs.pop(session_id, None)
        if self.failed is not None:
            return None
        data = delete_frame(session_id, reason)
        future = self.enqueue(data, (session_id, "delete", len(data), reason))
        future.add_done_callback(_retrieved)
        return future

    def close(self) -> None:
        self._io.shutdown(wait=True)
        for fd in (self._fd, self._lock):
            if fd is not None:
                os.close(fd)
        self._fd = self._lock = None

    def file_start(self) -> bytes:
        """The start of a new file: the magic and the header frame."""
        return MAGIC + frame(self.header)


def delete_frame(session_id: str, reason: str) -> bytes:
    return frame({"op": "delete", "sid": session_id, "reason": reason})


def _retrieved(future: asyncio.Future[None]) -> None:
    """An expiry's write is awaited by nobody: its failure is logged by the writer."""
    if not future.cancelled():
        future.exception()


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

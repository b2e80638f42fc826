"""Crash-safe sessions: a write-ahead journal of every session change (``--journal DIR``).

Every session creation, committed turn and deletion is appended to ``DIR/journal.bin``
and made durable (``fsync``) before the client is answered: a session id the client
received, and a turn whose reply it received, survive ``kill -9``. Writes are batched:
while one ``fsync`` runs, the frames of other sessions queue for the next one (group
commit), so N concurrent turns cost about one ``fsync`` each batch, not N.

On start the journal is replayed: every session that was not deleted comes back with the
same id, messages, records and token ids (so the same samples); deleted ones come back as
tombstones (410). The file is then compacted: rewritten with the frames of the live
sessions only, atomically (write to a new file, fsync, rename).

Frame: ``u32 length | u32 crc32 | payload``; payload: an orjson header line, then the raw
arrays it names (int32 ids, float32 or float64 logprobs). A turn of an agent context other
than the session's main one names it (``context``: its id and identity, design §5.5); a
turn without it (every turn of an older journal) replays into the main context. A torn or
corrupt frame at the end (a crash mid-write) ends the replay there; one in the middle is an
error naming its offset.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tito.session import Session
from tito.session.agents import MAIN, ContextInfo
from tito.session.turns import TurnCommit
from tito.types.errors import ConfigError
from tito.types.records import IDS_DTYPE, LOGPROB_DTYPE, TurnRecord

log = logging.getLogger("tito.journal")

FILE = "journal.bin"
_HEAD = struct.Struct("<II")
_ARRAYS = (("bridge_ids", IDS_DTYPE), ("output_ids", IDS_DTYPE), ("logprobs", LOGPROB_DTYPE))
_ROWS = ("routed_experts", "indexer_topk")
_RECORD_FIELDS = ("turn", "drop", "finish_reason", "prompt_len", "weight_version",
                  "cached_tokens", "e2e_latency", "request_ts", "commit_ts", "request",
                  "routed_experts_start_len", "indexer_topk_start_len", "weight_spans",
                  "finish_message")


# -- frames ------------------------------------------------------------------------------
def frame(header: dict[str, Any], *arrays: np.ndarray) -> bytes:
    payload = b"".join([orjson.dumps(header), b"\n", *(a.tobytes() for a in arrays)])
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def turn_frame(session_id: str, turn: TurnCommit) -> bytes:
    rec = turn.record
    header = {"op": "turn", "sid": session_id, "keep_records": turn.keep_records,
              "keep_messages": turn.keep_messages, "appended": turn.appended,
              "message": turn.message, "tools": turn.tools, "parent": turn.parent,
              "response_id": turn.response_id,
              "record": {name: getattr(rec, name) for name in _RECORD_FIELDS},
              "lengths": [len(getattr(rec, name)) for name, _ in _ARRAYS],
              "logprobs_dtype": np.dtype(rec.logprobs.dtype).str,
              **{f"{name}_shape": None if getattr(rec, name) is None
                 else list(getattr(rec, name).shape) for name in _ROWS}}
    if turn.context is not None and turn.context.id != MAIN:  # the main context: no field
        header["context"] = turn.context.to_json()
    arrays = [np.asarray(getattr(rec, name), _dtype(rec, name, dtype))
              for name, dtype in _ARRAYS]
    arrays += [np.ascontiguousarray(getattr(rec, name), dtype="<i4") for name in _ROWS
               if getattr(rec, name) is not None]
    return frame(header, *arrays)


def _dtype(rec: TurnRecord, name: str, default: Any) -> Any:
    """The stored dtype of an array: logprobs keep theirs (float32 or float64)."""
    return rec.logprobs.dtype if name == "logprobs" else default


def read_frames(data: bytes) -> Iterator[tuple[int, dict[str, Any], memoryview, bytes]]:
    """``(offset, header, arrays, raw frame)`` per complete frame; stops at a torn tail."""
    view = memoryview(data)
    offset = 0
    while offset + _HEAD.size <= len(data):
        length, crc = _HEAD.unpack_from(data, offset)
        end = offset + _HEAD.size + length
        if end > len(data):
            break  # torn write at the end: the crash happened mid-frame
        payload = view[offset + _HEAD.size : end]
        if zlib.crc32(payload) != crc:
            if end == len(data):
                break  # the last frame was being written
            raise ConfigError(f"journal frame at byte {offset} is corrupt (crc mismatch)")
        newline = bytes(payload[: min(len(payload), 1 << 26)]).index(b"\n")
        yield offset, orjson.loads(payload[:newline]), payload[newline + 1 :], \
            bytes(view[offset:end])
        offset = end


def turn_of(header: dict[str, Any], arrays: memoryview) -> TurnCommit:
    parts: dict[str, Any] = {}
    start = 0
    for (name, dtype), n in zip(_ARRAYS, header["lengths"], strict=True):
        if name == "logprobs":
            dtype = np.dtype(header.get("logprobs_dtype", dtype))
        size = n * np.dtype(dtype).itemsize
        parts[name] = np.frombuffer(arrays[start : start + size], dtype=dtype).copy()
        start += size
    for name in _ROWS:  # replay rows, when the turn has them
        shape = header.get(f"{name}_shape") or (header.get("routed_shape")
                                                if name == "routed_experts" else None)
        if shape is not None:
            size = int(np.prod(shape)) * 4
            parts[name] = np.frombuffer(arrays[start : start + size], dtype="<i4") \
                .astype(np.int32).reshape(shape)
            start += size
    record = TurnRecord(**header["record"], **parts)
    context = header.get("context")  # absent: the main context (and older journals)
    return TurnCommit(header["keep_records"], header["keep_messages"], header["appended"],
                      header["message"], header["tools"], record, header.get("parent"),
                      header.get("response_id"),
                      None if context is None else ContextInfo.from_json(context))


# -- replay ------------------------------------------------------------------------------
@dataclass
class Replayed:
    """What a journal held: the live sessions (in creation order) and the gone ones."""

    live: dict[str, Session] = field(default_factory=dict)
    gone: dict[str, str] = field(default_factory=dict)
    frames: dict[str, list[bytes]] = field(default_factory=dict)
    turns: int = 0


def replay(data: bytes, new_session: Any) -> Replayed:
    out = Replayed()
    for _offset, header, arrays, raw in read_frames(data):
        sid, op = header["sid"], header["op"]
        if op == "create":
            session = new_session(sid)
            session.created_at = session.last_active = header["ts"]
            out.live[sid] = session
            out.frames[sid] = [raw]
        elif op == "turn" and sid in out.live:
            out.live[sid].apply(turn_of(header, arrays), None)
            out.frames[sid].append(raw)
            out.turns += 1
        elif op == "delete" and sid in out.live:
            del out.live[sid], out.frames[sid]
            out.gone[sid] = header["reason"]
    for session in out.live.values():
        session.rebuild_snapshot()
    return out


# -- the writer --------------------------------------------------------------------------
class Journal:
    """Append frames; :meth:`write` returns once they are on disk (batched fsync)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--journal {str(self.dir)!r}: {exc}") from exc
        self.path = self.dir / FILE
        self._fd: int | None = None
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tito-journal")
        self._pending: list[bytes] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.syncs = 0
        self.frames_written = 0

    def load(self, new_session: Any, *, max_gone: int = 100_000) -> Replayed:
        """Replay the file, then compact it to the live sessions' frames (and the
        ``max_gone`` latest tombstones)."""
        data = self.path.read_bytes() if self.path.exists() else b""
        state = replay(data, new_session)
        if len(state.gone) > max_gone:
            state.gone = dict(list(state.gone.items())[-max_gone:])
        kept = b"".join(raw for frames in state.frames.values() for raw in frames)
        kept += b"".join(frame({"op": "delete", "sid": sid, "reason": reason})
                         for sid, reason in state.gone.items())
        tmp = self.dir / (FILE + ".compact")
        with open(tmp, "wb") as f:
            f.write(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.dir)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        log.info("journal %s: %d live sessions, %d turns, %d gone (%d -> %d bytes)",
                 self.path, len(state.live), state.turns, len(state.gone), len(data),
                 len(kept))
        return state

    async def write(self, data: bytes) -> None:
        """Append ``data`` and wait until it is durable."""
        await asyncio.shield(self.enqueue(data))  # a cancelled caller does not undo it

    def enqueue(self, data: bytes) -> asyncio.Future[None]:
        """Queue ``data`` for the next batch; the future is done once it is durable."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(data)
        self._waiters.append(future)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, waiters = b"".join(self._pending), self._waiters
            self._pending, self._waiters = [], []
            try:
                await loop.run_in_executor(self._io, self._append, batch)
            except Exception as exc:
                log.exception("journal write failed")
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
                continue
            self.syncs += 1
            self.frames_written += len(waiters)
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _append(self, data: bytes) -> None:
        assert self._fd is not None, "Journal.load() opens the file"
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)

    async def created(self, session: Session) -> None:
        await self.write(frame({"op": "create", "sid": session.session_id,
                                "ts": session.created_at}))

    async def turn(self, session_id: str, turn: TurnCommit) -> None:
        await self.write(turn_frame(session_id, turn))

    def deleted(self, session_id: str, reason: str) -> asyncio.Future[None]:
        return self.enqueue(frame({"op": "delete", "sid": session_id, "reason": reason}))

    def close(self) -> None:
        self._io.shutdown(wait=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

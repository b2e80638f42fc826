"""Reading a journal file frame by frame, past damage: a frame whose head or payload does
not check out is skipped up to the next intact frame head (found by its sync marker), and
reported as a :class:`Damage`. The file is mapped, not read whole: a start touches each
page once, in order.

A file without the format's magic is an older journal (``u32 length | u32 crc32 |
payload`` frames, no marker): :func:`legacy_frames` reads it (up to its first bad frame).
"""

from __future__ import annotations

import mmap
import re
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tito.server.journal.frames import HEAD, MAGIC, SYNC, Frame, parse_head, sid_text, split

_LEGACY_HEAD = struct.Struct("<II")
_SID = re.compile(rb'"sid":"([0-9a-f]{32})"')


@dataclass(slots=True)
class Damage:
    """Bytes ``[start, end)`` that hold no intact frame."""

    start: int
    end: int
    reason: str
    sessions: set[str] = field(default_factory=set)
    """Sessions whose frame(s) were there, as far as can be told (an intact head names
    its session; otherwise session ids found in the damaged bytes)."""
    zeros: bool = False
    """Every damaged byte is zero (a tail zero-filled by a power loss, say)."""

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "bytes": self.end - self.start,
                "reason": self.reason, "zeros": self.zeros, "sessions": sorted(self.sessions)}


@contextmanager
def mapped(path: Path) -> Iterator[Any]:
    """The file's bytes, mapped read-only (``b""`` when it is empty or absent)."""
    if not path.exists() or path.stat().st_size == 0:
        yield b""
        return
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(buf, "madvise"):
        buf.madvise(mmap.MADV_SEQUENTIAL)
    try:
        yield buf
    finally:
        try:
            buf.close()
        except BufferError:  # a view of it is still referenced: it closes when freed
            pass


def is_legacy(buf: Any) -> bool:
    """An older journal: no magic, and its first frame checks out the old way."""
    if len(buf) == 0 or buf[: len(MAGIC)] == MAGIC:
        return False
    if len(buf) < _LEGACY_HEAD.size:
        return False
    length, crc = _LEGACY_HEAD.unpack_from(buf, 0)
    end = _LEGACY_HEAD.size + length
    return end <= len(buf) and zlib.crc32(buf[_LEGACY_HEAD.size : end]) == crc


def frames(buf: Any) -> Iterator[Frame | Damage]:
    """Every intact frame and every damaged range of a new-format file, in order."""
    offset, size = 0, len(buf)
    if size and buf[: len(MAGIC)] != MAGIC:
        end = _next_head(buf, 0)
        yield _damage(buf, 0, end, "the file does not start with the journal's magic")
        offset = end
    elif size:
        offset = len(MAGIC)
    while offset < size:
        item = _frame_at(buf, offset)
        if isinstance(item, Frame):
            yield item
            offset += item.size
            continue
        reason, sid = item
        end = _next_head(buf, offset + 1)
        damage = _damage(buf, offset, end, reason)
        if sid is not None:
            damage.sessions.add(sid)
        yield damage
        offset = end


def _frame_at(buf: Any, offset: int) -> Frame | tuple[str, str | None]:
    head = parse_head(buf, offset)
    if isinstance(head, str):
        return head, None
    length, crc, raw_sid, seq = head
    sid = sid_text(raw_sid)
    start = offset + HEAD.size
    if start + length > len(buf):
        return "a frame cut short by the end of the file", sid
    payload = memoryview(buf)[start : start + length]
    if zlib.crc32(payload) != crc:
        return "a frame whose payload checksum does not match", sid
    try:
        header, arrays = split(payload)
    except ValueError:
        return "a frame whose header does not parse", sid
    return Frame(offset, HEAD.size + length, sid, seq, header, arrays)


def _next_head(buf: Any, offset: int) -> int:
    """The offset of the next intact frame head at or after ``offset`` (the file's end
    when there is none)."""
    while True:
        found = buf.find(SYNC, offset)
        if found < 0:
            return len(buf)
        if not isinstance(parse_head(buf, found), str):
            return found
        offset = found + 1


def _damage(buf: Any, start: int, end: int, reason: str) -> Damage:
    raw = bytes(buf[start:end]) if end - start <= 1 << 26 else b""
    zeros = bool(raw) and raw.count(0) == len(raw)
    sessions = {m.group(1).decode() for m in _SID.finditer(raw)}
    return Damage(start, end, "zero bytes" if zeros else reason, sessions, zeros)


def legacy_frames(buf: Any) -> Iterator[Frame | Damage]:
    """An older journal's frames (``u32 length | u32 crc32 | payload``); its first bad
    frame ends it (a damaged length cannot be told from a good one there)."""
    offset, size = 0, len(buf)
    while offset < size:
        if size - offset < _LEGACY_HEAD.size:
            break
        length, crc = _LEGACY_HEAD.unpack_from(buf, offset)
        start, end = offset + _LEGACY_HEAD.size, offset + _LEGACY_HEAD.size + length
        if end > size or zlib.crc32(buf[start:end]) != crc:
            break
        header, arrays = split(memoryview(buf)[start:end])
        sid = header.get("sid")
        yield Frame(offset, end - offset, sid, -1, header, arrays)
        offset = end
    if offset < size:
        yield _damage(buf, offset, size, "an older journal's frame that does not check out")

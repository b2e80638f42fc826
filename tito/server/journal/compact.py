"""Compaction: rewrite the journal with the live sessions' frames and the latest
tombstones only, atomically (a new file, fsynced, renamed over the old one).

At start the frames are copied from the mapped old file; while running, on the writer
thread (appends wait), read back from the file itself. Either way the cost grows with the
live data, not with the history.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from tito.server.journal.frames import FILE

if TYPE_CHECKING:
    from tito.server.journal.writer import Journal

Index = dict[str, list[tuple[int, int]]]
Read = Callable[[str, int, int, int], bytes]
"""(session id, its frame number, offset, size) -> the frame to write."""


def rewrite(journal: Journal, read: Read, index: Index,
            gone: OrderedDict[str, str]) -> tuple[int, int, Index]:
    """Write the new file and put it in place; ``(append fd, size, new index)``."""
    from tito.server.journal.writer import delete_frame, fsync_dir

    tmp = journal.dir / (FILE + ".compact")
    new: Index = {}
    with open(tmp, "wb") as out:
        start = journal.file_start()
        out.write(start)
        size = len(start)
        for sid, frames in index.items():
            places = new[sid] = []
            for seq, (offset, length) in enumerate(frames):
                data = read(sid, seq, offset, length)
                out.write(data)
                places.append((size, len(data)))
                size += len(data)
        for sid, reason in gone.items():
            data = delete_frame(sid, reason)
            out.write(data)
            size += len(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, journal.path)
    fsync_dir(journal.dir)
    fd = os.open(journal.path, os.O_WRONLY | os.O_APPEND)
    return fd, size, new


def compact(journal: Journal) -> None:
    """Compact the running journal (on its writer thread)."""
    old = os.open(journal.path, os.O_RDONLY)
    try:
        fd, size, index = rewrite(journal, lambda _s, _n, off, n: os.pread(old, n, off),
                                  journal._index, journal._gone)
    finally:
        os.close(old)
    previous = journal._fd
    journal.adopt(fd, size, index, journal._gone)
    journal.compactions += 1
    if previous is not None:
        os.close(previous)

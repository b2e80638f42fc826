"""Crash-safe sessions: a write-ahead journal of every session change (``--journal DIR``).

Every session creation, committed turn and deletion is appended to ``DIR/journal.bin``
and made durable (``fsync``) before the client is answered. One concept per module:
:mod:`.frames` (the on-disk format: self-checking frames with a sync marker),
:mod:`.scan` (reading a file frame by frame past damage), :mod:`.replay` (frames to
sessions, damage to a report), :mod:`.header` (what the replaying gateway must match),
:mod:`.startup` (opening at start), :mod:`.writer` (group-committed appends; a failed
write stops the journal: 503 ``journal_unavailable``), :mod:`.compact` (rewriting with
the live frames only), :mod:`.check` (``tito journal check``).
"""

from tito.server.journal.frames import FILE, frame
from tito.server.journal.replay import Replayed, Report
from tito.server.journal.startup import open_journal
from tito.server.journal.writer import Journal

__all__ = ["FILE", "Journal", "Replayed", "Report", "frame", "open_journal"]

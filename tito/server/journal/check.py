"""``tito journal check DIR [--repair]``: what an operator can learn from, and do to, a
journal folder without starting a gateway. Check reads every frame (mapped, frame by
frame) and reports intact frames, damaged ranges and the sessions they cost; repair
rewrites the file as a start would (the intact frames of the sessions that lost none,
tombstones for the others; the damaged file kept as ``journal.bin.damaged``), refused
while a gateway holds the journal (a check is not: it only reads).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path

from tito.server.journal.compact import rewrite
from tito.server.journal.frames import FILE
from tito.server.journal.lock import hold
from tito.server.journal.replay import Report, replay
from tito.server.journal.scan import is_legacy, mapped
from tito.server.journal.startup import _keep_damaged, _reader, items


def journal_files(root: Path) -> list[Path]:
    """The journal folders under ``root``: itself, or its ``worker-i`` folders."""
    folders = [root] if (root / FILE).exists() else []
    folders += sorted(p for p in root.glob("worker-*") if (p / FILE).exists())
    return folders


def check(folder: Path, *, repair: bool = False) -> Report:
    """The report of ``folder``'s journal; ``repair``: rewrite it without the damage."""
    from tito.server.journal.writer import Journal

    path = folder / FILE
    with hold(folder) if repair else nullcontext(), mapped(path) as buf:
        legacy = is_legacy(buf)
        state = replay(items(buf, legacy), None)
        report = state.report
        report.path, report.size, report.legacy = str(path), len(buf), legacy
        if repair and not report.clean:
            journal = Journal(folder, report.header)
            try:
                _keep_damaged(path)
                fd, _size, _index = rewrite(journal, _reader(buf, legacy), state.index,
                                            state.gone)
                os.close(fd)
            finally:
                journal.close()
    return report


def describe(report: Report) -> list[str]:
    """The report in lines for a terminal."""
    header = report.header or {}
    lines = [f"{report.path}: {report.size} bytes, {report.frames} intact frames, "
             f"{report.turns} turns" + (" (an older format)" if report.legacy else "")]
    if header:
        lines.append("  header: " + ", ".join(
            f"{k}={header.get(k)}" for k in ("session_version", "family", "template",
                                              "tokenizer", "workers", "worker")))
    elif report.size:
        lines.append("  header: lost (the configuration cannot be checked)")
    for damage in report.damage:
        lines.append(f"  DAMAGED bytes {damage.start}-{damage.end} ({damage.reason}); "
                     f"sessions: {', '.join(sorted(damage.sessions)) or 'none known'}")
    for sid, why in report.affected.items():
        lines.append(f"  session {sid} comes back as gone (410): {why}")
    if report.tail is not None:
        lines.append(f"  torn tail: bytes {report.tail.start}-{report.tail.end} "
                     f"({report.tail.reason}); a write that never finished, no session lost")
    lines.append("  clean" if report.clean else "  needs repair (a start repairs it too)")
    return lines

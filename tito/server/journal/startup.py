"""Opening a journal at start: check the folder layout and the header, replay the file
(mapped, frame by frame), report any damage, and compact when the file holds damage, an
older format or mostly deleted sessions. A damaged file is kept as ``journal.bin.damaged``
(one generation) and the report written to ``recovery.json``."""

from __future__ import annotations

import itertools
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tito.config import ServerConfig
from tito.render.base import TemplateRenderer
from tito.server.journal import header as headers
from tito.server.journal.compact import rewrite
from tito.server.journal.frames import FILE, Frame, reframe
from tito.server.journal.replay import Replayed, replay
from tito.server.journal.scan import Damage, frames, is_legacy, legacy_frames, mapped
from tito.session import Session
from tito.types.errors import ConfigError

if TYPE_CHECKING:
    from tito.server.journal.writer import Journal

log = logging.getLogger("tito.journal")
DAMAGED = FILE + ".damaged"
REPORT = "recovery.json"


def open_journal(config: ServerConfig, renderer: TemplateRenderer) -> Journal:
    """The journal of this gateway (``DIR`` or ``DIR/worker-i``), its layout checked."""
    from tito.server.journal.writer import Journal

    assert config.journal is not None
    root = Path(config.journal)
    if root.is_dir():
        headers.check_layout(root, config.workers)
    folder = root if config.workers == 1 else root / f"worker-{config.worker_index}"
    return Journal(folder, headers.expected(config, renderer))


def items(buf: Any, legacy: bool) -> Iterator[Frame | Damage]:
    return legacy_frames(buf) if legacy else frames(buf)


def load(journal: Journal, new_session: Callable[[str], Session]) -> Replayed:
    with mapped(journal.path) as buf:
        legacy = is_legacy(buf)
        stream = items(buf, legacy)
        first = next(stream, None)
        if isinstance(first, Frame) and first.header.get("op") == "header":
            headers.check(first.header, journal.header, journal.path)
        state = replay(itertools.chain([] if first is None else [first], stream),
                       new_session)
        report = state.report
        report.path, report.size, report.legacy = str(journal.path), len(buf), legacy
        journal.report = report
        _tell(journal, state)
        gone = OrderedDict(itertools.islice(
            state.gone.items(), max(0, len(state.gone) - journal.max_gone), None))
        live = sum(s for places in state.index.values() for _, s in places)
        if report.clean and report.header is not None and \
                len(buf) - live <= max(live, journal.compact_min_bytes):
            fd = os.open(journal.path, os.O_WRONLY | os.O_APPEND)
            journal.adopt(fd, len(buf), state.index, gone)
            return state
        if not report.clean and len(buf):
            _keep_damaged(journal.path)
        read = _reader(buf, legacy)
        try:
            fd, size, index = rewrite(journal, read, state.index, gone)
        except OSError as exc:
            raise ConfigError(f"--journal {str(journal.dir)!r}: could not rewrite the "
                              f"journal ({exc}); free some room and start again") from exc
    journal.adopt(fd, size, index, gone)
    log.info("journal %s: %d live sessions, %d turns, %d gone (%d -> %d bytes)",
             journal.path, len(state.live), report.turns, len(gone), report.size, size)
    return state


def _reader(buf: Any, legacy: bool) -> Callable[[str, int, int, int], bytes]:
    if legacy:
        return lambda sid, seq, off, n: reframe(bytes(buf[off + 8 : off + n]), sid, seq)
    return lambda _sid, _seq, off, n: bytes(buf[off : off + n])


def _keep_damaged(path: Path) -> None:
    """Keep the damaged file beside the new one (a hard link: no copy, no gap)."""
    damaged = path.with_name(DAMAGED)
    damaged.unlink(missing_ok=True)
    try:
        os.link(path, damaged)
    except OSError:
        log.warning("journal %s: could not keep the damaged file as %s", path, damaged)


def _tell(journal: Journal, state: Replayed) -> None:
    """Log what the replay found; write ``recovery.json`` when it was not clean."""
    report = state.report
    if report.legacy:
        log.warning("journal %s: an older journal format; rewritten in the new one (its "
                    "configuration could not be checked)", journal.path)
    elif report.header is None and report.size:
        log.warning("journal %s: its header is lost; the configuration could not be "
                    "checked", journal.path)
    if report.tail is not None and report.legacy:
        log.error("journal %s: an older journal, unreadable past byte %d (%s): the older "
                  "format cannot be resynchronised; what follows is dropped", journal.path,
                  report.tail.start, report.tail.reason)
    elif report.tail is not None:
        log.warning("journal %s: dropped %d bytes at the end (%s): a write that never "
                    "finished", journal.path, report.tail.end - report.tail.start,
                    report.tail.reason)
    for damage in report.damage:
        log.error("journal %s: skipped bytes %d-%d (%s); sessions affected: %s",
                  journal.path, damage.start, damage.end, damage.reason,
                  ", ".join(sorted(damage.sessions)) or "none known")
    for sid, why in report.affected.items():
        log.error("journal %s: session %s comes back as gone (410): %s", journal.path,
                  sid, why)
    if not report.clean:
        (journal.dir / REPORT).write_bytes(orjson.dumps(report.to_json(),
                                                        option=orjson.OPT_INDENT_2))
    if report.damage:
        log.error("journal %s: %d damaged range(s) skipped, %d session(s) affected; the "
                  "damaged file is kept as %s", journal.path, len(report.damage),
                  len(report.affected), DAMAGED)

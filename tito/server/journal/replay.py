"""Replaying a journal: frames become sessions, damage becomes a report.

A damaged range is skipped and every later intact frame is kept. A session that lost a
frame (the damage named it, or its frame numbers show a gap, or its creation is missing)
cannot be trusted to continue — its next turn would be rendered on a trajectory without
the lost turn — so it comes back as a tombstone whose reason says so (410). Damage at the
end of the file is a write that never finished (no client was answered for it): it is
dropped and affects no session. Sessions come back with their idle TTL counting from the
restart; Responses ids of v1 sessions are remembered again (``previous_response_id``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tito.server.api_state import ApiState
from tito.server.finish import restore_export, restore_finish
from tito.server.journal.frames import Frame, turn_of
from tito.server.journal.scan import Damage
from tito.server.session_options import SessionOptions
from tito.session import Session
from tito.session.agents import MAIN
from tito.session.turns import TurnCommit

SESSION_OPS = ("create", "turn", "finish", "export")
"""A session's numbered frames (its creation 0, then its turns and lifecycle events)."""
EVENTS: dict[str, Callable[[Session, dict[str, Any]], None]] = {
    "finish": restore_finish, "export": restore_export}
"""A session's frames besides its creation and turns: applied where they are in the
journal (a finish seals the snapshot of the turns replayed before it)."""


@dataclass
class Report:
    """What a replay found: intact frames, damaged ranges, the sessions they cost."""

    path: str = ""
    size: int = 0
    frames: int = 0
    turns: int = 0
    legacy: bool = False
    header: dict[str, Any] | None = None
    damage: list[Damage] = field(default_factory=list)
    affected: dict[str, str] = field(default_factory=dict)
    """Session id -> why it came back as a tombstone."""
    tail: Damage | None = None
    """Damage at the end of the file (an unfinished write), not counted as a loss."""

    @property
    def clean(self) -> bool:
        return not self.damage and self.tail is None and not self.legacy

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.size, "frames": self.frames,
                "turns": self.turns, "legacy": self.legacy, "header": self.header,
                "damage": [d.to_json() for d in self.damage],
                "torn_tail": None if self.tail is None else self.tail.to_json(),
                "affected_sessions": self.affected}


@dataclass
class Replayed:
    """The live sessions (in creation order), the gone ones, where each live session's
    frames are (offset, size), each one's next frame number, and the report."""

    live: dict[str, Session] = field(default_factory=dict)
    gone: OrderedDict[str, str] = field(default_factory=OrderedDict)
    index: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    seqs: dict[str, int] = field(default_factory=dict)
    report: Report = field(default_factory=Report)


def replay(items: Iterable[Frame | Damage], new_session: Callable[[str], Session] | None,
           *, now: float | None = None) -> Replayed:
    """Apply ``items`` (``new_session`` None: check only, build no session)."""
    out = Replayed()
    pending: list[Damage] = []  # damage not yet followed by an intact frame
    for item in items:
        if isinstance(item, Damage):
            pending.append(item)
            continue
        for damage in pending:  # an intact frame follows: it was mid-file damage
            _lost(out, damage)
        pending = []
        out.report.frames += 1
        _apply(out, item, new_session)
    if pending:
        out.report.tail = Damage(pending[0].start, pending[-1].end,
                                 "; ".join(sorted({d.reason for d in pending})),
                                 set().union(*(d.sessions for d in pending)),
                                 all(d.zeros for d in pending))
    now = time.time() if now is None else now
    for session in out.live.values():
        session.rebuild_snapshot()
        session.last_active = now  # the idle TTL counts from the restart
    return out


def _lost(out: Replayed, damage: Damage) -> None:
    out.report.damage.append(damage)
    for sid in damage.sessions:
        _drop(out, sid, f"frame(s) lost to journal damage at byte {damage.start}")


def _drop(out: Replayed, sid: str, why: str) -> None:
    """Tombstone a session that lost frames (410, the reason naming the damage)."""
    if sid in out.report.affected or sid in out.gone:
        return
    out.live.pop(sid, None)
    out.index.pop(sid, None)
    out.report.affected[sid] = why
    out.gone[sid] = f"damaged in the journal ({why}); see `tito journal check`"


def _apply(out: Replayed, item: Frame, new_session: Callable[[str], Session] | None) -> None:
    header = item.header
    op, sid = header.get("op"), header.get("sid") or item.sid
    if op == "header":
        out.report.header = header
    elif sid is None or sid in out.report.affected:
        return
    elif op == "delete":
        out.live.pop(sid, None)
        out.index.pop(sid, None)
        out.gone[sid] = header["reason"]
        out.gone.move_to_end(sid)
    elif op in SESSION_OPS:
        expected = out.seqs.get(sid, 0)
        if item.seq >= 0 and item.seq != expected:
            _drop(out, sid, f"frame {expected} of the session is missing (found {item.seq})")
        elif op == "create" or sid in out.index:
            if _session_frame(out, item, sid, new_session):
                out.index[sid].append((item.offset, item.size))
                out.seqs[sid] = expected + 1
        else:
            _drop(out, sid, "its creation frame is missing")


def _session_frame(out: Replayed, item: Frame, sid: str,
                   new_session: Callable[[str], Session] | None) -> bool:
    """Apply a session's creation or turn; False when the turn does not apply."""
    if item.header["op"] == "create":
        if new_session is not None:
            session = new_session(sid)
            session.created_at = session.last_active = item.header["ts"]
            options = item.header.get("options")
            if options is not None:
                ApiState.of(session).options = SessionOptions.from_json(options)
            out.live[sid] = session
        out.index[sid] = []
        return True
    if item.header["op"] != "turn":  # a finish or an export: no turn
        if new_session is not None:
            EVENTS[item.header["op"]](out.live[sid], item.header)
        return True
    if new_session is not None:
        try:
            _turn(out.live[sid], turn_of(item.header, item.arrays))
        except Exception as exc:  # an intact frame that does not apply
            _drop(out, sid, f"its frame {item.seq} at byte {item.offset} does not apply "
                            f"({type(exc).__name__}: {exc})")
            return False
    out.report.turns += 1
    return True


def _turn(session: Session, turn: TurnCommit) -> None:
    session.apply(turn, None)
    rid = turn.response_id
    if rid is None or session.response_messages(rid) is not None:
        return  # a v2 tree keeps each response's messages in its nodes
    context = MAIN if turn.context is None else turn.context.id
    try:
        messages = list(session.agent_context(context).messages)
    except Exception:
        return
    ApiState.of(session).restored_responses[rid] = messages

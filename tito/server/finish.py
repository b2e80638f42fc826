"""The collect lifecycle of the reference framework's newer session contract (design §6.4):
``POST /sessions/<id>/finish`` closes admission, waits for the turns already admitted,
seals a snapshot of what is committed and names it; ``POST /sessions/<id>/samples`` with
that ``snapshot_id`` exports it (the first export is kept: a retry must repeat its
parameters and gets the same bytes); ``DELETE`` frees the session.

The older lifecycle (``POST /samples`` without a snapshot, then ``DELETE``) stays: it
collects what is committed at that moment, as before. Snapshots live in memory with their
session; with ``--journal`` the seal and the first export's parameters and digest are
journaled (:mod:`tito.server.journal.frames`), so after a restart the snapshot is rebuilt
from the replayed turns at the point it was sealed and a repeated export answers the same
bytes (checked against the digest).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from xxhash import xxh3_128_hexdigest

from tito.server.api_state import ApiState
from tito.server.http import decode_json
from tito.session import Session
from tito.session.collect import Collection
from tito.types.errors import BadRequest, Conflict, NotFound

if TYPE_CHECKING:
    from tito.server.gateway import Gateway

MAX_FINISH_TIMEOUT = 90.0
"""Longest wait for admitted turns a finish may ask for (seconds, as the reference)."""
DEFAULT_FINISH_TIMEOUT = 60.0
WAIT_STEP = 0.01
"""Seconds between two looks at the session's running turns while a finish waits."""


@dataclass(frozen=True, slots=True)
class FinishQuery:
    producer_finished: bool = True
    """False: the agent did not finish its work (the snapshot is incomplete)."""
    timeout: float = DEFAULT_FINISH_TIMEOUT


@dataclass(slots=True)
class Snapshot:
    """A sealed snapshot: what the session had committed when its admitted turns ended
    (or the wait timed out)."""

    snapshot_id: str
    complete: bool
    unfinished: int
    """Turns still running when the wait timed out (they are not in the snapshot)."""
    collection: Collection
    reply: dict[str, Any]
    export: tuple[tuple[Any, ...], bytes] | None = None
    """The first successful export: its parameters and its bytes."""
    instance_id: str | None = None
    """The gateway instance that sealed it (its samples' metadata names it, also when a
    restarted gateway exports it)."""
    journaled: tuple[bytes, str] | None = None
    """The first export's parameters (JSON, its metadata's keys in the order they came)
    and the digest of its bytes, as the journal keeps them: after a restart the bytes are
    rebuilt with those very parameters and checked."""


@dataclass(slots=True)
class FinishState:
    """A session's finish: the query it was asked with and the sealing of its snapshot
    (a task: a client that leaves while it waits does not stop it; a journal replay
    gives the sealed snapshot itself)."""

    query: FinishQuery
    sealed: asyncio.Future[Snapshot] | None = None
    restored: Snapshot | None = None

    def snapshot(self) -> Snapshot | None:
        """The sealed snapshot (None while the finish still waits, or if sealing failed)."""
        if self.restored is not None:
            return self.restored
        sealed = self.sealed
        if sealed is None or not sealed.done() or sealed.cancelled() \
                or sealed.exception() is not None:
            return None
        return sealed.result()


def finish_query(raw: bytes) -> FinishQuery:
    """The finish body (empty: the defaults); a bad one is a 400."""
    data = decode_json(raw, allow_empty=True)
    if not isinstance(data, dict):
        raise BadRequest("finish body must be a JSON object")
    unknown = set(data) - {"producer_finished", "timeout"}
    if unknown:
        raise BadRequest(f"unknown finish field(s): {sorted(unknown)}")
    finished = data.get("producer_finished", True)
    if not isinstance(finished, bool):
        raise BadRequest("producer_finished must be true or false")
    timeout = data.get("timeout", DEFAULT_FINISH_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 <= timeout <= MAX_FINISH_TIMEOUT:
        raise BadRequest(f"timeout must be a number of seconds from 0 to "
                         f"{MAX_FINISH_TIMEOUT:g}")
    return FinishQuery(finished, float(timeout))


async def finish(gateway: Gateway, session: Session, query: FinishQuery) -> dict[str, Any]:
    """Finish ``session`` (idempotent: the same query gets the same reply; another query
    is 409 ``finish_conflict``). New turns are refused from the first call on."""
    state = finish_state(session)
    if state is not None:
        if state.query != query:
            raise Conflict(f"the session was finished with {_show(state.query)}; a repeated "
                           f"finish must ask the same (got {_show(query)})",
                           code="finish_conflict")
    else:
        state = FinishState(query, asyncio.ensure_future(_seal(gateway, session, query)))
        ApiState.of(session).finish = state
    if state.restored is not None:
        return state.restored.reply
    assert state.sealed is not None
    return (await asyncio.shield(state.sealed)).reply


async def _seal(gateway: Gateway, session: Session, query: FinishQuery) -> Snapshot:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + query.timeout
    while session.in_flight and loop.time() < deadline:
        await asyncio.sleep(WAIT_STEP)
    unfinished = _running(session)
    complete = query.producer_finished and unfinished == 0
    snapshot_id = "snap_" + os.urandom(12).hex()
    reply = {"session_id": session.session_id, "snapshot_id": snapshot_id,
             "complete": complete, "producer_finished": query.producer_finished,
             "unfinished_requests": unfinished, "failed_requests": 0,
             "num_turns": len(session.records)}
    snapshot = Snapshot(snapshot_id, complete, unfinished, session.collection(), reply,
                        instance_id=gateway.instance_id)
    if gateway.journal is not None:  # after the collection: replay rebuilds it there
        await gateway.journal.session_event(session.session_id, {
            "op": "finish", "query": [query.producer_finished, query.timeout],
            "reply": reply, "instance_id": gateway.instance_id})
    gateway.metrics.inc("sessions_finished_total")
    return snapshot


def restore_finish(session: Session, header: dict[str, Any]) -> None:
    """A journal replay's ``finish`` frame: the snapshot sealed from what the session had
    committed at that point of the journal (the turns replayed so far)."""
    finished, timeout = header["query"]
    reply = dict(header["reply"])
    session.rebuild_snapshot()  # a replay rebuilds the ids once at its end: here too
    snapshot = Snapshot(str(reply["snapshot_id"]), bool(reply["complete"]),
                        int(reply.get("unfinished_requests", 0)), session.collection(), reply,
                        instance_id=header.get("instance_id"))
    ApiState.of(session).finish = FinishState(FinishQuery(bool(finished), float(timeout)),
                                              restored=snapshot)


def restore_export(session: Session, header: dict[str, Any]) -> None:
    """A journal replay's ``export`` frame: the first export's parameters and digest."""
    state = finish_state(session)
    snapshot = None if state is None else state.snapshot()
    if snapshot is not None:
        snapshot.journaled = (str(header["params"]).encode(), str(header["digest"]))


def params_json(params: tuple[Any, ...]) -> bytes:
    """An export's parameters as the journal keeps them."""
    return orjson.dumps(list(params))


def journaled_params(snapshot: Snapshot) -> tuple[Any, ...] | None:
    """The parameters of the export the journal kept (None: none was)."""
    if snapshot.journaled is None:
        return None
    return tuple(orjson.loads(snapshot.journaled[0]))


def export_digest(payload: bytes) -> str:
    return xxh3_128_hexdigest(payload)


def check_rebuilt(snapshot: Snapshot, params: tuple[Any, ...], payload: bytes) -> None:
    """An export rebuilt after a restart must be the bytes the first one was (else 409
    ``snapshot_changed``: the gateway now collects differently, e.g. another
    ``--sample-postprocessor``)."""
    if snapshot.journaled is None or journaled_params(snapshot) != params:
        return
    if snapshot.journaled[1] != export_digest(payload):
        raise Conflict(f"snapshot {snapshot.snapshot_id} exports other bytes than before "
                          "the restart (the gateway's collection settings changed: "
                          "--sample-postprocessor, --sample-picker, replay flags); restart "
                          "it as it was to export the same samples",
                          code="snapshot_changed")


def _running(session: Session) -> int:
    return max(len(ApiState.of(session).replies.running), int(session.in_flight))


def finish_state(session: Session) -> FinishState | None:
    return ApiState.of(session).finish


def check_admission(session: Session) -> None:
    """A turn on a finished session is 409 ``session_finished`` (admission is closed)."""
    if finish_state(session) is not None:
        raise Conflict(f"session {session.session_id} is finished: it takes no new turns "
                       "(collect its snapshot, then delete it)", code="session_finished")


def snapshot_of(session: Session, snapshot_id: str) -> Snapshot:
    """The sealed snapshot ``snapshot_id`` of ``session`` (404 ``unknown_snapshot``; 409
    ``snapshot_not_sealed`` while its finish still waits)."""
    state = finish_state(session)
    snapshot = None if state is None else state.snapshot()
    if snapshot is None:
        if state is not None and state.sealed is not None and not state.sealed.done():
            raise Conflict("the session's finish is still waiting for its turns; collect "
                           "once it has answered", code="snapshot_not_sealed")
        raise NotFound(f"session {session.session_id} has no snapshot {snapshot_id!r} "
                       "(POST /sessions/<id>/finish makes one)", code="unknown_snapshot")
    if snapshot.snapshot_id != snapshot_id:
        raise NotFound(f"session {session.session_id} has no snapshot {snapshot_id!r} "
                       f"(its snapshot is {snapshot.snapshot_id!r})", code="unknown_snapshot")
    return snapshot


def cached_export(snapshot: Snapshot, params: tuple[Any, ...]) -> bytes | None:
    """The snapshot's first export when ``params`` repeat its parameters; None when it has
    none yet; 409 ``export_conflict`` for other parameters."""
    if snapshot.export is None:
        first_params = journaled_params(snapshot)
        if first_params is not None and first_params != params:
            raise Conflict("this snapshot was exported with other parameters (max_seq_len, "
                           "metadata, include_response); a retry must repeat them",
                           code="export_conflict")
        return None
    first, payload = snapshot.export
    if first != params:
        raise Conflict("this snapshot was exported with other parameters (max_seq_len, "
                       "metadata, include_response); a retry must repeat them",
                       code="export_conflict")
    return payload


def _show(query: FinishQuery) -> str:
    return (f"producer_finished={str(query.producer_finished).lower()}, "
            f"timeout={query.timeout:g}")

"""v1 linear sessions (design §5.1).

A request must extend the stored messages at the tail. A retry of the latest turn rolls
back one generated checkpoint (to the empty session when the first turn is retried);
deeper divergence is 400 ``rollback_too_deep``. Client-supplied assistant messages are
history, never checkpoints. A turn after a reply cut by ``finish_reason=length`` is
accepted and its sample holds every turn, unless ``--after-length-cut refuse`` (409
``truncated_generation``, as v2).

A turn is two steps around the engine call: :meth:`LinearSession.plan` validates the
request and computes the prompt ids without touching the trajectory (only the
``in_flight`` guard is set), and :meth:`LinearSession.commit` applies the rollback, if
any, and stores the generation. A failed engine call ends with :meth:`release`, which
leaves the session exactly as it was.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import numpy as np

from tito.render.base import TemplateRenderer
from tito.session.base import SessionBase, StoredBytes
from tito.session.collect import LinearCollection
from tito.session.idbuffer import IdBuffer
from tito.session.matchers import Matcher, differing_fields
from tito.session.options import keep_options, options_change
from tito.session.turns import (
    TurnCommit,
    TurnPlan,
    check_after_cut,
    divergence,
    extend_in_place,
    extended_snapshot,
    extension,
    first_turn,
    match_len,
    tolerated_counts,
)
from tito.types.errors import BadRequest, Conflict
from tito.types.messages import Message, TurnRequest
from tito.types.records import TurnRecord, snapshot_ids

__all__ = ["LinearSession", "TurnCommit", "TurnPlan"]


class LinearSession(SessionBase):
    """The state of one v1 trajectory."""

    version: ClassVar[str] = "v1"

    def __init__(self, session_id: str, renderer: TemplateRenderer, matcher: Matcher,
                 *, max_rollback: int = 1, api_state: object = None,
                 after_length_cut: str = "keep") -> None:
        super().__init__(session_id, renderer, matcher, api_state,
                         after_length_cut=after_length_cut)
        self.max_rollback = max_rollback
        self.messages: list[Message] = []
        self.records: list[TurnRecord] = []
        self.checkpoint_ends: list[int] = []
        self.snapshot = IdBuffer()
        self._shared_ids = renderer.max_trailing_trim == 0
        """The records' ids are views of the snapshot's storage (each id stored once).
        Only when the family declares no trailing trim: then no turn truncates the
        snapshot in place, so the viewed ids are never written over."""
        self._viewed: np.ndarray | None = None
        """The storage the records' ids view (None: none yet)."""
        self.tools: list[dict[str, Any]] | None = None
        self.in_flight = False

    # -- planning -------------------------------------------------------------------------
    def begin(self, request: TurnRequest | None = None) -> None:
        """Claim the session for one turn (409 while another one runs)."""
        if self.in_flight:
            raise Conflict(
                f"session {self.session_id} has a turn in progress; wait for its reply "
                "before sending the next request",
                code="turn_in_progress",
            )
        self.in_flight = True

    def prepare(self, request: TurnRequest) -> TurnPlan:
        """The plan of a claimed turn (:meth:`begin`): reads the session, changes nothing,
        so it may run in a worker thread while the session is claimed."""
        if not request.messages:
            raise BadRequest("messages must contain at least one message")
        return self._plan(request)

    def _plan(self, request: TurnRequest) -> TurnPlan:
        messages = request.messages
        if not self.records:
            return first_turn(self.renderer, request)
        prefix = request.stored_prefix
        equal = prefix is not None and self._exact and prefix == self.messages
        if equal:
            matched = len(self.messages)  # compared by the API layer (the same objects)
        else:
            matched = match_len(self.matcher, self.messages, messages, exact=self._exact)
        if matched == len(self.messages):
            plan = self._extend(request, len(self.records) - 1)
            if not equal:  # the echoed messages of the last turn, as the matcher took them
                start = self.checkpoint_ends[-2] if len(self.records) > 1 else 0
                plan.tolerated = tolerated_counts(self.matcher, self.messages, messages,
                                                  start, matched)
            return plan
        target = self._rollback_target(messages, matched)
        discard = len(self.records) - (target + 1)
        plan = first_turn(self.renderer, request, rolled_back=discard) if target < 0 else \
            self._extend(request, target)
        plan.divergence = {"discarded": discard,
                           **divergence(self.messages, messages, matched)}
        return plan

    def _rollback_target(self, messages: list[Message], matched: int) -> int:
        """The last record the request keeps when it leaves the stored path at message
        ``matched`` (-1: none). Refused: a rollback deeper than ``--max-rollback``, and a
        request that goes on after a rewritten copy of the model's last reply (it would
        discard that reply every turn)."""
        target = -1
        for k, end in enumerate(self.checkpoint_ends):
            if end <= matched:
                target = k
        discard = len(self.records) - (target + 1)
        if discard > self.max_rollback:
            raise BadRequest(
                f"rollback too deep: discard_count={discard} exceeds the limit of "
                f"{self.max_rollback} generated turn(s) (--max-rollback; stored has "
                f"{len(self.messages)} messages, request has {len(messages)} messages; "
                f"first difference at message {matched})",
                code="rollback_too_deep",
            )
        if matched == len(self.messages) - 1 and len(messages) > matched + 1:
            fields = ", ".join(differing_fields(self.messages[matched], messages[matched]))
            raise BadRequest(
                f"messages[{matched}] is not the reply the model generated in turn "
                f"{len(self.records) - 1} ({fields} differ) and the request goes on after "
                "it: the client rewrote the model's reply, and extending this session "
                "would discard that turn. Send the assistant message back as the API "
                "returned it, run with a --message-matcher that accepts the change, or "
                "use --session-version v2, which keeps every call as a sample of its own",
                code="history_rewritten")
        return target

    def _extend(self, request: TurnRequest, target: int) -> TurnPlan:
        """The plan of a request that keeps records ``0..target`` (a rollback discards the
        rest) and appends its messages past them: refused when it changes the render
        options of the kept path (:mod:`tito.session.options`), and under
        ``--after-length-cut refuse`` when record ``target`` was cut by ``length``."""
        check_after_cut(self.records[target], self.after_length_cut, f"turn {target}",
                        "retry that turn (a request that ends before its reply) or start "
                        "a new session")
        kwargs = self.records[target].request.get("chat_template_kwargs")
        change = options_change(self.tools, kwargs, request, self.renderer)
        if change is not None:
            raise BadRequest(
                f"the request changes the render of session {self.session_id}: {change}. "
                "Tools and template options are part of the history the model saw, so a "
                "v1 session cannot extend it; declare every tool from the first turn "
                "(deferred tools with defer_loading), keep the options, or use "
                "--session-version v2, where a change starts a new root",
                code="render_changed")
        keep_options(kwargs, request, self.renderer)
        keep_messages = self.checkpoint_ends[target]
        rolled_back = len(self.records) - (target + 1)
        base = snapshot_ids(self.records[: target + 1]) if rolled_back else self.snapshot.view()
        return extension(self.renderer, request, base, self.messages[keep_messages - 1],
                         keep_records=target + 1, keep_messages=keep_messages,
                         rolled_back=rolled_back, room=None if rolled_back else self.snapshot)

    # -- commit / release ----------------------------------------------------------------
    def release(self, plan: TurnPlan | None = None, *,
                request: TurnRequest | None = None) -> None:
        """The turn failed (or the claim of :meth:`begin` is given up): the session is left
        exactly as before the request."""
        self.in_flight = False

    def apply(self, turn: TurnCommit, plan: TurnPlan | None) -> None:
        """Apply a prepared turn. With its ``plan`` the snapshot is extended (its room is
        allocated first: past that, nothing can fail); without (journal replay) the
        snapshot is rebuilt from the records by :meth:`rebuild_snapshot` afterwards."""
        snapshot = self.snapshot
        in_place = False
        if plan is not None:
            in_place = plan.keep_records > 0 and not plan.rolled_back
            snapshot = extended_snapshot(snapshot if in_place else None, plan,
                                         turn.record.output_ids)
        # -- no failure past this line ----------------------------------------------------
        if in_place and plan is not None:
            extend_in_place(snapshot, plan, turn.record.output_ids)
        self.snapshot = snapshot
        if turn.keep_records < len(self.records):
            del self.records[turn.keep_records :]
            del self.checkpoint_ends[turn.keep_records :]
        del self.messages[turn.keep_messages :]
        self.messages.extend(turn.appended)
        self.messages.append(turn.message)
        self.records.append(turn.record)
        self.checkpoint_ends.append(len(self.messages))
        if turn.tools is not None:
            self.tools = turn.tools
        if plan is not None:
            self._view_ids()
        self.last_active = turn.record.commit_ts
        self.in_flight = False

    def _view_ids(self) -> None:
        """Point the records' ids at the snapshot's storage: the last record's, or every
        record's when the storage changed (it grew, a rollback or a replay rebuilt it), so
        that an old storage is freed. Record ``k``'s bridge ends at its ``prompt_len`` and
        its output follows; the snapshot holds exactly those ids (no trailing trim)."""
        if not self._shared_ids:
            return
        storage = self.snapshot.storage
        records = self.records[-1:] if storage is self._viewed else self.records
        self._viewed = storage
        for rec in records:
            end = rec.prompt_len
            rec.bridge_ids = storage[end - len(rec.bridge_ids) : end]
            rec.output_ids = storage[end : end + len(rec.output_ids)]

    def rebuild_snapshot(self) -> None:
        """The token snapshot from the records (after a journal replay)."""
        self.snapshot = IdBuffer(snapshot_ids(self.records))
        self._view_ids()

    # -- views ---------------------------------------------------------------------------
    def response_messages(self, response_id: str) -> list[Message] | None:
        """The path's messages up to the reply of the turn ``response_id`` names, when it
        is on the path."""
        for k in range(len(self.records) - 1, -1, -1):
            if self.records[k].generation_id == response_id:
                return self.messages[: self.checkpoint_ends[k]]
        return None

    @property
    def num_tokens(self) -> int:
        return len(self.snapshot)

    @property
    def ids_nbytes(self) -> int:
        """Bytes of the stored token ids: the snapshot's storage when the records view
        it, else the records' own arrays."""
        if self._shared_ids and self.records:
            return self.snapshot.storage.nbytes
        return sum(rec.bridge_ids.nbytes + rec.output_ids.nbytes for rec in self.records)

    def collection(self) -> LinearCollection:
        return LinearCollection(self.session_id, self.version, self.records[:],
                                self.messages[:], self.checkpoint_ends[:],
                                self.snapshot.view().copy(), self.tools, self.in_flight)

    def stored_bytes(self) -> StoredBytes:
        records = self.records
        return StoredBytes(tokens=self.num_tokens, ids=self.ids_nbytes,
                           logprobs=sum(rec.logprobs.nbytes for rec in records),
                           routing=self.routing_bytes(records))

    def view_key(self) -> Hashable:
        last = self.records[-1] if self.records else None
        return ("v1", len(self.records), None if last is None else last.commit_ts,
                self.in_flight)

"""v1 linear sessions (design §5.1).

A request must extend the stored messages at the tail. A retry of the latest turn rolls
back one generated checkpoint (to the empty session when the first turn is retried);
deeper divergence is 400 ``rollback_too_deep``. Client-supplied assistant messages are
history, never checkpoints.

A turn is two steps around the engine call: :meth:`LinearSession.plan` validates the
request and computes the prompt ids without touching the trajectory (only the
``in_flight`` guard is set), and :meth:`LinearSession.commit` applies the rollback, if
any, and stores the generation. A failed engine call ends with :meth:`release`, which
leaves the session exactly as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tito.render.base import TemplateRenderer
from tito.session.idbuffer import IdBuffer
from tito.session.matchers import BUILTIN, Matcher
from tito.types.engine import CheckedOutput, GenerateResult
from tito.types.errors import BadRequest, Conflict
from tito.types.messages import Message, TurnRequest
from tito.types.records import IDS_DTYPE, TurnRecord, snapshot_ids


@dataclass(slots=True)
class TurnPlan:
    """A validated turn, ready for the engine; nothing in the session has changed yet."""

    request: TurnRequest
    keep_records: int
    """Records kept (fewer than now on a rollback)."""
    keep_messages: int
    """Stored messages kept; ``request.messages[keep_messages:]`` are appended."""
    drop: int
    bridge_ids: np.ndarray
    prompt_ids: np.ndarray
    rolled_back: int
    request_ts: float = field(default_factory=lambda: time.time())

    @property
    def appended(self) -> list[Message]:
        return self.request.messages[self.keep_messages :]


@dataclass(slots=True)
class TurnCommit:
    """One committed turn as it changes a session: what the journal stores and replays."""

    keep_records: int
    keep_messages: int
    appended: list[Message]
    message: Message
    """The assistant message parsed from the generation."""
    tools: list[dict[str, Any]] | None
    record: TurnRecord


class LinearSession:
    """The state of one v1 trajectory."""

    version = "v1"

    def __init__(self, session_id: str, renderer: TemplateRenderer, matcher: Matcher,
                 *, max_rollback: int = 1) -> None:
        self.session_id = session_id
        self.renderer = renderer
        self.matcher = matcher
        # equal messages match under every builtin matcher (not necessarily a custom one)
        self._exact_matches = matcher in BUILTIN.values()
        self.max_rollback = max_rollback
        self.messages: list[Message] = []
        self.records: list[TurnRecord] = []
        self.checkpoint_ends: list[int] = []
        self.snapshot = IdBuffer()
        self.tools: list[dict[str, Any]] | None = None
        self.in_flight = False
        self.closed = False
        self.api_state: dict[str, Any] = {}
        """What the API layer keeps per session (e.g. the last answer, for retries)."""
        self.created_at = time.time()
        self.last_active = self.created_at

    # -- planning -------------------------------------------------------------------------
    def _match_len(self, request: list[Message]) -> int:
        kept = self.messages
        if self._exact_matches and request[: len(kept)] == kept:
            return len(kept)  # one C-level comparison: equal dicts match every builtin
        n = 0
        for stored, replayed in zip(self.messages, request, strict=False):
            if not self.matcher(stored, replayed):
                break
            n += 1
        return n

    def plan(self, request: TurnRequest) -> TurnPlan:
        """Validate ``request`` and compute its prompt ids; raises before any mutation."""
        self.begin()
        try:
            return self.prepare(request)
        except BaseException:
            self.in_flight = False
            raise

    def begin(self) -> None:
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
        kwargs = request.template_kwargs
        if not self.records:
            return self._first_turn(request, rolled_back=0)
        match_len = self._match_len(messages)
        if match_len == len(self.messages):
            target = len(self.records) - 1  # plain extension (or exact resend)
        else:
            target = -1
            for k, end in enumerate(self.checkpoint_ends):
                if end <= match_len:
                    target = k
            discard = len(self.records) - (target + 1)
            if discard > self.max_rollback:
                raise BadRequest(
                    f"rollback too deep: discard_count={discard} exceeds the limit of "
                    f"{self.max_rollback} generated turn(s) (stored has {len(self.messages)} "
                    f"messages, request has {len(messages)} messages; first difference at "
                    f"message {match_len})",
                    code="rollback_too_deep",
                )
            if target < 0:
                return self._first_turn(request, rolled_back=discard)
        keep_messages = self.checkpoint_ends[target]
        rolled_back = len(self.records) - (target + 1)
        if rolled_back:
            base = snapshot_ids(self.records[: target + 1])
        else:
            base = self.snapshot.view()
        previous = self.messages[keep_messages - 1]
        bridge = self.renderer.bridge(
            previous, int(base[-1]) if len(base) else None, messages[keep_messages:],
            tools=request.tools, template_kwargs=kwargs,
        )
        bridge_ids = np.asarray(bridge.ids, dtype=IDS_DTYPE)
        prompt = np.concatenate([base[: len(base) - bridge.drop], bridge_ids])
        return TurnPlan(request, target + 1, keep_messages, bridge.drop, bridge_ids, prompt,
                        rolled_back)

    def _first_turn(self, request: TurnRequest, *, rolled_back: int) -> TurnPlan:
        self._check_roles(request.messages)
        ids = np.asarray(
            self.renderer.render_prompt(request.messages, tools=request.tools,
                                        template_kwargs=request.template_kwargs),
            dtype=IDS_DTYPE,
        )
        return TurnPlan(request, 0, 0, 0, ids, ids, rolled_back)

    def _check_roles(self, messages: list[Message]) -> None:
        for i, message in enumerate(messages):
            role = message.get("role")
            if role not in ("system", "user", "assistant", "tool"):
                raise BadRequest(f"messages[{i}].role {role!r} is not supported",
                                 code="role_not_allowed")

    # -- commit / release ----------------------------------------------------------------
    def release(self, plan: TurnPlan | None = None) -> None:
        """The turn failed (or the claim of :meth:`begin` is given up): the session is left
        exactly as before the request."""
        self.in_flight = False

    def commit(self, plan: TurnPlan, result: GenerateResult, output: CheckedOutput,
               message: Message) -> TurnRecord:
        """Store the generation (applying the planned rollback first), atomically."""
        turn = self.prepare_commit(plan, result, output, message)
        self.apply(turn, plan)
        return turn.record

    def prepare_commit(self, plan: TurnPlan, result: GenerateResult, output: CheckedOutput,
                       message: Message) -> TurnCommit:
        """The committed turn, built without changing the session (it may fail)."""
        record = TurnRecord(
            turn=plan.keep_records,
            drop=plan.drop,
            bridge_ids=plan.bridge_ids,
            output_ids=output.ids,
            logprobs=output.logprobs,
            finish_reason=result.finish_reason,
            prompt_len=len(plan.prompt_ids),
            weight_version=result.weight_version,
            cached_tokens=result.cached_tokens,
            e2e_latency=result.e2e_latency,
            request_ts=plan.request_ts,
            commit_ts=time.time(),
            routed_experts=None,
            request={
                "appended_roles": [m.get("role") for m in plan.appended],
                "rolled_back": plan.rolled_back,
            },
        )
        return TurnCommit(plan.keep_records, plan.keep_messages, plan.appended, message,
                          plan.request.tools, record)

    def apply(self, turn: TurnCommit, plan: TurnPlan | None) -> None:
        """Apply a prepared turn. With its ``plan`` the snapshot is extended (its room is
        allocated first: past that, nothing can fail); without (journal replay) the
        snapshot is rebuilt from the records by :meth:`rebuild_snapshot` afterwards."""
        snapshot = self.snapshot
        if plan is not None:
            out = turn.record.output_ids
            if plan.keep_records == 0 or plan.rolled_back:
                snapshot = IdBuffer(plan.prompt_ids)
                snapshot.extend(out)
            else:
                snapshot.reserve(len(plan.prompt_ids) + len(out))
                snapshot.truncate(len(snapshot) - plan.drop)
                snapshot.extend(plan.bridge_ids)
                snapshot.extend(out)
        # -- no failure past this line ----------------------------------------------------
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
        self.last_active = turn.record.commit_ts
        self.in_flight = False

    def rebuild_snapshot(self) -> None:
        """The token snapshot from the records (after a journal replay)."""
        self.snapshot = IdBuffer(snapshot_ids(self.records))

    # -- views ---------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.snapshot)

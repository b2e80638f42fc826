"""The primitives every session version is made of (design §5): matching a replayed
history, planning a turn's prompt ids, building its record, and extending a token snapshot.

A v1 session is a tree with one path and bounded rollback, a v2 session a tree that keeps
every path; both call these functions, so one request produces the same prompt ids, the
same record and the same sample under either version.

A turn is two steps around the engine call: a :class:`TurnPlan` (validated, prompt ids
computed, nothing in the session changed) and a :class:`TurnCommit` (what the session
stores, built before the first mutation so that the mutation itself cannot fail).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tito.render.base import TemplateRenderer
from tito.session.agents import ContextInfo
from tito.session.idbuffer import IdBuffer
from tito.session.matchers import BUILTIN, Matcher, differing_fields, tolerated
from tito.types.engine import CheckedOutput, GenerateResult
from tito.types.errors import BadRequest, Conflict
from tito.types.messages import Message, TurnRequest
from tito.types.records import IDS_DTYPE, TurnRecord

ROLES = ("system", "user", "assistant", "tool")


@dataclass(slots=True)
class TurnPlan:
    """A validated turn, ready for the engine; nothing in the session has changed yet."""

    request: TurnRequest
    keep_records: int
    """Records on the path the turn extends (v1: fewer than now on a rollback)."""
    keep_messages: int
    """Messages on that path; ``request.messages[keep_messages:]`` are appended."""
    drop: int
    bridge_ids: np.ndarray
    prompt_ids: np.ndarray
    rolled_back: int
    """Generated turns the request abandoned (v1: discarded; v2: left as a branch)."""
    parent: int | None = None
    """v2: the node the turn extends (None: a new root). v1: unused."""
    request_ts: float = field(default_factory=lambda: time.time())
    response_id: str | None = None
    """The id of the API response that answers this turn (set by the API layer)."""
    tolerated: dict[str, int] | None = None
    """Differences the matcher tolerated in the messages the request echoed back, by kind
    (:func:`tito.session.matchers.tolerated`), counted once per echoed message."""
    rewrote: list[int] | None = None
    """v2: sibling nodes whose reply the request went on after, in a copy the matcher did
    not accept (not retries of them: the picker keeps them)."""
    divergence: dict[str, Any] | None = None
    """Where the request left the stored path when it discards generated turns: the first
    differing message and its fields (``fields`` empty: the request ends there)."""
    context: ContextInfo | None = None
    """The agent context the turn belongs to (None: a session without contexts)."""

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
    parent: int | None = None
    """v2: the node this turn's node hangs under (None: a root)."""
    response_id: str | None = None
    context: ContextInfo | None = None
    """The agent context it belongs to (None: the session's main context)."""


def exact_matches(matcher: Matcher) -> bool:
    """Whether equal messages always match under ``matcher`` (true of every builtin, so a
    C-level list comparison can stand in for the message-by-message walk)."""
    return matcher in BUILTIN.values() or hasattr(matcher, "call_ids_rendered")


def tolerated_counts(matcher: Matcher, stored: list[Message], request: list[Message],
                     start: int, end: int) -> dict[str, int] | None:
    """The differences the ``harness`` matcher tolerated between ``stored[start:end]`` and
    the request's same messages, by kind (None: none, or another matcher)."""
    ids_rendered = getattr(matcher, "call_ids_rendered", None)
    if ids_rendered is None:
        return None
    counts: dict[str, int] = {}
    for i in range(start, min(end, len(request))):
        kept, replayed = stored[i], request[i]
        if kept is replayed or kept == replayed:
            continue
        for kind in tolerated(kept, replayed, call_ids_rendered=ids_rendered) or ():
            counts[kind] = counts.get(kind, 0) + 1
    return counts or None


def divergence(stored: list[Message], request: list[Message], matched: int
               ) -> dict[str, Any]:
    """Where ``request`` leaves ``stored``: message ``matched``, its role, and the fields
    that differ there (empty when the request ends before it: a retry)."""
    if matched >= len(request) or matched >= len(stored):
        return {"message": matched, "role": None, "fields": []}
    return {"message": matched, "role": stored[matched].get("role"),
            "fields": differing_fields(stored[matched], request[matched])}


def match_len(matcher: Matcher, stored: list[Message], request: list[Message],
              start: int = 0, *, exact: bool = False) -> int:
    """How many messages of ``stored`` match ``request[start:]``, from the first on."""
    n = len(stored)
    if exact and request[start : start + n] == stored:
        return n
    matched = 0
    for kept, replayed in zip(stored, request[start : start + n], strict=False):
        if not matcher(kept, replayed):
            break
        matched += 1
    return matched


def check_after_cut(record: TurnRecord, after_length_cut: str, what: str, hint: str) -> None:
    """The rule for a turn after a length cut (design §5.6), the same in v1 and v2:
    ``keep`` extends a reply cut by ``finish_reason=length`` (its sample holds every
    turn); ``refuse`` (the reference framework's rule) is 409 ``truncated_generation``
    here, before the engine is called and before anything changes."""
    if after_length_cut == "refuse" and record.finish_reason == "length":
        raise Conflict(
            f"truncated generation cannot be extended: {what} ended with "
            "finish_reason='length' and the gateway runs with --after-length-cut refuse, "
            f"which closes that path for good; {hint}",
            code="truncated_generation",
        )


def check_roles(messages: list[Message]) -> None:
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise BadRequest(f"messages[{i}].role {role!r} is not supported",
                             code="role_not_allowed")


def first_turn(renderer: TemplateRenderer, request: TurnRequest, *, rolled_back: int = 0,
               parent: int | None = None) -> TurnPlan:
    """The plan of a turn rendered from scratch (the chat template on the whole request)."""
    check_roles(request.messages)
    ids = np.asarray(
        renderer.render_prompt(request.messages, tools=request.tools,
                               template_kwargs=request.template_kwargs),
        dtype=IDS_DTYPE,
    )
    return TurnPlan(request, 0, 0, 0, ids, ids, rolled_back, parent)


def extension(renderer: TemplateRenderer, request: TurnRequest, base: np.ndarray,
              previous: Message, *, keep_records: int, keep_messages: int,
              rolled_back: int = 0, parent: int | None = None,
              room: IdBuffer | None = None) -> TurnPlan:
    """The plan of a turn that extends a stored path: its snapshot ``base`` bit for bit
    (minus a declared trailing trim), then the bridge of the appended messages.
    ``room``: the buffer ``base`` is the whole view of, when the prompt may be built in
    its spare room (:func:`joined_prompt`)."""
    bridge = renderer.bridge(
        previous, int(base[-1]) if len(base) else None, request.messages[keep_messages:],
        tools=request.tools, template_kwargs=request.template_kwargs,
    )
    bridge_ids = np.asarray(bridge.ids, dtype=IDS_DTYPE)
    prompt = joined_prompt(base, bridge.drop, bridge_ids, room)
    return TurnPlan(request, keep_records, keep_messages, bridge.drop, bridge_ids, prompt,
                    rolled_back, parent)


def joined_prompt(base: np.ndarray, drop: int, bridge_ids: np.ndarray,
                  room: IdBuffer | None) -> np.ndarray:
    """``base`` less its last ``drop`` ids, then ``bridge_ids``. With ``room`` (``base`` is
    its whole view) and no drop, the bridge is written in the buffer's spare room and the
    prompt is a view (no copy of the stored prefix a turn): the buffer's ids are
    unchanged, and the commit that extends it in place writes the same bridge there.
    Only for a buffer no other turn reads or writes while this one runs (a claimed v1
    session's snapshot)."""
    if room is not None and drop == 0:
        assert len(room) == len(base), "room is the buffer base views"
        prompt = room.followed_by(bridge_ids)
        if prompt is not None:
            return prompt
    return np.concatenate([base[: len(base) - drop], bridge_ids])


def replay_start(plan: TurnPlan) -> int:
    """First position whose routing rows an incremental replay asks for: the stored
    prefix's rows are kept, except those of positions the turn changes — the previous
    turn's last generated id was never fed (its row is new), and a declared trailing trim
    of ``drop`` ids discards their rows (design §8)."""
    if plan.keep_records == 0:
        return 0
    base = len(plan.prompt_ids) - len(plan.bridge_ids) + plan.drop
    return max(0, base - max(plan.drop, 1))


def build_commit(plan: TurnPlan, result: GenerateResult, output: CheckedOutput,
                 message: Message, *, routed: np.ndarray | None = None,
                 routed_start: int = 0, indexer: np.ndarray | None = None) -> TurnCommit:
    """The committed turn (record included), built without changing any session.
    ``routed``: the turn's routing rows from position ``routed_start`` on (replay)."""
    request_facts: dict[str, Any] = {
        "appended_roles": [m.get("role") for m in plan.appended],
        "rolled_back": plan.rolled_back,
        # the request's messages are the path's first message_end - 1 (design §5.4)
        "message_end": plan.keep_messages + len(plan.appended) + 1,
    }
    if plan.request.settings:
        request_facts["settings"] = plan.request.settings
    if plan.request.template_kwargs:
        request_facts["chat_template_kwargs"] = plan.request.template_kwargs
    if plan.request.notes:
        request_facts["notes"] = plan.request.notes
    if plan.tolerated:
        request_facts["tolerated"] = plan.tolerated
    if plan.divergence is not None:
        request_facts["divergence"] = plan.divergence
    if plan.rewrote:
        request_facts["rewrote"] = plan.rewrote
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
        routed_experts=routed,
        routed_experts_start_len=routed_start if routed is not None else 0,
        indexer_topk=indexer,
        indexer_topk_start_len=routed_start if indexer is not None else 0,
        sampling_mask_ids=None if result.sampling_mask is None else result.sampling_mask.ids,
        sampling_mask_offsets=None if result.sampling_mask is None
        else result.sampling_mask.offsets,
        weight_spans=None if not result.weight_versions else [
            [s.version, s.start, s.end] for s in result.weight_versions],
        finish_message=result.finish_message if result.finish_reason == "abort" else None,
        spec_info=result.spec_info,
        request=request_facts,
        generation_id=plan.response_id,
        links=None if plan.request.links is None else plan.request.links.to_json() or None,
    )
    return TurnCommit(plan.keep_records, plan.keep_messages, plan.appended, message,
                      plan.request.tools, record, plan.parent, plan.response_id,
                      plan.context)


def extended_snapshot(snapshot: IdBuffer | None, plan: TurnPlan, output: np.ndarray
                      ) -> IdBuffer:
    """The token snapshot after the planned turn. ``snapshot`` is the path's current
    buffer when the plan extends it in place (its room is reserved here, so the caller's
    later truncate/extend cannot fail); None: a new buffer from the plan's prompt."""
    if snapshot is None:
        fresh = IdBuffer(plan.prompt_ids)
        fresh.extend(output)
        return fresh
    snapshot.reserve(len(plan.prompt_ids) + len(output))
    return snapshot


def extend_in_place(snapshot: IdBuffer, plan: TurnPlan, output: np.ndarray) -> None:
    """Apply the plan to the buffer :func:`extended_snapshot` reserved (cannot fail)."""
    snapshot.truncate(len(snapshot) - plan.drop)
    snapshot.extend(plan.bridge_ids)
    snapshot.extend(output)

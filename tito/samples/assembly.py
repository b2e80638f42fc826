"""Assemble a v1 trajectory's records into one training sample (design §6).

Steps, each a small pure function:

1. **pieces**: validate each record and lay out its bridge ids and output ids;
2. **declared trailing trim**: record ``i + 1``'s ``drop`` removes that many trailing ids
   from record ``i``'s output, with its logprobs in lockstep (the last turn is never
   trimmed; a drop longer than the previous output is an error);
3. **truncate** at ``max_seq_len`` at turn granularity: the first turn that overflows is
   cut (kept and marked truncated when at least one generated id survives, else dropped)
   and every later turn is dropped;
4. **merge**: concatenate the kept turns, stopping before a turn that would open an R3
   gap (``metadata["merge_stopped"]`` says so and how many turns it left out). A turn
   cut by ``finish_reason=length`` or ``abort`` does not end the trajectory (design
   §5.6): the turns after it are merged, its generated ids train like any others, and
   the closing token the next turn's template put after it is a bridge id (never
   generated, loss mask 0); ``metadata["length_cut_turns"]`` / ``["aborted_turns"]``
   list it;
5. **build** the sample (mask, logprobs, R3, status from the last kept turn, weight
   versions, lifecycle metadata) and verify its invariants.

Deterministic failures raise :class:`tito.types.errors.AssemblyError` (HTTP 422 on the OpenAI API).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from tito.samples.routing import INDEXER, has_routed_experts, merge_routed_experts
from tito.samples.sample import (
    LOGPROBS_DTYPE,
    LOSS_MASK_DTYPE,
    TOKENS_DTYPE,
    Sample,
    SampleStatus,
    sample_problem,
    status_from_finish_reason,
)
from tito.samples.sampling_mask import TurnMask, merge_sampling_mask, turn_mask
from tito.types.errors import AssemblyError
from tito.types.records import TurnRecord

EmptyReason = Literal["no_records", "all_truncated"]
Decode = Callable[[list[int]], str]


@dataclass(frozen=True, slots=True)
class AssemblyResult:
    """What assembly produced: samples, or none and why."""

    samples: list[Sample]
    empty_reason: EmptyReason | None
    """``no_records`` (nothing committed) or ``all_truncated``; None when samples exist."""
    completion_spans: list[tuple[int, int]] = field(default_factory=list)
    """(start, end) in the sample's ``tokens`` of each kept turn's generated ids."""


@dataclass(frozen=True, slots=True)
class _Turn:
    """One record laid out for merging; ``output``/``logprobs`` are already trimmed/cut."""

    record: TurnRecord
    bridge: np.ndarray
    output: np.ndarray
    logprobs: np.ndarray
    status: SampleStatus
    mask: TurnMask | None = None
    """Kept sets of ``output`` (sampling-mask replay), cut in lockstep."""

    @property
    def length(self) -> int:
        """Tokens this turn adds to the merged sequence."""
        return len(self.bridge) + len(self.output)

    def cut(self, keep: int, *, status: SampleStatus | None = None) -> _Turn:
        """This turn with only its first ``keep`` generated ids (logprobs in lockstep)."""
        return replace(
            self,
            output=self.output[:keep],
            logprobs=self.logprobs[:keep],
            mask=None if self.mask is None else self.mask.cut(keep),
            status=self.status if status is None else status,
        )


def assemble(
    records: Sequence[TurnRecord],
    *,
    decode: Decode,
    max_seq_len: int | None = None,
    metadata: dict[str, Any] | None = None,
    include_response: bool = True,
    routing: bool = False,
    indexer: bool = False,
    sampling_mask: bool = False,
) -> AssemblyResult:
    """Assemble a linear trajectory into (at most) one :class:`Sample`.

    ``decode`` turns ids (a list of ints) into text; it decodes the response region once
    (``include_response=False``: not at all, and ``Sample.response`` is None).
    ``routing`` / ``indexer``: routing (indexer) replay is on, so the sample must carry
    routed experts (indexer top-k) for every position (a record without its payload is an
    :class:`AssemblyError`). ``sampling_mask``: sampling-mask replay is on, so every kept
    turn must carry its kept token sets.
    ``metadata`` (the caller's, e.g. the agent's) is deep-copied into the sample; the
    sample's ``lifecycle`` key (one ``{turn, t0, t1, req_ts}`` entry per kept turn)
    overrides a caller key of that name.
    """
    if metadata is not None and not isinstance(metadata, dict):
        raise AssemblyError(f"metadata must be an object, got {type(metadata).__name__}")
    if not records:
        return AssemblyResult([], "no_records")
    turns = _trim(_pieces(records))
    if max_seq_len is not None:
        turns = _truncate(turns, max_seq_len)
    if not turns:
        return AssemblyResult([], "all_truncated")
    merged = _merge_span(turns)
    extra = {} if len(merged) == len(turns) else {"merge_stopped": {
        "reason": "routing_replay_gap", "turns_left_out": len(turns) - len(merged),
        "message": f"turn {len(merged)} has no routed experts after turns that had them: "
                   "it and the turns after it cannot be replayed in this sample"}}
    turns = merged
    sample = _build(turns, decode=decode if include_response else None,
                    metadata={**(metadata or {}), **extra}, routing=routing,
                    indexer=indexer, sampling_mask=sampling_mask)
    _verify(sample, turns, max_seq_len)
    return AssemblyResult([sample], None, _spans(turns))


def _spans(turns: list[_Turn]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    position = 0
    for turn in turns:
        position += len(turn.bridge)
        spans.append((position, position + len(turn.output)))
        position += len(turn.output)
    return spans


def _pieces(records: Sequence[TurnRecord]) -> list[_Turn]:
    """Validate each record against the previous one and lay it out (untrimmed)."""
    turns: list[_Turn] = []
    checkpoint = 0
    for i, rec in enumerate(records):
        where = f"record {i} (turn {rec.turn})"
        bridge = _ids(rec.bridge_ids, f"{where} bridge_ids")
        output = _ids(rec.output_ids, f"{where} output_ids")
        logprobs = np.asarray(rec.logprobs)
        if logprobs.ndim != 1 or len(logprobs) != len(output):
            raise AssemblyError(
                f"{where} has {len(output)} output ids but logprobs of shape {logprobs.shape}"
            )
        if i == 0:
            if rec.drop != 0:
                raise AssemblyError(f"{where} declares drop={rec.drop} but has no previous turn")
            if len(bridge) == 0:
                raise AssemblyError(f"{where} has an empty first prompt")
        elif not 0 <= rec.drop <= len(turns[-1].output):
            raise AssemblyError(
                f"{where} drops {rec.drop} trailing tokens but the previous turn generated "
                f"only {len(turns[-1].output)}"
            )
        prompt_len = checkpoint - rec.drop + len(bridge)
        if rec.prompt_len != prompt_len:
            raise AssemblyError(
                f"{where} has prompt_len {rec.prompt_len} but previous checkpoint {checkpoint} "
                f"- drop {rec.drop} + bridge {len(bridge)} = {prompt_len}"
            )
        checkpoint = prompt_len + len(output)
        status = status_from_finish_reason(rec.finish_reason)
        turns.append(_Turn(rec, bridge, output, logprobs, status, turn_mask(rec, where)))
    return turns


def _trim(turns: list[_Turn]) -> list[_Turn]:
    """Apply each turn's declared drop to the previous turn's output and logprobs."""
    out: list[_Turn] = []
    for i, turn in enumerate(turns):
        drop = turns[i + 1].record.drop if i + 1 < len(turns) else 0
        if drop:
            turn = turn.cut(len(turn.output) - drop)
        out.append(turn)
    return out


def _truncate(turns: list[_Turn], max_seq_len: int) -> list[_Turn]:
    """Keep whole turns while they fit; cut the first overflowing one, drop the rest."""
    kept: list[_Turn] = []
    total = 0
    for turn in turns:
        if total + turn.length <= max_seq_len:
            kept.append(turn)
            total += turn.length
            continue
        overflow = total + turn.length - max_seq_len
        keep = len(turn.output) - overflow
        if keep >= 1:
            kept.append(turn.cut(keep, status="truncated"))
        break
    return kept


def _merge_span(turns: list[_Turn]) -> list[_Turn]:
    """The prefix of turns that merge: stop before an R3 gap. A turn cut by ``length`` or
    ``abort`` goes on (a ``max_seq_len`` cut is already the last turn)."""
    merged: list[_Turn] = []
    any_r3 = False
    for turn in turns:
        if merged and any_r3 and not has_routed_experts(turn.record):
            break
        merged.append(turn)
        any_r3 = any_r3 or has_routed_experts(turn.record)
    return merged


def _cuts(turns: list[_Turn], finish_reason: str) -> list[dict[str, Any]]:
    """``{turn, start, end}`` of each kept turn that ended with ``finish_reason``
    (``length`` or ``abort``): its position among the sample's turns and its generated
    ids in ``tokens`` (an aborted turn's ``reason`` too)."""
    out: list[dict[str, Any]] = []
    for k, (turn, (start, end)) in enumerate(zip(turns, _spans(turns), strict=True)):
        if turn.record.finish_reason == finish_reason:
            out.append({"turn": k, "start": start, "end": end})
            if finish_reason == "abort":
                out[-1]["reason"] = _aborted_reason(turn)
    return out


def _aborted_reason(turn: _Turn) -> str:
    return turn.record.finish_message or \
        "the engine aborted the generation (finish_reason abort)"


def _build(turns: list[_Turn], *, decode: Decode | None, metadata: dict[str, Any],
           routing: bool = False, indexer: bool = False,
           sampling_mask: bool = False) -> Sample:
    """Concatenate the kept turns (per-turn numpy pieces, never per-token Python work)."""
    prompt, first = turns[0].bridge, turns[0]
    token_parts = [prompt, first.output]
    mask_parts = [np.ones(len(first.output), LOSS_MASK_DTYPE)]
    logprob_parts = [first.logprobs]
    for t in turns[1:]:
        token_parts += [t.bridge, t.output]
        mask_parts += [
            np.zeros(len(t.bridge), LOSS_MASK_DTYPE),
            np.ones(len(t.output), LOSS_MASK_DTYPE),
        ]
        logprob_parts += [np.zeros(len(t.bridge), LOGPROBS_DTYPE), t.logprobs]
    tokens = np.concatenate(token_parts).astype(TOKENS_DTYPE, copy=False)
    kept_lens = np.cumsum([t.length for t in turns]).tolist()
    sample_metadata = copy.deepcopy(metadata)
    sample_metadata["lifecycle"] = [_lifecycle(t.record, turns[k - 1].record if k else None)
                                    for k, t in enumerate(turns)]
    sample_metadata["weight_version_spans"] = _weight_spans(turns)
    spec_turns = [{"turn": k, **t.record.spec_info} for k, t in enumerate(turns)
                  if t.record.spec_info is not None]
    if spec_turns:
        sample_metadata["spec_info_turns"] = spec_turns
    for key, reason in (("length_cut_turns", "length"), ("aborted_turns", "abort")):
        cuts = _cuts(turns, reason)
        if cuts:
            sample_metadata[key] = cuts
    mask = merge_sampling_mask([(len(t.bridge), t.mask) for t in turns],
                               required=sampling_mask, turns=[t.record.turn for t in turns])
    last = turns[-1]
    if last.status == "aborted":
        sample_metadata["aborted_reason"] = _aborted_reason(last)
    return Sample(
        tokens=tokens,
        response_length=len(tokens) - len(prompt),
        loss_mask=np.concatenate(mask_parts),
        rollout_log_probs=np.concatenate(logprob_parts).astype(LOGPROBS_DTYPE, copy=False),
        rollout_routed_experts=merge_routed_experts([t.record for t in turns], kept_lens,
                                                    required=routing),
        rollout_indexer_topk=merge_routed_experts([t.record for t in turns], kept_lens,
                                                  required=indexer, kind=INDEXER),
        rollout_sampling_mask=None if mask is None else mask[0],
        rollout_sampling_mask_offsets=None if mask is None else mask[1],
        response=None if decode is None else decode(tokens[len(prompt) :].tolist()),
        status=turns[-1].status,
        weight_versions=[t.record.weight_version for t in turns],
        weight_version_calls=weight_version_calls(
            [(t.record, span) for t, span in zip(turns, _spans(turns), strict=True)]),
        spec_info=spec_info([t.record for t in turns]),
        metadata=sample_metadata,
        prefix_cache_info={"cached_tokens": sum(t.record.cached_tokens for t in turns),
                           "total_prompt_tokens": sum(t.record.prompt_len for t in turns)},
    )


def _weight_spans(turns: list[_Turn]) -> list[dict[str, Any]]:
    """Which weight version generated which ids: ``{version, start, end}`` over positions
    of ``tokens``, from a version's first generated id to its last before another
    version's (the bridge ids inside a span were not generated)."""
    spans: list[dict[str, Any]] = []
    for turn, (start, end) in zip(turns, _spans(turns), strict=True):
        rec = turn.record
        parts = rec.weight_spans or [[rec.weight_version, 0, len(turn.output)]]
        for version, a, b in parts:
            lo, hi = start + min(a, end - start), start + min(b, end - start)
            if hi <= lo:
                continue
            if spans and spans[-1]["version"] == version:
                spans[-1]["end"] = hi
            else:
                spans.append({"version": version, "start": lo, "end": hi})
    return spans


def weight_version_calls(turns: list[tuple[TurnRecord, tuple[int, int]]]
                         ) -> list[list[dict[str, Any]]]:
    """Per kept turn (record, (start, end) of its kept generated ids in ``tokens``):
    ``[{"version", "abs_start", "abs_end"}]``, the engine's spans (or its one version
    over the whole output) placed in ``tokens`` and clipped to the ids kept (trailing
    trim, ``max_seq_len`` cut); empty spans and unversioned turns give none."""
    calls: list[list[dict[str, Any]]] = []
    for rec, (start, end) in turns:
        parts = rec.weight_spans or ([] if rec.weight_version is None else
                                     [[rec.weight_version, 0, len(rec.output_ids)]])
        calls.append([{"version": version, "abs_start": start + a,
                       "abs_end": min(start + b, end)}
                      for version, a, b in parts if start + a < min(start + b, end)])
    return calls


SPEC_KEYS = {"spec_num_correct_drafts": ("spec_num_correct_drafts", "spec_accept_token_num"),
             "spec_num_proposed_drafts": ("spec_num_proposed_drafts", "spec_draft_token_num"),
             "spec_verify_ct": ("spec_verify_ct",)}
"""The reference framework's ``SpecInfo`` counters and the engine keys they sum (SGLang's
current names first, its older ones after)."""


def spec_info(records: list[TurnRecord]) -> dict[str, int] | None:
    """The kept turns' speculative-decoding counters summed as the reference framework's
    ``SpecInfo.add`` does (turns with ``spec_verify_ct > 0``; ``completion_tokens`` is the
    turn's generated count); None when no kept turn reported any."""
    reported = [rec for rec in records if rec.spec_info is not None]
    if not reported:
        return None
    total = dict.fromkeys((*SPEC_KEYS, "completion_tokens"), 0)
    for rec in reported:
        counters = rec.spec_info or {}
        if int(counters.get("spec_verify_ct") or 0) <= 0:
            continue
        for name, keys in SPEC_KEYS.items():
            total[name] += int(next((counters[k] for k in keys if k in counters), 0))
        total["completion_tokens"] += len(rec.output_ids)
    return total


def _lifecycle(rec: TurnRecord, previous: TurnRecord | None) -> dict[str, Any]:
    """One segment in the reference framework's shape: ``turn`` counts from 1, ``t1`` is
    the commit, ``t0`` its start by the engine's latency, ``req_ts`` the request's
    arrival, ``prev_t1`` the previous turn's commit (the gap is the agent's own work)."""
    t0 = None if rec.e2e_latency is None else rec.commit_ts - rec.e2e_latency
    segment: dict[str, Any] = {"t0": t0, "t1": rec.commit_ts, "turn": rec.turn + 1,
                               "req_ts": rec.request_ts}
    if previous is not None:
        segment["prev_t1"] = previous.commit_ts
    return segment


def _verify(sample: Sample, turns: list[_Turn], max_seq_len: int | None) -> None:
    """Invariants every assembled sample satisfies; a violation is a bug, reported as 422."""
    problem = sample_problem(sample)
    if problem is None and sample.loss_mask is not None:
        generated = sum(len(t.output) for t in turns)
        if int(sample.loss_mask.sum()) != generated:
            problem = f"loss_mask trains {int(sample.loss_mask.sum())} ids, expected {generated}"
    expected_len = sum(t.length for t in turns)
    if problem is None and len(sample.tokens) != expected_len:
        problem = f"sample has {len(sample.tokens)} tokens, expected {expected_len}"
    if problem is None and max_seq_len is not None and len(sample.tokens) > max_seq_len:
        problem = f"sample has {len(sample.tokens)} tokens, over max_seq_len {max_seq_len}"
    if problem is not None:
        raise AssemblyError(f"assembled sample violates an invariant: {problem}")


def _ids(value: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise AssemblyError(f"{what} must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    return arr

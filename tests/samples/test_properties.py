"""Property tests: random record chains against simple oracles."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from helpers.support import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from tito.samples import assemble, decode_samples, encode_samples, samples_identical
from tito.types.records import TurnRecord, snapshot_ids

from .helpers import Turn, chain, decode, routing_oracle

ids = st.integers(min_value=0, max_value=999)
logprob = st.floats(width=32, allow_nan=False, max_value=0.0)


@dataclass
class Trajectory:
    records: list[TurnRecord]
    r3_mode: str | None
    gap: int | None
    """Index of a turn > 0 whose R3 payload was removed (merge must stop before it)."""


@st.composite
def trajectories(draw: st.DrawFn, *, unfinished: bool, gaps: bool) -> Trajectory:
    n = draw(st.integers(1, 5))
    mode = draw(st.sampled_from([None, "full", "incremental"]))
    turns: list[Turn] = []
    for i in range(n):
        # With R3 every later turn appends something (as a real template does): an engine
        # cannot be asked for rows past a prompt that added nothing.
        min_bridge = 1 if i == 0 or mode is not None else 0
        bridge = draw(st.lists(ids, min_size=min_bridge, max_size=4))
        output = draw(st.lists(ids, max_size=4))
        drop = 0 if i == 0 else draw(st.integers(0, min(len(turns[-1].output), 2)))
        final = i == n - 1
        finish = (
            draw(st.sampled_from(["stop", "length", "abort"])) if (final or unfinished) else "stop"
        )
        turns.append(
            Turn(
                bridge,
                output,
                draw(st.lists(logprob, min_size=len(output), max_size=len(output))),
                drop=drop,
                finish=finish,
                weight_version=draw(st.sampled_from([None, "w1", "w2"])),
            )
        )
    records = chain(turns)
    if mode is not None:
        _attach_r3(records, mode)
    gap = None
    if mode is not None and gaps and n > 1 and draw(st.booleans()):
        gap = draw(st.integers(1, n - 1))
        records[gap].routed_experts = None
        records[gap].routed_experts_start_len = 0
    return Trajectory(records, mode, gap)


def _attach_r3(records: list[TurnRecord], mode: str) -> None:
    """R3 whose row ``r`` identifies position ``r`` and its token (see ``routing_oracle``)."""
    previous = 0
    for i, rec in enumerate(records):
        snap = snapshot_ids(records[: i + 1]).tolist()
        full = routing_oracle(snap, rec.checkpoint_len - 1)
        start = 0
        if mode == "incremental" and i > 0:
            start = min(previous - 1, previous - rec.drop)
        rec.routed_experts = full[start:]
        rec.routed_experts_start_len = start
        previous = rec.checkpoint_len


def trimmed_outputs(records: list[TurnRecord]) -> list[np.ndarray]:
    drops = [r.drop for r in records[1:]] + [0]
    return [r.output_ids[: len(r.output_ids) - d] for r, d in zip(records, drops, strict=True)]


def assert_round_trip(sample) -> None:
    data = encode_samples([sample], session_metadata={"k": 1}, empty_reason=None)
    [back] = decode_samples(data).samples
    assert samples_identical(back, sample)


@settings(max_examples=examples(150), deadline=None)
@given(trajectories(unfinished=False, gaps=False))
def test_untruncated_sample_is_the_snapshot(traj: Trajectory) -> None:
    records = traj.records
    [sample] = assemble(records, decode=decode, metadata={"a": 1}).samples
    tokens = sample.tokens
    assert tokens.tolist() == snapshot_ids(records).tolist()
    assert sample.response_length == len(tokens) - len(records[0].bridge_ids)
    outputs = trimmed_outputs(records)
    assert int(sample.loss_mask.sum()) == sum(len(o) for o in outputs)
    trained = sample.loss_mask.astype(bool)
    assert tokens[-sample.response_length :][trained].tolist() == np.concatenate(outputs).tolist()
    expected_lp = np.concatenate(
        [r.logprobs[: len(o)] for r, o in zip(records, outputs, strict=True)]
    )
    # float32 records widen exactly to the sample's float64
    assert sample.rollout_log_probs[trained].tobytes() == \
        expected_lp.astype(np.float64).tobytes()
    assert sample.rollout_log_probs[~trained].tobytes() == bytes(8 * int((~trained).sum()))
    assert sample.weight_versions == [r.weight_version for r in records]
    if traj.r3_mode is None:
        assert sample.rollout_routed_experts is None
    else:
        oracle = routing_oracle(tokens.tolist(), len(tokens) - 1)
        assert sample.rollout_routed_experts.tobytes() == oracle.tobytes()
    assert_round_trip(sample)


@settings(max_examples=examples(150), deadline=None)
@given(
    trajectories(unfinished=True, gaps=True),
    st.one_of(st.none(), st.integers(0, 30)),
)
def test_any_sample_is_a_consistent_snapshot_prefix(
    traj: Trajectory, max_seq_len: int | None
) -> None:
    records = traj.records
    result = assemble(records, decode=decode, max_seq_len=max_seq_len)
    prompt = len(records[0].bridge_ids)
    first_out = len(trimmed_outputs(records)[0])
    if max_seq_len is not None and max_seq_len < prompt + min(first_out, 1):
        assert result.samples == [] and result.empty_reason == "all_truncated"
        return
    [sample] = result.samples
    tokens = sample.tokens.tolist()
    snapshot = snapshot_ids(records).tolist()
    assert tokens == snapshot[: len(tokens)]
    assert max_seq_len is None or len(tokens) <= max_seq_len
    assert sample.response_length == len(tokens) - prompt
    kept = len(sample.weight_versions)
    assert kept == len(sample.metadata["lifecycle"])
    assert traj.gap is None or kept <= traj.gap
    if max_seq_len is None and traj.gap is None:
        # every turn after a length cut or an abort is in the sample (design §5.6)
        assert kept == len(records)
    for key, reason in (("length_cut_turns", "length"), ("aborted_turns", "abort")):
        cuts = [k for k, r in enumerate(records[:kept]) if r.finish_reason == reason]
        assert [c["turn"] for c in sample.metadata.get(key, [])] == cuts
    trained = sample.loss_mask.astype(bool)
    assert not sample.rollout_log_probs[~trained].any()
    if traj.r3_mode is None:
        assert sample.rollout_routed_experts is None
    else:
        oracle = routing_oracle(tokens, len(tokens) - 1)
        assert sample.rollout_routed_experts.tobytes() == oracle.tobytes()
    assert_round_trip(sample)

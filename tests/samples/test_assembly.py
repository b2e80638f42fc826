"""Sample assembly (design §6): trim, truncation, merge, R3, invariants."""

from __future__ import annotations

import numpy as np
import pytest

from tito.samples import assemble, status_from_finish_reason
from tito.types.errors import AssemblyError, ErrorKind
from tito.types.records import snapshot_ids

from .helpers import Turn, chain, decode, routing_oracle

GOLDEN_TOKENS = [1, 2, 3, 10, 11, 20, 21, 30, 31]


def golden(**second: object) -> list:
    """Prompt [1,2,3] → [10,11]; bridge [20,21] → [30,31] (the reference's golden)."""
    return chain(
        [
            Turn([1, 2, 3], [10, 11], [-0.125, -0.25], weight_version="w1"),
            Turn([20, 21], [30, 31], [-0.5, -1.0], weight_version="w2", **second),
        ]
    )


def only(result):
    assert result.empty_reason is None
    assert len(result.samples) == 1
    return result.samples[0]


# ------------------------------------------------------------------- golden / basics


def test_golden_two_turns() -> None:
    s = only(assemble(golden(), decode=decode, metadata={"agent": {"k": 1}}))
    assert s.tokens.dtype == np.int64
    assert s.tokens.tolist() == GOLDEN_TOKENS
    assert s.response_length == 6
    assert s.prompt_length == 3
    assert s.loss_mask.dtype == np.uint8
    assert s.loss_mask.tolist() == [1, 1, 0, 0, 1, 1]
    assert s.rollout_log_probs.dtype == np.float64
    assert s.rollout_log_probs.tolist() == [-0.125, -0.25, 0.0, 0.0, -0.5, -1.0]
    assert s.response == "10 11 20 21 30 31"
    assert s.status == "completed"
    assert s.weight_versions == ["w1", "w2"]
    assert s.rollout_routed_experts is None
    assert s.reward is None
    assert s.metadata == {
        "agent": {"k": 1},
        "lifecycle": [
            {"turn": 1, "t0": 100.5, "t1": 101.0, "req_ts": 100.0},
            {"turn": 2, "t0": 110.5, "t1": 111.0, "req_ts": 110.0, "prev_t1": 101.0},
        ],
        "weight_version_spans": [{"version": "w1", "start": 3, "end": 5},
                                 {"version": "w2", "start": 7, "end": 9}],
    }


def test_metadata_is_copied_and_t0_none_without_latency() -> None:
    caller = {"agent": {"k": [1]}, "lifecycle": "caller's"}
    s = only(assemble(golden(e2e_latency=None), decode=decode, metadata=caller))
    s.metadata["agent"]["k"].append(2)
    assert caller == {"agent": {"k": [1]}, "lifecycle": "caller's"}
    assert s.metadata["lifecycle"][1] == {"turn": 2, "t0": None, "t1": 111.0, "req_ts": 110.0,
                                          "prev_t1": 101.0}


def test_single_turn() -> None:
    s = only(assemble(chain([Turn([7, 8], [9], [-2.0], finish="stop")]), decode=decode))
    assert s.tokens.tolist() == [7, 8, 9]
    assert s.response_length == 1
    assert s.loss_mask.tolist() == [1]
    assert s.rollout_log_probs.tolist() == [-2.0]


def test_no_records() -> None:
    result = assemble([], decode=decode)
    assert result.samples == []
    assert result.empty_reason == "no_records"


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        ("stop", "completed"),
        ("tool_calls", "completed"),
        ("length", "truncated"),
        ("abort", "aborted"),
    ],
)
def test_status_from_finish_reason(reason: str, status: str) -> None:
    assert status_from_finish_reason(reason) == status


def test_unknown_finish_reason_is_unprocessable() -> None:
    with pytest.raises(AssemblyError, match="unknown finish_reason 'weird'") as exc:
        assemble(chain([Turn([1], [2], finish="weird")]), decode=decode)
    assert exc.value.kind is ErrorKind.UNPROCESSABLE


# ------------------------------------------------------------------- trailing trim


def test_trailing_trim_worked_example() -> None:
    # 9 is a stop token that the next turn's template replaces (drop=1, re-emitted as bridge).
    records = chain(
        [
            Turn([1, 2], [5, 9], [-1.0, -2.0]),
            Turn([9, 7], [8, 9], [-3.0, -4.0], drop=1),
            Turn([9, 6], [4], [-5.0], drop=1),
        ]
    )
    s = only(assemble(records, decode=decode))
    assert s.tokens.tolist() == [1, 2, 5, 9, 7, 8, 9, 6, 4]
    assert s.tokens.tolist() == snapshot_ids(records).tolist()
    assert s.loss_mask.tolist() == [1, 0, 0, 1, 0, 0, 1]
    assert s.rollout_log_probs.tolist() == [-1.0, 0.0, 0.0, -3.0, 0.0, 0.0, -5.0]
    assert s.response_length == 7
    assert s.response == "5 9 7 8 9 6 4"


def test_last_turn_is_never_trimmed() -> None:
    records = chain([Turn([1], [5, 9]), Turn([9], [8, 9], drop=1)])
    s = only(assemble(records, decode=decode))
    assert s.tokens.tolist() == [1, 5, 9, 8, 9]
    assert s.loss_mask.tolist() == [1, 0, 1, 1]


def test_drop_may_consume_a_whole_output() -> None:
    s = only(assemble(chain([Turn([1], [9]), Turn([9, 2], [3], drop=1)]), decode=decode))
    assert s.tokens.tolist() == [1, 9, 2, 3]
    assert s.loss_mask.tolist() == [0, 0, 1]


def test_drop_larger_than_previous_output_is_unprocessable() -> None:
    records = chain([Turn([1, 2], [5]), Turn([7], [8], drop=1)])
    records[1].drop = 2
    records[1].prompt_len -= 1
    with pytest.raises(AssemblyError) as exc:
        assemble(records, decode=decode)
    assert exc.value.kind is ErrorKind.UNPROCESSABLE
    assert "record 1 (turn 1) drops 2 trailing tokens but the previous turn generated only 1" in (
        exc.value.message
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: setattr(r[0], "drop", 1), "record 0 (turn 0) declares drop=1"),
        (lambda r: setattr(r[1], "drop", -1), "drops -1 trailing tokens"),
        (
            lambda r: setattr(r[1], "prompt_len", 99),
            "record 1 (turn 1) has prompt_len 99 but previous checkpoint 5 - drop 0 + bridge 2 = 7",
        ),
        (
            lambda r: setattr(r[1], "logprobs", np.zeros(3, np.float32)),
            "record 1 (turn 1) has 2 output ids but logprobs of shape (3,)",
        ),
        (
            lambda r: setattr(r[0], "bridge_ids", np.zeros(0, np.int32)),
            "record 0 (turn 0) has an empty first prompt",
        ),
        (
            lambda r: setattr(r[0], "output_ids", np.zeros((2, 1), np.int32)),
            "record 0 (turn 0) output_ids must be a 1-D integer array",
        ),
    ],
)
def test_malformed_records_are_unprocessable(mutate, message: str) -> None:
    records = golden()
    mutate(records)
    with pytest.raises(AssemblyError) as exc:
        assemble(records, decode=decode)
    assert message in exc.value.message


# ------------------------------------------------------------------- truncation


def test_max_seq_len_exactly_fits() -> None:
    s = only(assemble(golden(), decode=decode, max_seq_len=9))
    assert s.tokens.tolist() == GOLDEN_TOKENS
    assert s.status == "completed"


def test_truncation_cuts_inside_turn_two() -> None:
    s = only(assemble(golden(), decode=decode, max_seq_len=8))
    assert s.tokens.tolist() == GOLDEN_TOKENS[:8]
    assert s.status == "truncated"
    assert s.response_length == 5
    assert s.loss_mask.tolist() == [1, 1, 0, 0, 1]
    assert s.rollout_log_probs.tolist() == [-0.125, -0.25, 0.0, 0.0, -0.5]
    assert s.response == "10 11 20 21 30"
    assert [seg["turn"] for seg in s.metadata["lifecycle"]] == [1, 2]
    assert s.weight_versions == ["w1", "w2"]


def test_truncation_that_leaves_no_generated_id_drops_the_turn() -> None:
    # 7 tokens: turn 1 would keep only its bridge → dropped; turn 0 stays completed.
    s = only(assemble(golden(), decode=decode, max_seq_len=7))
    assert s.tokens.tolist() == [1, 2, 3, 10, 11]
    assert s.status == "completed"
    assert s.weight_versions == ["w1"]
    assert len(s.metadata["lifecycle"]) == 1


def test_truncation_inside_first_turn() -> None:
    s = only(assemble(golden(), decode=decode, max_seq_len=4))
    assert s.tokens.tolist() == [1, 2, 3, 10]
    assert s.status == "truncated"
    assert s.loss_mask.tolist() == [1]


@pytest.mark.parametrize("max_seq_len", [0, 2, 3])
def test_all_truncated(max_seq_len: int) -> None:
    result = assemble(golden(), decode=decode, max_seq_len=max_seq_len)
    assert result.samples == []
    assert result.empty_reason == "all_truncated"


def test_truncation_applies_after_trim() -> None:
    records = chain([Turn([1], [5, 9]), Turn([9, 2], [3, 4], drop=1)])
    # trimmed sequence [1, 5, 9, 2, 3, 4]: 5 tokens cut turn 1 to one generated id.
    s = only(assemble(records, decode=decode, max_seq_len=5))
    assert s.tokens.tolist() == [1, 5, 9, 2, 3]
    assert s.loss_mask.tolist() == [1, 0, 0, 1]
    assert s.status == "truncated"


# ------------------------------------------------------------------- merge stops


def test_turns_after_an_aborted_turn_are_merged() -> None:
    """The client went on after an aborted reply: every turn is in the sample, the
    aborted one listed with its place; the status is the last turn's."""
    records = chain([Turn([1, 2], [3]), Turn([4], [5, 6], finish="abort"), Turn([7], [8])])
    records[1].finish_message = "Abort by pause_generation(mode=abort)"
    s = only(assemble(records, decode=decode))
    assert s.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert s.loss_mask.tolist() == [1, 0, 1, 1, 0, 1]
    assert s.status == "completed" and len(s.weight_versions) == 3
    assert s.metadata["aborted_turns"] == [
        {"turn": 1, "start": 4, "end": 6, "reason": "Abort by pause_generation(mode=abort)"}]
    assert "aborted_reason" not in s.metadata


def test_turns_after_a_length_cut_are_merged() -> None:
    """A ``length`` cut does not end the trajectory (design §5.6): the cut turn's ids train,
    the closing id the next turn's bridge starts with does not, and the metadata lists
    the cut turn; the status is the last turn's."""
    records = chain([Turn([1, 2], [3], [-0.5]),
                     Turn([4], [5, 6], [-0.25, -0.75], finish="length"),
                     Turn([99, 7], [8], [-1.0])])  # 99: the closer the template added
    s = only(assemble(records, decode=decode))
    assert s.tokens.tolist() == [1, 2, 3, 4, 5, 6, 99, 7, 8]
    assert s.loss_mask.tolist() == [1, 0, 1, 1, 0, 0, 1]
    assert s.rollout_log_probs.tolist() == [-0.5, 0.0, -0.25, -0.75, 0.0, 0.0, -1.0]
    assert s.status == "completed"
    assert s.metadata["length_cut_turns"] == [{"turn": 1, "start": 4, "end": 6}]
    assert [seg["turn"] for seg in s.metadata["lifecycle"]] == [1, 2, 3]


def test_length_cut_last_turn_is_truncated() -> None:
    records = chain([Turn([1, 2], [3], finish="length"), Turn([98, 4], [5], finish="length")])
    s = only(assemble(records, decode=decode))
    assert s.tokens.tolist() == [1, 2, 3, 98, 4, 5]
    assert s.status == "truncated"
    assert [c["turn"] for c in s.metadata["length_cut_turns"]] == [0, 1]


def test_no_length_cut_no_key() -> None:
    assert "length_cut_turns" not in only(assemble(golden(), decode=decode)).metadata


def test_max_seq_len_still_drops_the_turns_after_its_cut() -> None:
    records = chain([Turn([1, 2], [3], finish="length"), Turn([4], [5, 6]), Turn([7], [8])])
    s = only(assemble(records, decode=decode, max_seq_len=5))
    assert s.tokens.tolist() == [1, 2, 3, 4, 5]
    assert s.status == "truncated"
    assert s.metadata["length_cut_turns"] == [{"turn": 0, "start": 2, "end": 3}]


def test_aborted_first_turn_without_output() -> None:
    s = only(assemble(chain([Turn([1, 2], [], finish="abort")]), decode=decode))
    assert s.tokens.tolist() == [1, 2]
    assert s.response_length == 0
    assert s.loss_mask.shape == (0,)
    assert s.status == "aborted"
    assert s.response == ""


# ------------------------------------------------------------------- R3


def full_r3_chain(drop_r3_at: int | None = None, finish: str = "stop") -> list:
    turns = [
        Turn([1, 2, 3], [10, 11]),
        Turn([20, 21], [30, 31]),
        Turn([40], [50, 51], finish=finish),
    ]
    records = chain(turns)
    for i, rec in enumerate(records):
        if i != drop_r3_at:
            snap = snapshot_ids(records[: i + 1])
            rec.routed_experts = routing_oracle(snap.tolist(), len(snap) - 1, 3, 2)
    return records


def test_full_r3_uses_the_last_tensor() -> None:
    records = full_r3_chain()
    s = only(assemble(records, decode=decode))
    assert s.rollout_routed_experts.dtype == np.int32
    assert s.rollout_routed_experts.shape == (11, 3, 2)
    np.testing.assert_array_equal(s.rollout_routed_experts, records[-1].routed_experts)


def test_full_r3_sliced_by_truncation() -> None:
    records = full_r3_chain()
    s = only(assemble(records, decode=decode, max_seq_len=8))
    assert s.status == "truncated"
    assert s.rollout_routed_experts.shape == (7, 3, 2)
    np.testing.assert_array_equal(s.rollout_routed_experts, records[1].routed_experts[:7])


def test_full_r3_gap_stops_the_merge_before_that_turn() -> None:
    s = only(assemble(full_r3_chain(drop_r3_at=1), decode=decode))
    assert s.tokens.tolist() == [1, 2, 3, 10, 11]
    assert s.metadata["merge_stopped"]["reason"] == "routing_replay_gap"
    assert s.metadata["merge_stopped"]["turns_left_out"] >= 1
    np.testing.assert_array_equal(s.rollout_routed_experts, routing_oracle(s.tokens, 4, 3, 2))


def test_r3_missing_on_first_turn_only_is_fine_in_full_mode() -> None:
    s = only(assemble(full_r3_chain(drop_r3_at=0), decode=decode))
    assert len(s.tokens) == 12
    np.testing.assert_array_equal(s.rollout_routed_experts, routing_oracle(s.tokens, 11, 3, 2))


def test_full_r3_too_few_rows_is_unprocessable() -> None:
    records = full_r3_chain()
    records[-1].routed_experts = records[-1].routed_experts[:5]
    with pytest.raises(AssemblyError, match=r"covers 5 rows but the merged sample needs 11"):
        assemble(records, decode=decode)


def test_r3_wrong_dtype_or_shape_is_unprocessable() -> None:
    records = full_r3_chain()
    records[1].routed_experts = records[1].routed_experts.astype(np.int64)
    with pytest.raises(AssemblyError, match=r"record 1 \(turn 1\) must be an int32"):
        assemble(records, decode=decode)
    records = full_r3_chain()
    records[2].routed_experts = records[2].routed_experts[:, :2]
    with pytest.raises(AssemblyError, match=r"have \(layers, top_k\) \(2, 2\) but record 0"):
        assemble(records, decode=decode)


def incremental_chain(*, drops: bool = False) -> tuple[list, np.ndarray]:
    """Additional R3: each turn only carries rows from ``start_len`` on."""
    if drops:
        turns = [Turn([1, 2], [5, 9]), Turn([9, 7], [8, 9], drop=1), Turn([9, 6], [4], drop=1)]
    else:
        turns = [Turn([1, 2, 3], [10, 11]), Turn([20, 21], [30, 31]), Turn([40], [50, 51])]
    records = chain(turns)
    final = snapshot_ids(records)
    reference = routing_oracle(final.tolist(), len(final) - 1)
    checkpoint = 0
    for i, rec in enumerate(records):
        start = 0 if i == 0 else min(checkpoint - 1, checkpoint - rec.drop)
        checkpoint = rec.checkpoint_len
        snap = snapshot_ids(records[: i + 1]).tolist()
        rec.routed_experts = routing_oracle(snap, checkpoint - 1)[start:]
        rec.routed_experts_start_len = start
    return records, reference


@pytest.mark.parametrize("drops", [False, True])
def test_incremental_r3_rebuilds_the_full_tensor(drops: bool) -> None:
    records, reference = incremental_chain(drops=drops)
    assert records[1].routed_experts_start_len > 0
    s = only(assemble(records, decode=decode))
    assert s.rollout_routed_experts.dtype == np.int32
    assert s.rollout_routed_experts.tobytes() == reference.tobytes()


@pytest.mark.parametrize(("max_seq_len", "rows"), [(8, 7), (5, 4), (10, 8), (11, 10)])
def test_incremental_r3_under_truncation(max_seq_len: int, rows: int) -> None:
    records, reference = incremental_chain()
    s = only(assemble(records, decode=decode, max_seq_len=max_seq_len))
    assert len(s.tokens) == rows + 1
    np.testing.assert_array_equal(s.rollout_routed_experts, reference[:rows])


def test_incremental_r3_after_a_trim_discards_dropped_rows() -> None:
    # drop=2: the earlier patch's rows for the dropped tokens must not be kept.
    records = chain([Turn([1, 2], [5, 8, 9]), Turn([3], [4], drop=2)])
    final = snapshot_ids(records).tolist()  # [1, 2, 5, 3, 4]
    records[0].routed_experts = routing_oracle([1, 2, 5, 8, 9], 4)
    records[1].routed_experts = routing_oracle(final, 4)[3:]
    records[1].routed_experts_start_len = 3
    s = only(assemble(records, decode=decode))
    np.testing.assert_array_equal(s.rollout_routed_experts, routing_oracle(final, 4))


@pytest.mark.parametrize(
    ("start", "message"),
    [
        (3, "incremental routing replay: record 1 (turn 1) starts at row 3; rows so far "
            "end at 4 (an overlap of 1 rows)"),
        (5, "incremental routing replay: record 1 (turn 1) starts at row 5; rows so far "
            "end at 4 (a gap of 1 rows)"),
    ],
)
def test_incremental_r3_misaligned_patch_is_unprocessable(start: int, message: str) -> None:
    records, reference = incremental_chain()
    records[1].routed_experts = reference[start:8]
    records[1].routed_experts_start_len = start
    with pytest.raises(AssemblyError) as exc:
        assemble(records, decode=decode)
    assert exc.value.kind is ErrorKind.UNPROCESSABLE
    assert exc.value.message == message


def test_incremental_r3_missing_first_payload_is_unprocessable() -> None:
    records, _ = incremental_chain()
    records[0].routed_experts = None
    with pytest.raises(AssemblyError, match=r"record 0 \(turn 0\) has no routed_experts payload"):
        assemble(records, decode=decode)


def test_incremental_r3_short_last_patch_is_unprocessable() -> None:
    records, _ = incremental_chain()
    records[2].routed_experts = records[2].routed_experts[:1]
    with pytest.raises(
        AssemblyError,
        match=r"incremental routing replay covers 9 rows but the merged sample needs 11",
    ):
        assemble(records, decode=decode)


def test_incremental_r3_gap_turn_stops_the_merge() -> None:
    records, reference = incremental_chain()
    records[2].routed_experts = None
    records[2].routed_experts_start_len = 0
    s = only(assemble(records, decode=decode))
    assert len(s.tokens) == 9
    np.testing.assert_array_equal(s.rollout_routed_experts, reference[:8])


def test_weight_version_spans_follow_mid_turn_updates_and_truncation() -> None:
    """A turn whose weights changed mid-generation reports the engine's spans; spans of one
    version merge across turns; truncation cuts them with the ids."""
    records = golden()
    records[1].weight_version = "w1"
    records[1].weight_spans = [["w1", 0, 1], ["w2", 1, 2]]
    s = only(assemble(records, decode=decode))
    assert s.metadata["weight_version_spans"] == [{"version": "w1", "start": 3, "end": 8},
                                                  {"version": "w2", "start": 8, "end": 9}]
    cut = only(assemble(records, decode=decode, max_seq_len=8))
    assert cut.metadata["weight_version_spans"] == [{"version": "w1", "start": 3, "end": 8}]


def test_aborted_turn_carries_its_reason() -> None:
    records = golden()
    records[1].finish_reason = "abort"
    records[1].finish_message = "Abort by pause_generation(mode=abort)"
    s = only(assemble(records, decode=decode))
    assert s.status == "aborted"
    assert s.metadata["aborted_reason"] == "Abort by pause_generation(mode=abort)"

"""A turn frame keeps a turn's speculative-decoding counters and weight-version spans;
a turn without counters writes no key for them (its frame is as before)."""

from __future__ import annotations

import numpy as np

from tito.server.journal.frames import HEAD, split, turn_frame, turn_of
from tito.session.turns import TurnCommit
from tito.types.records import TurnRecord

SID = "0123456789abcdef0123456789abcdef"


def record(**extra: object) -> TurnRecord:
    return TurnRecord(turn=0, drop=0, bridge_ids=np.array([1, 2], np.int32),
                      output_ids=np.array([5, 6], np.int32),
                      logprobs=np.array([-0.5, -0.25], np.float32), finish_reason="stop",
                      prompt_len=2, weight_version="v2", **extra)  # type: ignore[arg-type]


def round_trip(rec: TurnRecord) -> tuple[dict, TurnRecord]:
    commit = TurnCommit(0, 0, [{"role": "user", "content": "hi"}],
                        {"role": "assistant", "content": "ok"}, None, rec)
    data = turn_frame(SID, commit, 1)
    header, arrays = split(memoryview(data[HEAD.size:]))
    return header, turn_of(header, arrays).record


def test_counters_and_spans_survive() -> None:
    counters = {"spec_verify_ct": 1, "spec_num_correct_drafts": 1}
    header, back = round_trip(record(spec_info=counters,
                                     weight_spans=[["v1", 0, 1], ["v2", 1, 2]]))
    assert header["record"]["spec_info"] == counters
    assert back.spec_info == counters and back.weight_spans == [["v1", 0, 1], ["v2", 1, 2]]


def test_no_counters_no_key() -> None:
    header, back = round_trip(record())
    assert "spec_info" not in header["record"] and back.spec_info is None

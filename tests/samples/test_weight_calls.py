"""Per-call weight version spans and speculative-decoding counters of assembled samples,
and both ``weight_versions`` wire formats (the reference framework's merged list of
strings and its newer ``WeightVersionsPerCall`` spans)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import safetensors.numpy

from tito.samples import META_KEY, CodecError, assemble, decode_samples, encode_samples
from tito.samples.sample import sample_problem

from .helpers import Turn, chain, decode

SPEC = {"spec_verify_ct": 2, "spec_num_correct_drafts": 1, "spec_num_proposed_drafts": 6}


def trimmed_chain() -> list:
    """Turn 0 generates [5, 9] under v1 then v2 (9: a stop id the next template drops);
    turn 1 [8, 9] under v2; turn 2 [4] with no version reported."""
    return chain([
        Turn([1, 2], [5, 9], weight_version="v2",
             extra={"weight_spans": [["v1", 0, 1], ["v2", 1, 2]], "spec_info": SPEC}),
        Turn([9, 7], [8, 9], drop=1, weight_version="v2",
             extra={"spec_info": {"spec_verify_ct": 1, "spec_accept_token_num": 1,
                                  "spec_draft_token_num": 3}}),
        Turn([9, 6], [4], drop=1),
    ])


def test_calls_are_absolute_clipped_to_kept_ids_and_one_per_turn() -> None:
    [s] = assemble(trimmed_chain(), decode=decode).samples
    assert s.tokens.tolist() == [1, 2, 5, 9, 7, 8, 9, 6, 4]
    # turn 0 kept only [5] (its 9 was dropped): the v2 span after it is gone
    assert s.weight_version_calls == [
        [{"version": "v1", "abs_start": 2, "abs_end": 3}],
        [{"version": "v2", "abs_start": 5, "abs_end": 6}],
        [],
    ]
    assert s.weight_versions == ["v2", "v2", None]
    assert sample_problem(s) is None


def test_a_max_seq_len_cut_clips_the_last_call() -> None:
    records = chain([Turn([1, 2], [5, 6, 7], weight_version="v1",
                          extra={"weight_spans": [["v1", 0, 1], ["v2", 1, 3]]})])
    [s] = assemble(records, decode=decode, max_seq_len=4).samples
    assert s.weight_version_calls == [[{"version": "v1", "abs_start": 2, "abs_end": 3},
                                       {"version": "v2", "abs_start": 3, "abs_end": 4}]]


def test_spec_info_sums_both_namings_and_lists_each_turn() -> None:
    [s] = assemble(trimmed_chain(), decode=decode).samples
    assert s.spec_info == {"spec_num_correct_drafts": 2, "spec_num_proposed_drafts": 9,
                           "spec_verify_ct": 3, "completion_tokens": 4}
    assert s.metadata["spec_info_turns"] == [
        {"turn": 0, **SPEC},
        {"turn": 1, "spec_verify_ct": 1, "spec_accept_token_num": 1,
         "spec_draft_token_num": 3}]


def test_no_spec_counters_no_keys() -> None:
    [s] = assemble(chain([Turn([1, 2], [5], weight_version="v1")]), decode=decode).samples
    assert s.spec_info is None and "spec_info_turns" not in s.metadata


def test_the_default_wire_is_unchanged_and_spans_round_trip() -> None:
    [s] = assemble(trimmed_chain(), decode=decode).samples
    default = encode_samples([s], session_metadata={}, empty_reason=None)
    s.spec_info, spec = None, s.spec_info
    plain = encode_samples([s], session_metadata={}, empty_reason=None)
    s.spec_info = spec
    assert b"turn_weight_versions" not in default and b"abs_start" not in default
    assert b'"spec_info"' in default and b'"spec_info"' not in plain  # only when reported

    [back] = decode_samples(default).samples
    assert back.weight_versions == ["v2", "v2", None] and back.weight_version_calls == []
    assert back.spec_info == s.spec_info

    spans = encode_samples([s], session_metadata={}, empty_reason=None,
                           weight_versions_format="spans")
    [back] = decode_samples(spans).samples
    assert back.weight_version_calls == s.weight_version_calls
    assert back.weight_versions == ["v2", "v2", None]  # from turn_weight_versions


def test_a_spans_payload_without_strings_takes_each_calls_last_version() -> None:
    [s] = assemble(trimmed_chain(), decode=decode).samples
    s.weight_versions = []  # as a reference server writing only its per-call spans would
    payload = encode_samples([s], session_metadata={}, empty_reason=None,
                             weight_versions_format="spans")
    tensors = safetensors.numpy.load(payload)
    meta = orjson.loads(tensors[META_KEY].tobytes())
    del meta["samples"][0]["turn_weight_versions"]
    tensors[META_KEY] = np.frombuffer(orjson.dumps(meta), dtype=np.uint8).copy()
    [back] = decode_samples(safetensors.numpy.save(tensors)).samples
    assert back.weight_versions == ["v1", "v2", None]


@pytest.mark.parametrize("calls, message", [
    ([[{"version": "v1", "abs_start": 3, "abs_end": 2}]], "invalid weight version span"),
    ([[{"version": "v1", "abs_start": 0, "abs_end": 99}]], "invalid weight version span"),
    ([[{"version": "v1", "abs_start": 2, "abs_end": 4}],
      [{"version": "v1", "abs_start": 3, "abs_end": 4}]], "invalid weight version span"),
    ([[{"version": "", "abs_start": 0, "abs_end": 1}]], "non-empty str"),
    ([{"version": "v1", "abs_start": 0, "abs_end": 1}], "list of lists"),
])
def test_bad_calls_are_refused_by_the_codec(calls: list, message: str) -> None:
    [s] = assemble(chain([Turn([1, 2], [5, 6], weight_version="v1")]), decode=decode).samples
    s.weight_version_calls = calls
    with pytest.raises(CodecError, match=message):
        encode_samples([s], session_metadata={}, empty_reason=None,
                       weight_versions_format="spans")


def test_an_unknown_format_is_refused() -> None:
    [s] = assemble(chain([Turn([1, 2], [5], weight_version="v1")]), decode=decode).samples
    with pytest.raises(CodecError, match="weight_versions_format"):
        encode_samples([s], session_metadata={}, empty_reason=None,
                       weight_versions_format="strings")
    assert np.asarray(s.tokens).tolist() == [1, 2, 5]

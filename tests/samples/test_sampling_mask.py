"""Sampling-mask replay in assembly and on the samples wire: kept sets follow the
response region (none on bridge ids), a declared trim and a truncation cut them in
lockstep, a turn without its sets is an error naming it, and the decoder rejects
malformed ids/offsets while a payload without the feature is unchanged."""

from __future__ import annotations

import itertools

import numpy as np
import orjson
import pytest
import safetensors.numpy

from tito.samples import CodecError, assemble, decode_samples, encode_samples
from tito.samples.sample import Sample
from tito.types.errors import AssemblyError
from tito.types.records import TurnRecord

from .helpers import Turn, chain, decode


def with_masks(records: list[TurnRecord], sets: list[list[list[int]]]) -> list[TurnRecord]:
    for rec, turn_sets in zip(records, sets, strict=True):
        rec.sampling_mask_ids = np.array([t for s in turn_sets for t in s], np.int32)
        rec.sampling_mask_offsets = np.concatenate(
            [[0], np.cumsum([len(s) for s in turn_sets])]).astype(np.int64)
    return records


def kept_sets(sample: Sample) -> list[list[int]]:
    ids, offsets = sample.rollout_sampling_mask, sample.rollout_sampling_mask_offsets
    assert ids is not None and offsets is not None
    assert ids.dtype == np.int32 and offsets.dtype == np.int64
    return [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)]


def records() -> list[TurnRecord]:
    return with_masks(chain([Turn([1, 2], [10, 11, 12]), Turn([20], [30, 31], drop=1)]),
                      [[[10, 5], [11], [12, 7, 8]], [[30, 9], [31]]])


def test_sets_follow_the_response_with_the_trim() -> None:
    [sample] = assemble(records(), decode=decode, sampling_mask=True).samples
    # turn 1 dropped turn 0's last id (12) with its set; the bridge id 20 keeps none
    assert sample.tokens.tolist() == [1, 2, 10, 11, 20, 30, 31]
    assert kept_sets(sample) == [[10, 5], [11], [], [30, 9], [31]]


def test_truncation_cuts_the_sets() -> None:
    [sample] = assemble(records(), decode=decode, max_seq_len=6, sampling_mask=True).samples
    assert sample.status == "truncated"
    assert kept_sets(sample) == [[10, 5], [11], [], [30, 9]]


def test_a_turn_without_sets_is_an_error_naming_it() -> None:
    recs = records()
    recs[1].sampling_mask_ids = recs[1].sampling_mask_offsets = None
    with pytest.raises(AssemblyError, match="kept turn 1 has no sampling mask"):
        assemble(recs, decode=decode)
    bare = chain([Turn([1, 2], [10])])
    assert assemble(bare, decode=decode).samples[0].rollout_sampling_mask is None
    with pytest.raises(AssemblyError, match="kept turn 0 has no sampling mask"):
        assemble(bare, decode=decode, sampling_mask=True)


def test_offsets_that_do_not_fit_the_output_are_an_error() -> None:
    recs = records()
    recs[0].sampling_mask_offsets = np.array([0, 2, 3], np.int64)  # 3 output ids
    with pytest.raises(AssemblyError, match="3 output ids but sampling-mask offsets"):
        assemble(recs, decode=decode, sampling_mask=True)


def test_wire_round_trip_and_off_is_unchanged() -> None:
    [sample] = assemble(records(), decode=decode, sampling_mask=True).samples
    payload = encode_samples([sample], session_metadata={}, empty_reason=None)
    [back] = decode_samples(payload).samples
    assert kept_sets(back) == kept_sets(sample)
    [plain] = assemble(records(), decode=decode).samples  # records have sets: kept anyway
    plain.rollout_sampling_mask = plain.rollout_sampling_mask_offsets = None
    off = encode_samples([plain], session_metadata={}, empty_reason=None)
    assert b"rollout_sampling_mask" not in off  # no tensor, no null marker
    assert decode_samples(off).samples[0].rollout_sampling_mask is None


def corrupt(**tensors: np.ndarray) -> bytes:
    [sample] = assemble(records(), decode=decode, sampling_mask=True).samples
    parts = safetensors.numpy.load(
        encode_samples([sample], session_metadata={}, empty_reason=None))
    meta = orjson.loads(parts.pop("_samples_meta").tobytes())
    for name, value in tensors.items():
        if value.size == 0 and value.dtype == np.bool_:
            parts.pop(name)
        else:
            parts[name] = value
    return safetensors.numpy.save({**parts, "_samples_meta": np.frombuffer(
        orjson.dumps(meta), np.uint8)})


@pytest.mark.parametrize(("tensors", "message"), [
    ({"rollout_sampling_mask_offsets.0": np.zeros(0, np.bool_)}, "come together"),
    ({"rollout_sampling_mask.0": np.zeros(0, np.bool_)}, "come together"),
    ({"rollout_sampling_mask.0": np.arange(8, dtype=np.int64)}, "must have dtype int32"),
    ({"rollout_sampling_mask_offsets.0": np.array([0, 2, 3], np.int64)},
     r"rollout_sampling_mask_offsets has 3 entries but response_length \+ 1 is 6"),
    ({"rollout_sampling_mask_offsets.0": np.array([0, 3, 2, 4, 6, 8], np.int64)},
     "without decreasing"),
    ({"rollout_sampling_mask_offsets.0": np.array([1, 2, 3, 4, 6, 8], np.int64)},
     "without decreasing"),
    ({"rollout_sampling_mask_offsets.0": np.array([0, 2, 3, 3, 5, 9], np.int64)},
     "without decreasing"),
    ({"rollout_sampling_mask.0": np.zeros((2, 4), np.int32)}, "must be a 1-D array"),
])
def test_decoder_rejects_malformed_masks(tensors: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode_samples(corrupt(**tensors))

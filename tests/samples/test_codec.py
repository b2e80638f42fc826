"""Samples wire codec: round trips and every decode rejection with its message."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import safetensors.numpy

from tito.samples import (
    CodecError,
    Sample,
    assemble,
    decode_samples,
    encode_samples,
    samples_identical,
)
from tito.types.records import snapshot_ids

from .helpers import Turn, chain, decode, routing_oracle


def golden_sample() -> Sample:
    records = chain(
        [
            Turn([1, 2, 3], [10, 11], [-0.125, -0.25], weight_version="w1"),
            Turn([20, 21], [30, 31], [-0.5, -1.0], weight_version="w2"),
        ]
    )
    records[-1].routed_experts = routing_oracle(snapshot_ids(records).tolist(), 8, 3, 2)
    return assemble(records, decode=decode, metadata={"agent": "a"}).samples[0]


def plain_sample(**overrides: object) -> Sample:
    fields: dict = {
        "tokens": np.array([5, 6, 7], np.int64),
        "response_length": 2,
        "loss_mask": np.array([1, 0], np.uint8),
        "rollout_log_probs": np.array([-0.5, 0.0], np.float64),
        "rollout_routed_experts": None,
        "response": "6 7",
        "status": "completed",
        "weight_versions": ["w"],
        "metadata": {"m": 1},
        "reward": None,
    }
    fields.update(overrides)
    return Sample(**fields)


def roundtrip(samples: list[Sample], **kwargs: object):
    kwargs.setdefault("session_metadata", {"s": 1})
    kwargs.setdefault("empty_reason", None)
    return decode_samples(encode_samples(samples, **kwargs))


# ------------------------------------------------------------------- round trips


def test_golden_round_trip_and_container_layout() -> None:
    sample = golden_sample()
    sample.reward = 0.75
    data = encode_samples(
        [sample], session_metadata={"tito_session_mismatch": []}, empty_reason=None
    )
    raw = safetensors.numpy.load(data)
    assert sorted(raw) == [
        "_samples_meta",
        "loss_mask.0",
        "rollout_log_probs.0",
        "rollout_routed_experts.0",
        "tokens.0",
    ]
    assert raw["_samples_meta"].dtype == np.uint8 and raw["_samples_meta"].ndim == 1
    meta = orjson.loads(raw["_samples_meta"].tobytes())
    assert meta["format_version"] == 1
    assert meta["empty_reason"] is None
    assert meta["samples"][0]["nulls"] == ["rollout_indexer_topk"]
    decoded = decode_samples(data)
    assert decoded.session_metadata == {"tito_session_mismatch": []}
    assert decoded.empty_reason is None
    [back] = decoded.samples
    assert samples_identical(back, sample)
    assert back.reward == 0.75
    assert back.tokens.dtype == np.int64
    assert back.rollout_routed_experts.dtype == np.int32
    assert back.rollout_routed_experts.flags.writeable


def test_floats_round_trip_bit_exactly() -> None:
    # -0.0, +0.0, smallest subnormal, -inf, +inf, 1/3, a NaN with a payload, -1.0
    bits = np.array(
        [0x8000000000000000, 0, 1, 0xFFF0000000000000, 0x7FF0000000000000,
         0x3FD5555555555555, 0x7FF8000000001234, 0xBFF0000000000000],
        dtype=np.uint64,
    )

    def with_logprobs(logprobs: np.ndarray) -> Sample:
        return plain_sample(
            tokens=np.arange(9, dtype=np.int64),
            response_length=8,
            loss_mask=np.ones(8, np.uint8),
            rollout_log_probs=logprobs,
            reward=-0.0,
        )

    sample = with_logprobs(bits.view(np.float64))
    [back] = roundtrip([sample]).samples
    assert back.rollout_log_probs.view(np.uint64).tolist() == bits.tolist()
    assert np.signbit(back.reward)
    assert samples_identical(back, sample)
    positive_zero = bits.copy()
    positive_zero[0] = 0
    assert not samples_identical(back, with_logprobs(positive_zero.view(np.float64)))


def test_zero_size_arrays_are_not_none() -> None:
    sample = plain_sample(
        tokens=np.zeros(0, np.int64),
        response_length=0,
        loss_mask=np.zeros(0, np.uint8),
        rollout_log_probs=np.zeros(0, np.float64),
        rollout_routed_experts=np.zeros((0, 3, 2), np.int32),
    )
    [back] = roundtrip([sample]).samples
    assert samples_identical(back, sample)
    assert back.rollout_routed_experts is not None
    assert back.rollout_routed_experts.shape == (0, 3, 2)
    assert back.loss_mask is not None and back.loss_mask.shape == (0,)


def test_none_tensors_stay_none() -> None:
    sample = plain_sample(loss_mask=None, rollout_log_probs=None, rollout_routed_experts=None)
    data = encode_samples([sample], session_metadata={}, empty_reason=None)
    raw = safetensors.numpy.load(data)
    assert sorted(raw) == ["_samples_meta", "tokens.0"]
    meta = orjson.loads(raw["_samples_meta"].tobytes())
    assert meta["samples"][0]["nulls"] == [
        "loss_mask",
        "rollout_log_probs",
        "rollout_routed_experts",
        "rollout_indexer_topk",
    ]
    [back] = decode_samples(data).samples
    assert back.loss_mask is None and back.rollout_log_probs is None
    assert back.rollout_routed_experts is None
    assert samples_identical(back, sample)


def test_multiple_samples_are_independent() -> None:
    a = golden_sample()
    b = plain_sample(reward=1.0, status="aborted", weight_versions=[None])
    decoded = roundtrip([a, b])
    assert [samples_identical(x, y) for x, y in zip(decoded.samples, [a, b], strict=True)] == [
        True,
        True,
    ]
    decoded.samples[0].metadata["new"] = 1
    assert "new" not in decoded.samples[1].metadata
    assert decoded.samples[1].reward == 1.0 and isinstance(decoded.samples[1].reward, float)


@pytest.mark.parametrize("reason", ["no_records", "all_truncated"])
def test_empty_reply_round_trips_its_reason(reason: str) -> None:
    decoded = roundtrip([], session_metadata={"x": [1, 2]}, empty_reason=reason)
    assert decoded.samples == []
    assert decoded.empty_reason == reason
    assert decoded.session_metadata == {"x": [1, 2]}


def test_non_contiguous_arrays_serialize_their_values() -> None:
    r3 = np.arange(2 * 3 * 2, dtype=np.int32).reshape(2, 2, 3).transpose(0, 2, 1)[:, ::-1]
    logprobs = (np.arange(4, dtype=np.float64) - 5)[::2]
    tokens = np.arange(6, dtype=np.int64)[::2]
    for arr in (r3, logprobs, tokens):
        assert not arr.flags.c_contiguous
    sample = plain_sample(tokens=tokens, rollout_log_probs=logprobs, rollout_routed_experts=r3)
    [back] = roundtrip([sample]).samples
    assert samples_identical(back, sample)
    assert back.rollout_routed_experts.tolist() == r3.tolist()
    assert back.rollout_log_probs.tolist() == [-5.0, -3.0]
    assert back.tokens.tolist() == [0, 2, 4]


def test_value_preserving_conversions() -> None:
    sample = plain_sample(
        tokens=np.array([5, 6, 7], np.int32),
        loss_mask=np.array([True, False]),
        rollout_log_probs=np.array([-0.5, 0.25], np.float32),
    )
    [back] = roundtrip([sample]).samples
    assert back.tokens.dtype == np.int64 and back.tokens.tolist() == [5, 6, 7]
    assert back.loss_mask.dtype == np.uint8 and back.loss_mask.tolist() == [1, 0]
    assert back.rollout_log_probs.dtype == np.float64  # float32 widens exactly
    assert back.rollout_log_probs.tolist() == [-0.5, 0.25]


def test_numpy_values_in_metadata_are_serialized() -> None:
    decoded = roundtrip(
        [],
        session_metadata={"ids": np.array([1, 2], np.int32), "n": np.int64(3)},
        empty_reason="no_records",
    )
    assert decoded.session_metadata == {"ids": [1, 2], "n": 3}


# ------------------------------------------------------------------- encode rejections


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"loss_mask": np.array([1, -1], np.int64)},
            "sample 0: loss_mask values do not fit wire dtype uint8",
        ),
        (
            {"loss_mask": np.array([1, 256], np.int64)},
            "sample 0: loss_mask values do not fit wire dtype uint8",
        ),
        (
            {"tokens": np.array([5, 6, 2**63], np.uint64)},
            "sample 0: tokens values do not fit wire dtype int64",
        ),
        ({"tokens": np.array([5, 6.5, 7])}, "sample 0: tokens values do not fit wire dtype int64"),
        (
            {"rollout_log_probs": np.array([-0.5, 0.0], np.complex128) + 1j},
            "sample 0: rollout_log_probs values do not fit wire dtype float64",
        ),
        (
            {"rollout_routed_experts": np.zeros((2, 1, 1), np.int64)},
            "sample 0: rollout_routed_experts must have dtype int32, got int64",
        ),
        (
            {"loss_mask": np.array([1, 0, 1], np.uint8)},
            "sample 0: loss_mask has 3 entries but response_length is 2",
        ),
        ({"reward": float("nan")}, "sample 0: reward must be finite, got nan"),
        ({"metadata": {"bad": object()}}, "_samples_meta cannot be serialized as JSON"),
    ],
)
def test_encode_rejections(overrides: dict, message: str) -> None:
    with pytest.raises(CodecError) as exc:
        encode_samples([plain_sample(**overrides)], session_metadata={}, empty_reason=None)
    assert message in str(exc.value)


def test_encode_rejects_inconsistent_empty_reason() -> None:
    with pytest.raises(CodecError, match="an empty reply needs a reason"):
        encode_samples([], session_metadata={}, empty_reason=None)
    with pytest.raises(CodecError, match="'no_records' is inconsistent with 1 samples"):
        encode_samples([plain_sample()], session_metadata={}, empty_reason="no_records")
    with pytest.raises(CodecError, match="empty_reason must be one of"):
        encode_samples([], session_metadata={}, empty_reason="bored")


# ------------------------------------------------------------------- decode rejections


def good_parts() -> tuple[dict[str, np.ndarray], dict]:
    """The tensors and meta document of a valid two-sample payload, to corrupt."""
    a = golden_sample()
    b = plain_sample(rollout_routed_experts=None)
    tensors = safetensors.numpy.load(
        encode_samples([a, b], session_metadata={"s": 1}, empty_reason=None)
    )
    meta = orjson.loads(tensors.pop("_samples_meta").tobytes())
    return tensors, meta


def pack(tensors: dict[str, np.ndarray], meta: object | bytes) -> bytes:
    raw = meta if isinstance(meta, bytes) else orjson.dumps(meta)
    return safetensors.numpy.save({**tensors, "_samples_meta": np.frombuffer(raw, np.uint8)})


def rejects(data: bytes, message: str) -> None:
    with pytest.raises(CodecError) as exc:
        decode_samples(data)
    assert isinstance(exc.value, ValueError)
    assert message in str(exc.value), str(exc.value)


def test_good_parts_decode() -> None:
    tensors, meta = good_parts()
    assert len(decode_samples(pack(tensors, meta)).samples) == 2


def test_rejects_invalid_container() -> None:
    rejects(b"definitely not safetensors", "invalid safetensors container")
    tensors, meta = good_parts()
    rejects(pack(tensors, meta)[:-7], "invalid safetensors container")
    rejects(b"", "invalid safetensors container")


def test_rejects_missing_meta() -> None:
    tensors, _ = good_parts()
    rejects(safetensors.numpy.save(tensors), "payload has no _samples_meta tensor")


@pytest.mark.parametrize(
    ("meta_tensor", "message"),
    [
        (np.zeros(4, np.int8), "_samples_meta must be a rank-one uint8 tensor, got int8"),
        (
            np.zeros((2, 2), np.uint8),
            "_samples_meta must be a rank-one uint8 tensor, got uint8 with shape (2, 2)",
        ),
    ],
)
def test_rejects_bad_meta_tensor(meta_tensor: np.ndarray, message: str) -> None:
    tensors, _ = good_parts()
    rejects(safetensors.numpy.save({**tensors, "_samples_meta": meta_tensor}), message)


def test_rejects_bad_json_and_versions() -> None:
    tensors, meta = good_parts()
    rejects(pack(tensors, b"{not json"), "_samples_meta is not valid UTF-8 JSON")
    rejects(pack(tensors, b"\xff\xfe"), "_samples_meta is not valid UTF-8 JSON")
    rejects(pack(tensors, [1, 2]), "_samples_meta must be a JSON object, got array")
    rejects(
        pack(tensors, {**meta, "format_version": 2}),
        "unsupported _samples_meta format_version 2 (supported: 1, or none",
    )
    rejects(
        pack(tensors, {**meta, "format_version": True}),
        "unsupported _samples_meta format_version True",
    )
    # no format_version: the reference framework's layout, which requires its own keys
    no_version = {k: v for k, v in meta.items() if k != "format_version"}
    assert len(decode_samples(pack(tensors, no_version)).samples) == 2
    del no_version["samples"][0]["prefix_cache_info"]
    rejects(pack(tensors, no_version), "sample 0 meta lacks keys: ['prefix_cache_info']")
    no_samples = {k: v for k, v in meta.items() if k != "samples"}
    rejects(pack(tensors, no_samples), "_samples_meta lacks keys: ['samples']")
    rejects(pack(tensors, {**meta, "samples": {}}), "_samples_meta samples must be a list")


def test_rejects_bad_envelope() -> None:
    tensors, meta = good_parts()
    rejects(
        pack(tensors, {**meta, "session_metadata": [1]}),
        "decode: session_metadata must be an object, got array",
    )
    rejects(
        pack(tensors, {**meta, "empty_reason": "no_records"}),
        "decode: empty_reason 'no_records' is inconsistent with 2 samples",
    )
    rejects(
        pack(tensors, {**meta, "empty_reason": "whatever"}), "decode: empty_reason must be one of"
    )


def test_rejects_missing_promised_tensor() -> None:
    tensors, meta = good_parts()
    del tensors["loss_mask.1"]
    rejects(pack(tensors, meta), "payload lacks promised tensor loss_mask.1")


@pytest.mark.parametrize(
    ("key", "bad", "message"),
    [
        ("tokens.0", np.int32, "tokens.0 must have dtype int64, got int32"),
        ("loss_mask.1", np.int64, "loss_mask.1 must have dtype uint8, got int64"),
        (
            "rollout_log_probs.0",
            np.float32,
            "rollout_log_probs.0 must have dtype float64, got float32",
        ),
        (
            "rollout_routed_experts.0",
            np.int64,
            "rollout_routed_experts.0 must have dtype int32, got int64",
        ),
    ],
)
def test_rejects_wrong_dtype(key: str, bad: type, message: str) -> None:
    tensors, meta = good_parts()
    tensors[key] = tensors[key].astype(bad)
    rejects(pack(tensors, meta), message)


def test_rejects_bad_null_markers() -> None:
    tensors, meta = good_parts()
    meta["samples"][1]["nulls"] = ["rollout_routed_experts", "response"]
    rejects(pack(tensors, meta), "sample 1: null markers reference non-tensor fields: ['response']")
    tensors, meta = good_parts()
    meta["samples"][0]["nulls"] = ["tokens"]
    rejects(pack(tensors, meta), "sample 0: null markers reference non-nullable fields: ['tokens']")
    meta["samples"][0]["nulls"] = "loss_mask"
    rejects(pack(tensors, meta), "sample 0: nulls must be a list of field names")


def test_rejects_orphan_tensors() -> None:
    tensors, meta = good_parts()
    tensors["extra.0"] = np.zeros(1, np.int64)
    tensors["tokens.7"] = np.zeros(1, np.int64)
    rejects(pack(tensors, meta), "payload carries unreferenced tensors: ['extra.0', 'tokens.7']")
    # A tensor that is present but also marked null is unreferenced too.
    tensors, meta = good_parts()
    meta["samples"][0]["nulls"] = ["rollout_routed_experts", "rollout_indexer_topk"]
    rejects(
        pack(tensors, meta), "payload carries unreferenced tensors: ['rollout_routed_experts.0']"
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("metadata", [1], "sample 0: metadata must be an object, got list"),
        ("metadata", None, "sample 0: metadata must be an object, got NoneType"),
        ("response_length", 10, "sample 0: response_length 10 exceeds len(tokens) 9"),
        ("response_length", 5, "sample 0: loss_mask has 6 entries but response_length is 5"),
        ("response_length", 6.0, "sample 0: response_length must be a non-negative int"),
        ("response_length", -1, "sample 0: response_length must be a non-negative int"),
        ("status", "running", "sample 0: status must be one of"),
        ("response", 3, "sample 0: response must be a str or null, got int"),
        ("weight_versions", [1], "sample 0: weight_versions must be a list of str or null"),
        ("reward", True, "sample 0: reward must be a number or null, got True"),
    ],
)
def test_rejects_bad_json_fields(field: str, value: object, message: str) -> None:
    tensors, meta = good_parts()
    meta["samples"][0][field] = value
    rejects(pack(tensors, meta), message)


def test_rejects_inconsistent_tensor_lengths() -> None:
    tensors, meta = good_parts()
    tensors["rollout_log_probs.1"] = np.zeros(3, np.float64)
    rejects(
        pack(tensors, meta), "sample 1: rollout_log_probs has 3 entries but response_length is 2"
    )
    tensors, meta = good_parts()
    tensors["rollout_routed_experts.0"] = tensors["rollout_routed_experts.0"][:5]
    rejects(
        pack(tensors, meta), "sample 0: rollout_routed_experts has 5 rows but len(tokens) - 1 is 8"
    )
    tensors, meta = good_parts()
    tensors["tokens.1"] = np.zeros((3, 1), np.int64)
    rejects(pack(tensors, meta), "sample 1: tokens must be a 1-D array")


def test_rejects_sample_meta_shape() -> None:
    tensors, meta = good_parts()
    meta["samples"][0] = [1]
    rejects(pack(tensors, meta), "sample 0 meta must be an object, got array")
    tensors, meta = good_parts()
    del meta["samples"][1]["reward"]
    rejects(pack(tensors, meta), "sample 1 meta lacks keys: ['reward']")


def test_null_response_round_trips() -> None:
    sample = Sample(tokens=np.arange(5, dtype=np.int64), response_length=2,
                    loss_mask=np.ones(2, dtype=np.uint8),
                    rollout_log_probs=np.full(2, -0.5, dtype=np.float64), response=None)
    decoded = decode_samples(encode_samples([sample], session_metadata={}, empty_reason=None))
    assert decoded.samples[0].response is None
    assert decoded.samples[0].tokens.tolist() == [0, 1, 2, 3, 4]


def test_indexer_topk_round_trips() -> None:
    rows = np.arange(2 * 2 * 3, dtype=np.int32).reshape(2, 2, 3)
    [back] = roundtrip([plain_sample(rollout_indexer_topk=rows)]).samples
    assert back.rollout_indexer_topk is not None
    assert back.rollout_indexer_topk.dtype == np.int32
    assert np.array_equal(back.rollout_indexer_topk, rows)

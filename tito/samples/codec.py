"""Wire codec of the samples reply (design §6, "Wire format").

One safetensors container:

* per-sample tensors ``<field>.<index>`` with fixed dtypes: ``tokens`` int64,
  ``loss_mask`` uint8, ``rollout_log_probs`` float64, ``rollout_routed_experts`` and
  ``rollout_indexer_topk`` int32; with sampling-mask replay, ``rollout_sampling_mask``
  int32 (kept ids) and ``rollout_sampling_mask_offsets`` int64 (``response_length + 1``),
  both left out entirely (no null marker) when the feature is off;
* ``_samples_meta``: a rank-1 uint8 tensor holding compact UTF-8 JSON::

    {"format_version": 1,
     "samples": [{"response", "response_length", "status", "weight_versions",
                  "metadata", "reward", "prefix_cache_info", "spec_info"?,
                  "nulls": [<tensor fields that are None>]}],
     "session_metadata": {...},
     "empty_reason": null | "no_records" | "all_truncated" | "incomplete"}

``weight_versions`` is one version string per kept turn (format ``versions``, the
default and the reference framework's merged wire), or with ``weight_versions_format
spans`` one list per kept turn of ``{"version", "abs_start", "abs_end"}`` spans over
``tokens`` (its newer ``WeightVersionsPerCall`` wire), the strings then riding along as
``turn_weight_versions``. ``spec_info`` (speculative-decoding counters) is there only
when a kept turn reported some.

Encoding makes arrays contiguous and converts a dtype only when every value survives
(routed experts must already be int32). Decoding trusts nothing: every missing, extra,
mis-typed or inconsistent part is a :class:`CodecError` with a precise message. Tensor
bytes are copied verbatim, so floats round-trip bit-exactly (``-0.0``, NaN payloads);
a zero-size tensor stays a zero-size array and is distinct from None.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import safetensors.numpy

from tito.samples.sample import (
    LOGPROBS_DTYPE,
    LOSS_MASK_DTYPE,
    ROUTED_EXPERTS_DTYPE,
    SAMPLING_MASK_DTYPE,
    SAMPLING_MASK_OFFSETS_DTYPE,
    TOKENS_DTYPE,
    Sample,
    sample_problem,
)

FORMAT_VERSION = 1
META_KEY = "_samples_meta"
EMPTY_REASONS: tuple[str | None, ...] = (None, "no_records", "all_truncated", "incomplete")
"""``incomplete``: a finished snapshot whose producer did not finish, or whose turns
were still running when its finish timed out (no samples)."""


@dataclass(frozen=True, slots=True)
class _TensorField:
    name: str
    dtype: np.dtype
    strict: bool
    """Strict fields must already have the wire dtype (no conversion)."""
    nullable: bool
    optional: bool = False
    """Left out entirely when None (no tensor, no null marker), so a payload without the
    feature is byte-identical to one from before the field existed; absent on decode:
    None."""


TENSOR_FIELDS: tuple[_TensorField, ...] = (
    _TensorField("tokens", TOKENS_DTYPE, strict=False, nullable=False),
    _TensorField("loss_mask", LOSS_MASK_DTYPE, strict=False, nullable=True),
    _TensorField("rollout_log_probs", LOGPROBS_DTYPE, strict=False, nullable=True),
    _TensorField("rollout_routed_experts", ROUTED_EXPERTS_DTYPE, strict=True, nullable=True),
    _TensorField("rollout_indexer_topk", ROUTED_EXPERTS_DTYPE, strict=True, nullable=True),
    _TensorField("rollout_sampling_mask", SAMPLING_MASK_DTYPE, strict=True, nullable=True,
                 optional=True),
    _TensorField("rollout_sampling_mask_offsets", SAMPLING_MASK_OFFSETS_DTYPE, strict=True,
                 nullable=True, optional=True),
)
_TENSOR_NAMES = frozenset(f.name for f in TENSOR_FIELDS)
_JSON_KEYS = ("response", "response_length", "status", "weight_versions", "metadata", "reward")
_REFERENCE_KEYS = ("response", "response_length", "status", "weight_versions",
                   "prefix_cache_info", "metadata")
"""The reference framework's per-sample keys (its v2 adds ``reward``)."""
WEIGHT_VERSIONS_FORMATS = ("versions", "spans")
"""``weight_versions`` on the wire: a version string per kept turn, or per-call spans."""
REFERENCE_LAYOUT = 0
"""A ``_samples_meta`` without ``format_version``: written by the reference session server."""


class CodecError(ValueError):
    """A samples payload that cannot be encoded or decoded; the message says exactly why."""


@dataclass(frozen=True, slots=True)
class DecodedSamples:
    """A decoded samples reply."""

    samples: list[Sample]
    session_metadata: dict[str, Any]
    empty_reason: str | None


# --------------------------------------------------------------------------- encode


def encode_samples(
    samples: Sequence[Sample], *, session_metadata: dict[str, Any], empty_reason: str | None,
    weight_versions_format: str = "versions",
) -> bytes:
    """Serialize ``samples`` and the session metadata into one safetensors container.

    ``empty_reason`` must be None exactly when ``samples`` is non-empty.
    ``weight_versions_format``: ``versions`` or ``spans`` (see the module). JSON values may
    hold numpy scalars/arrays (they decode as plain numbers/lists); a non-finite reward
    or a value JSON cannot hold is a :class:`CodecError`.
    """
    _check_envelope(len(samples), session_metadata, empty_reason, where="encode")
    if weight_versions_format not in WEIGHT_VERSIONS_FORMATS:
        raise CodecError(f"weight_versions_format must be one of "
                         f"{list(WEIGHT_VERSIONS_FORMATS)}, got {weight_versions_format!r}")
    spans = weight_versions_format == "spans"
    tensors: dict[str, np.ndarray] = {}
    metas: list[dict[str, Any]] = []
    for i, sample in enumerate(samples):
        problem = sample_problem(sample)
        if problem is not None:
            raise CodecError(f"sample {i}: {problem}")
        if sample.reward is not None and not np.isfinite(sample.reward):
            raise CodecError(f"sample {i}: reward must be finite, got {sample.reward!r}")
        nulls: list[str] = []
        for spec in TENSOR_FIELDS:
            value = getattr(sample, spec.name)
            if value is None:
                if not spec.optional:
                    nulls.append(spec.name)
            else:
                tensors[f"{spec.name}.{i}"] = _to_wire(value, spec, i)
        metas.append(_sample_meta(sample, nulls, spans=spans))
    document = {
        "format_version": FORMAT_VERSION,
        "samples": metas,
        "session_metadata": session_metadata,
        "empty_reason": empty_reason,
    }
    try:
        meta = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        raise CodecError(f"{META_KEY} cannot be serialized as JSON: {exc}") from exc
    tensors[META_KEY] = np.frombuffer(meta, dtype=np.uint8).copy()
    return safetensors.numpy.save(tensors)


def _sample_meta(sample: Sample, nulls: list[str], *, spans: bool) -> dict[str, Any]:
    """A sample's ``_samples_meta`` entry (``spans``: per-call weight version spans)."""
    entry: dict[str, Any] = {
        "response": sample.response,
        "response_length": int(sample.response_length),
        "status": sample.status,
        "weight_versions": sample.weight_version_calls if spans else sample.weight_versions,
        "metadata": sample.metadata,
        "reward": None if sample.reward is None else float(sample.reward),
        "prefix_cache_info": sample.prefix_cache_info,
        "nulls": nulls,
    }
    if spans:
        entry["turn_weight_versions"] = sample.weight_versions
    if sample.spec_info is not None:
        entry["spec_info"] = sample.spec_info
    return entry


def _to_wire(value: np.ndarray, spec: _TensorField, index: int) -> np.ndarray:
    """``value`` as a contiguous array of the wire dtype, or a CodecError."""
    arr = np.asarray(value)
    if arr.dtype != spec.dtype:
        if spec.strict:
            raise CodecError(
                f"sample {index}: {spec.name} must have dtype {spec.dtype}, got {arr.dtype}"
            )
        if not _fits(arr, spec.dtype):
            raise CodecError(
                f"sample {index}: {spec.name} values do not fit wire dtype {spec.dtype}"
            )
        arr = arr.astype(spec.dtype)
    return np.ascontiguousarray(arr)


def _fits(arr: np.ndarray, wire: np.dtype) -> bool:
    """Whether casting ``arr`` to ``wire`` keeps every value exactly."""
    if arr.dtype.kind not in "biuf":
        return False
    if arr.size == 0 or np.can_cast(arr.dtype, wire, "safe"):
        return True
    if wire.kind in "iu":
        if arr.dtype.kind == "f" and not (np.isfinite(arr).all() and (arr == np.trunc(arr)).all()):
            return False
        info = np.iinfo(wire)
        # Python int/float comparisons are exact (numpy scalars would round to float64).
        return info.min <= arr.min().item() and arr.max().item() <= info.max
    with np.errstate(over="ignore", invalid="ignore"):
        converted = arr.astype(wire)
    if arr.dtype.kind == "f":
        return bool(np.array_equal(converted.astype(arr.dtype), arr, equal_nan=True))
    # Integers into a float dtype: compare through float64, exact up to 2**53.
    magnitude = max(abs(arr.min().item()), abs(arr.max().item()))
    return magnitude <= 2**53 and bool(
        np.array_equal(converted.astype(np.float64), arr.astype(np.float64))
    )


# --------------------------------------------------------------------------- decode


def decode_samples(data: bytes) -> DecodedSamples:
    """Parse a container written by :func:`encode_samples`, or by the reference
    framework's session server (no ``format_version``: its keys, ``reward`` optional);
    reject anything else."""
    try:
        tensors = safetensors.numpy.load(bytes(data))
    except Exception as exc:  # the loader raises its own (non-ValueError) error types
        raise CodecError(f"invalid safetensors container: {exc}") from exc
    meta = _read_meta(tensors)
    referenced = {META_KEY}
    reference = "format_version" not in meta
    samples = [_decode_sample(i, entry, tensors, referenced, reference)
               for i, entry in enumerate(meta["samples"])]
    orphans = sorted(set(tensors) - referenced)
    if orphans:
        raise CodecError(f"payload carries unreferenced tensors: {orphans}")
    return DecodedSamples(samples, meta["session_metadata"], meta["empty_reason"])


def _read_meta(tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    if META_KEY not in tensors:
        raise CodecError(f"payload has no {META_KEY} tensor")
    raw = tensors[META_KEY]
    if raw.ndim != 1 or raw.dtype != np.uint8:
        raise CodecError(
            f"{META_KEY} must be a rank-one uint8 tensor, got {raw.dtype} with shape {raw.shape}"
        )
    try:
        meta = orjson.loads(raw.tobytes())
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"{META_KEY} is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise CodecError(f"{META_KEY} must be a JSON object, got {_json_type(meta)}")
    version = meta.get("format_version", REFERENCE_LAYOUT)
    if version not in (FORMAT_VERSION, REFERENCE_LAYOUT) or isinstance(version, bool):
        raise CodecError(
            f"unsupported {META_KEY} format_version {version!r} (supported: {FORMAT_VERSION}, "
            "or none: the reference framework's layout)"
        )
    missing = [k for k in ("samples", "session_metadata", "empty_reason") if k not in meta]
    if missing:
        raise CodecError(f"{META_KEY} lacks keys: {missing}")
    if not isinstance(meta["samples"], list):
        raise CodecError(f"{META_KEY} samples must be a list, got {_json_type(meta['samples'])}")
    _check_envelope(
        len(meta["samples"]), meta["session_metadata"], meta["empty_reason"], where="decode"
    )
    return meta


def _check_envelope(
    n_samples: int, session_metadata: object, empty_reason: object, *, where: str
) -> None:
    if not isinstance(session_metadata, dict):
        raise CodecError(
            f"{where}: session_metadata must be an object, got {_json_type(session_metadata)}"
        )
    if empty_reason not in EMPTY_REASONS:
        raise CodecError(
            f"{where}: empty_reason must be one of {list(EMPTY_REASONS)}, got {empty_reason!r}"
        )
    if (n_samples == 0) != (empty_reason is not None):
        raise CodecError(
            f"{where}: empty_reason {empty_reason!r} is inconsistent with {n_samples} samples "
            "(an empty reply needs a reason; a non-empty one has none)"
        )


def _prefix_cache_info(i: int, value: object) -> dict[str, int]:
    """``{"cached_tokens", "total_prompt_tokens"}`` (absent in our format before it
    carried them: zeros)."""
    if value is None:
        return {"cached_tokens": 0, "total_prompt_tokens": 0}
    if not isinstance(value, dict) or not all(
            isinstance(value.get(k, 0), int) and not isinstance(value.get(k, 0), bool)
            for k in ("cached_tokens", "total_prompt_tokens")):
        raise CodecError(f"sample {i}: prefix_cache_info must be an object of integer "
                         f"cached_tokens and total_prompt_tokens, got {value!r}")
    return {"cached_tokens": int(value.get("cached_tokens", 0)),
            "total_prompt_tokens": int(value.get("total_prompt_tokens", 0))}


def _decode_sample(
    i: int, entry: object, tensors: dict[str, np.ndarray], referenced: set[str],
    reference: bool = False,
) -> Sample:
    if not isinstance(entry, dict):
        raise CodecError(f"sample {i} meta must be an object, got {_json_type(entry)}")
    required = _REFERENCE_KEYS if reference else _JSON_KEYS
    missing = [k for k in (*required, "nulls") if k not in entry]
    if missing:
        raise CodecError(f"sample {i} meta lacks keys: {missing}")
    nulls = _null_markers(i, entry["nulls"])
    # Only nullable fields can be absent here: _null_markers rejects the others.
    arrays = {spec.name: _read_tensor(i, spec, tensors, referenced)
              for spec in TENSOR_FIELDS if spec.name not in nulls
              and not (spec.optional and f"{spec.name}.{i}" not in tensors)}
    sample = Sample(
        tokens=arrays["tokens"],
        response_length=entry["response_length"],
        loss_mask=arrays.get("loss_mask"),
        rollout_log_probs=arrays.get("rollout_log_probs"),
        rollout_routed_experts=arrays.get("rollout_routed_experts"),
        rollout_indexer_topk=arrays.get("rollout_indexer_topk"),
        rollout_sampling_mask=arrays.get("rollout_sampling_mask"),
        rollout_sampling_mask_offsets=arrays.get("rollout_sampling_mask_offsets"),
        response=entry["response"],
        status=entry["status"],
        **_weight_versions(i, entry),
        spec_info=entry.get("spec_info"),
        metadata=entry["metadata"],
        reward=entry.get("reward"),
        prefix_cache_info=_prefix_cache_info(i, entry.get("prefix_cache_info")),
    )
    problem = sample_problem(sample)
    if problem is not None:
        raise CodecError(f"sample {i}: {problem}")
    if sample.reward is not None:
        sample.reward = float(sample.reward)
    return sample


def _weight_versions(i: int, entry: dict[str, Any]) -> dict[str, Any]:
    """``weight_versions`` (strings per turn) and ``weight_version_calls`` of a sample
    meta in either format. A spans payload without ``turn_weight_versions`` (the
    reference framework's newer wire) gives each turn the version of its last span."""
    value = entry["weight_versions"]
    if not (isinstance(value, list) and value and all(isinstance(v, list) for v in value)):
        return {"weight_versions": value, "weight_version_calls": []}
    versions = entry.get("turn_weight_versions")
    if versions is None:
        versions = [call[-1].get("version") if call and isinstance(call[-1], dict) else None
                    for call in value]
    return {"weight_versions": versions, "weight_version_calls": value}


def _read_tensor(
    i: int, spec: _TensorField, tensors: dict[str, np.ndarray], referenced: set[str]
) -> np.ndarray:
    """Sample ``i``'s tensor of field ``spec``, which the meta promised, marked referenced."""
    key = f"{spec.name}.{i}"
    if key not in tensors:
        raise CodecError(f"payload lacks promised tensor {key}")
    arr = tensors[key]
    if arr.dtype != spec.dtype:
        raise CodecError(f"{key} must have dtype {spec.dtype}, got {arr.dtype}")
    referenced.add(key)
    return arr


def _null_markers(i: int, nulls: object) -> set[str]:
    if not isinstance(nulls, list) or not all(isinstance(n, str) for n in nulls):
        raise CodecError(f"sample {i}: nulls must be a list of field names, got {nulls!r}")
    unknown = sorted(set(nulls) - _TENSOR_NAMES)
    if unknown:
        raise CodecError(f"sample {i}: null markers reference non-tensor fields: {unknown}")
    required = sorted(f.name for f in TENSOR_FIELDS if not f.nullable and f.name in nulls)
    if required:
        raise CodecError(f"sample {i}: null markers reference non-nullable fields: {required}")
    return set(nulls)


def _json_type(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


__all__ = [
    "FORMAT_VERSION",
    "META_KEY",
    "TENSOR_FIELDS",
    "WEIGHT_VERSIONS_FORMATS",
    "CodecError",
    "DecodedSamples",
    "decode_samples",
    "encode_samples",
]

"""Checks of an SGLang ``/generate`` reply (design §8): every field the gateway uses,
``output_ids`` against ``meta_info.output_token_logprobs`` id by id, the replay payloads.

A reply we cannot use (not JSON, a field of the wrong type or out of range) is an
:class:`EngineError` with code ``engine_protocol_error`` naming the field; an abort with
an engine error status an :class:`EngineRejected` (4xx) or an ``engine_rejected``
:class:`EngineError` (5xx).
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np

from tito.engines.reply_bulk import MAX_TOKEN_ID, bulk_output
from tito.types.engine import (
    LOGPROB_TOLERANCE,
    CheckedOutput,
    FinishReason,
    GenerateResult,
    SamplingMask,
    WeightSpan,
    compact_logprobs,
)
from tito.types.errors import EngineError, EngineRejected
from tito.types.records import IDS_DTYPE

PROTOCOL_ERROR = "engine_protocol_error"
"""``code`` of an :class:`EngineError` raised because the engine's reply is malformed."""
BULK_MIN_IDS = 128
"""Replies with at least this many output ids are checked in bulk
(:func:`~tito.engines.reply_bulk.bulk_output`); shorter ones entry by entry, where numpy's
cost per call is more than the passes it saves (a 16-id reply: 16.4 µs bulk, 10.9 entry by
entry; 64 ids: 21.9 / 19.7; 128: 27.4 / 31.8; 512: 63.1 / 102.7)."""


def protocol_error(message: str) -> EngineError:
    """An :class:`EngineError` for a reply we cannot use (code ``engine_protocol_error``)."""
    return EngineError(message, code=PROTOCOL_ERROR)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_INT = frozenset({int})
_NUMBER = frozenset({float, int})


def _well_formed_logprobs(lp: list[Any], output_ids: list[int]) -> list[float] | None:
    """The logprobs of ``lp`` when every entry is a well-formed ``[logprob, id(, text)]``
    for its output id with a finite logprob <= 0 (up to :data:`LOGPROB_TOLERANCE` of
    rounding; checked in C-level passes); None: check
    entry by entry."""
    try:  # an entry that is not a list fails one of these, or the comparison below
        if not set(map(len, lp)) <= {2, 3}:
            return None
        tokens = [entry[1] for entry in lp]
        values = [entry[0] for entry in lp]
    except (TypeError, KeyError, IndexError):
        return None
    if tokens != output_ids or not set(map(type, tokens)) <= _INT:
        return None
    kinds = set(map(type, values))
    if not kinds <= _NUMBER:
        return None
    if kinds != {float}:
        try:
            values = [float(v) for v in values]
        except OverflowError:
            return None
    # max > 0 catches positives and +inf; a NaN or -inf makes the sum non-finite (so
    # can an overflowing sum of huge finite values: the entry-by-entry check decides)
    if values and not (max(values) <= LOGPROB_TOLERANCE and math.isfinite(sum(values))):
        return None
    return values


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class ReplyCheck:
    """Checks of one ``/generate`` reply; every failure is an ``engine_protocol_error``
    :class:`EngineError` naming the field (an engine answering garbage is a bad gateway,
    not a bug of ours)."""

    def __init__(self, rid: str, vocab_size: int | None = None) -> None:
        self.rid = rid
        self.vocab_size = vocab_size

    def error(self, problem: str) -> EngineError:
        return protocol_error(f"engine reply for {self.rid}: {problem}")

    def meta(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or "meta_info" not in data:
            raise protocol_error(f"engine reply for {self.rid} is not a /generate result object")
        meta = data["meta_info"]
        if not isinstance(meta, dict):
            raise self.error(f"meta_info is {_kind(meta)}, not an object")
        return meta

    def finish(self, meta: dict[str, Any]) -> tuple[FinishReason, int | str | None]:
        """The finish reason and matched stop; an abort with an error status raises."""
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type") if isinstance(finish, dict) else None
        if kind not in ("stop", "length", "abort"):
            raise protocol_error(
                f"engine reply for {self.rid} has an unknown finish_reason {finish!r}")
        if kind == "abort":
            self._check_abort_status(finish)
        matched = finish.get("matched") if kind == "stop" else None
        if matched is not None and not (_is_int(matched) or isinstance(matched, str)):
            raise self.error(f"meta_info.finish_reason.matched is {_kind(matched)}, "
                             "not a token id or a string")
        return kind, matched

    @staticmethod
    def finish_message(meta: dict[str, Any]) -> str | None:
        finish = meta.get("finish_reason")
        message = finish.get("message") if isinstance(finish, dict) else None
        return message if isinstance(message, str) else None

    def _check_abort_status(self, finish: dict[str, Any]) -> None:
        status = finish.get("status_code")
        if status is None:
            return
        if not _is_int(status):
            raise self.error(f"meta_info.finish_reason.status_code is {_kind(status)}, "
                             "not an integer")
        if 400 <= status < 600:
            reason = f"engine aborted {self.rid}: {finish.get('message')}"
            if status >= 500:
                raise EngineError(reason, code="engine_rejected")
            raise EngineRejected(reason, engine_status=status)

    def output_ids(self, data: dict[str, Any]) -> list[int]:
        output_ids = data.get("output_ids")
        if not isinstance(output_ids, list):
            raise protocol_error(f"engine reply for {self.rid} has no output_ids")
        # every turn: C-level passes (types, then range)
        if set(map(type, output_ids)) <= _INT and self._in_range(output_ids):
            return output_ids
        for i, tok in enumerate(output_ids):
            self._check_id(i, tok)
        return output_ids

    def _in_range(self, ids: list[int]) -> bool:
        if not ids:
            return True
        vocab, top = self.vocab_size, max(ids)
        return min(ids) >= 0 and top <= MAX_TOKEN_ID and (vocab is None or top < vocab)

    def _check_id(self, i: int, tok: Any) -> None:
        if not _is_int(tok):
            raise self.error(f"output_ids[{i}] is {_kind(tok)} {tok!r}, not a token id")
        if tok < 0:
            raise self.error(f"output_ids[{i}] is {tok}, a negative token id")
        if tok > MAX_TOKEN_ID:
            raise self.error(f"output_ids[{i}] is {tok}, over the largest token id "
                             f"({MAX_TOKEN_ID})")
        if self.vocab_size is not None and tok >= self.vocab_size:
            raise self.error(f"output_ids[{i}] is {tok}, outside the vocabulary "
                             f"({self.vocab_size} ids)")

    def logprobs(self, meta: dict[str, Any], output_ids: list[int]) -> list[float]:
        lp = meta.get("output_token_logprobs")
        if not isinstance(lp, list):
            raise protocol_error(
                f"engine reply for {self.rid} has no meta_info.output_token_logprobs "
                "(return_logprob must be honoured)"
            )
        if len(lp) != len(output_ids):
            raise self.error(f"{len(lp)} output_token_logprobs for {len(output_ids)} output_ids")
        fast = _well_formed_logprobs(lp, output_ids)
        if fast is not None:
            return fast
        return [self._logprob(i, entry, tid)
                for i, (entry, tid) in enumerate(zip(lp, output_ids, strict=True))]

    def _logprob(self, i: int, entry: Any, tid: int) -> float:
        """``[logprob, id]`` or ``[logprob, id, text]`` for output token ``tid``: a finite
        logprob <= 0, up to :data:`LOGPROB_TOLERANCE` of rounding in the engine's
        log-softmax (orjson, SGLang's encoder, writes NaN and infinities as null)."""
        if not isinstance(entry, list) or not 2 <= len(entry) <= 3:
            raise self.error(f"meta_info.output_token_logprobs[{i}] is {entry!r}, not a "
                             "[logprob, id, text] list")
        value, token = entry[0], entry[1]
        if token != tid or not _is_int(token):
            raise self.error(f"logprob entry {i} is for token {token!r}, output_ids has {tid}")
        if not _is_number(value):
            raise self.error(f"meta_info.output_token_logprobs[{i}][0] is {_kind(value)}, "
                             "not a number")
        try:
            logprob = float(value)
        except OverflowError:
            logprob = math.inf
        if not math.isfinite(logprob) or logprob > LOGPROB_TOLERANCE:
            raise self.error(f"meta_info.output_token_logprobs[{i}][0] is {value!r}, not a "
                             "log-probability (finite and <= 0)")
        return logprob

    def count(self, meta: dict[str, Any], key: str) -> int:
        value = meta.get(key)
        if value is None:
            return 0
        if not _is_int(value) or value < 0:
            raise self.error(f"meta_info.{key} is {_kind(value)} {value!r}, not a count")
        return value

    def weight_version(self, meta: dict[str, Any]) -> str | None:
        value = meta.get("weight_version")
        if value is not None and not isinstance(value, str):
            raise self.error(f"meta_info.weight_version is {_kind(value)}, not a string")
        return value

    def spec_info(self, meta: dict[str, Any]) -> dict[str, int | float] | None:
        """The numeric ``spec_*`` counters of ``meta_info`` (speculative decoding); None
        when there are none. Other ``spec_*`` values (e.g. a histogram) are not kept."""
        out = {key: value for key, value in meta.items()
               if key.startswith("spec_") and _is_number(value)}
        return out or None

    def e2e_latency(self, meta: dict[str, Any]) -> float | None:
        value = meta.get("e2e_latency")
        if value is None:
            return None
        if not _is_number(value):
            raise self.error(f"meta_info.e2e_latency is {_kind(value)}, not a number")
        return float(value)

    def rows(self, meta: dict[str, Any], key: str) -> bytes | None:
        """A base64 replay payload (``routed_experts``, ``indexer_topk``) as raw bytes."""
        payload = meta.get(key)
        if payload is None:
            return None
        if not isinstance(payload, str):
            raise self.error(f"meta_info.{key} is {_kind(payload)}, not a base64 string")
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise self.error(f"meta_info.{key} is not base64: {exc}") from exc

    def sampling_mask(self, meta: dict[str, Any]) -> SamplingMask | None:
        """``meta_info.output_token_sampling_mask``: per output id, the list of token ids
        its sampling kept (SGLang ``return_sampling_mask``); ids in the vocabulary."""
        sets = meta.get("output_token_sampling_mask")
        if sets is None:
            return None
        key = "meta_info.output_token_sampling_mask"
        if not isinstance(sets, list) or not all(isinstance(s, list) for s in sets):
            raise self.error(f"{key} is {_kind(sets)}, not a list of token id lists")
        flat = [tok for s in sets for tok in s]
        if not (set(map(type, flat)) <= _INT and self._in_range(flat)):
            for i, s in enumerate(sets):
                for tok in s:
                    if not _is_int(tok) or not 0 <= tok <= MAX_TOKEN_ID or (
                            self.vocab_size is not None and tok >= self.vocab_size):
                        raise self.error(f"{key}[{i}] holds {tok!r}, not a token id in "
                                         "the vocabulary")
        offsets = np.zeros(len(sets) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, sets), dtype=np.int64, count=len(sets)),
                  out=offsets[1:])
        return SamplingMask(np.array(flat, dtype=IDS_DTYPE), offsets)

    def weight_versions(self, meta: dict[str, Any]) -> list[WeightSpan] | None:
        """``meta_info.weight_versions``: ``[{"version", "start", "end"}]`` over output
        indices, present only when the weights changed while the request ran."""
        spans = meta.get("weight_versions")
        if spans is None:
            return None
        if not isinstance(spans, list):
            raise self.error(f"meta_info.weight_versions is {_kind(spans)}, not a list")
        out: list[WeightSpan] = []
        for i, span in enumerate(spans):
            if not (isinstance(span, dict) and isinstance(span.get("version"), str)
                    and _is_int(span.get("start")) and _is_int(span.get("end"))
                    and 0 <= span["start"] <= span["end"]):
                raise self.error(f"meta_info.weight_versions[{i}] is {span!r}, not "
                                 "{version: str, start: int, end: int}")
            out.append(WeightSpan(span["version"], span["start"], span["end"]))
        return out

    def optional_count(self, meta: dict[str, Any], key: str) -> int | None:
        return None if meta.get(key) is None else self.count(meta, key)


def parse_generate_response(data: Any, *, rid: str,
                            vocab_size: int | None = None) -> GenerateResult:
    """Validate an SGLang ``/generate`` reply (n=1) and turn it into a GenerateResult.

    A malformed reply raises an ``engine_protocol_error`` :class:`EngineError` naming the
    field: ids must be >= 0 (and < ``vocab_size`` when given), logprobs finite and <= 0
    (up to :data:`LOGPROB_TOLERANCE`, the gateway's own check, ``check_output``).
    An abort with an engine error status raises :class:`EngineRejected` (4xx) or an
    ``engine_rejected`` :class:`EngineError` (5xx).
    """
    reply = ReplyCheck(rid, vocab_size)
    meta = reply.meta(data)
    kind, matched = reply.finish(meta)
    ids = data.get("output_ids")
    bulk = bulk_output(ids, meta.get("output_token_logprobs"), vocab_size) \
        if isinstance(ids, list) and len(ids) >= BULK_MIN_IDS else None
    if bulk is None:  # the entry-by-entry checks name what is wrong
        output_ids = reply.output_ids(data)
        logprobs = reply.logprobs(meta, output_ids)
        checked = CheckedOutput(np.array(output_ids, dtype=IDS_DTYPE),
                                compact_logprobs(logprobs))
    else:
        output_ids, (logprobs, checked) = data["output_ids"], bulk
    return GenerateResult(
        output_ids=output_ids,
        logprobs=logprobs,
        finish_reason=kind,
        matched_stop=matched,
        prompt_tokens=reply.count(meta, "prompt_tokens"),
        cached_tokens=reply.count(meta, "cached_tokens"),
        weight_version=reply.weight_version(meta),
        weight_versions=reply.weight_versions(meta),
        routed_experts=reply.rows(meta, "routed_experts"),
        indexer_topk=reply.rows(meta, "indexer_topk"),
        indexer_topk_num_layers=reply.optional_count(meta, "indexer_topk_num_layers"),
        sampling_mask=reply.sampling_mask(meta),
        e2e_latency=reply.e2e_latency(meta),
        spec_info=reply.spec_info(meta),
        finish_message=reply.finish_message(meta),
        checked=checked,
    )


def max_model_len(models: Any) -> int | None:
    """The smallest positive ``max_model_len`` of a ``/v1/models`` reply (None: none)."""
    cards = models.get("data") if isinstance(models, dict) else None
    if not isinstance(cards, list):
        return None
    lengths = [c["max_model_len"] for c in cards
               if isinstance(c, dict) and _is_int(c.get("max_model_len"))
               and c["max_model_len"] > 0]
    return min(lengths) if lengths else None

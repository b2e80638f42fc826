"""SGLang's ``/generate`` stream, assembled in linear total work (design §8).

SGLang streams in one of two modes, a server setting (``--incremental-streaming-output``):

- **cumulative** (the default): every chunk holds all the ``output_ids`` so far and
  ``meta_info.output_token_logprobs`` all their logprobs, so chunk *k* is *k* ids long
  (SGLang sends only the newest state when the reader is behind);
- **incremental**: every chunk holds the ids generated since the previous chunk and
  their logprobs (SGLang joins the chunks queued while the reader was behind).

In both, ``meta_info.completion_tokens`` counts every id so far and the last chunk has a
non-null ``finish_reason``; its other fields (counts, routed experts, weight versions)
are whole. :class:`StreamAssembler` tells the mode from each chunk (``output_ids`` holds
``completion_tokens`` ids: cumulative; the ids since the previous chunk: incremental) and
keeps the ids and logprobs so far. Each chunk's *new* ids and logprobs are checked as
the whole reply would be (ids integers in ``[0, vocab)``, logprob entries for their ids,
finite and <= 0), so nothing unchecked is streamed; the final chunk is checked as a reply
(:func:`~tito.engines.sglang_reply.parse_generate_response` on its new part) and, in
cumulative mode, its ids must extend the ones streamed.

A cumulative chunk is not parsed whole: once the mode is known, only the part past the
ids and logprobs already read is decoded (:meth:`StreamAssembler._tail`), located with a
few ``find`` calls from where the previous chunk put them (JSON strings escape every
quote, so ``"output_ids":[`` can only be the key). Python work per chunk is then in
proportion to its new ids, not to the turn's length; a chunk the fast path cannot read
(another key order, logprob texts, the final chunk) is parsed whole with orjson.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from tito.engines.sglang_reply import ReplyCheck, parse_generate_response, protocol_error
from tito.engines.transport import error_text
from tito.types.engine import CheckedOutput, GenerateResult, compact_logprobs
from tito.types.errors import EngineError
from tito.types.records import IDS_DTYPE

Mode = Literal["cumulative", "incremental"]

_IDS_KEY = b'"output_ids":['
_LP_KEY = b'"output_token_logprobs":['
_NOT_FINAL = b'"finish_reason":null'


@dataclass(slots=True)
class _Cursor:
    """Where the previous cumulative chunk put its arrays (byte offsets and lengths)."""

    ids_at: int = 0
    ids_len: int = 0
    """Bytes of the ``output_ids`` array's inside (``1,2,3``)."""
    lp_len: int = 0
    """Bytes of the ``output_token_logprobs`` array's inside."""


@dataclass(slots=True)
class StreamAssembler:
    """The ids and logprobs of one streamed ``/generate`` request so far.

    :meth:`feed` takes each ``data:`` payload (not ``[DONE]``); it returns None for a
    chunk that adds nothing, the ids list so far after one that adds ids (the same list
    object, grown in place: read it before the next :meth:`feed`), or the whole
    :class:`GenerateResult` after the final chunk.
    """

    rid: str
    vocab_size: int | None = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mode: Mode | None = None
    """Known once a chunk after the first told it apart."""
    chunks: int = 0
    fast_chunks: int = 0
    """Cumulative chunks read by their tail only."""
    _cursor: _Cursor | None = None

    def feed(self, data: bytes) -> list[int] | GenerateResult | None:
        self.chunks += 1
        if self.mode == "cumulative" and self._cursor is not None:
            tail = self._tail(data, self._cursor)
            if tail is not None:
                self.fast_chunks += 1
                return self._extend(*tail)
        event = self._event(data)
        meta = ReplyCheck(self.rid, self.vocab_size).meta(event)
        ids = event.get("output_ids")
        if not isinstance(ids, list):
            raise protocol_error(f"stream chunk for {self.rid} has no output_ids")
        lp = meta.get("output_token_logprobs")
        new_ids, new_lp = self._new_part(ids, meta.get("completion_tokens"), lp)
        if meta.get("finish_reason") is not None:
            return self._final(event, meta, new_ids, new_lp)
        out = self._extend(new_ids, new_lp)
        if self.mode == "cumulative":
            self._cursor = _locate(data, len(self.ids))
        return out

    # -- the whole-chunk path --------------------------------------------------------
    def _event(self, data: bytes) -> dict[str, Any]:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise protocol_error(f"stream event for {self.rid} is not JSON: {exc}") from exc
        if not isinstance(event, dict):
            raise protocol_error(f"stream event for {self.rid} is not an object")
        if "error" in event:
            raise EngineError(f"engine stream error: {error_text(data)}")
        return event

    def _new_part(self, ids: list[Any], completion: Any, lp: Any) -> tuple[list[Any], Any]:
        """The ids (and logprob entries) this chunk adds, the mode learnt on the way."""
        seen, n = len(self.ids), len(ids)
        if not (isinstance(completion, int) and not isinstance(completion, bool)):
            completion = n if self.mode != "incremental" else seen + n  # not reported
        if self.mode != "cumulative" and completion == seen + n and (seen == 0 or n != completion):
            if seen:
                self.mode = "incremental"
            return ids, lp
        if self.mode != "incremental" and n == completion and n >= seen:
            if seen:
                self.mode = "cumulative"
            return ids[seen:], lp[seen:] if isinstance(lp, list) else lp
        raise protocol_error(
            f"stream chunk for {self.rid}: {n} output_ids with completion_tokens "
            f"{completion} after {seen} ids streamed are neither all the ids so far nor "
            "the new ones")

    def _checked(self, new_ids: list[Any], new_lp: Any) -> tuple[list[int], list[float]]:
        """``new_ids`` and their logprobs, checked as a reply's (ids in the vocabulary,
        entries ``[logprob, id, text]`` for them, finite and <= 0)."""
        reply = ReplyCheck(self.rid, self.vocab_size)
        ids = reply.output_ids({"output_ids": new_ids})
        return ids, reply.logprobs({"output_token_logprobs": new_lp}, ids)

    def _extend(self, new_ids: list[Any], new_lp: Any) -> list[int] | None:
        if not new_ids and not (isinstance(new_lp, list) and new_lp):
            return None
        ids, logprobs = self._checked(new_ids, new_lp)
        self.ids += ids
        self.logprobs += logprobs
        return self.ids

    def _final(self, event: dict[str, Any], meta: dict[str, Any], new_ids: list[Any],
               new_lp: Any) -> GenerateResult:
        """The whole result: the final chunk checked as a reply of its new part."""
        all_ids = event["output_ids"]
        if self.mode != "incremental" and len(all_ids) == len(self.ids) + len(new_ids) \
                and all_ids[:len(self.ids)] != self.ids:
            raise protocol_error(f"the final stream chunk of {self.rid} does not extend "
                                 "the ids streamed before it")
        part = dict(event, output_ids=new_ids,
                    meta_info=dict(meta, output_token_logprobs=new_lp))
        result = parse_generate_response(part, rid=self.rid, vocab_size=self.vocab_size)
        if not self.ids:
            return result
        result.output_ids = self.ids + result.output_ids
        result.logprobs = self.logprobs + result.logprobs
        result.checked = CheckedOutput(np.array(result.output_ids, dtype=IDS_DTYPE),
                                       compact_logprobs(result.logprobs))
        return result

    # -- the tail path (cumulative chunks) ---------------------------------------------
    def _tail(self, data: bytes, cur: _Cursor) -> tuple[list[Any], list[Any]] | None:
        """The new ids and logprob entries of a non-final cumulative chunk, read past the
        prefix the previous chunk had; None: read it whole."""
        at = data.find(_IDS_KEY, max(0, cur.ids_at - 64))
        if at == -1:
            return None
        ids_start = at + len(_IDS_KEY)
        skip = ids_start + cur.ids_len
        ids_end = data.find(b"]", skip)
        if ids_end == -1 or data[skip:skip + 1] not in (b",", b"]"):
            return None
        lp_at = data.find(_LP_KEY, ids_end)
        if lp_at == -1 or data.find(_NOT_FINAL, ids_end, lp_at) == -1:
            return None
        lp_start = lp_at + len(_LP_KEY)
        lp_skip = lp_start + cur.lp_len
        lp_end = data.find(b"]]", lp_skip) + 1 if data[lp_skip:lp_skip + 1] == b"," \
            else lp_skip
        if lp_end == 0 or data[lp_end:lp_end + 1] != b"]":
            return None
        try:
            new_ids = orjson.loads(b"[" + data[skip + 1:ids_end] + b"]") \
                if ids_end > skip else []
            new_lp = orjson.loads(b"[" + data[lp_skip + 1:lp_end] + b"]") \
                if lp_end > lp_skip else []
        except orjson.JSONDecodeError:
            return None
        if len(new_lp) != len(new_ids):
            return None
        cur.ids_at, cur.ids_len, cur.lp_len = at, ids_end - ids_start, lp_end - lp_start
        return new_ids, new_lp


def _locate(data: bytes, n: int) -> _Cursor | None:
    """Where a cumulative chunk of ``n`` ids (parsed whole) has its arrays; None when its
    layout is not the one :meth:`StreamAssembler._tail` reads."""
    at = data.find(_IDS_KEY)
    if at == -1:
        return None
    ids_start = at + len(_IDS_KEY)
    ids_end = data.find(b"]", ids_start)
    lp_at = data.find(_LP_KEY, ids_end)
    if ids_end == -1 or lp_at == -1:
        return None
    lp_start = lp_at + len(_LP_KEY)
    lp_end = data.find(b"]]", lp_start) + 1 if n else lp_start
    if lp_end == 0 or data[lp_end:lp_end + 1] != b"]":
        return None
    return _Cursor(at, ids_end - ids_start, lp_end - lp_start)

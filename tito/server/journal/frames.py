"""The journal's on-disk format: a file header, then self-checking frames.

File: ``MAGIC`` (8 bytes), then frames. Frame head (36 bytes, little-endian):
``sync marker (4) | u32 payload length | u32 crc32(payload) | session id (16 raw bytes)
| u32 seq | u32 crc32(the 32 bytes before)``; then the payload: an orjson header line,
then the raw arrays it names (int32 ids, float32 or float64 logprobs). ``seq`` numbers a
session's frames (its creation 0, its turns 1, 2, ...), so a lost frame shows as a gap.

The head's own checksum makes a damaged length detectable before it is trusted; the sync
marker lets a reader find the next frame after a damaged one. The first frame is the
journal's header (``op: header``): what the replaying gateway must match.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tito.session.agents import MAIN, ContextInfo
from tito.session.turns import TurnCommit
from tito.types.records import IDS_DTYPE, LOGPROB_DTYPE, TurnRecord

FILE = "journal.bin"
MAGIC = b"TITOJRN\x02"
SYNC = b"\xa5TJ\x5a"
HEAD = struct.Struct("<4sII16sII")
CHECKED = HEAD.size - 4
"""Bytes of the head its checksum covers."""
MAX_PAYLOAD = 1 << 30
NO_SID = bytes(16)
_ARRAYS = (("bridge_ids", IDS_DTYPE), ("output_ids", IDS_DTYPE), ("logprobs", LOGPROB_DTYPE))
_ROWS = ("routed_experts", "indexer_topk")
_MASK = (("sampling_mask_ids", "<i4"), ("sampling_mask_offsets", "<i8"))
_RECORD_FIELDS = ("turn", "drop", "finish_reason", "prompt_len", "weight_version",
                  "cached_tokens", "e2e_latency", "request_ts", "commit_ts", "request",
                  "routed_experts_start_len", "indexer_topk_start_len", "weight_spans",
                  "finish_message")
_OPTIONAL_FIELDS = ("spec_info",)
"""Record fields written only when set (older journals lack them: the default)."""


@dataclass(slots=True)
class Frame:
    """One intact frame: where it is, its session and number, its header and arrays."""

    offset: int
    size: int
    sid: str | None
    seq: int
    header: dict[str, Any]
    arrays: memoryview


def sid_bytes(session_id: str | None) -> bytes:
    if session_id is None:
        return NO_SID
    try:
        raw = bytes.fromhex(session_id)
    except ValueError:
        raw = b""
    return raw if len(raw) == 16 else zlib.crc32(session_id.encode()).to_bytes(16, "little")


def sid_text(raw: bytes) -> str | None:
    return None if raw == NO_SID else raw.hex()


def frame(header: dict[str, Any], *arrays: np.ndarray, seq: int = 0) -> bytes:
    """A frame of ``header`` (its ``sid`` goes in the head too) and ``arrays``."""
    payload = b"".join([orjson.dumps(header), b"\n", *(a.tobytes() for a in arrays)])
    head = struct.pack("<4sII16sI", SYNC, len(payload), zlib.crc32(payload),
                       sid_bytes(header.get("sid")), seq)
    return head + zlib.crc32(head).to_bytes(4, "little") + payload


def reframe(payload: bytes, session_id: str | None, seq: int) -> bytes:
    """An older journal's frame payload in a frame of this format."""
    head = struct.pack("<4sII16sI", SYNC, len(payload), zlib.crc32(payload),
                       sid_bytes(session_id), seq)
    return head + zlib.crc32(head).to_bytes(4, "little") + payload


def parse_head(buf: Any, offset: int) -> tuple[int, int, bytes, int] | str:
    """``(length, payload crc, sid, seq)`` of the head at ``offset``, or why it is not one."""
    if len(buf) - offset < HEAD.size:
        return "a frame head cut short by the end of the file"
    sync, length, crc, sid, seq, check = HEAD.unpack_from(buf, offset)
    if sync != SYNC:
        return "no frame marker"
    if zlib.crc32(buf[offset : offset + CHECKED]) != check:
        return "a frame head whose checksum does not match"
    if length > MAX_PAYLOAD:
        return "a frame head with an impossible length"
    return length, crc, sid, seq


def split(payload: memoryview) -> tuple[dict[str, Any], memoryview]:
    """A payload's orjson header and the arrays after it."""
    newline = bytes(payload[: min(len(payload), 1 << 20)]).index(b"\n")
    return orjson.loads(payload[:newline]), payload[newline + 1 :]


# -- turns -------------------------------------------------------------------------------
def turn_frame(session_id: str, turn: TurnCommit, seq: int) -> bytes:
    rec = turn.record
    fields: dict[str, Any] = {name: getattr(rec, name) for name in _RECORD_FIELDS}
    fields.update({name: getattr(rec, name) for name in _OPTIONAL_FIELDS
                   if getattr(rec, name) is not None})
    if rec.links is not None:  # generation links (absent: none, as in older journals)
        fields["links"] = rec.links
    header: dict[str, Any] = {"op": "turn", "sid": session_id, "keep_records": turn.keep_records,
              "keep_messages": turn.keep_messages, "appended": turn.appended,
              "message": turn.message, "tools": turn.tools, "parent": turn.parent,
              "response_id": turn.response_id,
              "record": fields,
              "lengths": [len(getattr(rec, name)) for name, _ in _ARRAYS],
              "logprobs_dtype": np.dtype(rec.logprobs.dtype).str,
              **{f"{name}_shape": None if getattr(rec, name) is None
                 else list(getattr(rec, name).shape) for name in _ROWS}}
    if turn.context is not None and turn.context.id != MAIN:  # the main context: no field
        header["context"] = turn.context.to_json()
    arrays = [np.asarray(getattr(rec, name), _dtype(rec, name, dtype))
              for name, dtype in _ARRAYS]
    arrays += [np.ascontiguousarray(getattr(rec, name), dtype="<i4") for name in _ROWS
               if getattr(rec, name) is not None]
    if rec.sampling_mask_ids is not None and rec.sampling_mask_offsets is not None:
        # sampling-mask replay (absent key: none, as in older journals)
        header["sampling_mask_lengths"] = [len(rec.sampling_mask_ids),
                                           len(rec.sampling_mask_offsets)]
        arrays += [np.ascontiguousarray(rec.sampling_mask_ids, dtype="<i4"),
                   np.ascontiguousarray(rec.sampling_mask_offsets, dtype="<i8")]
    return frame(header, *arrays, seq=seq)


def _dtype(rec: TurnRecord, name: str, default: Any) -> Any:
    """The stored dtype of an array: logprobs keep theirs (float32 or float64)."""
    return rec.logprobs.dtype if name == "logprobs" else default


def turn_of(header: dict[str, Any], arrays: memoryview) -> TurnCommit:
    parts: dict[str, Any] = {}
    start = 0
    for (name, dtype), n in zip(_ARRAYS, header["lengths"], strict=True):
        if name == "logprobs":
            dtype = np.dtype(header.get("logprobs_dtype", dtype))
        size = n * np.dtype(dtype).itemsize
        parts[name] = np.frombuffer(arrays[start : start + size], dtype=dtype).copy()
        start += size
    for name in _ROWS:  # replay rows, when the turn has them
        shape = header.get(f"{name}_shape") or (header.get("routed_shape")
                                                if name == "routed_experts" else None)
        if shape is not None:
            size = int(np.prod(shape)) * 4
            parts[name] = np.frombuffer(arrays[start : start + size], dtype="<i4") \
                .astype(np.int32).reshape(shape)
            start += size
    lengths = header.get("sampling_mask_lengths")
    if lengths is not None:
        for (name, wire), n in zip(_MASK, lengths, strict=True):
            size = n * np.dtype(wire).itemsize
            parts[name] = np.frombuffer(arrays[start : start + size], dtype=wire) \
                .astype(wire.lstrip("<"))
            start += size
    record = TurnRecord(**header["record"], **parts, generation_id=header.get("response_id"))
    context = header.get("context")  # absent: the main context (and older journals)
    return TurnCommit(header["keep_records"], header["keep_messages"], header["appended"],
                      header["message"], header["tools"], record, header.get("parent"),
                      header.get("response_id"),
                      None if context is None else ContextInfo.from_json(context))

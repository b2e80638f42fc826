"""The common case of an SGLang ``/generate`` reply's output, checked in bulk.

:func:`tito.engines.sglang_reply.parse_generate_response` checks ``output_ids`` and
``meta_info.output_token_logprobs`` in C-level passes, each a few tens of µs on a 4k-token
reply, and as many again to store them (int32 ids, compact logprobs). :func:`bulk_output`
does the same work in fewer passes, for a reply that is well formed:

- the ids are serialized once by orjson, which writes a value by its exact type: a flat
  list of non-negative integers (no bool, no float) is the only value that serializes to
  digits and commas between two brackets; the int32 array is then bounded by numpy;
- the logprob entries' ids are the same integers when their serialization is the same
  bytes (one comparison instead of a comparison and a type pass);
- the logprobs' finiteness, bound and compaction are numpy passes over one float64 array.

Anything else (a bool, a float id, an int logprob, a bad length, a value out of range)
returns None and the entry-by-entry checks decide, naming the culprit: a reply this
accepts, they accept with the same ids, logprobs and stored arrays (tested against them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from tito.types.engine import LOGPROB_TOLERANCE, CheckedOutput
from tito.types.records import IDS_DTYPE, LOGPROB_DTYPE

MAX_TOKEN_ID = int(np.iinfo(IDS_DTYPE).max)
"""The largest token id the gateway stores (int32): a larger one is a protocol error
even when the vocabulary size is not known."""
_DIGITS_AND_COMMAS = b"0123456789,"
_ENTRY_LENGTHS = frozenset({2, 3})


def bulk_output(output_ids: Any, lp: Any, vocab_size: int | None
                ) -> tuple[list[float], CheckedOutput] | None:
    """(logprobs, stored arrays) of a well-formed reply's ``output_ids`` and
    ``output_token_logprobs`` (``[logprob, id]`` or ``[logprob, id, text]`` entries);
    None: check them entry by entry."""
    if not isinstance(output_ids, list) or not isinstance(lp, list):
        return None
    ids = _ids(output_ids, vocab_size)
    if ids is None:
        return None
    array, blob = ids
    logprobs = _logprobs(lp, blob)
    if logprobs is None:
        return None
    values, stored = logprobs
    return values, CheckedOutput(array, stored)


def _ids(output_ids: list[Any], vocab_size: int | None) -> tuple[np.ndarray, bytes] | None:
    """(int32 ids, their serialization) when ``output_ids`` is a flat list of token ids."""
    try:
        blob = orjson.dumps(output_ids)
    except TypeError:  # an integer past 64 bits
        return None
    if blob[1:-1].translate(None, _DIGITS_AND_COMMAS):
        return None  # a sign, a fraction, true/false, a nested list, a string...
    try:
        wide = np.array(output_ids, dtype=np.int64)
    except OverflowError:
        return None
    if len(wide):
        top = int(wide.max())
        if top > MAX_TOKEN_ID or (vocab_size is not None and top >= vocab_size):
            return None
    return wide.astype(IDS_DTYPE), blob


def _logprobs(lp: list[Any], ids_blob: bytes) -> tuple[list[float], np.ndarray] | None:
    """(logprobs, stored logprobs) when every entry is ``[logprob, id(, text)]`` for its
    output id, with a float logprob that is finite and <= :data:`LOGPROB_TOLERANCE`."""
    columns = _columns(lp)
    if columns is None:
        return None
    values, tokens = columns
    try:
        if orjson.dumps(tokens) != ids_blob:  # the same integers, in the same order
            return None
    except TypeError:
        return None
    if not set(map(type, values)) <= {float}:
        return None
    wide = np.array(values, dtype=np.float64)
    if len(wide) and not (np.isfinite(wide).all() and wide.max() <= LOGPROB_TOLERANCE):
        return None
    with np.errstate(over="ignore"):  # a float64 past float32's range: kept as float64
        narrow = wide.astype(LOGPROB_DTYPE)
    return values, (narrow if np.array_equal(narrow, wide) else wide)


def _columns(lp: list[Any]) -> tuple[list[Any], list[Any]] | None:
    """(logprobs, ids) of the entries when each is a list of 2 or 3 items (None: not).
    SGLang's ``[logprob, id, text]`` triples are unpacked (two passes); other entries
    are measured, then indexed."""
    try:
        return [v for v, _, _ in lp], [t for _, t, _ in lp]
    except (TypeError, ValueError):
        pass
    try:
        if not set(map(len, lp)) <= _ENTRY_LENGTHS:
            return None
        return [entry[0] for entry in lp], [entry[1] for entry in lp]
    except (TypeError, KeyError, IndexError):
        return None

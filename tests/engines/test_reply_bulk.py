"""The bulk check of a reply's output (:mod:`tito.engines.reply_bulk`) against the
entry-by-entry checks it stands in for: for well-formed replies and for replies with one
defect each (a bool, float or string id, a sign, ids past the vocabulary, int32 or 64 bits,
a nested list, entries of other lengths, a mismatched or mistyped entry id, int, bool,
null, non-finite or positive logprobs, a logprob not exact in float32), parsing the reply
gives the same ids, logprobs (values and types) and stored arrays (dtypes and values), or
the same error."""

from __future__ import annotations

import math
from typing import Any
from unittest import mock

import numpy as np
from helpers.support import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from tito.engines import sglang_reply
from tito.engines.reply_bulk import bulk_output
from tito.engines.sglang_reply import parse_generate_response
from tito.types.errors import TitoError

VOCAB = 1000
ODD_IDS: list[Any] = [True, False, 5.0, -1, VOCAB, 2**31, 2**63, 2**64, "5", None, [5], 0]
ODD_LOGPROBS: list[Any] = [-1, 0, True, False, None, math.nan, math.inf, -math.inf, 0.5,
                           1e-6, -0.0, -1e308, "-1.0", [-1.0]]


def reply(ids: list[Any], entries: list[Any]) -> dict[str, Any]:
    return {"text": "", "output_ids": ids, "meta_info": {
        "id": "r", "finish_reason": {"type": "stop", "matched": 2},
        "output_token_logprobs": entries, "prompt_tokens": 3, "cached_tokens": 0}}


def outcome(data: dict[str, Any], vocab: int | None) -> tuple[Any, ...]:
    """The parse's result, every reply through the bulk check (whatever its length)."""
    try:
        with mock.patch.object(sglang_reply, "BULK_MIN_IDS", 0):
            r = parse_generate_response(data, rid="r", vocab_size=vocab)
    except TitoError as exc:
        return ("error", type(exc).__name__, str(exc), exc.code)
    assert r.checked is not None
    return ("ok", r.output_ids, [(type(v), v) for v in r.logprobs],
            r.checked.ids.dtype, r.checked.ids.tolist(),
            r.checked.logprobs.dtype, r.checked.logprobs.tolist())


def entry_by_entry(data: dict[str, Any], vocab: int | None) -> tuple[Any, ...]:
    with mock.patch.object(sglang_reply, "bulk_output", lambda *args: None):
        return outcome(data, vocab)


def well_formed(n: int, draw: Any) -> tuple[list[int], list[list[Any]]]:
    ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n))
    values = draw(st.lists(st.one_of(st.sampled_from([-0.5, -0.25, -0.1, -2.0, -0.0]),
                                     st.floats(-50, 0)), min_size=n, max_size=n))
    width = draw(st.sampled_from([2, 3]))
    return ids, [[v, t, None][:width] for v, t in zip(values, ids, strict=True)]


def defect(ids: list[Any], entries: list[Any], draw: Any) -> None:
    """One defect, in place."""
    i = draw(st.integers(0, len(ids) - 1))
    kind = draw(st.sampled_from(["id", "entry_id", "logprob", "length", "shape",
                                 "shorter"]))
    if kind == "id":
        ids[i] = entries[i][1] = draw(st.sampled_from(ODD_IDS))
    elif kind == "entry_id":
        entries[i][1] = draw(st.sampled_from([ids[i] + 1, float(ids[i]), str(ids[i]), None]
                                             + ([True] if ids[i] == 1 else [])))
    elif kind == "logprob":
        entries[i][0] = draw(st.sampled_from(ODD_LOGPROBS))
    elif kind == "length":
        entries[i] = draw(st.sampled_from([entries[i][:1], [*entries[i], None, "x"], []]))
    elif kind == "shape":
        entries[i] = draw(st.sampled_from(["ab", "abc", {"0": 1, "1": 2}, {"a": 1, "b": 2, "c": 3},
                                          None, 7]))
    else:
        entries.pop()


@settings(max_examples=examples(400), deadline=None)
@given(data=st.data())
def test_bulk_parse_equals_entry_by_entry(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 40))
    ids, entries = well_formed(n, data.draw)
    if n and data.draw(st.booleans()):
        defect(ids, entries, data.draw)
    vocab = data.draw(st.sampled_from([VOCAB, None]))
    body = reply(ids, entries)
    assert outcome(body, vocab) == entry_by_entry(body, vocab)


def test_well_formed_replies_take_the_bulk_path() -> None:
    ids = list(range(0, 900, 7))
    entries = [[-0.5 - i / 8, t, None] for i, t in enumerate(ids)]
    got = bulk_output(ids, entries, VOCAB)
    assert got is not None
    values, checked = got
    assert values == [e[0] for e in entries]
    assert checked.ids.dtype == np.int32 and checked.ids.tolist() == ids
    assert checked.logprobs.dtype == np.float32  # multiples of 1/8: exact in float32
    entries[3][0] = -0.1  # not exact in float32: all kept as float64
    got = bulk_output(ids, entries, VOCAB)
    assert got is not None and got[1].logprobs.dtype == np.float64
    assert bulk_output([], [], VOCAB) is not None


def test_odd_values_leave_it_to_the_entry_checks() -> None:
    for odd in ODD_IDS:
        if odd != 0:
            assert bulk_output([1, odd], [[-1.0, 1], [-1.0, odd]], VOCAB) is None
    for odd in ODD_LOGPROBS:
        if odd not in (1e-6, -0.0, -1e308):  # finite floats within the bound pass
            assert bulk_output([1], [[odd, 1]], VOCAB) is None


def test_short_replies_are_checked_entry_by_entry_long_ones_in_bulk() -> None:
    calls: list[int] = []

    def spy(ids: Any, entries: Any, vocab: int | None) -> Any:
        calls.append(len(ids))
        return bulk_output(ids, entries, vocab)

    with mock.patch.object(sglang_reply, "bulk_output", spy):
        for n in (1, sglang_reply.BULK_MIN_IDS - 1, sglang_reply.BULK_MIN_IDS):
            ids = [7] * n
            parse_generate_response(reply(ids, [[-0.5, 7, None]] * n), rid="r",
                                    vocab_size=VOCAB)
    assert calls == [sglang_reply.BULK_MIN_IDS]


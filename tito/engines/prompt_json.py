"""The JSON text of a prompt's token ids, built on the previous turn's: O(new ids) a turn.

A session's prompt at turn n starts with its prompt at turn n-1, bit for bit (the TITO
invariant: prompt + completion of turn n-1 is a prefix of the prompt of turn n). An engine
client that sends ids as JSON (SGLang's ``input_ids``, vLLM's ``prompt``) therefore
serializes only the ids past the previous prompt, and splices them onto that prompt's
text (benchmarks/prompt_json.py measures both).

Entries are keyed by session (:func:`prompt_key`: the session of a gateway request id; a
foreign request id, a one-off call, keeps nothing) and hold the previous prompt's raw ids,
so an entry is used only when the new prompt starts with exactly those ids (one
``memcmp``): a rolled-back or branched prompt that does not is serialized whole, and
replaces the entry. Least recently used entries are evicted past a byte budget (ids +
text, about 11 bytes a token) and past an entry budget that follows the load: at most
:data:`ENTRIES_PER_REQUEST` entries per request the client has had in flight at once (at
least :data:`MIN_ENTRIES`). The sessions that come back are the ones in flight or between
two turns; the rest (finished, or idle for good) would otherwise hold a copy of their whole
prompt until the byte budget pushed them out. The client brackets each request with
:meth:`PromptJson.begin` and :meth:`PromptJson.end`.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import orjson

from tito.types.engine import TokenIds
from tito.types.placement import session_of
from tito.types.records import IDS_DTYPE

DEFAULT_MAX_BYTES = 64 << 20
"""The cache's budget: 64 MiB holds ~6 million prompt tokens (e.g. 200 sessions of 30k)."""

MIN_ENTRIES = 64
"""The entry budget until the peak in flight passes ``MIN_ENTRIES / ENTRIES_PER_REQUEST``."""

ENTRIES_PER_REQUEST = 2
"""Entries kept per request in flight at the peak: room for the sessions between turns
(running their tools) as well as those waiting on the engine."""

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def prompt_key(rid: str) -> str | None:
    """The session of a gateway request id (``<session>_t<turn>_<hex>``); None for any
    other id (nothing to reuse: it is not a turn of a session)."""
    session = session_of(rid)
    return None if session == rid else session


class PromptJson:
    """``ids_json(key, ids)``: the JSON array text of ``ids``, equal to
    ``orjson.dumps(list(ids))``, reusing the text of ``key``'s previous prompt."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES,
                 min_entries: int = MIN_ENTRIES) -> None:
        self.max_bytes = max_bytes
        self.max_entries = min_entries
        """The entry budget: ``max(min_entries, ENTRIES_PER_REQUEST * peak_in_flight)``."""
        self.min_entries = min_entries
        self.in_flight = 0
        """Requests between :meth:`begin` and :meth:`end`."""
        self.peak_in_flight = 0
        self._entries: OrderedDict[str, tuple[bytearray, bytearray]] = OrderedDict()
        """key -> (the previous prompt's ids as raw int32 bytes, its JSON text), both grown
        in place turn after turn."""
        self._size = 0
        self.reused = 0
        """Calls that spliced onto a stored prompt (the rest serialized the whole prompt)."""

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._size

    def begin(self) -> None:
        """A request is sent (raises the entry budget with the peak in flight)."""
        self.in_flight += 1
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
            self.max_entries = max(self.min_entries, ENTRIES_PER_REQUEST * self.in_flight)

    def end(self) -> None:
        """A request begun with :meth:`begin` is answered, failed or cancelled."""
        self.in_flight -= 1

    def ids_json(self, key: str | None, ids: TokenIds) -> bytes:
        """``key``: the session (None: serialize whole, keep nothing)."""
        return self.payload(key, ids, b"", b"")

    def payload(self, key: str | None, ids: TokenIds, head: bytes, rest: bytes) -> bytes:
        """``head + ids_json(key, ids) + rest`` in one copy (an engine request body)."""
        arr = np.ascontiguousarray(ids, dtype=IDS_DTYPE)
        if key is None:
            return b"".join((head, orjson.dumps(arr, option=_NUMPY), rest))
        raw = arr.data.cast("B")  # the ids' bytes, not copied
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._size -= len(entry[0]) + len(entry[1])
            if not self._extend(entry, arr, raw):
                entry = None
        if entry is None:
            entry = (bytearray(raw), bytearray(orjson.dumps(arr, option=_NUMPY)))
        else:
            self.reused += 1
        body = b"".join((head, entry[1], rest))
        size = len(entry[0]) + len(entry[1])
        if size <= self.max_bytes:
            self._entries[key] = entry
            self._size += size
            while self._size > self.max_bytes or len(self._entries) > self.max_entries:
                _, (old_raw, old_text) = self._entries.popitem(last=False)
                self._size -= len(old_raw) + len(old_text)
        return body

    @staticmethod
    def _extend(entry: tuple[bytearray, bytearray], arr: np.ndarray, raw: memoryview) -> bool:
        """Grow the entry in place to ``arr`` when ``arr`` starts with its ids (the
        buffers grow with slack, as lists do: no new copy of the whole prompt a turn)."""
        prev_raw, text = entry
        # one memcmp (bytearray == buffer), not a copy of the whole prompt's bytes
        if not prev_raw or len(raw) < len(prev_raw) or prev_raw != raw[: len(prev_raw)]:
            return False
        tail = arr[len(prev_raw) // arr.itemsize :]
        if len(tail):
            # "[1,2" + "," + "3,4]": the text without its "]", the tail's without "["
            prev_raw += raw[len(prev_raw):]
            text[-1:] = b","
            text += memoryview(orjson.dumps(tail, option=_NUMPY))[1:]
        return True

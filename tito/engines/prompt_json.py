"""The JSON text of a prompt's token ids, built on the previous turn's: O(new ids) a turn.

A session's prompt at turn n starts with its prompt at turn n-1, bit for bit (the TITO
invariant: prompt + completion of turn n-1 is a prefix of the prompt of turn n). An engine
client that sends ids as JSON (SGLang's ``input_ids``, vLLM's ``prompt``) therefore
serializes only the ids past the previous prompt, and splices them onto that prompt's
text: a 3,000-id prompt costs ~27 us to serialize whole, the 150 new ids ~2 us.

Entries are keyed by session (:func:`prompt_key`: the session of a gateway request id; a
foreign request id, a one-off call, keeps nothing) and hold the previous prompt's raw ids,
so an entry is used only when the new prompt starts with exactly those ids (one
``memcmp``): a rolled-back or branched prompt that does not is serialized whole, and
replaces the entry. Least recently used entries are evicted past a byte budget (ids +
text, about 11 bytes a token).
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

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def prompt_key(rid: str) -> str | None:
    """The session of a gateway request id (``<session>_t<turn>_<hex>``); None for any
    other id (nothing to reuse: it is not a turn of a session)."""
    session = session_of(rid)
    return None if session == rid else session


class PromptJson:
    """``ids_json(key, ids)``: the JSON array text of ``ids``, equal to
    ``orjson.dumps(list(ids))``, reusing the text of ``key``'s previous prompt."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[bytes, bytes]] = OrderedDict()
        """key -> (the previous prompt's ids as raw int32 bytes, its JSON text)."""
        self._size = 0
        self.reused = 0
        """Calls that spliced onto a stored prompt (the rest serialized the whole prompt)."""

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._size

    def ids_json(self, key: str | None, ids: TokenIds) -> bytes:
        """``key``: the session (None: serialize whole, keep nothing)."""
        arr = np.ascontiguousarray(ids, dtype=IDS_DTYPE)
        if key is None:
            return orjson.dumps(arr, option=_NUMPY)
        raw = arr.tobytes()
        text = None
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._size -= len(entry[0]) + len(entry[1])
            text = self._spliced(arr, raw, *entry)
        if text is None:
            text = orjson.dumps(arr, option=_NUMPY)
        else:
            self.reused += 1
        if len(raw) + len(text) <= self.max_bytes:
            self._entries[key] = (raw, text)
            self._size += len(raw) + len(text)
            while self._size > self.max_bytes:
                _, (old_raw, old_text) = self._entries.popitem(last=False)
                self._size -= len(old_raw) + len(old_text)
        return text

    @staticmethod
    def _spliced(arr: np.ndarray, raw: bytes, prev_raw: bytes, prev_text: bytes
                 ) -> bytes | None:
        """``arr``'s text from the previous prompt's, when ``arr`` starts with it."""
        if not prev_raw or not raw.startswith(prev_raw):
            return None
        tail = arr[len(prev_raw) // arr.itemsize :]
        if not len(tail):
            return prev_text
        # "[1,2" + "," + "3,4]": the previous text without its "]", the tail's without "["
        return b"".join((memoryview(prev_text)[:-1], b",",
                         memoryview(orjson.dumps(tail, option=_NUMPY))[1:]))

"""Encodings of long texts that come back: the fast encoder's memory for repeated pieces.

Every session of a harness opens with the same system prompt and tool list (Claude Code:
~100 KB of text between two added tokens), and the first turn of each session renders and
encodes it from scratch: ~8 ms of ``tiktoken`` for 25k tokens, where looking it up costs
the string's hash (~50 µs). :class:`RepeatedPieces` keeps the ids of a long piece of
ordinary text once it has been seen twice (a doorkeeper set of hashes admits it: a tool
result that never comes back is hashed, never stored), least recently used first out,
within a bound on the characters kept. Encoding is a pure function of the text, so a kept
encoding is exactly what encoding the text again gives; the key is the text itself (a hash
collision only admits a piece early).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable

LONG_PIECE = 1024
"""Pieces of at least this many characters go through the cache (shorter ones cost little
to encode next to a lookup, and the encoder keeps the shortest in its own table)."""
KEPT_CHARS = 2 << 20
"""At most this many characters of pieces are kept (their ids take 4 bytes each, at most
one per character: with the keys, ~10 MB at most)."""
SEEN_KEPT = 8192
"""Hashes of pieces seen once, at most (then the set starts over)."""


class RepeatedPieces:
    """``encode`` through a cache of the long pieces seen at least twice; thread-safe (the
    gateway encodes on its event loop and in its worker pool)."""

    def __init__(self, encode: Callable[[str], list[int]], *, kept_chars: int = KEPT_CHARS,
                 seen_kept: int = SEEN_KEPT) -> None:
        self.encode = encode
        self.kept_chars = kept_chars
        self.seen_kept = seen_kept
        self._kept: dict[str, array[int]] = {}  # least recently used first
        self._chars = 0
        self._seen: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, piece: str) -> list[int]:
        key = hash(piece)
        with self._lock:
            ids = self._kept.pop(piece, None)
            if ids is not None:
                self._kept[piece] = ids  # the most recently used now
                return ids.tolist()
            admit = key in self._seen
            if not admit:
                if len(self._seen) >= self.seen_kept:
                    self._seen.clear()
                self._seen.add(key)
        out = self.encode(piece)
        if admit and len(piece) <= self.kept_chars:
            try:
                self._keep(piece, array("I", out))
            except OverflowError:  # an id past 32 bits: not kept
                pass
        return out

    def _keep(self, piece: str, ids: array[int]) -> None:
        with self._lock:
            if piece in self._kept:
                return
            self._seen.discard(hash(piece))
            self._kept[piece] = ids
            self._chars += len(piece)
            while self._chars > self.kept_chars:
                oldest = next(iter(self._kept))
                del self._kept[oldest]
                self._chars -= len(oldest)

    def __len__(self) -> int:
        return len(self._kept)

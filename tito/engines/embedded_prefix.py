"""A small prefix cache for the embedded engine: finished sequences' KV, reused by prefix.

Agent turns are append-only (turn k+1's prompt starts with turn k's prompt and output), so
keeping each finished sequence's KV cache and copying its longest common prefix into a new
request skips most of the prefill, which dominates a multi-turn rollout on a CPU. Entries
are evicted least-recently-used past a byte budget; an entry whose tokens are a prefix of a
newer entry's is dropped at once (the newer one covers it). As in SGLang, at most
``len(prompt) - 1`` tokens are reused: the last prompt token is always recomputed to get
the next-token logits.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tito.engines.embedded_model import KVCache


@dataclass(slots=True)
class PrefixEntry:
    tokens: np.ndarray  # int64, the tokens whose KV is in ``cache``
    cache: KVCache


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m


class PrefixStore:
    """Finished sequences' KV caches, looked up by longest common token prefix."""

    def __init__(self, budget_bytes: int, min_match: int = 4):
        self.budget_bytes = budget_bytes
        self.min_match = min_match
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self._ids = itertools.count()
        self._bytes = 0
        self.hits = 0
        self.lookups = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, prompt: Sequence[int]) -> tuple[PrefixEntry | None, int]:
        """The entry sharing the longest prefix with ``prompt`` and that length (capped at
        ``len(prompt) - 1``); ``(None, 0)`` below ``min_match``."""
        self.lookups += 1
        if not self._entries or len(prompt) < 2:
            return None, 0
        arr = np.asarray(prompt, dtype=np.int64)
        best_key, best_n = None, 0
        for key, entry in self._entries.items():
            n = common_prefix(entry.tokens, arr)
            if n > best_n:
                best_key, best_n = key, n
        best_n = min(best_n, len(prompt) - 1)
        if best_key is None or best_n < self.min_match:
            return None, 0
        self._entries.move_to_end(best_key)
        self.hits += 1
        return self._entries[best_key], best_n

    def put(self, tokens: Sequence[int], cache: KVCache) -> None:
        """Keep ``cache`` (holding KV for exactly ``tokens``) for later prefix matches."""
        if len(tokens) < self.min_match or not 0 < cache.nbytes <= self.budget_bytes:
            return
        arr = np.asarray(tokens, dtype=np.int64)
        cache.length = len(arr)
        for key in [
            k for k, e in self._entries.items()
            if len(e.tokens) <= len(arr) and common_prefix(e.tokens, arr) == len(e.tokens)
        ]:
            self._drop(key)
        self._entries[next(self._ids)] = PrefixEntry(arr, cache)
        self._bytes += cache.nbytes
        while self._bytes > self.budget_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        for key in list(self._entries):
            self._drop(key)

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.cache.nbytes

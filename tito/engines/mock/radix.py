"""The mock's stand-in for SGLang's radix cache: it only has to report ``cached_tokens``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class RadixCache:
    """Longest cached prefix of a token sequence, page-keyed for speed (exact per token)."""

    PAGE = 16

    def __init__(self, max_pages: int = 1 << 18) -> None:
        self.root: dict[bytes, Any] = {}
        self.pages = 0
        self.max_pages = max_pages
        """Bound on memory (4M tokens by default): beyond it everything is evicted."""

    @staticmethod
    def _bytes(ids: Sequence[int]) -> bytes:
        return np.asarray(ids, dtype="<i4").tobytes()

    def match(self, ids: Sequence[int]) -> int:
        data = self._bytes(ids)
        step = self.PAGE * 4
        node, pos = self.root, 0
        while True:
            key = data[pos : pos + step]
            child = node.get(key) if len(key) == step else None
            if child is not None:
                node, pos = child, pos + step
                continue
            best = 0
            for k in node:
                n = min(len(k), len(key))
                i = 0
                while i < n and k[i : i + 4] == key[i : i + 4]:
                    i += 4
                best = max(best, i)
            return (pos + best) // 4

    def insert(self, ids: Sequence[int]) -> None:
        data = self._bytes(ids)
        step = self.PAGE * 4
        if self.pages + len(data) // step > self.max_pages:
            self.clear()
        node, pos = self.root, 0
        while pos + step <= len(data):
            key = data[pos : pos + step]
            child = node.get(key)
            if child is None:
                child = node[key] = {}
                self.pages += 1
            node, pos = child, pos + step
        tail = data[pos:]
        if tail and tail not in node:
            node[tail] = None  # a partial page: a leaf

    def clear(self) -> None:
        self.root = {}
        self.pages = 0

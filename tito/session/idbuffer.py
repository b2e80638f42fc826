"""A growable int32 token buffer: amortised O(1) append, O(1) truncate, zero-copy view."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tito.types.records import IDS_DTYPE


class IdBuffer:
    __slots__ = ("_data", "_len")

    def __init__(self, ids: Sequence[int] | np.ndarray = ()) -> None:
        arr = np.asarray(ids, dtype=IDS_DTYPE)
        self._data = np.empty(max(64, 2 * len(arr)), dtype=IDS_DTYPE)
        self._data[: len(arr)] = arr
        self._len = len(arr)

    def __len__(self) -> int:
        return self._len

    def view(self) -> np.ndarray:
        """The ids (a view: valid until the next mutation)."""
        return self._data[: self._len]

    @property
    def storage(self) -> np.ndarray:
        """The whole allocated array (ids, then room). A view of ``[a:b]``, ``b <=
        len(self)``, keeps its values unless the buffer is truncated below ``b`` and then
        extended (which writes over them); growing copies the ids to a new array and
        leaves this one as it was."""
        return self._data

    def last(self) -> int | None:
        return int(self._data[self._len - 1]) if self._len else None

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot truncate {self._len} ids to {length}")
        self._len = length

    def followed_by(self, ids: np.ndarray) -> np.ndarray | None:
        """The ids, then ``ids``, as a view of the storage: ``ids`` are written in the
        room past the ids, which stay as they are (so does the length); None when the room
        is too small. The view keeps its values until the buffer is truncated below its
        end and extended, or extended with other ids, or asked again (each call writes
        over the room)."""
        end = self._len + len(ids)
        if end > len(self._data):
            return None
        self._data[self._len : end] = ids
        return self._data[:end]

    def reserve(self, capacity: int) -> None:
        """Room for ``capacity`` ids: after this, truncating and extending up to that
        length cannot fail (the only allocation happens here)."""
        if capacity > len(self._data):
            grown = np.empty(max(capacity, 2 * len(self._data)), dtype=IDS_DTYPE)
            grown[: self._len] = self._data[: self._len]
            self._data = grown

    def extend(self, ids: Sequence[int] | np.ndarray) -> None:
        arr = np.asarray(ids, dtype=IDS_DTYPE)
        need = self._len + len(arr)
        self.reserve(need)
        self._data[self._len : need] = arr
        self._len = need

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

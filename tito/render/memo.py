"""Trusted stand-in bridges remembered as skeletons of the bridge text itself.

Once a slot trusts its stand-ins (:mod:`tito.render.standin`), its bridge text is the
junction, then the stand-in render of the appended messages past the synthetic base: the
base's render is cached and the appended messages fill a skeleton
(:mod:`tito.render.skeleton`). For one slot, one shape of the appended messages and one
kind of stored last id (none, a stop id, another id), everything but the contents is the
same every turn: the drop, the junction, the base's length, the skeleton's pieces. A
:class:`BridgeMemo` keeps that as one skeleton whose first piece starts after the base, so
a turn's bridge text is one fill. An entry is made from a bridge text the renderer
computed, and only when filling it with the same contents gives that very text.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from tito.render.skeleton import Shape, Skeleton

MemoKey = tuple[bytes, Shape, bool, bool]
"""(the slot, the shape of the appended messages, no stored last id, it is a stop id)."""
MEMOS = 256
"""Entries a renderer keeps (then it starts over). Each holds its slot, whose bytes
carry the request's tool list (up to ~100 KB for a harness): a bound on that copy."""


def bridge_skeleton(base_text: str, skeleton: Skeleton, drop: int, junction: str,
                    contents: Sequence[str], expected: tuple[int, str]) -> Skeleton | None:
    """The skeleton of the bridge text (``junction``, then the skeleton's fill past
    ``base_text``), when it gives ``expected`` (drop, text) for ``contents``; else None."""
    first = skeleton.pieces[0]
    if not first.startswith(base_text):
        return None
    memo = Skeleton((junction + first[len(base_text):], *skeleton.pieces[1:]), skeleton.slots)
    if (drop, memo.fill(contents)) != expected:
        return None
    return memo


class BridgeMemo:
    """Per memo key: the drop and the bridge text's skeleton, or None (no memo for it)."""

    def __init__(self, size: int = MEMOS) -> None:
        self.size = size
        self._entries: dict[MemoKey, tuple[int, Skeleton] | None] = {}

    def __contains__(self, key: MemoKey) -> bool:
        return key in self._entries

    def get(self, key: MemoKey) -> tuple[int, Skeleton] | None:
        return self._entries.get(key)

    def put(self, key: MemoKey, entry: tuple[int, Skeleton] | None) -> None:
        if len(self._entries) >= self.size:
            self._entries.clear()
        self._entries[key] = entry

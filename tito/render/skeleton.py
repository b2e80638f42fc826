"""Bridge skeletons: the render of appended messages with their contents as slots.

Every later turn renders the bridge's synthetic base + the appended messages with the chat
template (:meth:`tito.render.base.TemplateRenderer.bridge`). When the template treats each
appended content as an opaque string, that render is one fixed text with the contents
pasted in. So a *skeleton* is rendered once per shape (roles, fields, the base's key) with
sentinel contents, checked against a second render with other sentinels, and filled by
joining strings afterwards: far cheaper than a Jinja render (figures in
docs/performance.md, "Figures behind the code").

A content qualifies (:func:`opaque`) when it is a non-empty string with no whitespace at
either end, no ``<`` and no sentinel character. The content-dependent branches of the
supported templates test the edges (``strip``, ``trim``) or look for markers that start
with ``<`` (``<tool_response>``, ``</think>``), so a qualifying content takes the branch the
sentinel took. A template that escapes or rewrites content (``tojson``, ``split``) loses
the sentinel (which carries a quote, a backslash, a newline and an apostrophe) in its
output and gets no skeleton; neither does a render that fails. Other
contents, and messages with fields beyond ``role``, ``content``, ``name`` and
``tool_call_id``, render with the template as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tito.types.messages import Message

OPEN, CLOSE = "\ue000", "\ue001"
"""Private-use characters around a sentinel: not whitespace, not markup."""
_FIELDS = frozenset({"role", "content", "name", "tool_call_id"})
Shape = tuple[tuple[object, ...], ...]


def opaque(content: object) -> bool:
    """A content the template cannot tell from a sentinel."""
    return (isinstance(content, str) and content != "" and not content[0].isspace()
            and not content[-1].isspace() and "<" not in content
            and OPEN not in content and CLOSE not in content)


def shape_of(appended: Sequence[Message], keyed: frozenset[str]) -> Shape | None:
    """What a skeleton depends on: per message its role, field names and the values of
    the ``keyed`` fields (those the template or the family reads). None: no skeleton."""
    shape = []
    for m in appended:
        if not m.keys() <= _FIELDS or not opaque(m.get("content")):
            return None
        shape.append((m.get("role"), *sorted(m.keys()),
                      *((f, m[f]) for f in sorted(keyed) if f in m)))
    return tuple(shape)


@dataclass(frozen=True, slots=True)
class Skeleton:
    pieces: tuple[str, ...]
    """Text around the slots: one more piece than slots."""
    slots: tuple[int, ...]
    """For each slot, the appended message whose content fills it."""

    def fill(self, contents: Sequence[str]) -> str:
        parts = [self.pieces[0]]
        for slot, piece in zip(self.slots, self.pieces[1:], strict=True):
            parts += (contents[slot], piece)
        return "".join(parts)


_ESCAPED = '"\\\n\''
"""Characters every escaping filter changes (``tojson``, HTML escaping), inside each
sentinel: a template that escapes content loses the sentinel."""


def _sentinel(tag: str, index: int) -> str:
    return f"{OPEN}{tag}{index}{_ESCAPED}{CLOSE}"


def build_skeleton(render: Callable[[list[Message]], str],
                   appended: Sequence[Message]) -> Skeleton | None:
    """The skeleton of ``render(appended)``, or None when the template does not treat
    every content as an opaque string (or the render fails)."""
    try:
        first = render([{**m, "content": _sentinel("a", i)} for i, m in enumerate(appended)])
        second = render([{**m, "content": _sentinel("b", i)} for i, m in enumerate(appended)])
    except Exception:
        return None
    parts = re.split(f"{OPEN}a(\\d+){re.escape(_ESCAPED)}{CLOSE}", first)
    skeleton = Skeleton(tuple(parts[0::2]), tuple(int(i) for i in parts[1::2]))
    if set(skeleton.slots) != set(range(len(appended))) or OPEN in "".join(skeleton.pieces):
        return None  # a content is missing, rewritten or escaped
    if skeleton.fill([_sentinel("b", i) for i in range(len(appended))]) != second:
        return None
    return skeleton

"""The ``tito_session_mismatch`` comparator (design §4.4).

Compares a trajectory's accumulated ids with the canonical render of its committed
messages, segmented at special tokens. Classes:

- ``special_token_count``: the special/content segment structure differs;
- ``special_token_type``: a special token differs;
- ``non_assistant_text``: text outside assistant turns differs;
- ``assistant_text``: assistant text differs (expected: history assistant tokens are the
  model's own ids, which need not equal a re-tokenization of the parsed message).

The first three (:data:`tito.types.mismatch.STRICT_TYPES`) must be zero for a correct
family. Per family: the special-token set that
segments (``FamilySpec.comparator_special``, e.g. Kimi leaves out ``<|im_middle|>``), the
trailing tokens stripped from both ends (``trailing_tokens``: stop tokens the next turn's
template replaces, e.g. GLM's ``<|user|>``), and how assistant text is recognised
(``assistant_start``, ``turn_openers``, ``assistant_openers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tito.render.base import TemplateRenderer
from tito.render.divergence import Hints, hints_for, id_divergence
from tito.types.mismatch import MISMATCH_TYPES

_CLIP = 200


def segments(ids: Sequence[int], special: frozenset[int]) -> list[tuple[bool, list[int]]]:
    """Split ids into (is_special, ids) segments: each special token alone, text grouped."""
    out: list[tuple[bool, list[int]]] = []
    for tid in ids:
        tid = int(tid)
        if tid in special:
            out.append((True, [tid]))
        elif out and not out[-1][0]:
            out[-1][1].append(tid)
        else:
            out.append((False, [tid]))
    return out


def special_set(renderer: TemplateRenderer) -> frozenset[int]:
    tok = renderer.tokenizer
    names = renderer.spec.comparator_special
    if names is None:
        return tok.special_ids
    return frozenset(i for n in names if (i := tok.token_to_id(n)) is not None)


def _trailing_ids(renderer: TemplateRenderer) -> frozenset[int]:
    tok = renderer.tokenizer
    return frozenset(i for n in renderer.spec.trailing_tokens
                     if (i := tok.token_to_id(n)) is not None)


def _strip_trailing(ids: list[int], trailing: frozenset[int]) -> list[int]:
    while ids and ids[-1] in trailing:
        ids = ids[:-1]
    return ids


def _canonical_ids(renderer: TemplateRenderer, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None, *, last_turn_closed: bool,
                   template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """The canonical render, ending where the model's last output ends.

    The junction after the final stop token is never generated; when the last turn did not
    end with a stop id (cut by ``length``, an ``abort`` or a stop string), its closer is
    not in the accumulated ids either.
    """
    text = renderer.render_text(messages, tools=tools, template_kwargs=template_kwargs)
    stop, junction = renderer.junction_text(text)
    if stop is not None:
        text = text[: len(text) - len(junction) - (0 if last_turn_closed else len(stop))]
    return renderer.tokenizer.encode(text)


class _RoleTracker:
    """Which segments are assistant text, from the openers seen so far."""

    def __init__(self, renderer: TemplateRenderer) -> None:
        spec = renderer.spec
        self.start = spec.assistant_start
        self.openers = spec.turn_openers
        self.assistant = spec.assistant_openers or ((self.start,) if self.start else ())
        self.tail = ""  # text since the last opener (bounded)
        self.role_text = ""

    def feed(self, text: str) -> None:
        if not self.openers:
            self.tail = text
            return
        joined = self.tail + text
        best = max(((joined.rfind(o), o) for o in self.openers), default=(-1, ""))
        if best[0] >= 0:
            self.role_text = joined[best[0]:best[0] + 64]
            self.tail = joined[best[0]:][-256:]
        else:
            self.tail = joined[-256:]

    def is_assistant(self, text: str) -> bool:
        if not self.assistant:
            return False
        if not self.openers:
            return any((self.tail + text).startswith(a) for a in self.assistant)
        probe = (self.role_text if self.role_text else "") + ""
        joined = self.tail + text
        best = max(((joined.rfind(o), o) for o in self.openers), default=(-1, ""))
        if best[0] >= len(self.tail):  # an opener inside this very segment
            probe = joined[best[0]:best[0] + 64]
        return any(probe.startswith(a) for a in self.assistant)


@dataclass(frozen=True, slots=True)
class TurnSpan:
    """Where one turn of a path ends: its messages (its assistant included), its held ids
    (less what the next turn's junction dropped) and the template kwargs it ran with."""

    messages: int
    ids: int
    kwargs: dict[str, Any] | None = None


Segments = list[tuple[bool, list[int]]]


def _boundary(segs: Segments) -> int:
    """Segments a longer sequence surely shares with this prefix (a trailing text segment
    may go on)."""
    return len(segs) - (1 if segs and not segs[-1][0] else 0)


def _groups(turns: Sequence[TurnSpan] | None, n_messages: int, n_ids: int,
            kwargs: dict[str, Any] | None) -> list[tuple[TurnSpan | None, TurnSpan]]:
    """(turn before, last turn) of each run of turns rendered with the same kwargs; the
    last run ends at the whole path."""
    if not turns:
        return [(None, TurnSpan(n_messages, n_ids, kwargs))]
    out: list[tuple[TurnSpan | None, TurnSpan]] = []
    prev: TurnSpan | None = None
    for k, turn in enumerate(turns):
        last = k + 1 == len(turns)
        if last or turns[k + 1].kwargs != turn.kwargs:
            end = TurnSpan(n_messages, n_ids, turn.kwargs) if last else turn
            out.append((prev, end))
            prev = turn
    return out


class _Comparer:
    """One path's comparison, run by runs of turns with equal template kwargs: each run's
    new segments against the canonical render under that run's own kwargs."""

    def __init__(self, renderer: TemplateRenderer, messages: list[dict[str, Any]],
                 accumulated: list[int], tools: list[dict[str, Any]] | None,
                 junctions: tuple[int, ...]) -> None:
        self.renderer, self.messages, self.acc, self.tools = renderer, messages, accumulated, tools
        self.special = special_set(renderer)
        self.trailing = _trailing_ids(renderer)
        self.actual = segments(_strip_trailing(accumulated, self.trailing), self.special)
        self.offsets = list(np.cumsum([0] + [len(s) for _, s in self.actual]))
        self.junctions = junctions
        self._hints: Hints | None = None  # built on the first mismatch
        self.roles = _RoleTracker(renderer)

    @property
    def hints(self) -> Hints:
        if self._hints is None:
            self._hints = hints_for(self.renderer, self.messages, junctions=self.junctions)
        return self._hints

    def _held(self, n_ids: int) -> Segments:
        return segments(_strip_trailing(self.acc[:n_ids], self.trailing), self.special)

    def _canonical(self, turn: TurnSpan, kwargs: dict[str, Any] | None) -> Segments:
        closed = self.acc[turn.ids - 1] in self.renderer.stop_ids if turn.ids else True
        ids = _canonical_ids(self.renderer, self.messages[: turn.messages], self.tools,
                             last_turn_closed=closed, template_kwargs=kwargs)
        return segments(_strip_trailing(ids, self.trailing), self.special)

    def run(self, prev: TurnSpan | None, end: TurnSpan, last: bool) -> list[dict[str, Any]]:
        kwargs = end.kwargs
        a_lo = 0 if prev is None else _boundary(self._held(prev.ids))
        a_hi = len(self.actual) if last else _boundary(self._held(end.ids))
        canon = self._canonical(end, kwargs)
        c_lo = 0 if prev is None else _boundary(self._canonical(prev, kwargs))
        c_hi = len(canon) if last else _boundary(canon)
        return self.compare(canon[c_lo:c_hi], self.actual[a_lo:a_hi], a_lo)

    def _first_diff(self, exp: list[int], act: list[int], at: int) -> dict[str, Any]:
        hints = replace(self.hints, junctions=tuple(j - self.offsets[at]
                                                    for j in self.hints.junctions))
        div = id_divergence(self.renderer.tokenizer, exp, act, hints)
        if div is None:
            return {"reason": "text_differs", "first_diff": None}
        first = {"token_index": None if div.token_index is None
                 else int(self.offsets[at]) + div.token_index,
                 "expected_id": div.expected_id, "actual_id": div.actual_id,
                 "expected_token": div.expected_token, "actual_token": div.actual_token}
        return {"reason": div.reason, "first_diff": first}

    def compare(self, expected: Segments, actual: Segments, at: int) -> list[dict[str, Any]]:
        tok = self.renderer.tokenizer
        if [s for s, _ in expected] != [s for s, _ in actual]:
            flat = [[i for _, seg in segs for i in seg] for segs in (expected, actual)]
            return [{
                "type": "special_token_count",
                "segment_index": -1,
                "expected_text": f"{len(expected)} segments",
                "actual_text": f"{len(actual)} segments",
                "detail": (f"segment count differs: expected {len(expected)}, got {len(actual)}"
                           if len(expected) != len(actual)
                           else "segment structure (special/content pattern) differs"),
                **self._first_diff(flat[0], flat[1], at),
            }]
        report: list[dict[str, Any]] = []
        for i, ((is_special, exp), (_, act)) in enumerate(zip(expected, actual, strict=True)):
            exp_text = tok.decode(exp)
            if exp != act:
                act_text = tok.decode(act)
                kind = None
                if is_special:
                    kind = "special_token_type"
                elif exp_text != act_text:  # same text, other ids: not a content mismatch
                    kind = ("assistant_text" if self.roles.is_assistant(exp_text)
                            else "non_assistant_text")
                if kind is not None:
                    report.append({"type": kind, "segment_index": at + i,
                                   "expected_text": exp_text[:_CLIP],
                                   "actual_text": act_text[:_CLIP],
                                   "detail": f"segment {at + i} differs",
                                   **self._first_diff(exp, act, at + i)})
            self.roles.feed(exp_text)
        return report


def mismatch_report(renderer: TemplateRenderer, messages: list[dict[str, Any]],
                    accumulated: np.ndarray | Sequence[int],
                    *, tools: list[dict[str, Any]] | None = None,
                    template_kwargs: dict[str, Any] | None = None,
                    turns: Sequence[TurnSpan] | None = None) -> list[dict[str, Any]]:
    """Mismatches between ``accumulated`` and the canonical render of ``messages``.

    ``turns``: where each turn ends and the kwargs it ran with; each run of turns with
    equal kwargs is compared under its own kwargs (a session that switches thinking
    between turns is compared turn by turn). Without ``turns``, the whole path is compared
    under ``template_kwargs``. Each item carries its ``reason``
    (:data:`tito.types.mismatch.REASONS`) and ``first_diff`` (the first differing token)."""
    if not messages or len(accumulated) == 0:
        return []
    acc = [int(i) for i in accumulated]
    if turns and (turns[-1].messages > len(messages) or turns[-1].ids > len(acc)):
        turns = None  # spans that do not fit this path: compare it whole
    junctions = tuple(t.ids for t in (turns or [])[:-1])
    comparer = _Comparer(renderer, messages, acc, tools, junctions)
    groups = _groups(turns, len(messages), len(acc), template_kwargs)
    report: list[dict[str, Any]] = []
    for g, (prev, end) in enumerate(groups):
        items = comparer.run(prev, end, g + 1 == len(groups))
        report.extend(items)
        if any(item["type"] == "special_token_count" for item in items):
            break  # the structure is lost from here on
    return report


def count_by_type(report: list[dict[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(MISMATCH_TYPES, 0)
    for item in report:
        counts[item["type"]] += 1
    return counts

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
from typing import Any

import numpy as np

from tito.render.base import TemplateRenderer
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


def mismatch_report(renderer: TemplateRenderer, messages: list[dict[str, Any]],
                    accumulated: np.ndarray | Sequence[int],
                    *, tools: list[dict[str, Any]] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Mismatches between ``accumulated`` and the canonical render of ``messages`` (with
    the template settings the session's turns were rendered with)."""
    if not messages or len(accumulated) == 0:
        return []
    last_turn_closed = int(accumulated[-1]) in renderer.stop_ids
    tok = renderer.tokenizer
    special = special_set(renderer)
    trailing = _trailing_ids(renderer)
    canonical = _canonical_ids(renderer, messages, tools, last_turn_closed=last_turn_closed,
                               template_kwargs=template_kwargs)
    expected = segments(_strip_trailing(canonical, trailing), special)
    actual = segments(_strip_trailing([int(i) for i in accumulated], trailing), special)
    if [s for s, _ in expected] != [s for s, _ in actual]:
        return [{
            "type": "special_token_count",
            "segment_index": -1,
            "expected_text": f"{len(expected)} segments",
            "actual_text": f"{len(actual)} segments",
            "detail": (f"segment count differs: expected {len(expected)}, got {len(actual)}"
                       if len(expected) != len(actual)
                       else "segment structure (special/content pattern) differs"),
        }]
    roles = _RoleTracker(renderer)
    report: list[dict[str, Any]] = []
    for i, ((is_special, exp), (_, act)) in enumerate(zip(expected, actual, strict=True)):
        exp_text = tok.decode(exp)
        if exp != act:
            act_text = tok.decode(act)
            kind = None
            if is_special:
                kind = "special_token_type"
            elif exp_text != act_text:  # same text, other ids: not a content mismatch
                kind = "assistant_text" if roles.is_assistant(exp_text) else "non_assistant_text"
            if kind is not None:
                report.append({
                    "type": kind,
                    "segment_index": i,
                    "expected_text": exp_text[:_CLIP],
                    "actual_text": act_text[:_CLIP],
                    "detail": f"segment {i} differs",
                })
        roles.feed(exp_text)
    return report


def count_by_type(report: list[dict[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(MISMATCH_TYPES, 0)
    for item in report:
        counts[item["type"]] += 1
    return counts

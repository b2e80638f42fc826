"""The ``tito_session_mismatch`` comparator (DESIGN 4.4).

Compares a trajectory's accumulated ids with the canonical render of its committed
messages, segmented at special tokens. Classes:

- ``special_token_count``: the special/content segment structure differs;
- ``special_token_type``: a special token differs;
- ``non_assistant_text``: text outside assistant turns differs;
- ``assistant_text``: assistant text differs (expected: history assistant tokens are the
  model's own ids, which need not equal a re-tokenization of the parsed message).

The first three must be zero for a correct family.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tito.render.base import TemplateRenderer

MISMATCH_TYPES = ("special_token_count", "special_token_type", "non_assistant_text",
                  "assistant_text")
STRICT_TYPES = MISMATCH_TYPES[:3]
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


def _canonical_ids(renderer: TemplateRenderer, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None) -> list[int]:
    text = renderer.render_text(messages, tools=tools)
    stop, junction = renderer.junction_text(text)
    if stop is not None and junction:
        text = text[: len(text) - len(junction)]
    return renderer.tokenizer.encode(text)


def mismatch_report(renderer: TemplateRenderer, messages: list[dict[str, Any]],
                    accumulated: np.ndarray | Sequence[int],
                    *, tools: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Mismatches between ``accumulated`` and the canonical render of ``messages``."""
    if not messages or len(accumulated) == 0:
        return []
    tok = renderer.tokenizer
    special = tok.special_ids
    expected = segments(_canonical_ids(renderer, messages, tools), special)
    actual = segments(list(accumulated), special)
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
    start = renderer.spec.assistant_start
    report: list[dict[str, Any]] = []
    for i, ((is_special, exp), (_, act)) in enumerate(zip(expected, actual, strict=True)):
        if exp == act:
            continue
        exp_text, act_text = tok.decode(exp), tok.decode(act)
        if is_special:
            kind = "special_token_type"
        elif exp_text == act_text:
            continue  # same text, different tokenization: not a mismatch of content
        else:
            opener = tok.decode(expected[i - 1][1]) if i > 0 else ""
            in_assistant = bool(start) and (opener + exp_text).startswith(start)
            kind = "assistant_text" if in_assistant else "non_assistant_text"
        report.append({
            "type": kind,
            "segment_index": i,
            "expected_text": exp_text[:_CLIP],
            "actual_text": act_text[:_CLIP],
            "detail": f"segment {i} differs",
        })
    return report


def count_by_type(report: list[dict[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(MISMATCH_TYPES, 0)
    for item in report:
        counts[item["type"]] += 1
    return counts

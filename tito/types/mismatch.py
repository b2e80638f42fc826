"""Classes of the ``tito_session_mismatch`` report (design §4.4).

The comparator (:mod:`tito.render.compare`) writes them into a sample's metadata and the
rollout checks (:mod:`tito.client.checks`) read them back, so the names live here, below
both.
"""

from __future__ import annotations

MISMATCH_TYPES: tuple[str, ...] = ("special_token_count", "special_token_type",
                                   "non_assistant_text", "assistant_text")
"""Every class, in report order."""
STRICT_TYPES: tuple[str, ...] = MISMATCH_TYPES[:3]
"""The classes that must be zero for a correct family (``assistant_text`` is expected)."""

REASONS: tuple[str, ...] = (
    "reasoning_dropped", "value_reserialized", "tool_call_rerendered",
    "bpe_merge_across_junction", "tokenization_differs", "truncated_without_close",
    "unknown_closing_sequence", "assistant_in_appended_span", "special_token_differs",
    "text_differs", "parse_mismatch", "render_error")
"""Why a bridge, a verification case or a session comparison diverged (the ``reason`` of a
failed ``tito verify-template`` case, of ``/health``'s self-check and of each
``tito_session_mismatch`` item), a closed set, most specific first:

- ``reasoning_dropped``: the later render lacks reasoning an earlier render (or the held
  ids) carries: the template drops or clears earlier reasoning;
- ``value_reserialized``: a boolean, number or null is written another way (``true`` and
  ``True``, ``2`` and ``2.0``);
- ``tool_call_rerendered``: the divergence lies inside a tool call whose text is rendered
  differently from the held text (spacing, key order, quoting);
- ``bpe_merge_across_junction``: same text, but the ids differ where held ids meet a
  bridge (a fresh tokenization merges across the junction);
- ``tokenization_differs``: same text, the ids differ away from any junction (the model's
  own tokenization of its text);
- ``truncated_without_close``: a turn ends (cut by ``length``, ``abort`` or a stop
  string) where the canonical render has the turn's closing token;
- ``unknown_closing_sequence``: a turn closes with a token or text the family does not
  know as a closer where the canonical render has one of its closers;
- ``assistant_in_appended_span``: the divergence is inside an assistant message supplied
  by the client in the appended span (few-shot, compaction), not a generation;
- ``special_token_differs``: another special token (a different opener or marker);
- ``text_differs``: any other text difference;
- ``parse_mismatch``: parsing a completion does not give its message back (a verifier
  ``parse_round_trip`` case);
- ``render_error``: the template could not render the conversation at all.
"""

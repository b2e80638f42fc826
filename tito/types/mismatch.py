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

"""Sessions: v1 linear (:mod:`.linear`), v2 trees (:mod:`.tree`), on shared primitives
(:mod:`.turns`)."""

from __future__ import annotations

from tito.session.linear import LinearSession
from tito.session.tree import TreeSession

Session = LinearSession | TreeSession
"""A live session of either version."""

__all__ = ["LinearSession", "Session", "TreeSession"]

"""Sessions: the protocol the server uses (:mod:`.base`), sessions of agent contexts
(:mod:`.contexts`, :mod:`.agents`) whose contexts are v1 paths (:mod:`.linear`) or v2
trees (:mod:`.tree`) on shared primitives (:mod:`.turns`), collections of their samples
(:mod:`.collect`) and what they say of themselves (:mod:`.metadata`)."""

from __future__ import annotations

from tito.session.base import Session, SessionBase, StoredBytes, TurnSession
from tito.session.contexts import ContextSession
from tito.session.linear import LinearSession
from tito.session.tree import TreeSession

__all__ = ["ContextSession", "LinearSession", "Session", "SessionBase", "StoredBytes",
           "TreeSession", "TurnSession"]

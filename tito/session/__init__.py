"""Sessions: the protocol the server uses (:mod:`.base`), v1 linear (:mod:`.linear`) and
v2 trees (:mod:`.tree`) on shared primitives (:mod:`.turns`), collections of their
samples (:mod:`.collect`) and what they say of themselves (:mod:`.metadata`)."""

from __future__ import annotations

from tito.session.base import Session, SessionBase, StoredBytes
from tito.session.linear import LinearSession
from tito.session.tree import TreeSession

__all__ = ["LinearSession", "Session", "SessionBase", "StoredBytes", "TreeSession"]

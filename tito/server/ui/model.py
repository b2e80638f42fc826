"""What the viewer knows of one session (or one written sample) at one moment, and a
small cache of those, so that paging through a long strip assembles and decodes once."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from tito.server.ui.strip import Trajectory
from tito.types.errors import BadRequest

TRAJECTORIES_PER_MODEL = 8
MODELS = 4


@dataclass
class SessionModel:
    """One session's views: summary, tree (v2), samples preview, and the strip of any
    path, built on demand by ``build(node)`` (``node`` None: the default path)."""

    id: str
    version: str
    summary: dict[str, Any]
    preview: dict[str, Any]
    build: Callable[[int | None], Trajectory]
    tree: dict[str, Any] | None = None
    nodes: int = 0
    """v2: node ids are ``0 .. nodes - 1``."""
    _paths: OrderedDict[int | None, Trajectory] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check_node(self, node: int | None) -> None:
        if node is None:
            return
        if self.tree is None:
            raise BadRequest("leaf is only meaningful for a v2 session tree")
        if not 0 <= node < self.nodes:
            raise BadRequest(f"no node {node} in this tree (it has {self.nodes} nodes)")

    def trajectory(self, node: int | None) -> Trajectory:
        """The strip of the root→``node`` path (blocking: decodes every token once)."""
        self.check_node(node)
        with self._lock:
            cached = self._paths.get(node)
            if cached is not None:
                self._paths.move_to_end(node)
                return cached
        traj = self.build(node)
        with self._lock:
            self._paths[node] = traj
            while len(self._paths) > TRAJECTORIES_PER_MODEL:
                self._paths.popitem(last=False)
        return traj


class ModelCache:
    """The latest models, keyed by session id and a key of the session's state (a new
    turn, a rollback or a deletion makes a new model)."""

    def __init__(self, size: int = MODELS) -> None:
        self.size = size
        self._models: OrderedDict[str, tuple[Hashable, SessionModel]] = OrderedDict()

    def get(self, session_id: str, state: Hashable) -> SessionModel | None:
        hit = self._models.get(session_id)
        if hit is None or hit[0] != state:
            return None
        self._models.move_to_end(session_id)
        return hit[1]

    def put(self, session_id: str, state: Hashable, model: SessionModel) -> None:
        self._models[session_id] = (state, model)
        self._models.move_to_end(session_id)
        while len(self._models) > self.size:
            self._models.popitem(last=False)

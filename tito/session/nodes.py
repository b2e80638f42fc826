"""The nodes of a v2 trajectory tree (design §5.2) and the paths through them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tito.types.messages import Message
from tito.types.records import TurnRecord


@dataclass(slots=True)
class Node:
    """One committed generation and the messages it added to its parent's path."""

    id: int
    """Creation (= commit) order: the only ordering key."""
    parent: int | None
    depth: int
    """0 for a root."""
    delta: list[Message]
    """The request messages this node appended to its parent's path, then the assistant."""
    tools: list[dict[str, Any]] | None
    record: TurnRecord
    path_messages: int
    """Messages on the root→node path (this node's assistant included)."""
    response_id: str | None = None
    children: list[int] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return self.record.finish_reason == "length"

    @property
    def completion_span(self) -> tuple[int, int]:
        """Where this node's generated ids sit in its root→node snapshot."""
        return self.record.prompt_len, self.record.checkpoint_len


def path_of(nodes: list[Node], node_id: int) -> list[Node]:
    """The root→node path of ``node_id``."""
    path: list[Node] = []
    current: int | None = node_id
    while current is not None:
        node = nodes[current]
        path.append(node)
        current = node.parent
    path.reverse()
    return path


def leaves_of(nodes: list[Node]) -> list[Node]:
    """Childless nodes, in creation order."""
    return [n for n in nodes if not n.children]


def path_messages(path: list[Node]) -> list[Message]:
    return [m for node in path for m in node.delta]

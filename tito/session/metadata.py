"""What a session says about itself (design §6): the metadata of one path — a v1
session's, or one root→leaf path of a v2 tree — with its mismatch report, and the tree
view of a v2 session.

Pure: reads records, messages and ids; the renderer words the mismatch report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tito.render.base import TemplateRenderer
from tito.render.compare import TurnSpan, mismatch_report
from tito.session.nodes import Node, leaves_of, path_messages, path_of
from tito.types.errors import TitoError
from tito.types.messages import Message
from tito.types.records import TurnRecord, snapshot_ids


@dataclass(frozen=True, slots=True)
class Describer:
    """Who describes a path: the gateway's renderer and its instance id."""

    renderer: TemplateRenderer
    instance_id: str

    def path(self, session_id: str, version: str, records: list[TurnRecord],
             messages: list[Message], ids: np.ndarray,
             tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The metadata of one path (records, its messages, its ids), mismatch report
        included: what a sample of it carries."""
        renderer = self.renderer
        meta: dict[str, Any] = {
            "session_id": session_id,
            "session_version": version,
            "family": renderer.family,
            "num_turns": len(records),
            "num_messages": len(messages),
            "num_tokens": len(ids),
            "max_trailing_trim": renderer.max_trailing_trim,
            "max_trim_tokens": renderer.max_trailing_trim,
            "instance_id": self.instance_id,
        }
        for key, fact in (("tito_turn_notes", "notes"), ("tito_tolerated", "tolerated"),
                          ("tito_discarded_turns", "divergence")):
            listed = per_turn(records, fact)
            if listed:
                meta[key] = listed
        kwargs = records[-1].request.get("chat_template_kwargs") if records else None
        try:
            meta["tito_session_mismatch"] = mismatch_report(
                renderer, messages, np.asarray(ids), tools=tools, template_kwargs=kwargs,
                turns=turn_spans(records))
        except TitoError as exc:
            meta["tito_session_mismatch_error"] = exc.message
        return meta

    def trajectory(self, session_id: str, path: list[Node]) -> dict[str, Any]:
        """The metadata of one root→node path of a tree (what v1 reports for its path)."""
        records = [n.record for n in path]
        tools = next((n.tools for n in reversed(path) if n.tools is not None), None)
        return self.path(session_id, "v2", records, path_messages(path),
                         snapshot_ids(records), tools)

    def tree(self, session_id: str, nodes: list[Node], active_leaf: int | None
             ) -> dict[str, Any]:
        """A tree's metadata: that of its active path (the last node when the active leaf
        is not among ``nodes``), and ``tree``."""
        leaf = active_leaf if active_leaf is not None and active_leaf < len(nodes) else \
            (len(nodes) - 1 if nodes else None)
        meta = self.trajectory(session_id, [] if leaf is None else path_of(nodes, leaf))
        meta["tree"] = tree_view(nodes, leaf)
        return meta


def turn_spans(records: list[TurnRecord]) -> list[TurnSpan] | None:
    """Where each turn of a path ends and the template kwargs it ran with (None: a record
    without its message count, e.g. from an older journal)."""
    spans = []
    for k, rec in enumerate(records):
        end = rec.request.get("message_end")
        if not isinstance(end, int):
            return None
        dropped = records[k + 1].drop if k + 1 < len(records) else 0
        spans.append(TurnSpan(end, rec.checkpoint_len - dropped,
                              rec.request.get("chat_template_kwargs")))
    return spans


def per_turn(records: list[TurnRecord], fact: str) -> list[dict[str, Any]]:
    """``[{"turn": k, **fact}]`` for each record whose request facts hold ``fact``."""
    return [{"turn": k, **rec.request[fact]} for k, rec in enumerate(records)
            if rec.request.get(fact)]


def tree_view(nodes: list[Node], active_leaf: int | None) -> dict[str, Any]:
    """``metadata.tree``: every node and every leaf with its path (design §5.2); each
    node has the reference framework's keys (``id``, ``parent``, ``seq`` = its commit
    order, ``truncated``, ``committed_at``, ``completion_span``, ``num_tokens``,
    ``response_id``) and tito's (``depth``, ``rewrote``, ``finish_reason``)."""
    return {
        "active_leaf": active_leaf,
        "nodes": [{"id": n.id, "parent": n.parent, "seq": n.id, "depth": n.depth,
                   "truncated": n.truncated, "completion_span": list(n.completion_span),
                   "num_tokens": n.record.checkpoint_len,
                   "rewrote": n.record.request.get("rewrote", []), "finish_reason":
                   n.record.finish_reason, "committed_at": n.record.commit_ts,
                   "response_id": n.response_id, **(n.record.links or {})}
                  for n in nodes],
        "leaves": [{"node_id": leaf.id, "path_node_ids": [p.id for p in path_of(nodes, leaf.id)]}
                   for leaf in leaves_of(nodes)],
    }

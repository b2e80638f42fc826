"""JSON views of the viewer besides the strip (pure): a session's list entry, the v2
tree with each leaf's fate, the samples preview."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tito.samples.sample import Sample, status_from_finish_reason
from tito.session import Session
from tito.session.tree import Node
from tito.types.errors import AssemblyError
from tito.types.mismatch import MISMATCH_TYPES, STRICT_TYPES

MISMATCH_DETAIL = 5
"""Mismatch entries shown per sample (the counts cover all)."""


def session_item(session: Session) -> dict[str, Any]:
    """A live session in the list: id, version, turns, tokens, status, times."""
    records = session.records
    item: dict[str, Any] = {
        "id": session.session_id, "version": session.version, "turns": len(records),
        "tokens": session.num_tokens, "status": _status(session),
        "created_at": session.created_at, "last_active": session.last_active,
    }
    item.update(session.counts())  # a tree's nodes and leaves
    return item


def context_list(session: Session, shown: str | None) -> dict[str, Any]:
    """A session's agent contexts as the viewer lists them (none: only the main one), and
    the one shown."""
    entries = session.details().get("contexts")
    if not entries:
        return {}
    keys = ("context_id", "agent_id", "role", "parent_agent_id", "parent_tool_call_id",
            "source", "num_turns", "num_tokens", "turn_in_progress")
    return {"context": shown or entries[0]["context_id"],
            "contexts": [{k: e.get(k) for k in keys} for e in entries]}


def _status(session: Session) -> str:
    if session.in_flight:
        return "running"
    records = session.records
    if not records:
        return "empty"
    try:
        return status_from_finish_reason(records[-1].finish_reason)
    except AssemblyError:
        return records[-1].finish_reason


def tree_json(nodes: Sequence[Node], active_leaf: int | None,
              leaf_states: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Every node (with its turn facts) and each leaf's state: ``kept`` (the picker kept
    its sample), ``dropped`` (the picker left it out) or ``trimmed`` (nothing of it
    survives ``max_seq_len``); ``trimmed: true`` on a kept or dropped leaf whose sample
    was cut."""
    return {
        "active_leaf": active_leaf,
        "nodes": [{"id": n.id, "parent": n.parent, "depth": n.depth,
                   "children": list(n.children), "finish_reason": n.record.finish_reason,
                   "truncated": n.truncated, "num_tokens": n.record.checkpoint_len,
                   "bridge_len": len(n.record.bridge_ids),
                   "output_len": len(n.record.output_ids),
                   "e2e_latency": n.record.e2e_latency, "committed_at": n.record.commit_ts,
                   "response_id": n.response_id, "leaf": n.id in leaf_states,
                   **leaf_states.get(n.id, {})}
                  for n in nodes],
    }


def leaf_states(leaves: Sequence[int], path_tokens: dict[int, int],
                assembled: dict[int, Sample], kept: set[int]) -> dict[int, dict[str, Any]]:
    """The fate of each leaf: assembled sample (or none), picked or not, cut or not."""
    states: dict[int, dict[str, Any]] = {}
    for leaf in leaves:
        sample = assembled.get(leaf)
        if sample is None:
            states[leaf] = {"state": "trimmed", "trimmed": True}
            continue
        states[leaf] = {"state": "kept" if leaf in kept else "dropped",
                        "trimmed": len(sample.tokens) < path_tokens.get(leaf, 0)}
    return states


def sample_json(index: int, sample: Sample) -> dict[str, Any]:
    """What a trainer gets in one sample, summarized: lengths, mask coverage, status,
    reward, mismatch classes."""
    meta = sample.metadata
    rl = sample.response_length
    ones = 0 if sample.loss_mask is None else int(sample.loss_mask.sum())
    mismatch = meta.get("tito_session_mismatch")
    entries = [m for m in mismatch if isinstance(m, dict)] if isinstance(mismatch, list) \
        else []
    counts = {kind: sum(1 for m in entries if m.get("type") == kind)
              for kind in MISMATCH_TYPES}
    leaf = meta.get("leaf") if isinstance(meta.get("leaf"), dict) else None
    lifecycle = meta.get("lifecycle")
    return {
        "index": index, "status": sample.status, "tokens": len(sample.tokens),
        "prompt_length": sample.prompt_length, "response_length": rl,
        "loss_mask_ones": ones, "mask_coverage": ones / rl if rl else 0.0,
        "reward": sample.reward, "weight_versions": list(sample.weight_versions),
        "num_turns": len(lifecycle) if isinstance(lifecycle, list) else None,
        "leaf": None if leaf is None else leaf.get("node_id"),
        "path_node_ids": None if leaf is None else leaf.get("path_node_ids"),
        "mismatch": counts, "strict_mismatches": sum(counts[k] for k in STRICT_TYPES),
        "mismatch_detail": entries[:MISMATCH_DETAIL],
        "mismatch_error": meta.get("tito_session_mismatch_error"),
        "aborted_reason": meta.get("aborted_reason"),
        "prefix_cache_info": dict(sample.prefix_cache_info),
    }


def preview_json(samples: Sequence[Sample], empty_reason: str | None,
                 session_metadata: dict[str, Any], error: str | None = None
                 ) -> dict[str, Any]:
    """The samples preview: what ``POST /sessions/<id>/samples`` would return now."""
    keys = ("session_version", "family", "num_turns", "num_messages", "num_tokens",
            "turn_in_progress")
    return {
        "samples": [sample_json(k, s) for k, s in enumerate(samples)],
        "empty_reason": empty_reason,
        "error": error,
        "session": {k: session_metadata[k] for k in keys if k in session_metadata},
    }

"""Samples of a v2 trajectory tree (design §6): one sample per leaf, then a picker and a
postprocessor.

1. :func:`assemble_leaves`: every leaf (creation order) is assembled exactly as v1
   assembles a trajectory (:func:`tito.samples.assembly.assemble`: trim, truncate,
   merge); leaves that truncate away are skipped. Each sample's ``metadata["leaf"]`` says
   where it came from: ``node_id``, ``parent``, ``path_node_ids``, ``response_id`` and
   ``completion_spans`` (``[node_id, start, end]``: where each node's generated ids sit
   in the sample's ``tokens``).
2. a **picker** ``(leaf_samples, session_metadata) -> subset`` chooses what to train on;
   the default, :func:`drop_retries`, drops superseded retries;
3. a **postprocessor** ``(samples, session_metadata, agent_metadata) -> samples``; the
   default, :func:`train_once`, makes every shared completion train exactly once and
   applies the agent's ``reward``.

:func:`run_hooks` runs both, checks the picker's answer (a duplicate-free subset of its
input: selection only) and turns any failure into an :class:`AssemblyError` (422) naming
the hooks. The output is ordered deeper path first, then later commit (in a session of
several agent contexts, the main agent's context first; each context's nodes are its own:
samples carry ``context_id``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tito.samples.assembly import Decode, assemble
from tito.samples.sample import Sample
from tito.types.errors import AssemblyError
from tito.types.records import TurnRecord

Picker = Callable[[list[Sample], dict[str, Any]], list[Sample]]
Postprocessor = Callable[[list[Sample], dict[str, Any], dict[str, Any]], list[Sample]]


@dataclass(frozen=True, slots=True)
class LeafPath:
    """A leaf of the tree and the records of its root→leaf path."""

    path_node_ids: list[int]
    records: list[TurnRecord]
    parent: int | None
    response_id: str | None = None

    @property
    def node_id(self) -> int:
        return self.path_node_ids[-1]


def assemble_leaves(leaves: Sequence[LeafPath], *, decode: Decode,
                    max_seq_len: int | None,
                    metadata_of: Callable[[LeafPath], dict[str, Any]],
                    include_response: bool = True, routing: bool = False,
                    indexer: bool = False, sampling_mask: bool = False) -> list[Sample]:
    """One sample per leaf that survives truncation, in the leaves' order."""
    samples: list[Sample] = []
    for leaf in leaves:
        result = assemble(leaf.records, decode=decode, max_seq_len=max_seq_len,
                          metadata=metadata_of(leaf), include_response=include_response,
                          routing=routing, indexer=indexer, sampling_mask=sampling_mask)
        if not result.samples:
            continue
        sample = result.samples[0]
        spans = [[node_id, start, end] for node_id, (start, end)
                 in zip(leaf.path_node_ids, result.completion_spans, strict=False)]
        sample.metadata["leaf"] = {"node_id": leaf.node_id, "parent": leaf.parent,
                                   "path_node_ids": list(leaf.path_node_ids),
                                   "response_id": leaf.response_id,
                                   "completion_spans": spans}
        samples.append(sample)
    return samples


def leaf_info(sample: Sample) -> dict[str, Any]:
    leaf = sample.metadata.get("leaf")
    if not isinstance(leaf, dict):
        raise AssemblyError("sample metadata has no 'leaf' (not a v2 leaf sample)")
    return leaf


def drop_retries(leaf_samples: list[Sample], session_metadata: dict[str, Any]
                 ) -> list[Sample]:
    """The default picker: drop the leaves retries superseded.

    A leaf with a later sibling (a child of the same parent committed after it) is an
    abandoned attempt: the agent re-sent the request and went on from the new branch;
    unless that sibling went on after a rewritten copy of the leaf's reply (its node's
    ``rewrote``: a harness that edits the model's replies), which supersedes nothing.
    A root leaf is superseded by a later root with the same first prompt (a re-sent
    first turn); a later root with another prompt is another conversation (a
    sub-agent) and supersedes nothing. Deep abandoned lines have no later sibling at
    their leaf and are kept: they are data. In a session of several agent contexts each
    context's tree is its own (``context_id``). Output: the main agent's context first,
    then deeper path first, then later commit.
    """
    groups: dict[Any, list[Sample]] = {}
    for sample in leaf_samples:
        groups.setdefault(sample.metadata.get("context_id"), []).append(sample)
    kept = [s for context, samples in groups.items()
            for s in _not_superseded(samples, tree_of(session_metadata, context))]
    return sorted(kept, key=order_key(session_metadata), reverse=True)


def tree_of(session_metadata: dict[str, Any], context: Any) -> dict[str, Any]:
    """The tree a leaf sample belongs to: the session's, or its agent context's."""
    if context is None:
        return dict(session_metadata["tree"])
    for entry in session_metadata.get("contexts") or ():
        if entry.get("context_id") == context:
            return dict(entry["tree"])
    raise AssemblyError(f"sample of agent context {context!r}, which the session metadata "
                        "does not list")


def _not_superseded(samples: list[Sample], tree: dict[str, Any]) -> list[Sample]:
    nodes = tree["nodes"]
    parents = {node["id"]: node["parent"] for node in nodes}
    rewrote = {node["id"]: set(node.get("rewrote") or ()) for node in nodes}
    children: dict[int | None, list[int]] = {}
    for node_id, parent in parents.items():
        children.setdefault(parent, []).append(node_id)
    root_prompts = {int(leaf_info(s)["path_node_ids"][0]): s.tokens[: s.prompt_length]
                    for s in samples}

    def superseded(sample: Sample) -> bool:
        leaf = leaf_info(sample)
        node_id, parent = int(leaf["node_id"]), leaf["parent"]
        later = [n for n in children.get(parent, []) if n > node_id]
        if parent is not None:
            return any(node_id not in rewrote[n] for n in later)
        prompt = sample.tokens[: sample.prompt_length]
        return any(n in root_prompts and np.array_equal(root_prompts[n], prompt)
                   for n in later)

    return [s for s in samples if not superseded(s)]


def order_key(session_metadata: dict[str, Any]
              ) -> Callable[[Sample], tuple[int, int, int]]:
    """The picked samples' order (descending): the main agent's context first (then the
    others as the session metadata lists them), deeper path first, then later commit."""
    rank = {entry.get("context_id"): k
            for k, entry in enumerate(session_metadata.get("contexts") or ())}

    def key(sample: Sample) -> tuple[int, int, int]:
        leaf = leaf_info(sample)
        return (-rank.get(sample.metadata.get("context_id"), 0), len(leaf["path_node_ids"]),
                int(leaf["node_id"]))

    return key


def train_once(samples: list[Sample], session_metadata: dict[str, Any],
               agent_metadata: dict[str, Any]) -> list[Sample]:
    """The default postprocessor. Every node's completion trains in exactly one sample:
    the kept sample of the earliest leaf (lowest node id) whose path holds it; the others
    zero their loss mask over it (nodes are those of the sample's agent context). An
    agent ``reward`` (a number) becomes every sample's ``reward``. The order is kept."""
    owner: dict[tuple[Any, int], int] = {}
    for k, sample in sorted(enumerate(samples), key=lambda ks: int(leaf_info(ks[1])["node_id"])):
        context = sample.metadata.get("context_id")
        for node_id in leaf_info(sample)["path_node_ids"]:
            owner.setdefault((context, int(node_id)), k)
    for k, sample in enumerate(samples):
        prompt_len = sample.prompt_length
        mask = sample.loss_mask
        context = sample.metadata.get("context_id")
        for node_id, start, end in leaf_info(sample)["completion_spans"]:
            if owner[(context, int(node_id))] == k or mask is None:
                continue
            lo, hi = max(start - prompt_len, 0), max(end - prompt_len, 0)
            if hi > lo:
                mask = mask.copy() if mask is sample.loss_mask else mask
                mask[lo:hi] = 0
        sample.loss_mask = mask
    if "reward" in agent_metadata and agent_metadata["reward"] is not None:
        reward = agent_metadata["reward"]
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise AssemblyError(f"agent metadata reward must be a number, got {reward!r}")
        for sample in samples:
            sample.reward = float(reward)
    return samples


def run_hooks(leaf_samples: list[Sample], *, picker: Picker, postprocessor: Postprocessor,
              names: tuple[str, str], session_metadata: dict[str, Any],
              agent_metadata: dict[str, Any]) -> list[Sample]:
    """Pick, order (deeper path first, then later commit), postprocess; any failure is a
    422 naming both hooks."""
    where = f"session sample hook failed (picker={names[0]}, postprocessor={names[1]})"
    try:
        picked = picker(leaf_samples, session_metadata)
    except AssemblyError as exc:
        raise AssemblyError(f"{where}: {exc.message}") from exc
    except Exception as exc:
        raise AssemblyError(f"{where}: {type(exc).__name__}: {exc}") from exc
    _check_subset(picked, leaf_samples, where)
    # the main agent's context first, deeper path first, then later commit
    picked = sorted(picked, key=order_key(session_metadata), reverse=True)
    try:
        out = postprocessor(picked, session_metadata, agent_metadata)
    except AssemblyError as exc:
        raise AssemblyError(f"{where}: {exc.message}") from exc
    except Exception as exc:
        raise AssemblyError(f"{where}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, list) or not all(isinstance(s, Sample) for s in out):
        raise AssemblyError(f"{where}: the postprocessor must return a list of samples")
    return out


def _check_subset(picked: Any, given: list[Sample], where: str) -> None:
    if not isinstance(picked, list):
        raise AssemblyError(f"{where}: the picker must return a list, got "
                            f"{type(picked).__name__}")
    ids = [id(s) for s in picked]
    if len(set(ids)) != len(ids):
        raise AssemblyError(f"{where}: the picker returned duplicates; it must return a "
                            "subset of its input samples without duplicates (pure selection)")
    if not set(ids) <= {id(s) for s in given}:
        raise AssemblyError(f"{where}: the picker returned samples that are not among its "
                            "input (copies or new ones); it must return a subset of its "
                            "input samples (pure selection)")

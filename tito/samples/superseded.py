"""A v2 postprocessor for explicit supersession (the reference framework's newer
``exclude_superseded``, design §6.1b): a turn sent with ``X-Miles-Supersedes: <generation
id>`` replaces that generation for training. After :func:`~tito.samples.tree.train_once`,
every superseded generation's completion is masked out of the loss wherever it sits (it
stays as context: a later turn may have been built on it), and a sample left with no
trainable token is dropped. ``session_metadata["selection"]`` says what was excluded:
``excluded_generation_ids`` and ``trainable_tokens``. The default postprocessor keeps
superseded generations (their nodes are only marked ``supersedes`` in the tree), as the
reference framework's default does.

``--sample-postprocessor tito.samples.superseded:exclude_superseded``.
"""

from __future__ import annotations

from typing import Any

from tito.samples.sample import Sample
from tito.samples.tree import leaf_info, train_once, tree_of


def exclude_superseded(samples: list[Sample], session_metadata: dict[str, Any],
                       agent_metadata: dict[str, Any]) -> list[Sample]:
    """:func:`train_once`, then the superseded generations masked out (see the module)."""
    out = train_once(samples, session_metadata, agent_metadata)
    excluded: dict[Any, set[int]] = {}
    names: set[str] = set()
    for context in {s.metadata.get("context_id") for s in out}:
        nodes = tree_of(session_metadata, context).get("nodes") or []
        superseded = {n["supersedes"] for n in nodes if n.get("supersedes")}
        hits = [n for n in nodes if n.get("response_id") in superseded]
        excluded[context] = {int(n["id"]) for n in hits}
        names.update(str(n["response_id"]) for n in hits)
    kept: list[Sample] = []
    trainable = 0
    for sample in out:
        _mask(sample, excluded.get(sample.metadata.get("context_id"), set()))
        count = 0 if sample.loss_mask is None else int(sample.loss_mask.sum())
        if count > 0:
            kept.append(sample)
            trainable += count
    session_metadata["selection"] = {"excluded_generation_ids": sorted(names),
                                     "trainable_tokens": trainable}
    return kept


def _mask(sample: Sample, nodes: set[int]) -> None:
    """Zero ``sample``'s loss mask over the completions of ``nodes``."""
    mask = sample.loss_mask
    if not nodes or mask is None:
        return
    prompt_len = sample.prompt_length
    for node_id, start, end in leaf_info(sample)["completion_spans"]:
        lo, hi = max(start - prompt_len, 0), max(end - prompt_len, 0)
        if int(node_id) in nodes and hi > lo:
            mask = mask.copy() if mask is sample.loss_mask else mask
            mask[lo:hi] = 0
    sample.loss_mask = mask

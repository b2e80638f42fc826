"""A v2 postprocessor for failed attempts (the reference framework's
``non_positive_attempts``, design §6.1b): the agent names the generations that failed
(``non_positive_advantage_response_ids`` in its metadata: the response ids its turns were
answered with), and every kept sample whose path holds one gets
``metadata.non_positive_advantage_spans``: ``[start, end)`` over its response region
where those completions sit, for a trainer that clamps their advantage at zero. The
context stays in the sample (loss mask and reward unchanged); everything else is
:func:`~tito.samples.tree.train_once`'s. The spans come from the gateway's own completion
spans, never from the agent (an agent value under that key is replaced).
"""

from __future__ import annotations

from typing import Any

from tito.samples.sample import Sample
from tito.samples.tree import leaf_info, train_once, tree_of
from tito.types.errors import AssemblyError

RESPONSE_IDS = "non_positive_advantage_response_ids"
SPANS = "non_positive_advantage_spans"


def non_positive_attempts(samples: list[Sample], session_metadata: dict[str, Any],
                          agent_metadata: dict[str, Any]) -> list[Sample]:
    """:func:`train_once`, then each sample's ``non_positive_advantage_spans``."""
    wanted = agent_metadata.get(RESPONSE_IDS)
    if not isinstance(wanted, list) or not all(isinstance(r, str) and r for r in wanted):
        raise AssemblyError(f"the agent must give {RESPONSE_IDS} as a list of non-empty "
                            "strings (the response ids of the failed generations)")
    requested = set(wanted)
    bad: dict[Any, set[int]] = {}
    found: list[str] = []
    for context in {s.metadata.get("context_id") for s in samples} or {None}:
        nodes = tree_of(session_metadata, context).get("nodes") or []
        hits = [n for n in nodes if n.get("response_id") in requested]
        found.extend(n["response_id"] for n in hits)
        bad[context] = {int(n["id"]) for n in hits}
    if len(found) != len(set(found)):
        raise AssemblyError(f"{RESPONSE_IDS} must each name one generation of the session")
    missing = requested - set(found)
    if missing and samples:
        raise AssemblyError(f"{RESPONSE_IDS} not in the session's trees: {sorted(missing)}")
    out = train_once(samples, session_metadata, agent_metadata)
    for sample in out:
        invalid = bad.get(sample.metadata.get("context_id"), set())
        start_of_response = sample.prompt_length
        spans = []
        for node_id, start, end in leaf_info(sample)["completion_spans"]:
            if int(node_id) not in invalid:
                continue
            lo = max(start - start_of_response, 0)
            hi = min(end - start_of_response, sample.response_length)
            if lo < hi:
                spans.append([lo, hi])
        sample.metadata[SPANS] = spans
    return out

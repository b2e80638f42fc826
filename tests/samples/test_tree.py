"""v2 samples: per-leaf assembly, the default picker and postprocessor (properties over
random forests), and the hook contract (pure selection, errors that name the hooks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.support import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tito.render import TemplateRenderer, build_renderer
from tito.samples.sample import Sample
from tito.samples.tree import LeafPath, assemble_leaves, drop_retries, run_hooks, train_once
from tito.session.matchers import strict
from tito.session.tree import TreeSession, leaves_of, path_messages, path_of
from tito.types.engine import GenerateResult, check_output
from tito.types.errors import AssemblyError
from tito.types.messages import TurnRequest
from tito.types.records import snapshot_ids


@pytest.fixture(scope="module")
def renderer(qwen3_dir: Path) -> TemplateRenderer:
    return build_renderer("qwen3", qwen3_dir)


def grow(renderer: TemplateRenderer, ops: list[tuple[int, int]]) -> TreeSession:
    """A forest from ops ``(kind, pick)``: 0 extends a random node's path with a user
    message, 1 re-sends the request of a random node (a retry: a sibling), 2 starts a new
    root (pick even: with the first root's prompt, a re-sent first turn)."""
    s = TreeSession("t", renderer, strict)
    requests: list[list[dict[str, Any]]] = []
    for n, (kind, pick) in enumerate(ops):
        if not s.nodes or kind == 2:
            prompt = "root 0" if (pick % 2 == 0 and s.nodes) or not s.nodes else f"root {n}"
            request = [{"role": "user", "content": prompt}]
        else:
            node = s.nodes[pick % len(s.nodes)]
            if kind == 1:
                request = requests[node.id]
            else:
                request = [*path_messages(path_of(s.nodes, node.id)),
                           {"role": "user", "content": f"u{n}"}]
        plan = s.plan(TurnRequest(messages=list(request)))
        out = renderer.render_completion({"role": "assistant", "content": f"a{n}"})
        result = GenerateResult(output_ids=out, logprobs=[-(n + 1) / 8] * len(out),
                                finish_reason="stop")
        s.commit(plan, result, check_output(result, renderer.tokenizer.vocab_size),
                 renderer.parse(out, "stop").to_message())
        requests.append(request)
    return s


def leaf_samples(s: TreeSession, renderer: TemplateRenderer,
                 max_seq_len: int | None = None) -> list[Sample]:
    leaves = [LeafPath([n.id for n in path_of(s.nodes, leaf.id)],
                       [n.record for n in path_of(s.nodes, leaf.id)], leaf.parent)
              for leaf in leaves_of(s.nodes)]
    return assemble_leaves(leaves, decode=renderer.tokenizer.decode, max_seq_len=max_seq_len,
                           metadata_of=lambda leaf: {}, include_response=False)


def session_meta(s: TreeSession) -> dict[str, Any]:
    return {"tree": {"nodes": [{"id": n.id, "parent": n.parent} for n in s.nodes]}}


def oracle_kept(s: TreeSession) -> set[int]:
    kept = set()
    for leaf in leaves_of(s.nodes):
        if leaf.parent is not None:
            later = [n for n in s.nodes if n.parent == leaf.parent and n.id > leaf.id]
        else:
            prompt = leaf.record.bridge_ids.tolist()
            later = [n for n in s.nodes if n.parent is None and n.id > leaf.id
                     and n.record.bridge_ids.tolist() == prompt]
        if not later:
            kept.add(leaf.id)
    return kept


OPS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50)), min_size=1, max_size=14)


@pytest.mark.slow
@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_default_hooks_over_random_forests(renderer: TemplateRenderer,
                                           ops: list[tuple[int, int]]) -> None:
    s = grow(renderer, ops)
    samples = leaf_samples(s, renderer)
    assert len(samples) == len(leaves_of(s.nodes))
    for sample in samples:  # tokens are the leaf's snapshot
        path = path_of(s.nodes, sample.metadata["leaf"]["node_id"])
        assert np.array_equal(sample.tokens, snapshot_ids([n.record for n in path]))
    out = run_hooks(samples, picker=drop_retries, postprocessor=train_once,
                    names=("p", "q"), session_metadata=session_meta(s),
                    agent_metadata={"reward": 1.0})
    assert {x.metadata["leaf"]["node_id"] for x in out} == oracle_kept(s)
    keys = [(len(x.metadata["leaf"]["path_node_ids"]), x.metadata["leaf"]["node_id"])
            for x in out]
    assert keys == sorted(keys, reverse=True)
    trained: dict[int, int] = {}
    for x in out:
        assert x.reward == 1.0
        assert x.loss_mask is not None
        for node_id, start, end in x.metadata["leaf"]["completion_spans"]:
            region = x.loss_mask[start - x.prompt_length : end - x.prompt_length]
            assert region.min() == region.max()  # a completion trains whole or not at all
            trained[node_id] = trained.get(node_id, 0) + int(region[0])
        masked = int(x.loss_mask.sum())
        spans = sum(int(x.loss_mask[a - x.prompt_length : b - x.prompt_length].sum())
                    for _, a, b in x.metadata["leaf"]["completion_spans"])
        assert masked == spans  # bridge ids never train
    assert all(count == 1 for count in trained.values())  # every kept completion once
    assert set(trained) == {n for x in out for n in x.metadata["leaf"]["path_node_ids"]}


def test_truncated_away_leaves_are_skipped(renderer: TemplateRenderer) -> None:
    s = grow(renderer, [(0, 0), (0, 0), (2, 1)])  # a 2-node chain and a second root
    prompt_len = s.nodes[0].record.prompt_len
    samples = leaf_samples(s, renderer, max_seq_len=prompt_len)  # no generated id fits
    assert samples == []


def test_picker_must_select(renderer: TemplateRenderer) -> None:
    s = grow(renderer, [(0, 0), (1, 0)])
    samples = leaf_samples(s, renderer)
    meta = session_meta(s)

    def run(picker: Any, post: Any = train_once) -> list[Sample]:
        return run_hooks(samples, picker=picker, postprocessor=post, names=("my.pick", "my.post"),
                         session_metadata=meta, agent_metadata={})

    with pytest.raises(AssemblyError, match="duplicates"):
        run(lambda xs, m: [xs[0], xs[0]])
    with pytest.raises(AssemblyError, match="not among its input"):
        run(lambda xs, m: [Sample(tokens=xs[0].tokens, response_length=0, loss_mask=None,
                                  rollout_log_probs=None)])
    with pytest.raises(AssemblyError, match=r"picker=my\.pick.*ZeroDivisionError"):
        run(lambda xs, m: [1 / 0])
    with pytest.raises(AssemblyError, match=r"postprocessor=my\.post.*KeyError"):
        run(lambda xs, m: xs, lambda xs, m, a: {}["x"])
    assert len(run(lambda xs, m: list(xs))) == 2  # keep-all keeps the retried leaf too
    with pytest.raises(AssemblyError, match="reward must be a number"):
        run_hooks(samples, picker=drop_retries, postprocessor=train_once, names=("a", "b"),
                  session_metadata=meta, agent_metadata={"reward": "high"})

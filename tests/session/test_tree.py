"""v2 trajectory trees on the real qwen3 renderer: where a request attaches, what becomes
a new node, and that nothing is ever lost or moved by a failed request."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tito.render import TemplateRenderer, build_renderer
from tito.session.linear import LinearSession
from tito.session.matchers import loose_tool_call, strict
from tito.session.tree import TreeSession, path_of
from tito.session.turns import TurnPlan
from tito.types.engine import GenerateResult, check_output
from tito.types.errors import BadRequest, Conflict
from tito.types.messages import TurnRequest
from tito.types.records import snapshot_ids

Message = dict[str, Any]


@pytest.fixture(scope="module")
def renderer(qwen3_dir: Path) -> TemplateRenderer:
    return build_renderer("qwen3", qwen3_dir)


def finish(session: TreeSession | LinearSession, plan: TurnPlan, reply: str,
           finish_reason: str = "stop") -> Message:
    out = session.renderer.render_completion({"role": "assistant", "content": reply})
    if finish_reason == "length":
        out = out[:-1]
    result = GenerateResult(output_ids=out, logprobs=[-0.5] * len(out),
                            finish_reason=finish_reason)  # type: ignore[arg-type]
    message = session.renderer.parse(out, finish_reason).to_message()
    output = check_output(result, session.renderer.tokenizer.vocab_size)
    session.commit(plan, result, output, message)
    return message


def turn(session: TreeSession | LinearSession, messages: list[Message], reply: str,
         finish_reason: str = "stop") -> Message:
    return finish(session, session.plan(TurnRequest(messages=list(messages))), reply,
                  finish_reason)


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def tree_state(s: TreeSession) -> Any:
    return ([(n.id, n.parent, copy.deepcopy(n.delta), n.record.output_ids.tolist())
             for n in s.nodes], s.active_leaf, s.snapshot.view().tolist(), s.in_flight)


def parents(s: TreeSession) -> list[int | None]:
    return [n.parent for n in s.nodes]


def chain(renderer: TemplateRenderer, n: int = 3) -> tuple[TreeSession, list[Message]]:
    s = TreeSession("t", renderer, strict)
    history: list[Message] = []
    for k in range(n):
        history.append(user(f"u{k}"))
        history.append(turn(s, history, f"a{k}"))
    return s, history


def test_extension_grows_one_path_with_the_v1_snapshot(renderer: TemplateRenderer) -> None:
    s, history = chain(renderer)
    v1 = LinearSession("l", renderer, strict)
    for k in range(3):
        turn(v1, history[: 2 * k + 1], f"a{k}")
    assert parents(s) == [None, 0, 1] and s.active_leaf == 2
    assert s.snapshot.view().tolist() == v1.snapshot.view().tolist()
    assert s.snapshot.view().tolist() == snapshot_ids(s.records).tolist()
    assert s.messages == v1.messages


def test_exact_resend_attaches_to_the_leaf(renderer: TemplateRenderer) -> None:
    s, history = chain(renderer, 2)
    assert s.attach_point(history) == (1, 4)
    assert s.attach_point([*history, user("more")]) == (1, 4)


def test_retry_becomes_a_sibling(renderer: TemplateRenderer) -> None:
    s, history = chain(renderer, 2)
    turn(s, history[:3], "a1 again")  # the second turn re-sent
    assert parents(s) == [None, 0, 0]
    assert s.active_leaf == 2 and [n.id for n in s.active_path] == [0, 2]
    assert s.records[-1].request["rolled_back"] == 1


def test_divergence_inside_a_delta_attaches_before_it(renderer: TemplateRenderer) -> None:
    s, history = chain(renderer, 3)
    # same first turn, then a different user message: attaches to node 0
    request = [*history[:2], user("something else")]
    assert s.attach_point(request) == (0, 2)
    turn(s, request, "other")
    assert parents(s) == [None, 0, 1, 0]


def test_deep_divergence_is_accepted_not_rejected(renderer: TemplateRenderer) -> None:
    s, history = chain(renderer, 4)
    turn(s, [*history[:2], user("back to the start")], "fresh")  # abandons 3 turns
    assert parents(s)[-1] == 0 and len(s.nodes) == 5
    assert s.records[-1].request["rolled_back"] == 3
    assert [n.id for n in path_of(s.nodes, 3)] == [0, 1, 2, 3]  # the old line is kept


def test_zero_overlap_is_a_new_root(renderer: TemplateRenderer) -> None:
    s, _ = chain(renderer, 2)
    turn(s, [user("a sub-agent's task")], "done")
    assert parents(s) == [None, 0, None] and s.active_leaf == 2
    assert s.records[-1].prompt_len == len(s.records[-1].bridge_ids)  # rendered from scratch


def test_compaction_with_a_rewritten_assistant(renderer: TemplateRenderer) -> None:
    """The harness rewrites an old assistant message (e.g. strips its thinking): matching
    stops before it; the rewritten assistant joins the new node's messages as history."""
    s, history = chain(renderer, 3)
    compacted = [history[0], {"role": "assistant", "content": "a0 (summary)"}, *history[2:],
                 user("next")]
    assert s.attach_point(compacted) == (None, 0)  # node 0's assistant differs: no root
    turn(s, compacted, "after compaction")
    assert parents(s) == [None, 0, 1, None]
    assert s.nodes[3].delta[:-1] == compacted


def test_twins_commit_as_siblings(renderer: TemplateRenderer) -> None:
    s, history = chain(renderer, 1)
    request = TurnRequest(messages=[*history, user("same question")])
    first, second = s.plan(request), s.plan(request)  # concurrent: both planned first
    assert s.in_flight
    finish(s, first, "x")
    finish(s, second, "y")
    assert parents(s) == [None, 0, 0] and not s.in_flight
    assert s.nodes[1].record.bridge_ids.tolist() == s.nodes[2].record.bridge_ids.tolist()
    assert s.active_leaf == 2
    assert s.snapshot.view().tolist() == snapshot_ids(s.records).tolist()


@pytest.mark.slow
def test_a_1024_deep_chain(renderer: TemplateRenderer) -> None:
    s, history = chain(renderer, 1)
    for k in range(1, 1024):  # commit without the engine: deep, not slow
        history.append(user(f"u{k}"))
        history.append(turn(s, history, "a"))
    assert len(s.nodes) == 1024 and s.nodes[-1].depth == 1023
    assert s.attach_point(history) == (1023, len(history))
    with pytest.raises(Conflict) as err:  # the default cap: checked before the engine
        s.plan(TurnRequest(messages=[*history, user("one more")]))
    assert err.value.code == "node_cap_reached"
    assert "replaying history verbatim" in err.value.message
    assert not s.in_flight


def test_truncated_node_cannot_be_extended_under_refuse(renderer: TemplateRenderer) -> None:
    s = TreeSession("t", renderer, strict, after_length_cut="refuse")
    a0 = turn(s, [user("u0")], "cut off", finish_reason="length")
    before = tree_state(s)
    with pytest.raises(Conflict) as err:
        s.plan(TurnRequest(messages=[user("u0"), a0, user("go on")]))
    assert err.value.code == "truncated_generation"
    assert tree_state(s) == before
    turn(s, [user("u0")], "retry before the cut")  # branching before the cut works
    assert parents(s) == [None, None]


def test_failed_requests_change_nothing(renderer: TemplateRenderer) -> None:
    s, history = chain(renderer, 2)
    before = tree_state(s)
    for bad in ([], [*history, {"role": "wizard", "content": "x"}][-1:]):
        with pytest.raises(BadRequest):
            s.plan(TurnRequest(messages=bad))
        assert tree_state(s) == before
    plan = s.plan(TurnRequest(messages=[*history[:1], user("elsewhere")]))
    s.release(plan)  # the engine failed
    assert tree_state(s) == before and s.active_leaf == 1


def test_matcher_decides_what_attaches(renderer: TemplateRenderer) -> None:
    s = TreeSession("t", renderer, loose_tool_call)
    call = {"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}
    a0 = {"role": "assistant", "content": None, "tool_calls": [call]}
    out = renderer.render_completion(a0)
    plan = s.plan(TurnRequest(messages=[user("u")]))
    result = GenerateResult(output_ids=out, logprobs=[-0.1] * len(out), finish_reason="stop")
    s.commit(plan, result, check_output(result, renderer.tokenizer.vocab_size),
             renderer.parse(out, "stop").to_message())
    stored_call = s.nodes[0].delta[-1]["tool_calls"][0]
    replayed = {"role": "assistant", "content": "", "tool_calls": [{
        **stored_call, "function": {"name": "f", "arguments": '{"b": 2, "a": 1}'}}]}
    request = [user("u"), replayed, {"role": "tool", "tool_call_id": stored_call["id"],
                                     "content": "3"}]
    assert s.attach_point(request) == (0, 2)
    strict_tree = TreeSession("t", renderer, strict)
    strict_tree.nodes = s.nodes
    assert strict_tree.attach_point(request) == (None, 0)


def test_prompt_ids_are_the_parent_snapshot_plus_the_bridge(renderer: TemplateRenderer
                                                            ) -> None:
    s, history = chain(renderer, 3)
    plan = s.plan(TurnRequest(messages=[*history[:4], user("branch")]))
    parent_ids = snapshot_ids([n.record for n in path_of(s.nodes, 1)])
    assert plan.parent == 1
    assert np.array_equal(plan.prompt_ids[: len(parent_ids)], parent_ids)
    s.release(plan)


def test_changed_tools_start_a_new_root(renderer: TemplateRenderer) -> None:
    tool = {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}
    more = {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}}
    s = TreeSession("s", renderer, strict)
    first = [user("one")]
    finish(s, s.plan(TurnRequest(list(first), tools=[tool])), "hi")
    reply = s.messages[-1]
    finish(s, s.plan(TurnRequest([*first, reply, user("two")], tools=[tool, more])), "ok")
    assert [n.parent for n in s.nodes] == [None, None]  # a new root, not a child
    finish(s, s.plan(TurnRequest([*first, reply, user("two"), s.messages[-1],
                                  user("three")])), "fine")
    assert [n.parent for n in s.nodes] == [None, None, 1]  # tools left out: the recorded


def test_options_left_out_are_kept_in_the_child_record(renderer: TemplateRenderer) -> None:
    """A child that leaves the chat-template options out renders with its path's and its
    record lists them (a comparator renders the path under them); the thinking switch is
    per turn."""
    s = TreeSession("s", renderer, strict)
    first = [user("one")]
    finish(s, s.plan(TurnRequest(list(first), template_kwargs={"x": 1})), "hi")
    plan = s.plan(TurnRequest([*first, s.messages[-1], user("two")],
                              template_kwargs={"enable_thinking": False}))
    finish(s, plan, "ok")
    assert [n.parent for n in s.nodes] == [None, 0]
    assert s.nodes[1].record.request["chat_template_kwargs"] == {
        "x": 1, "enable_thinking": False}

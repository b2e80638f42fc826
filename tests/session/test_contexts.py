"""Sessions of agent contexts (design §5.5) on the real qwen3 renderer: routing by agent
headers, by the conversation's opening message and by side-request signs; one claim per
context; refusals that leave the session as it was; lineage in the samples (v1: one per
context, v2: every context's leaves through one picker)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tito.render import TemplateRenderer, build_renderer
from tito.samples.tree import drop_retries, train_once
from tito.session import ContextSession, LinearSession, TreeSession
from tito.session.agents import opening, spawning_call, title_like
from tito.session.collect import (
    CollectSettings,
    ContextsCollection,
    Hooks,
    LinearCollection,
    TreeCollection,
)
from tito.session.matchers import resolve_matcher
from tito.session.metadata import Describer
from tito.session.turns import TurnPlan
from tito.types.engine import GenerateResult, check_output
from tito.types.errors import BadRequest, Conflict
from tito.types.messages import AgentRef, TurnRequest

Message = dict[str, Any]
VERSIONS = ["v1", "v2"]
TOOLS = [{"type": "function", "function": {
    "name": "Agent", "description": "Run a sub-agent on a task",
    "parameters": {"type": "object", "properties": {"prompt": {"type": "string"}}}}}]
SYSTEM = {"role": "system", "content": "You are the main agent."}
TASK = {"role": "user", "content": "Fix the failing test."}


@pytest.fixture(scope="module")
def renderer(qwen3_dir: Path) -> TemplateRenderer:
    return build_renderer("qwen3", qwen3_dir)


def make(renderer: TemplateRenderer, version: str, **kwargs: Any) -> ContextSession:
    matcher = resolve_matcher("harness", call_ids_rendered=renderer.renders_call_ids())

    def new_context() -> LinearSession | TreeSession:
        if version == "v2":
            return TreeSession("s", renderer, matcher)
        return LinearSession("s", renderer, matcher)

    return ContextSession("s", new_context, matcher=matcher, **kwargs)


def request(messages: list[Message], *, tools: Any = None, agent: AgentRef | None = None,
            structured: bool = False) -> TurnRequest:
    return TurnRequest(messages=list(messages), tools=tools, agent=agent,
                       structured=structured)


def finish(s: ContextSession, plan: TurnPlan, reply: Message | str) -> Message:
    """Commit ``plan`` with the canonical completion of ``reply``."""
    renderer = s.agent_context("main").renderer  # type: ignore[attr-defined]
    message = {"role": "assistant", "content": reply} if isinstance(reply, str) else reply
    out = renderer.render_completion(message)
    result = GenerateResult(output_ids=out, logprobs=[-0.5] * len(out), finish_reason="stop")
    parsed = renderer.parse(out, "stop").to_message()
    output = check_output(result, renderer.tokenizer.vocab_size)
    s.apply(s.prepare_commit(plan, result, output, parsed), plan)
    return parsed


def turn(s: ContextSession, messages: list[Message], reply: Message | str = "ok",
         **kwargs: Any) -> Message:
    return finish(s, s.plan(request(messages, **kwargs)), reply)


def agent_call(prompt: str) -> Message:
    return {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "Agent", "arguments": json.dumps({"prompt": prompt})}}]}


def settings(renderer: TemplateRenderer) -> CollectSettings:
    return CollectSettings(Describer(renderer, "i"),
                           Hooks(drop_retries, train_once, ("drop_retries", "train_once")))


def routing(s: ContextSession) -> Any:
    """Everything routing and the views read, to compare before and after a refusal."""
    return [(key, ctx.info, ctx.turns, ctx.claims, ctx.tool_claims, ctx.has_tools,
             copy.deepcopy(ctx.openings), len(ctx.session.records), ctx.session.in_flight)
            for key, ctx in s.contexts.items()]


def identities(s: ContextSession) -> list[tuple[Any, ...]]:
    return [(c.info.id, c.info.role, c.info.parent_agent_id, c.info.source)
            for c in s.contexts.values()]


# -- one context ---------------------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_a_session_with_only_its_main_context_is_its_path(renderer: TemplateRenderer,
                                                          version: str) -> None:
    s = make(renderer, version)
    a1 = turn(s, [SYSTEM, TASK], "A1")
    turn(s, [SYSTEM, TASK, a1, {"role": "user", "content": "more"}], "A2")
    collection = s.collection()
    assert isinstance(collection, LinearCollection if version == "v1" else TreeCollection)
    assert "contexts" not in s.details() and "contexts" not in s.counts()
    assert s.view_key() == s.agent_context("main").view_key()
    [sample] = collection.collect(settings(renderer)).samples
    assert not {"agent_id", "context_id", "role"} & set(sample.metadata)


# -- routing -------------------------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_a_new_opening_is_a_context_of_its_own(renderer: TemplateRenderer,
                                               version: str) -> None:
    """A sub-agent without headers: its conversation opens with its own task; it goes on
    in its context while the main agent's path stays whole (v1: no rollback)."""
    s = make(renderer, version)
    a1 = turn(s, [SYSTEM, TASK], agent_call("Look at parser.py"), tools=TOOLS)
    sub = [{"role": "system", "content": "You are a sub-agent."},
           {"role": "user", "content": "Look at parser.py"}]
    b1 = turn(s, sub, "B1")
    turn(s, [*sub, b1, {"role": "user", "content": "and?"}], "B2")
    turn(s, [SYSTEM, TASK, a1, {"role": "tool", "tool_call_id": a1["tool_calls"][0]["id"],
                                "content": "B2"}], "A2", tools=TOOLS)
    assert identities(s) == [("main", "main", None, "default"),
                             ("agent-1", "subagent", "main", "inferred")]
    assert s.contexts["agent-1"].info.parent_tool_call_id == a1["tool_calls"][0]["id"]
    assert len(s.agent_context("main").records) == len(s.agent_context("agent-1").records) == 2
    assert all(r.request["rolled_back"] == 0 for r in s.agent_context("main").records)
    assert len(s.records) == 2 and s.messages[-1]["content"] == "A2"  # the view: main's


def test_a_rewrite_of_the_same_conversation_keeps_the_v1_rules(
        renderer: TemplateRenderer) -> None:
    """The same opening, gone elsewhere deeper than --max-rollback: still 400, and the
    session is as it was (a compaction is not another agent)."""
    s = make(renderer, "v1")
    history = [TASK]
    for k in range(3):
        history += [turn(s, history, f"A{k}"), {"role": "user", "content": f"u{k}"}]
    before = routing(s)
    with pytest.raises(BadRequest) as err:
        s.plan(request([TASK, {"role": "user", "content": "elsewhere"}]))
    assert err.value.code == "rollback_too_deep"
    assert routing(s) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_a_retry_of_the_first_turn_stays_in_its_context(renderer: TemplateRenderer,
                                                        version: str) -> None:
    s = make(renderer, version)
    turn(s, [TASK], "A1")
    turn(s, [{"role": "system", "content": "Be brief."}, TASK], "A1 again")
    assert list(s.contexts) == ["main"]


def test_header_contexts_have_their_own_claim(renderer: TemplateRenderer) -> None:
    """v1: a sub-agent's turn runs while the main agent's does; within a context the
    second request is still 409, naming the context."""
    s = make(renderer, "v1")
    main_plan = s.plan(request([SYSTEM, TASK], tools=TOOLS))
    sub = AgentRef(agent_id="7f3a9c21b0e4d5f68", header="x-claude-code-agent-id")
    sub_plan = s.plan(request([{"role": "user", "content": "Look at parser.py"}], agent=sub))
    with pytest.raises(Conflict) as err:
        s.plan(request([SYSTEM, TASK], tools=TOOLS))
    assert err.value.code == "turn_in_progress"
    with pytest.raises(Conflict) as err:
        s.plan(request([{"role": "user", "content": "Look at parser.py"}], agent=sub))
    assert err.value.code == "turn_in_progress" and "7f3a9c21b0e4d5f68" in err.value.message
    finish(s, sub_plan, "B1")
    finish(s, main_plan, "A1")
    assert identities(s) == [("main", "main", None, "default"),
                             ("7f3a9c21b0e4d5f68", "subagent", "main", "header")]
    assert not s.in_flight


@pytest.mark.parametrize("version", VERSIONS)
def test_headers_name_the_main_agent_and_its_children(renderer: TemplateRenderer,
                                                      version: str) -> None:
    """The reference framework's style: every agent names itself; the first parentless one
    is the main agent (the view), children name their parent and tool call."""
    s = make(renderer, version)
    root = AgentRef(agent_id="root", context_id="root-1")
    a1 = turn(s, [SYSTEM, TASK], agent_call("Review the diff"), tools=TOOLS, agent=root)
    child = AgentRef(agent_id="reviewer", parent_agent_id="root",
                     parent_tool_call_id="call_x")
    turn(s, [{"role": "user", "content": "Review the diff"}], "LGTM", agent=child)
    assert identities(s)[1:] == [("root-1", "main", None, "header"),
                                 ("reviewer", "subagent", "root", "header")]
    assert s.contexts["reviewer"].info.parent_tool_call_id == "call_x"
    assert s.records and s.messages[-1] == a1  # the view follows the named main agent
    # a second context of a known agent (after a compaction) keeps its identity
    turn(s, [SYSTEM, {"role": "user", "content": "summary so far"}], "ok",
         agent=AgentRef(agent_id="root", context_id="root-2"), tools=TOOLS)
    assert identities(s)[-1] == ("root-2", "main", None, "header")
    # a request without headers never joins a named context, nor takes the main view
    turn(s, [SYSTEM, TASK, a1, {"role": "user", "content": "stray"}], "ok")
    assert identities(s)[-1] == ("agent-4", "subagent", "root", "inferred")
    assert s.primary().info.id == "root-1" and not s.contexts["main"].used


def test_a_header_agent_gets_its_spawning_call(renderer: TemplateRenderer) -> None:
    s = make(renderer, "v2")
    a1 = turn(s, [SYSTEM, TASK], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "Agent", "arguments": json.dumps(
            {"prompt": "Check the tests in test_io.py"})}},
        {"id": "c2", "type": "function", "function": {"name": "Agent", "arguments": json.dumps(
            {"prompt": "Check the docs in README.md"})}}]}, tools=TOOLS)
    ids = [c["id"] for c in a1["tool_calls"]]
    for agent, task in (("a", "Check the docs in README.md"), ("b", "Check the tests in "
                                                                   "test_io.py")):
        turn(s, [{"role": "user", "content": [{"type": "text", "text": f"<note/>{task}"}]}],
             "done", agent=AgentRef(agent_id=agent))
    assert [s.contexts[k].info.parent_tool_call_id for k in ("a", "b")] == [ids[1], ids[0]]


# -- refusals leave the session as it was --------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_an_unknown_parent_is_400_naming_it(renderer: TemplateRenderer, version: str) -> None:
    s = make(renderer, version)
    turn(s, [TASK], "A1")
    before = routing(s)
    with pytest.raises(BadRequest) as err:
        s.plan(request([{"role": "user", "content": "sub"}],
                       agent=AgentRef(agent_id="sub", parent_agent_id="ghost")))
    assert err.value.code == "unknown_parent_agent" and "'ghost'" in err.value.message
    assert "main" in err.value.message  # the agents it has
    with pytest.raises(BadRequest) as err:
        s.plan(request([{"role": "user", "content": "sub"}],
                       agent=AgentRef(agent_id="sub", parent_agent_id="sub")))
    assert err.value.code == "invalid_agent_header"
    assert routing(s) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_a_context_identity_never_changes(renderer: TemplateRenderer, version: str) -> None:
    s = make(renderer, version)
    turn(s, [TASK], "A1")
    turn(s, [{"role": "user", "content": "sub"}], "B1", agent=AgentRef(agent_id="sub"))
    turn(s, [{"role": "user", "content": "sub 2"}], "C1",
         agent=AgentRef(agent_id="sub2", parent_agent_id="sub"))
    before = routing(s)
    with pytest.raises(Conflict) as err:
        s.plan(request([{"role": "user", "content": "sub 2"}],
                       agent=AgentRef(agent_id="sub2", parent_agent_id="main")))
    assert err.value.code == "context_conflict"
    assert routing(s) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_a_failed_first_turn_leaves_no_context(renderer: TemplateRenderer,
                                               version: str) -> None:
    s = make(renderer, version)
    turn(s, [TASK], "A1")
    before = routing(s)
    plan = s.plan(request([{"role": "user", "content": "sub"}], agent=AgentRef(agent_id="x")))
    assert "x" in s.contexts and s.in_flight
    s.release(plan)  # the engine failed
    assert routing(s) == before
    with pytest.raises(BadRequest):  # refused while planning
        s.plan(request([{"role": "robot", "content": "sub"}], agent=AgentRef(agent_id="x")))
    with pytest.raises(BadRequest):  # an inferred one, likewise
        s.plan(request([{"role": "robot", "content": "another"}]))
    assert routing(s) == before


# -- side requests -------------------------------------------------------------------------
def test_side_requests_are_contexts_of_their_own(renderer: TemplateRenderer) -> None:
    """v1: a title request while the main agent's first turn runs (no 409); side requests
    only on a session whose main agent has tools."""
    s = make(renderer, "v1")
    main_plan = s.plan(request([SYSTEM, TASK], tools=TOOLS))
    title = [{"role": "system", "content": "Summarize the conversation."}, TASK]
    finish(s, s.plan(request(title, structured=True)), '{"title": "Fix a test"}')
    finish(s, main_plan, "A1")
    named = [{"role": "system", "content": "Write a 3-7 word title for this task."},
             {"role": "user", "content": "Fix the failing test, then run it."}]
    turn(s, named, "Fixing a test")  # title-like, no schema, another conversation
    assert identities(s) == [("main", "main", None, "default"),
                             ("side-1", "side", "main", "side"),
                             ("side-2", "side", "main", "side")]
    assert len(s.agent_context("side-1").records) == 1

    # a side conversation goes on in its context, side-like or not
    follow = [*named, {"role": "assistant", "content": "Fixing a test"},
              *[{"role": "user", "content": f"and {k}?"} for k in range(3)]]
    turn(s, follow, "ok")
    assert len(s.contexts) == 3 and len(s.agent_context("side-2").records) == 2

    plain = make(renderer, "v1")  # a main agent without tools: no side requests
    turn(plain, [TASK], "A1")
    turn(plain, [*title[:1], {"role": "user", "content": "x"}], "{}", structured=True)
    assert [c.info.role for c in plain.contexts.values()] == ["main", "subagent"]


def test_side_request_signs() -> None:
    assert title_like([{"role": "system", "content": "Generate a TITLE."},
                       {"role": "user", "content": "hi"}])
    assert title_like([{"role": "user", "content": [{"type": "text",
                                                     "text": "Give this a title: hi"}]}])
    assert not title_like([{"role": "user", "content": "subtitle"}])
    assert not title_like([{"role": "system", "content": "a title"},
                           *[{"role": "user", "content": "x"}] * 4])
    assert opening([{"role": "system", "content": "s"}, TASK]) is TASK
    assert opening([SYSTEM]) is SYSTEM and opening([]) is None
    call = agent_call("Look at parser.py")
    assert spawning_call(call, {"role": "user", "content": "Please: Look at parser.py"}) \
        == "call_1"
    assert spawning_call(call, {"role": "user", "content": "Look at lexer.py"}) is None
    assert spawning_call(agent_call("short"), {"role": "user", "content": "short"}) is None


# -- samples -------------------------------------------------------------------------------
def build_agents(s: ContextSession) -> str:
    """A main agent with a sub-agent (no headers) and a side request; the id of the tool
    call that handed the sub-agent its task."""
    a1 = turn(s, [SYSTEM, TASK], agent_call("Look at parser.py"), tools=TOOLS)
    turn(s, [{"role": "user", "content": "Look at parser.py"}], "found it")
    turn(s, [{"role": "system", "content": "Name it."}, TASK], '{"title": "t"}',
         structured=True)
    turn(s, [SYSTEM, TASK, a1, {"role": "tool", "tool_call_id": a1["tool_calls"][0]["id"],
                                "content": "found it"}], "fixed", tools=TOOLS)
    return str(a1["tool_calls"][0]["id"])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_samples_carry_lineage_main_first(renderer: TemplateRenderer, version: str,
                                          policy: str) -> None:
    s = make(renderer, version, side_requests=policy)
    call = build_agents(s)
    collection = s.collection()
    assert isinstance(collection, ContextsCollection)
    got = collection.collect(settings(renderer))
    lineage = [(x.metadata["context_id"], x.metadata["role"], x.metadata["parent_agent_id"],
                x.metadata["agent_id"]) for x in got.samples]
    expected = [("main", "main", None, "main"), ("agent-1", "subagent", "main", "agent-1")]
    if policy == "keep":
        expected.append(("side-2", "side", "main", "side-2"))
    assert lineage == expected
    assert got.samples[0].metadata["num_turns"] == 2
    assert got.samples[1].metadata["parent_tool_call_id"] == call
    meta = got.session_metadata
    assert [c["context_id"] for c in meta["contexts"]] == ["main", "agent-1", "side-2"]
    assert meta["side_requests"] == policy and meta["num_turns"] == 2
    if version == "v2":
        assert all("tree" in c for c in meta["contexts"])
        assert got.leaf_samples == 3
        # each context's node 0 trains in its own sample (nodes are per context)
        for sample in got.samples:
            assert sample.loss_mask is not None and sample.loss_mask.sum() > 0
    for sample in got.samples:
        assert not sample.metadata["tito_session_mismatch"]


def test_v2_picker_works_per_context(renderer: TemplateRenderer) -> None:
    """Node ids repeat across contexts: a retry in one context supersedes only its own
    leaf, and train_once keeps each context's shared completions once."""
    s = make(renderer, "v2")
    turn(s, [TASK], "A1")
    sub = [{"role": "user", "content": "sub task"}]
    b1 = turn(s, sub, "B1", agent=AgentRef(agent_id="sub"))
    turn(s, [*sub, b1, {"role": "user", "content": "go"}], "B2", agent=AgentRef(agent_id="sub"))
    turn(s, [*sub, b1, {"role": "user", "content": "go"}], "B2'", agent=AgentRef(agent_id="sub"))
    got = s.collection().collect(settings(renderer))
    leaves = [(x.metadata["context_id"], x.metadata["leaf"]["node_id"]) for x in got.samples]
    assert leaves == [("main", 0), ("sub", 2)]  # sub's node 1 was retried by node 2
    sub_sample = got.samples[1]
    prompt = sub_sample.prompt_length
    node, start, end = sub_sample.metadata["leaf"]["completion_spans"][0]
    mask = np.asarray(sub_sample.loss_mask)
    assert node == 0 and mask[start - prompt:end - prompt].all()  # sub's node 0 trains here


def test_views_list_the_contexts(renderer: TemplateRenderer) -> None:
    s = make(renderer, "v1")
    build_agents(s)
    entries = s.details()["contexts"]
    assert [(e["context_id"], e["role"], e["source"], e["num_turns"]) for e in entries] == [
        ("main", "main", "default", 2), ("agent-1", "subagent", "inferred", 1),
        ("side-2", "side", "side", 1)]
    assert s.counts()["contexts"] == 3
    assert s.stored_bytes().tokens == sum(c.session.num_tokens for c in s.contexts.values())
    with pytest.raises(BadRequest) as err:
        s.agent_context("nope")
    assert err.value.code == "unknown_context" and "agent-1" in err.value.message

"""v1 linear sessions on the real qwen3 renderer: extension, rollback, validation order."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from tito.render import TemplateRenderer, build_renderer
from tito.session.linear import LinearSession
from tito.session.matchers import loose_tool_call, strict
from tito.types.engine import GenerateResult, check_output
from tito.types.errors import BadRequest, Conflict
from tito.types.messages import TurnRequest
from tito.types.records import snapshot_ids


@pytest.fixture(scope="module")
def renderer(qwen3_dir: Path) -> TemplateRenderer:
    return build_renderer("qwen3", qwen3_dir)


def generate(session: LinearSession, messages: list[dict], reply: dict) -> dict:
    """One turn whose engine output is the canonical completion of ``reply``."""
    plan = session.plan(TurnRequest(messages=messages))
    out = session.renderer.render_completion(reply)
    result = GenerateResult(output_ids=out, logprobs=[-0.5] * len(out), finish_reason="stop")
    message = session.renderer.parse(out, "stop").to_message()
    output = check_output(result, session.renderer.tokenizer.vocab_size)
    session.commit(plan, result, output, message)
    return message


def state(session: LinearSession) -> tuple:
    return (copy.deepcopy(session.messages), [r.turn for r in session.records],
            list(session.checkpoint_ends), session.snapshot.view().tolist(), session.in_flight)


U1 = {"role": "user", "content": "one"}
U2 = {"role": "user", "content": "two"}
U3 = {"role": "user", "content": "three"}


def three_turns(renderer: TemplateRenderer) -> tuple[LinearSession, list[dict]]:
    s = LinearSession("s", renderer, strict)
    a1 = generate(s, [U1], {"role": "assistant", "content": "A1"})
    a2 = generate(s, [U1, a1, U2], {"role": "assistant", "content": "A2"})
    a3 = generate(s, [U1, a1, U2, a2, U3], {"role": "assistant", "content": "A3"})
    return s, [U1, a1, U2, a2, U3, a3]


def test_extension_keeps_tito_invariant(renderer: TemplateRenderer) -> None:
    s, history = three_turns(renderer)
    assert len(s.records) == 3 and s.checkpoint_ends == [2, 4, 6]
    for prev, cur in zip(s.records, s.records[1:], strict=False):
        assert cur.prompt_len == prev.checkpoint_len + len(cur.bridge_ids)
    assert s.snapshot.view().tolist() == snapshot_ids(s.records).tolist()
    canonical = renderer.render_prompt(history[:5])
    assert s.snapshot.view().tolist()[: len(canonical)] == canonical


def test_retry_of_latest_turn_rolls_back_one_step(renderer: TemplateRenderer) -> None:
    s, history = three_turns(renderer)
    generate(s, [*history[:4], {"role": "user", "content": "three, again"}],
             {"role": "assistant", "content": "A3b"})
    assert len(s.records) == 3
    assert s.messages[4]["content"] == "three, again"
    assert s.records[-1].request["rolled_back"] == 1
    assert s.snapshot.view().tolist() == snapshot_ids(s.records).tolist()


def test_retry_of_first_turn_rolls_back_to_empty(renderer: TemplateRenderer) -> None:
    s = LinearSession("s", renderer, strict)
    generate(s, [U1], {"role": "assistant", "content": "A1"})
    generate(s, [{"role": "user", "content": "other"}], {"role": "assistant", "content": "B"})
    assert len(s.records) == 1 and s.messages[0]["content"] == "other"
    assert s.snapshot.view().tolist() == snapshot_ids(s.records).tolist()


def test_deep_divergence_is_400_and_changes_nothing(renderer: TemplateRenderer) -> None:
    s, history = three_turns(renderer)
    before = state(s)
    with pytest.raises(BadRequest) as err:
        s.plan(TurnRequest(messages=[*history[:2], {"role": "user", "content": "x"}]))
    assert err.value.code == "rollback_too_deep"
    assert "discard_count=2" in err.value.message and "limit of 1" in err.value.message
    assert "stored has 6 messages, request has 3 messages" in err.value.message
    assert state(s) == before
    generate(s, [*history, {"role": "user", "content": "four"}],
             {"role": "assistant", "content": "A4"})  # still extendable
    assert len(s.records) == 4


def test_pure_drop_retry(renderer: TemplateRenderer) -> None:
    s, history = three_turns(renderer)
    generate(s, history[:5], {"role": "assistant", "content": "A3 retry"})
    assert len(s.records) == 3 and s.messages[-1]["content"] == "A3 retry"


def test_client_assistant_is_history_not_checkpoint(renderer: TemplateRenderer) -> None:
    s = LinearSession("s", renderer, strict)
    few_shot = [U1, {"role": "assistant", "content": "example"}, U2]
    a = generate(s, few_shot, {"role": "assistant", "content": "A"})
    assert s.checkpoint_ends == [4]
    # Divergence inside the few-shot prefix rolls back to empty (one generated turn).
    generate(s, [U1, {"role": "assistant", "content": "changed"}, U2],
             {"role": "assistant", "content": "B"})
    assert len(s.records) == 1
    # Injected assistant appended after a generated turn: history, allowed for qwen3.
    generate(s, [*s.messages, {"role": "assistant", "content": "(injected)"}, U3],
             {"role": "assistant", "content": "C"})
    assert s.checkpoint_ends == [4, 7]
    assert a["content"] == "A"


def test_turn_in_progress_is_409_and_release_restores(renderer: TemplateRenderer) -> None:
    s, history = three_turns(renderer)
    before = state(s)
    plan = s.plan(TurnRequest(messages=[*history, U1]))
    with pytest.raises(Conflict) as err:
        s.plan(TurnRequest(messages=[*history, U2]))
    assert err.value.code == "turn_in_progress"
    s.release(plan)
    assert state(s) == before


def test_rollback_applied_only_at_commit(renderer: TemplateRenderer) -> None:
    s, history = three_turns(renderer)
    before = state(s)
    plan = s.plan(TurnRequest(messages=[*history[:4], {"role": "user", "content": "alt"}]))
    assert plan.rolled_back == 1
    s.release(plan)  # the engine failed
    assert state(s) == before


def test_loose_matcher_accepts_reserialized_arguments(renderer: TemplateRenderer) -> None:
    s = LinearSession("s", renderer, loose_tool_call)
    call = {"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}
    a1 = generate(s, [U1], {"role": "assistant", "content": "", "tool_calls": [call]})
    replay = copy.deepcopy(a1)
    replay["tool_calls"][0]["function"]["arguments"] = '{"b":2,"a":1.0}'
    replay["tool_calls"][0]["index"] = 0
    generate(s, [U1, replay, {"role": "tool", "tool_call_id": a1["tool_calls"][0]["id"],
                              "content": "3"}], {"role": "assistant", "content": "3"})
    assert len(s.records) == 2 and s.records[1].request["rolled_back"] == 0
    assert s.messages[1] is not replay and s.messages[1] == a1  # stored stays authoritative


def test_strict_matcher_refuses_to_discard_a_reply_the_client_rewrote(
        renderer: TemplateRenderer) -> None:
    """Under strict, re-dumped arguments make the echoed reply another message; the
    request goes on after it, so extending would discard the model's turn silently: 400
    ``history_rewritten`` naming the message and the field, the session as it was."""
    s = LinearSession("s", renderer, strict)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    a1 = generate(s, [U1], {"role": "assistant", "content": "", "tool_calls": [call]})
    replay = copy.deepcopy(a1)
    replay["tool_calls"][0]["function"]["arguments"] = '{"a":1}'
    before = (list(s.messages), len(s.records), s.snapshot.view().copy())
    with pytest.raises(BadRequest, match=r"messages\[1\] is not the reply.*"
                       r"tool_calls\[0\].function.arguments") as info:
        s.plan(TurnRequest([U1, replay, {"role": "tool", "content": "3"}]))
    assert info.value.code == "history_rewritten"
    assert "--session-version v2" in info.value.message
    assert (s.messages, len(s.records)) == before[:2] and not s.in_flight
    assert np.array_equal(s.snapshot.view(), before[2])


def test_a_retry_that_discards_a_turn_says_where_it_left_the_path(
        renderer: TemplateRenderer) -> None:
    s = LinearSession("s", renderer, strict)
    a1 = generate(s, [U1], {"role": "assistant", "content": "hi"})
    generate(s, [U1, a1, U2], {"role": "assistant", "content": "first try"})
    generate(s, [U1, a1, U2], {"role": "assistant", "content": "second try"})
    assert len(s.records) == 2
    assert s.records[1].request["divergence"] == {"discarded": 1, "message": 3,
                                                  "role": None, "fields": []}
    assert "divergence" not in s.records[0].request


def test_empty_messages_and_bad_role(renderer: TemplateRenderer) -> None:
    s = LinearSession("s", renderer, strict)
    with pytest.raises(BadRequest, match="at least one message"):
        s.plan(TurnRequest(messages=[]))
    with pytest.raises(BadRequest, match="not supported"):
        s.plan(TurnRequest(messages=[{"role": "function", "content": "x"}]))
    assert not s.in_flight


def test_records_store_deltas_not_history(renderer: TemplateRenderer) -> None:
    s, _ = three_turns(renderer)
    assert all(r.bridge_ids.dtype == np.int32 and r.logprobs.dtype == np.float32
               for r in s.records)
    assert sum(len(r.bridge_ids) + len(r.output_ids) for r in s.records) == len(s.snapshot)


def test_a_prefix_checked_upstream_plans_like_a_full_comparison(
        renderer: TemplateRenderer) -> None:
    """``stored_prefix`` (the API layer compared the messages to this copy of the stored
    ones) skips the session's comparison only while it is still the session's messages."""
    s, history = three_turns(renderer)
    request = [*history, {"role": "user", "content": "four"}]
    known = list(s.messages)
    plain = s.plan(TurnRequest(messages=request))
    s.release(plain)
    checked = s.plan(TurnRequest(messages=request, stored_prefix=known))
    s.release(checked)
    assert checked.prompt_ids.tolist() == plain.prompt_ids.tolist()
    assert (checked.keep_records, checked.rolled_back) == (plain.keep_records, 0)
    # the session moved on after the copy was taken: the copy no longer counts
    generate(s, [*history[:4], {"role": "user", "content": "three, again"}],
             {"role": "assistant", "content": "A3b"})
    stale = s.plan(TurnRequest(messages=request, stored_prefix=known))
    s.release(stale)
    assert stale.rolled_back == 1 and stale.keep_records == 2  # the retry is undone


def _views_storage(session: LinearSession) -> bool:
    storage = session.snapshot.storage
    return all(a.base is storage for r in session.records for a in (r.bridge_ids, r.output_ids))


def test_records_view_the_snapshot_so_each_id_is_stored_once(
        renderer: TemplateRenderer) -> None:
    s, history = three_turns(renderer)
    assert _views_storage(s)
    assert snapshot_ids(s.records).tolist() == s.snapshot.view().tolist()
    # the ids of each record are the ones the engine returned and the bridge computed
    assert s.records[0].output_ids.tolist() == renderer.render_completion(history[1])
    assert s.ids_nbytes == s.snapshot.storage.nbytes


def test_records_follow_the_snapshot_when_it_grows(renderer: TemplateRenderer) -> None:
    s = LinearSession("s", renderer, strict)
    messages: list[dict] = [U1]
    storages = set()
    expected: list[list[int]] = []
    for k in range(12):
        reply = {"role": "assistant", "content": f"answer {k} " + "word " * 40}
        messages.append(generate(s, messages, reply))
        expected.append(renderer.render_completion(reply))
        messages.append({"role": "user", "content": f"more {k}"})
        storages.add(id(s.snapshot.storage))
        assert _views_storage(s)  # after every growth too: no old storage kept alive
    assert len(storages) > 2
    assert [r.output_ids.tolist() for r in s.records] == expected
    assert snapshot_ids(s.records).tolist() == s.snapshot.view().tolist()


def test_a_rollback_moves_the_kept_records_to_the_new_snapshot(
        renderer: TemplateRenderer) -> None:
    s, history = three_turns(renderer)
    old = s.snapshot.storage
    kept = [r.output_ids.tolist() for r in s.records[:2]]
    generate(s, [*history[:4], {"role": "user", "content": "three, again"}],
             {"role": "assistant", "content": "A3b"})
    assert s.snapshot.storage is not old and _views_storage(s)
    assert [r.output_ids.tolist() for r in s.records[:2]] == kept
    assert snapshot_ids(s.records).tolist() == s.snapshot.view().tolist()


def test_a_replayed_session_views_its_rebuilt_snapshot(renderer: TemplateRenderer) -> None:
    s, _ = three_turns(renderer)
    copy_of = LinearSession("s", renderer, strict)
    for rec in s.records:  # as the journal replays: records with their own arrays
        rec_copy = copy.copy(rec)
        rec_copy.bridge_ids, rec_copy.output_ids = rec.bridge_ids.copy(), rec.output_ids.copy()
        copy_of.records.append(rec_copy)
    copy_of.rebuild_snapshot()
    assert _views_storage(copy_of)
    assert copy_of.snapshot.view().tolist() == s.snapshot.view().tolist()


def test_a_family_with_a_trailing_trim_keeps_its_own_ids() -> None:
    """GLM drops the stored stop id when the next turn opens (it doubles as the opener):
    the snapshot is truncated in place, so records must not view it."""
    glm = build_renderer("glm47", "standin")  # the stand-in tokenizer (no GLM vocabulary)
    s = LinearSession("s", glm, strict)
    a1 = generate(s, [U1], {"role": "assistant", "content": "A1"})
    first = s.records[0].output_ids.tolist()
    generate(s, [U1, a1, U2], {"role": "assistant", "content": "A2"})
    assert s.records[1].drop == 1
    storage = s.snapshot.storage
    assert not any(a.base is storage for r in s.records for a in (r.bridge_ids, r.output_ids))
    assert s.records[0].output_ids.tolist() == first  # its stop id, trimmed in the snapshot
    assert s.snapshot.view().tolist() == snapshot_ids(s.records).tolist()
    assert s.ids_nbytes == sum(r.bridge_ids.nbytes + r.output_ids.nbytes for r in s.records)


# -- harness replay: tolerated differences, render changes --------------------------------
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
OTHER = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {}}}}


def with_tools(session: LinearSession, messages: list[dict], reply: dict,
               tools: list[dict] | None, kwargs: dict | None = None) -> dict:
    plan = session.plan(TurnRequest(messages=messages, tools=tools, template_kwargs=kwargs))
    out = session.renderer.render_completion(reply)
    result = GenerateResult(output_ids=out, logprobs=[-0.5] * len(out), finish_reason="stop")
    message = session.renderer.parse(out, "stop").to_message()
    session.commit(plan, result, check_output(result, session.renderer.tokenizer.vocab_size),
                   message)
    return message


def test_a_harness_that_drops_the_reasoning_keeps_every_turn(
        renderer: TemplateRenderer) -> None:
    from tito.session.matchers import harness_matcher

    s = LinearSession("s", renderer, harness_matcher(renderer.renders_call_ids()))
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    a1 = generate(s, [U1], {"role": "assistant", "content": "", "reasoning_content": "look",
                            "tool_calls": [call]})
    echoed = {"role": "assistant", "content": None, "tool_calls": [
        {**call, "id": "call_x", "function": {"name": "get_weather",
                                              "arguments": '{"city":"Paris"}'}}]}
    a2 = generate(s, [U1, echoed, {"role": "tool", "tool_call_id": "call_x", "content": "21"}],
                  {"role": "assistant", "content": "21", "reasoning_content": "done"})
    generate(s, [U1, echoed, {"role": "tool", "tool_call_id": "call_x", "content": "21"},
                 {"role": "assistant", "content": "21"}, U2],
             {"role": "assistant", "content": "ok"})
    assert len(s.records) == 3 and s.messages[1] is a1 and s.messages[3] is a2  # stored wins
    assert s.records[1].request["tolerated"] == {
        "reasoning_dropped": 1, "arguments_reformatted": 1, "call_id_changed": 1}
    assert s.records[2].request["tolerated"] == {"reasoning_dropped": 1}  # only the new one
    assert "tolerated" not in s.records[0].request and "divergence" not in s.records[2].request
    assert np.array_equal(s.snapshot.view(), snapshot_ids(s.records))


def test_changed_tools_or_options_are_refused_in_v1(renderer: TemplateRenderer) -> None:
    s = LinearSession("s", renderer, strict)
    a1 = with_tools(s, [U1], {"role": "assistant", "content": "hi"}, [TOOL], {"x": 1})
    before = state(s)
    with pytest.raises(BadRequest, match=r"tools \(1 -> 2: added search\)") as info:
        s.plan(TurnRequest([U1, a1, U2], tools=[TOOL, OTHER]))
    assert info.value.code == "render_changed" and "--session-version v2" in info.value.message
    with pytest.raises(BadRequest, match=r"chat_template_kwargs \(x 1 -> 2\)"):
        s.plan(TurnRequest([U1, a1, U2], tools=[TOOL], template_kwargs={"x": 2}))
    assert state(s) == before
    # left out: the recorded ones stay; the thinking switch is per turn
    with_tools(s, [U1, a1, U2], {"role": "assistant", "content": "ok"}, None,
               {"enable_thinking": False})
    assert s.tools == [TOOL] and len(s.records) == 2
    # ... and the turn's record lists them (a comparator renders the path under them)
    assert s.records[1].request["chat_template_kwargs"] == {"x": 1, "enable_thinking": False}


def test_a_request_compares_only_the_options_it_sets(renderer: TemplateRenderer) -> None:
    """Each option a request sets is compared with the path's; one it leaves out is kept
    (before, any option set made every recorded one compulsory: 400 naming ``y``)."""
    s = LinearSession("s", renderer, strict)
    a1 = with_tools(s, [U1], {"role": "assistant", "content": "hi"}, None, {"x": 1, "y": 2})
    with pytest.raises(BadRequest, match=r"chat_template_kwargs \(z unset -> 3\)"):
        s.plan(TurnRequest([U1, a1, U2], template_kwargs={"z": 3}))
    with_tools(s, [U1, a1, U2], {"role": "assistant", "content": "ok"}, None, {"x": 1})
    assert s.records[1].request["chat_template_kwargs"] == {"y": 2, "x": 1}


def test_v1_still_rolls_back_a_retry_with_other_tools(renderer: TemplateRenderer) -> None:
    """A re-sent first turn re-renders from scratch: its tools may change."""
    s = LinearSession("s", renderer, strict)
    with_tools(s, [U1], {"role": "assistant", "content": "hi"}, [TOOL])
    with_tools(s, [U1], {"role": "assistant", "content": "hello"}, [TOOL, OTHER])
    assert len(s.records) == 1 and s.tools == [TOOL, OTHER]
    assert s.records[0].request["divergence"]["discarded"] == 1


def _scripted_prompts(renderer: TemplateRenderer) -> tuple[list[list[int]], list[bool], tuple]:
    """Every plan's prompt over a script of turns that extend, fail (released), roll
    back, grow the snapshot and go on after a replay from the records; and whether each
    prompt was a view of the session's snapshot storage."""
    s = LinearSession("s", renderer, strict)
    prompts: list[list[int]] = []
    shared: list[bool] = []

    def plan_and(messages: list[dict], reply: dict | None) -> dict | None:
        plan = s.plan(TurnRequest(messages=messages))
        prompts.append(plan.prompt_ids.tolist())
        shared.append(bool(np.shares_memory(plan.prompt_ids, s.snapshot.storage)))
        if reply is None:  # the engine failed
            s.release(plan)
            return None
        before = plan.prompt_ids.copy()
        out = renderer.render_completion(reply)
        result = GenerateResult(output_ids=out, logprobs=[-0.5] * len(out),
                                finish_reason="stop")
        message = renderer.parse(out, "stop").to_message()
        s.commit(plan, result, check_output(result, renderer.tokenizer.vocab_size), message)
        assert plan.prompt_ids.tolist() == before.tolist()  # the commit kept its values
        return message

    messages: list[dict] = [U1]
    for k in range(10):
        if k in (3, 7):  # a failed turn, then the same position with other messages
            plan_and([*messages, {"role": "user", "content": "lost " * (k + 1)}], None)
        messages.append(plan_and(messages, {"role": "assistant", "content": f"a{k} " * 30}))
        messages.append({"role": "user", "content": f"more {k} " * (k + 1)})
        if k == 5:  # a retry of the last turn: rolled back
            messages = [*messages[:-3], {"role": "user", "content": "again"}]
    replayed = LinearSession("s", renderer, strict)
    replayed.records, replayed.messages = s.records, s.messages
    replayed.checkpoint_ends = s.checkpoint_ends
    replayed.rebuild_snapshot()
    s = replayed
    messages.append(plan_and(messages, {"role": "assistant", "content": "after the replay"}))
    return prompts, shared, state(s)


def test_prompts_built_in_the_snapshot_room_equal_the_concatenated_ones(
        renderer: TemplateRenderer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path (the bridge written past the snapshot's ids, the prompt a view)
    against the slow one (a new array a turn): the same prompts and the same session."""
    fast, shared, fast_state = _scripted_prompts(renderer)
    assert sum(shared) >= 8  # the fast path ran (the first turn and a rollback do not)
    monkeypatch.setattr("tito.session.idbuffer.IdBuffer.followed_by", lambda self, ids: None)
    slow, slow_shared, slow_state = _scripted_prompts(renderer)
    assert not any(slow_shared)
    assert fast == slow
    assert fast_state == slow_state

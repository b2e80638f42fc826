"""Turns after a length cut (design §5.6) on the real qwen3 renderer, one rule in v1 and v2
and inside agent contexts: ``keep`` extends the cut reply and the sample holds every turn
(the cut reply trains, the closing token the template adds is bridge); ``refuse`` is 409
``truncated_generation`` at planning time, with the session exactly as before."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tito.render import TemplateRenderer, build_renderer
from tito.samples.tree import drop_retries, train_once
from tito.session import ContextSession, LinearSession, TreeSession
from tito.session.collect import CollectSettings, Hooks
from tito.session.matchers import strict
from tito.session.metadata import Describer
from tito.types.engine import GenerateResult, check_output
from tito.types.errors import Conflict
from tito.types.messages import AgentRef, TurnRequest

Message = dict[str, Any]
Session = LinearSession | TreeSession | ContextSession


@pytest.fixture(scope="module")
def renderer(qwen3_dir: Path) -> TemplateRenderer:
    return build_renderer("qwen3", qwen3_dir)


def new(renderer: TemplateRenderer, version: str, policy: str) -> Session:
    if version == "v2":
        return TreeSession("s", renderer, strict, after_length_cut=policy)
    return LinearSession("s", renderer, strict, after_length_cut=policy)


def in_contexts(renderer: TemplateRenderer, version: str, policy: str) -> ContextSession:
    return ContextSession("s", lambda: new(renderer, version, policy), matcher=strict)


def turn(s: Session, messages: list[Message], reply: str, *, cut: bool = False,
         agent: AgentRef | None = None) -> Message:
    """One committed turn; ``cut``: the engine stopped it by ``length`` (no stop id)."""
    renderer = s.renderer if not isinstance(s, ContextSession) else \
        s.agent_context("main").renderer  # type: ignore[attr-defined]
    plan = s.plan(TurnRequest(messages=list(messages), agent=agent))
    out = renderer.render_completion({"role": "assistant", "content": reply})
    out = out[:-1] if cut else out
    reason = "length" if cut else "stop"
    result = GenerateResult(output_ids=out, logprobs=[-0.5] * len(out),
                            finish_reason=reason)  # type: ignore[arg-type]
    message = renderer.parse(out, reason).to_message()
    output = check_output(result, renderer.tokenizer.vocab_size)
    s.apply(s.prepare_commit(plan, result, output, message), plan)
    return message


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def settings(renderer: TemplateRenderer) -> CollectSettings:
    return CollectSettings(Describer(renderer, "i"),
                           Hooks(drop_retries, train_once, ("drop_retries", "train_once")))


def state(s: Session) -> Any:
    return (copy.deepcopy(s.messages), [r.output_ids.tolist() for r in s.records],
            s.num_tokens, s.in_flight)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_keep_puts_every_turn_in_the_sample(renderer: TemplateRenderer, version: str) -> None:
    s = new(renderer, version, "keep")
    a0 = turn(s, [user("u0")], "a reply the engine cut off", cut=True)
    history = [user("u0"), a0, user("go on")]
    a1 = turn(s, history, "more")
    turn(s, [*history, a1, user("again")], "done")
    [sample] = s.collection().collect(settings(renderer)).samples
    records = s.records
    assert len(records) == 3 and sample.status == "completed"  # the last turn's status
    tokens = sample.tokens.tolist()
    assert tokens == np.concatenate([np.concatenate([r.bridge_ids, r.output_ids])
                                     for r in records]).tolist()
    cut = records[0]
    start, end = cut.prompt_len, cut.checkpoint_len
    assert sample.metadata["length_cut_turns"] == [{"turn": 0, "start": start, "end": end}]
    mask = sample.loss_mask.tolist()
    prompt = sample.prompt_length
    assert mask[: end - prompt] == [1] * len(cut.output_ids)  # the cut reply trains
    im_end = renderer.tokenizer.encode("<|im_end|>")
    assert tokens[end : end + len(im_end)] == im_end  # the closer the template added...
    assert mask[end - prompt] == 0  # ...is bridge
    assert sample.rollout_log_probs[end - prompt] == 0.0
    assert int(sample.loss_mask.sum()) == sum(len(r.output_ids) for r in records)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_refuse_is_409_before_anything_changes(renderer: TemplateRenderer,
                                               version: str) -> None:
    s = new(renderer, version, "refuse")
    a0 = turn(s, [user("u0")], "a reply the engine cut off", cut=True)
    before = state(s)
    with pytest.raises(Conflict) as err:
        s.plan(TurnRequest(messages=[user("u0"), a0, user("go on")]))
    assert err.value.code == "truncated_generation"
    assert "--after-length-cut refuse" in err.value.message
    assert state(s) == before
    turn(s, [user("u0")], "a retry of the cut turn")  # before the cut: allowed
    assert len(s.records) == 1 and s.records[0].finish_reason == "stop"


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("policy", ["keep", "refuse"])
def test_the_rule_holds_in_a_sub_agent_context(renderer: TemplateRenderer, version: str,
                                               policy: str) -> None:
    s = in_contexts(renderer, version, policy)
    turn(s, [user("main task")], "delegating")
    sub = AgentRef(agent_id="sub-1")
    a0 = turn(s, [user("sub task")], "cut off", cut=True, agent=sub)
    follow = TurnRequest(messages=[user("sub task"), a0, user("go on")], agent=sub)
    if policy == "refuse":
        before = state(s.contexts["sub-1"].session)
        with pytest.raises(Conflict) as err:
            s.plan(follow)
        assert err.value.code == "truncated_generation"
        assert state(s.contexts["sub-1"].session) == before
        return
    turn(s, [user("sub task"), a0, user("go on")], "finished", agent=sub)
    samples = s.collection().collect(settings(renderer)).samples
    [sub_sample] = [x for x in samples if x.metadata.get("agent_id") == "sub-1"]
    assert len(sub_sample.metadata["lifecycle"]) == 2
    assert [c["turn"] for c in sub_sample.metadata["length_cut_turns"]] == [0]

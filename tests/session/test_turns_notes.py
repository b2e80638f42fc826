"""A request's notes (what the API layer changed) travel with its turn: in the record's
request facts and in the sample metadata of every path that holds the turn."""

from __future__ import annotations

import numpy as np

from tito.render.base import TemplateRenderer
from tito.samples.tree import drop_retries, train_once
from tito.session.collect import CollectSettings, Hooks
from tito.session.linear import LinearSession
from tito.session.matchers import strict
from tito.session.metadata import Describer
from tito.types.engine import GenerateResult, check_output
from tito.types.messages import TurnRequest


def _turn(session: LinearSession, renderer: TemplateRenderer, messages: list[dict],
          notes: dict | None) -> dict:
    plan = session.plan(TurnRequest(messages, notes=notes))
    reply = {"role": "assistant", "content": f"ok {len(messages)}"}
    ids = renderer.render_completion(reply)
    result = GenerateResult(output_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")
    session.commit(plan, result, check_output(result, renderer.tokenizer.vocab_size), reply)
    return reply


def test_notes_are_kept_per_turn_and_listed_in_the_sample(qwen3_renderer: TemplateRenderer
                                                          ) -> None:
    session = LinearSession("s" * 32, qwen3_renderer, strict)
    first = [{"role": "user", "content": "hi"}]
    reply = _turn(session, qwen3_renderer, first, None)
    second = [*first, reply, {"role": "user", "content": "more"}]
    _turn(session, qwen3_renderer, second, {"hosted_tools_left_out": ["web_search"]})
    assert "notes" not in session.records[0].request
    assert session.records[1].request["notes"] == {"hosted_tools_left_out": ["web_search"]}
    settings = CollectSettings(Describer(qwen3_renderer, "i" * 32),
                               Hooks(drop_retries, train_once, ("p", "q")))
    collected = session.collection().collect(settings)
    assert collected.session_metadata["tito_turn_notes"] == [
        {"turn": 1, "hosted_tools_left_out": ["web_search"]}]
    assert collected.samples[0].metadata["tito_turn_notes"] == [
        {"turn": 1, "hosted_tools_left_out": ["web_search"]}]
    assert np.array_equal(collected.samples[0].tokens[:3], session.snapshot.view()[:3])

"""``reasoning.effort`` and ``usage.output_tokens_details.reasoning_tokens`` on
/v1/responses (real ``tito serve`` + ``tito mock-engine`` for qwen3, the real ``openai``
SDK): the effort drives the family's thinking switch (``none``/``minimal`` off, others
on) unless ``chat_template_kwargs`` says otherwise; the reasoning tokens are the generated
ids through ``</think>``, counted on the engine's output ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers.support import engine_log, new_session

from tito.types.tokenizer import load_tokenizer


def client_for(url: str, sid: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x",
                              max_retries=0)


def think_end(qwen3_dir: Path, output_ids: list[int]) -> int:
    """The generated ids through ``</think>`` (0 without one)."""
    end = load_tokenizer(qwen3_dir).require_id("</think>")
    return output_ids.index(end) + 1 if end in output_ids else 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("text", "effort", "thinks"), [
    ("THINK a long and careful thought\nSAY Hi.", None, True),
    ("SAY Hi.", None, True),  # thinking on, nothing thought: the empty block's ids
    ("THINK dropped\nSAY Hi.", "minimal", False),
])
async def test_reasoning_tokens_are_counted_on_the_ids(
        stack: Any, qwen3_dir: Path, text: str, effort: str | None, thinks: bool,
        stream: bool) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    kwargs: Any = {"reasoning": {"effort": effort}} if effort else {}
    if stream:
        async with client.responses.stream(model="m", input=text, **kwargs) as events:
            reply = await events.get_final_response()
    else:
        reply = await client.responses.create(model="m", input=text, **kwargs)
    (entry,) = engine_log(engine.url, sid)
    expected = think_end(qwen3_dir, entry["output_ids"])
    assert (expected > 0) == thinks
    assert reply.usage is not None
    assert reply.usage.output_tokens_details.reasoning_tokens == expected
    assert reply.usage.output_tokens == len(entry["output_ids"])


@pytest.mark.parametrize(("body", "kwargs"), [
    ({"reasoning": {"effort": "minimal"}}, {"enable_thinking": False}),
    ({"reasoning": {"effort": "low"}}, {"enable_thinking": True}),
    ({"reasoning": {"effort": "xhigh", "summary": "auto"}}, {"enable_thinking": True}),
    ({"reasoning": {"effort": "high"}, "chat_template_kwargs": {"enable_thinking": False}},
     {"enable_thinking": False}),  # the explicit kwargs win
    ({"reasoning": {"summary": "auto"}}, None),  # no effort: the family's default
])
async def test_effort_sets_the_thinking_switch(stack: Any, body: dict[str, Any],
                                               kwargs: dict[str, Any] | None) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    resp = httpx.post(f"{gateway.url}/sessions/{sid}/v1/responses",
                      json={"model": "m", "input": "THINK t\nSAY Hi.", **body})
    assert resp.status_code == 200, resp.text
    (record,) = httpx.get(f"{gateway.url}/sessions/{sid}").json()["records"]
    assert record.get("chat_template_kwargs") == kwargs
    kinds = [item["type"] for item in resp.json()["output"]]
    assert kinds == (["message"] if kwargs == {"enable_thinking": False}
                     else ["reasoning", "message"])

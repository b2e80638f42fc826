"""Chat Completions for harnesses: ``reasoning_effort`` drives the family's thinking
switch and effort level (an explicit ``chat_template_kwargs`` wins),
``usage.completion_tokens_details.reasoning_tokens`` counts the generated reasoning ids,
and ``web_search_options`` (OpenAI's hosted search) is left out, noted and warned about
once, or refused under ``--hosted-tools error``. Real ``tito serve`` + ``tito
mock-engine`` with the real ``openai`` SDK, or the app in-process."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers.fakes import ModelEngine
from helpers.inproc import asgi_client, openai_for
from helpers.inproc import new_session as new_inproc_session
from helpers.support import engine_log, new_session, tokenizer_dir

from tito.config import ServerConfig
from tito.render import TemplateRenderer, build_renderer
from tito.samples import decode_samples
from tito.server.gateway import Gateway
from tito.types.tokenizer import load_tokenizer

USER = [{"role": "user", "content": "THINK a careful thought\nSAY Hi."}]
_RENDERERS: dict[str, TemplateRenderer] = {}


def client_for(url: str, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x", max_retries=0)


def through_think_end(qwen3_dir: Path, output_ids: list[int]) -> int:
    end = load_tokenizer(qwen3_dir).require_id("</think>")
    return output_ids.index(end) + 1 if end in output_ids else 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("effort", "thinks"), [(None, True), ("none", False),
                                                ("medium", True)])
def test_reasoning_tokens_in_usage(stack: Any, qwen3_dir: Path, effort: str | None,
                                   thinks: bool, stream: bool) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    extra: Any = {"reasoning_effort": effort} if effort else {}
    if stream:
        chunks = list(client.chat.completions.create(
            model="m", messages=USER, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True}, **extra))
        usage = chunks[-1].usage
    else:
        usage = client.chat.completions.create(model="m", messages=USER,  # type: ignore[arg-type]
                                               **extra).usage
    (entry,) = engine_log(engine.url, sid)
    expected = through_think_end(qwen3_dir, entry["output_ids"])
    assert (expected > 0) == thinks
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == expected
    assert usage.completion_tokens == len(entry["output_ids"])
    (record,) = httpx.get(f"{gateway.url}/sessions/{sid}").json()["records"]
    assert record.get("chat_template_kwargs") == (
        None if effort is None else {"enable_thinking": thinks})


def test_explicit_template_kwargs_win_over_the_effort(stack: Any) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    reply = client_for(gateway.url, sid).chat.completions.create(
        model="m", messages=USER, reasoning_effort="high",  # type: ignore[arg-type]
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].message.content == "Hi."
    assert getattr(reply.choices[0].message, "reasoning_content", None) is None
    (record,) = httpx.get(f"{gateway.url}/sessions/{sid}").json()["records"]
    assert record["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize(("family", "fixture", "effort", "shown"), [
    ("gpt_oss", "gpt-oss", "high", "Reasoning: high"),
    ("gpt_oss", "gpt-oss", "minimal", "Reasoning: low"),
    ("gpt_oss", "gpt-oss", None, "Reasoning: medium"),
    ("deepseek_v4", "deepseek-v4", "xhigh", "Reasoning Effort: Absolute maximum"),
])
async def test_effort_reaches_the_template_level(family: str, fixture: str,
                                                 effort: str | None, shown: str) -> None:
    """A family whose template takes an effort level gets it through its kwarg."""
    tokenizer = str(tokenizer_dir(fixture))
    renderer = _RENDERERS.get(family) or _RENDERERS.setdefault(
        family, build_renderer(family, tokenizer))
    engine = ModelEngine(renderer)
    gateway = Gateway(ServerConfig(tokenizer=tokenizer, family=family, engine="sglang",
                                   engine_url="http://fake"), renderer, engine)
    body: dict[str, Any] = {"messages": USER}
    if effort is not None:
        body["reasoning_effort"] = effort
    async with asgi_client(gateway) as http:
        sid = await new_inproc_session(http)
        resp = await http.post(f"/sessions/{sid}/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text
        samples = decode_samples((await http.post(f"/sessions/{sid}/samples")).content)
    assert shown in renderer.tokenizer.decode(engine.calls[0].input_ids)
    assert samples.samples[0].metadata["tito_session_mismatch"] == []


async def test_web_search_options_are_left_out_and_noted(
        gateway: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tito.server")
    async with asgi_client(gateway) as http:
        sid = await new_inproc_session(http)
        client = openai_for(http, sid)
        messages: list[Any] = [{"role": "user", "content": "hi"}]
        for _ in range(2):
            reply = await client.chat.completions.create(
                model="m", messages=messages, web_search_options={})
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": "more"}]
        samples = decode_samples((await http.post(f"/sessions/{sid}/samples")).content)
    assert samples.samples[0].metadata["tito_turn_notes"] == [
        {"turn": 0, "hosted_tools_left_out": ["web_search"]},
        {"turn": 1, "hosted_tools_left_out": ["web_search"]}]
    warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warned) == 1 and sid in warned[0]


async def test_web_search_options_refused_under_the_error_policy(make_gateway: Any) -> None:
    gateway: Gateway = make_gateway(hosted_tools="error")
    async with asgi_client(gateway) as http:
        sid = await new_inproc_session(http)
        resp = await http.post(f"/sessions/{sid}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "web_search_options": {}})
        assert resp.status_code == 400
        assert resp.json()["error"]["code"] == "unsupported_tool"
        assert (await http.get(f"/sessions/{sid}")).json()["records"] == []

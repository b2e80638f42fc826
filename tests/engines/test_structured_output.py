"""Structured output on the engine wire: a JSON schema in SamplingParams is SGLang's
``sampling_params.json_schema`` (checked by the mock as SGLang does: one constraint at
most, a schema that compiles) and vLLM's ``structured_outputs.json``."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web

from tito.engines.mock import MockEngine
from tito.engines.sglang import SGLangEngine, sampling_payload
from tito.engines.vllm import VLLMEngine
from tito.types.engine import SamplingParams
from tito.types.errors import EngineRejected

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})


def test_the_sglang_payload_carries_the_schema_only_when_given() -> None:
    assert "json_schema" not in sampling_payload(SamplingParams())
    assert sampling_payload(SamplingParams(json_schema=SCHEMA))["json_schema"] == SCHEMA


async def test_the_mock_accepts_a_schema_as_sglang_does(
        make_mock: Callable[..., MockEngine], serve: Callable[..., Awaitable[str]]) -> None:
    mock = make_mock()
    engine = SGLangEngine(await serve(mock.app()))
    ids = mock.model.renderer.render_prompt([{"role": "user", "content": 'SAY {"a": 1}'}])
    try:
        result = await engine.generate(ids, SamplingParams(max_new_tokens=16,
                                                           json_schema=SCHEMA), "s_t0_r0")
        assert mock.tokenizer.decode(result.output_ids).startswith('{"a": 1}')
        assert mock.core.log[-1]["sampling_params"]["json_schema"] == SCHEMA
        for schema, expected in (("{not json", "Failed to compile json grammar"),
                                 ("[1]", "Failed to compile json grammar")):
            with pytest.raises(EngineRejected, match=expected) as caught:
                await engine.generate(ids, SamplingParams(json_schema=schema), "s_t1_r0")
            assert caught.value.engine_status == 400
    finally:
        await engine.close()


async def test_the_mock_refuses_two_constraints(
        make_mock: Callable[..., MockEngine], serve: Callable[..., Awaitable[str]]) -> None:
    mock = make_mock()
    url = await serve(mock.app())
    async with httpx.AsyncClient(base_url=url) as http:
        resp = await http.post("/generate", json={"input_ids": [1, 2], "sampling_params": {
            "json_schema": SCHEMA, "regex": "a+"}})
    assert resp.status_code == 400
    assert resp.json() == {"error": {"message":
                                     "Only one of regex, json_schema, or ebnf can be set."}}


async def test_the_vllm_payload_carries_structured_outputs(
        web_server: Callable[[Any], Awaitable[str]]) -> None:
    bodies: list[dict[str, Any]] = []

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})

    async def completions(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response({"id": "c", "choices": [{
            "index": 0, "text": "{}", "token_ids": [5], "finish_reason": "stop",
            "logprobs": {"token_logprobs": [-0.5]}}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1}})

    engine = VLLMEngine(await web_server({("GET", "/v1/models"): models,
                                          ("POST", "/v1/completions"): completions}))
    try:
        await engine.generate([1, 2], SamplingParams(max_new_tokens=2), "s_t000000_ab")
        await engine.generate([1, 2], SamplingParams(max_new_tokens=2, json_schema=SCHEMA),
                              "s_t000001_ab")
    finally:
        await engine.close()
    assert "structured_outputs" not in bodies[0]
    assert bodies[1]["structured_outputs"] == {"json": SCHEMA}

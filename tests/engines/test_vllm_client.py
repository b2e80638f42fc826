"""The vLLM client against a scripted ``/v1/completions`` (no vLLM needed): the prompt's
ids spliced onto the session's previous prompt, and every request counted in flight
while it runs (the prompt-text cache's entry budget)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson
import pytest
from aiohttp import web

from tito.engines.vllm import VLLMEngine
from tito.types.engine import SamplingParams
from tito.types.errors import EngineError, EngineRejected

PARAMS = SamplingParams(max_new_tokens=2)


def choice() -> dict[str, Any]:
    return {"index": 0, "text": "ab", "token_ids": [5, 6], "finish_reason": "stop",
            "logprobs": {"token_logprobs": [-0.5, -0.25]}}


def completion() -> dict[str, Any]:
    return {"id": "c", "choices": [choice()],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2}}


async def models(request: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})


async def test_prompts_are_spliced_and_requests_counted_in_flight(
        web_server: Callable[[Any], Awaitable[str]]) -> None:
    release = asyncio.Event()
    bodies: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        await release.wait()
        if body["request_id"].startswith("bad"):
            return web.json_response({"error": {"message": "no"}}, status=400)
        if body["stream"]:
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: " + orjson.dumps(completion()) + b"\n\ndata: [DONE]\n\n")
            return resp
        return web.json_response(completion())

    engine = VLLMEngine(await web_server({("GET", "/v1/models"): models,
                                          ("POST", "/v1/completions"): completions}))

    async def stream(rid: str) -> None:
        async for _ in engine.generate_stream([1, 2], PARAMS, rid):
            pass

    try:
        tasks = [asyncio.ensure_future(c) for c in (
            engine.generate(np.asarray([1, 2], dtype=np.int32), PARAMS, "s_t000000_ab"),
            engine.generate([3], PARAMS, "t_t000000_ab"), stream("u_t000000_ab"),
            engine.generate([4], PARAMS, "bad_t000000_ab"))]
        while len(bodies) < 4:
            await asyncio.sleep(0.01)
        assert engine.prompt_json.in_flight == 4
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[-1], EngineRejected)
        assert engine.prompt_json.in_flight == 0 and engine.prompt_json.peak_in_flight == 4
        # the session's next prompt extends its previous one: spliced, the same text
        await engine.generate([1, 2, 5, 6, 9], PARAMS, "s_t000001_ab")
    finally:
        await engine.close()
    prompts = {b["request_id"]: b["prompt"] for b in bodies}
    assert prompts == {"s_t000000_ab": [1, 2], "t_t000000_ab": [3], "u_t000000_ab": [1, 2],
                       "bad_t000000_ab": [4], "s_t000001_ab": [1, 2, 5, 6, 9]}
    assert engine.prompt_json.reused == 1


def delta_events(ids: list[int], step: int, *, bad: int | None = None) -> bytes:
    """vLLM's /v1/completions stream: each chunk's new token_ids and their logprobs, the
    finish reason on the last, then usage and [DONE]."""
    out = b""
    for at in range(0, len(ids), step):
        new = ids[at:at + step]
        if bad is not None and at == step:  # the second chunk
            new = [bad, *new[1:]]
        last = at + step >= len(ids)
        event = {"id": "c", "choices": [{
            "index": 0, "text": "x", "token_ids": new,
            "logprobs": {"token_logprobs": [-0.5] * len(new)},
            "finish_reason": "length" if last else None}]}
        out += b"data: " + orjson.dumps(event) + b"\n\n"
    usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 2,
                                                 "completion_tokens": len(ids)}}
    return out + b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"


async def stream_server(web_server: Callable[[Any], Awaitable[str]], body: bytes) -> str:
    async def completions(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for at in range(0, len(body), 4096):
            await resp.write(body[at:at + 4096])
        return resp

    return await web_server({("GET", "/v1/models"): models,
                             ("POST", "/v1/completions"): completions})


async def test_deltas_are_appended_to_one_list_and_the_result_is_whole(
        web_server: Callable[[Any], Awaitable[str]]) -> None:
    ids = [(5 * i + 1) % 900 for i in range(3000)]
    engine = VLLMEngine(await stream_server(web_server, delta_events(ids, 7)))
    lengths, lists = [], set()
    try:
        async for chunk in engine.generate_stream([1, 2], PARAMS, "d_t000000_ab"):
            if chunk.result is not None:
                result = chunk.result
                break
            lengths.append(len(chunk.output_ids))
            lists.add(id(chunk.output_ids))
    finally:
        await engine.close()
    assert lengths == [*range(7, 3000, 7), 3000] and len(lists) == 1  # grown, not copied
    assert result.output_ids == ids and result.logprobs == [-0.5] * 3000
    assert result.finish_reason == "length" and result.prompt_tokens == 2


async def test_an_id_over_int32_in_a_delta_is_a_protocol_error(
        web_server: Callable[[Any], Awaitable[str]]) -> None:
    engine = VLLMEngine(await stream_server(web_server, delta_events(list(range(20)), 5,
                                                                     bad=2**31)))
    got = []
    try:
        with pytest.raises(EngineError) as info:
            async for chunk in engine.generate_stream([1, 2], PARAMS, "e_t000000_ab"):
                got.append(len(chunk.output_ids))
    finally:
        await engine.close()
    assert got == [5] and info.value.code == "engine_protocol_error"

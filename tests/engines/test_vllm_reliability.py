"""The vLLM client over the shared HTTP transport (:mod:`tito.engines.transport`): the one
safe stale-connection retry, as the SGLang client has it (tests/engines/test_sglang_reliability.py),
and probes under a short timeout, not the generation timeout.

The idle-gap test blocks the client's event loop between requests with ``time.sleep``, as
a busy gateway does: the engine (served by another thread, as another process would)
closes the idle connection meanwhile, and the client only learns it when it writes the
next request on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import tito.engines.transport as transport
import tito.engines.vllm as vllm
from tito.engines.vllm import VLLMEngine
from tito.net import bind_tcp, url_of
from tito.types.engine import SamplingParams
from tito.types.errors import EngineError, EngineTimeout

pytestmark = pytest.mark.slow  # real timeouts against a stalled vLLM stand-in

PARAMS = SamplingParams(max_new_tokens=2)
MODELS = {"data": [{"id": "m", "max_model_len": 4096}]}


def completion() -> dict[str, Any]:
    return {"id": "c", "choices": [{"index": 0, "text": "ab", "token_ids": [5, 6],
                                    "finish_reason": "stop",
                                    "logprobs": {"token_logprobs": [-0.5, -0.25]}}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2}}


def vllm_app(seen: list[str]) -> Starlette:
    """``/v1/models`` and ``/v1/completions`` as vLLM answers them; ``seen``: every
    completion's ``request_id`` as it arrives (a request id ``slow...`` waits 2 s)."""

    async def models(request: Request) -> Response:
        return JSONResponse(MODELS)

    async def completions(request: Request) -> Response:
        rid = orjson.loads(await request.body())["request_id"]
        seen.append(rid)
        if rid.startswith("slow"):
            await asyncio.sleep(2)
        return JSONResponse(completion())

    return Starlette(routes=[Route("/v1/models", models),
                             Route("/v1/completions", completions, methods=["POST"])])


async def with_idle_gaps(engine: VLLMEngine, n: int, gap: float) -> int:
    """``n`` sequential turns, the loop blocked ``gap`` seconds after each; the failures."""
    failures = 0
    for i in range(n):
        try:
            await engine.generate([1, 2], PARAMS, f"r{i}")
        except EngineError:
            failures += 1
        time.sleep(gap)  # a busy loop: the engine's FIN stays unread
    return failures


# ---- stale keep-alive connections ----------------------------------------------------------


@pytest.mark.slow  # real idle timeouts
async def test_stale_pooled_connections_are_retried_once(
        serve_in_thread: Callable[..., str]) -> None:
    seen: list[str] = []
    engine = VLLMEngine(serve_in_thread(vllm_app(seen), timeout_keep_alive=0.05),
                        keepalive_timeout=10)  # longer than the engine's: reuse stale ones
    try:
        assert await with_idle_gaps(engine, 10, 0.15) == 0
        assert engine.stale_retries > 0 and engine.stats().stale_retries == engine.stale_retries
        assert seen == [f"r{i}" for i in range(10)]  # every request ran exactly once
    finally:
        await engine.close()


@pytest.mark.slow
async def test_without_the_retry_stale_connections_fail(
        serve_in_thread: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The control of the test above: the same traffic fails when nothing is retried."""
    monkeypatch.setattr(transport, "closed_before_reply", lambda exc: False)
    seen: list[str] = []
    engine = VLLMEngine(serve_in_thread(vllm_app(seen), timeout_keep_alive=0.05),
                        keepalive_timeout=10)
    try:
        assert await with_idle_gaps(engine, 6, 0.15) > 0
        assert engine.stale_retries == 0
    finally:
        await engine.close()


def test_default_keepalive_is_below_the_engines() -> None:
    assert VLLMEngine("http://engine").keepalive_timeout == 4.0  # vLLM's uvicorn: 5 s


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes] | None:
    """(path, body) of the next HTTP/1.1 request on a connection; None at its end."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.split(b"\r\n")
    length = next((int(line.split(b":")[1]) for line in lines
                   if line.lower().startswith(b"content-length:")), 0)
    return lines[0].split()[1].decode(), await reader.readexactly(length)


def _reply(writer: asyncio.StreamWriter, payload: Any) -> None:
    body = orjson.dumps(payload)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(body), body))


async def test_closed_before_any_reply_on_a_reused_connection_is_sent_once_more() -> None:
    """A keep-alive connection the engine closes after reading a request, without a byte
    of response, looks on the wire like an idle close: the request is sent once more on a
    fresh connection (here the engine then answers it)."""
    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        while (request := await _read_request(reader)) is not None:
            path, body = request
            if path == "/v1/completions":
                rid = orjson.loads(body)["request_id"]
                seen.append(rid)
                if rid == "gone" and served and seen.count("gone") == 1:
                    break  # close the reused connection, no response
            _reply(writer, MODELS if path == "/v1/models" else completion())
            await writer.drain()
            served += 1
        writer.close()

    sock = bind_tcp("127.0.0.1", 0)
    server = await asyncio.start_server(handle, sock=sock)
    engine = VLLMEngine(url_of(sock))
    try:
        await engine.generate([1, 2], PARAMS, "warm")  # /v1/models, then a completion
        result = await engine.generate([1, 2], PARAMS, "gone")
        assert result.output_ids == [5, 6]
        assert engine.stale_retries == 1 and seen == ["warm", "gone", "gone"]
        assert engine.stats().stale_retries == 1 and engine.stats().url == engine.url
    finally:
        await engine.close()
        server.close()
        await server.wait_closed()


async def test_timeout_on_a_reused_connection_is_not_retried(
        serve: Callable[..., Awaitable[str]]) -> None:
    seen: list[str] = []
    engine = VLLMEngine(await serve(vllm_app(seen)), timeout=0.3)
    try:
        await engine.generate([1, 2], PARAMS, "warm")
        with pytest.raises(EngineTimeout) as info:
            await engine.generate([1, 2], PARAMS, "slow")
        assert info.value.code == "engine_timeout" and "timed out after 0.3s" in str(info.value)
        assert engine.stale_retries == 0 and seen == ["warm", "slow"]
    finally:
        await engine.close()


# ---- probes: a short timeout, not the generation timeout --------------------------------


async def test_probe_of_a_slow_vllm_answers_within_the_probe_timeout(
        web_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm, "PROBE_TIMEOUT_S", 0.1)

    async def health(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        return web.Response()

    engine = VLLMEngine(await web_server({("GET", "/health"): health}))  # 600 s generation
    try:
        start = time.perf_counter()
        assert await engine.probe() == f"no answer from {engine.url}/health within 0.1s"
        assert await engine.health() is False
        assert time.perf_counter() - start < 0.45
    finally:
        await engine.close()


async def test_probe_of_a_healthy_and_an_unhealthy_vllm(web_server: Any) -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.Response()

    async def sick(request: web.Request) -> web.Response:
        return web.json_response({"detail": "engine dead"}, status=503)

    healthy = VLLMEngine(await web_server({("GET", "/health"): ok}))
    unhealthy = VLLMEngine(await web_server({("GET", "/health"): sick}))
    try:
        assert await healthy.probe() is None
        problem = await unhealthy.probe()
        assert problem is not None and "HTTP 503" in problem and "engine dead" in problem
    finally:
        await healthy.close()
        await unhealthy.close()


async def test_models_are_asked_within_a_short_timeout(
        web_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm, "MODELS_TIMEOUT_S", 0.1)

    async def models(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        return web.json_response(MODELS)

    engine = VLLMEngine(await web_server({("GET", "/v1/models"): models}))
    try:
        start = time.perf_counter()
        with pytest.raises(EngineTimeout, match=r"/v1/models timed out after 0\.1s"):
            await engine.context_length()
        assert time.perf_counter() - start < 0.45
    finally:
        await engine.close()


async def test_probe_of_a_down_vllm() -> None:
    sock = bind_tcp("127.0.0.1", 0)
    url = url_of(sock)
    sock.close()
    engine = VLLMEngine(url)
    try:
        problem = await engine.probe()
        assert problem is not None and problem.startswith("ClientConnectorError")
        assert await engine.health() is False
    finally:
        await engine.close()

"""The SGLang client against real failures over HTTP: stale keep-alive connections and the
one safe retry, the mock engine's faults mapped to error codes, the context length and
the health probe.

The stale-connection tests block the client's event loop between requests with
``time.sleep``, as a busy gateway does: the engine (served by another thread, as another
process would) closes the idle connection meanwhile, and the client only learns it when it
writes the next request on it.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import ClientPayloadError, web

import tito.engines.sglang as sglang
import tito.engines.transport as transport
from tito.engines.mock import MockConfig, MockEngine
from tito.engines.sglang import SGLangEngine
from tito.net import bind_tcp, url_of
from tito.types.engine import GenerateResult, SamplingParams
from tito.types.errors import EngineError, EngineTimeout, EngineUnreachable

pytestmark = pytest.mark.slow  # real idle timeouts and keep-alive waits

MakeMock = Callable[..., MockEngine]


def chat_prompt(mock: MockEngine, text: str) -> list[int]:
    """Prompt ids of one ChatML user message (its directives script the mock)."""
    return mock.tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


async def ask(engine: SGLangEngine, mock: MockEngine, text: str, rid: str) -> GenerateResult:
    return await engine.generate(chat_prompt(mock, text), SamplingParams(max_new_tokens=8), rid)


def rids(mock: MockEngine) -> list[str]:
    return [entry["rid"] for entry in mock.core.log]


async def with_idle_gaps(engine: SGLangEngine, mock: MockEngine, n: int, gap: float) -> int:
    """``n`` sequential turns, the loop blocked ``gap`` seconds after each; the failures."""
    failures = 0
    for i in range(n):
        try:
            await ask(engine, mock, "SAY hello", f"r{i}")
        except EngineError:
            failures += 1
        time.sleep(gap)  # a busy loop: the engine's FIN stays unread
    return failures


# ---- stale keep-alive connections ----------------------------------------------------------


async def test_stale_pooled_connections_are_retried_once(
        make_mock: MakeMock, serve_in_thread: Callable[..., str]) -> None:
    mock = make_mock(keepalive_timeout=0.05)
    engine = SGLangEngine(serve_in_thread(mock.app(), **mock.server_options()),
                          keepalive_timeout=10)  # longer than the engine's: reuse stale ones
    try:
        assert await with_idle_gaps(engine, mock, 10, 0.15) == 0
        assert engine.stale_retries > 0
        assert rids(mock) == [f"r{i}" for i in range(10)]  # every request ran exactly once
    finally:
        await engine.close()


async def test_without_the_retry_stale_connections_fail(
        make_mock: MakeMock, serve_in_thread: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The control of the test above: the same traffic fails when nothing is retried."""
    monkeypatch.setattr(transport, "closed_before_reply", lambda exc: False)
    mock = make_mock(keepalive_timeout=0.05)
    engine = SGLangEngine(serve_in_thread(mock.app(), **mock.server_options()),
                          keepalive_timeout=10)
    try:
        assert await with_idle_gaps(engine, mock, 6, 0.15) > 0
        assert engine.stale_retries == 0
    finally:
        await engine.close()


async def test_a_shorter_keepalive_never_reuses_a_closed_connection(
        make_mock: MakeMock, serve_in_thread: Callable[..., str]) -> None:
    """keepalive_timeout below the engine's: idle connections are dropped before it closes
    them, so nothing needs a retry."""
    mock = make_mock(keepalive_timeout=0.2)
    engine = SGLangEngine(serve_in_thread(mock.app(), **mock.server_options()),
                          keepalive_timeout=0.1)
    try:
        assert await with_idle_gaps(engine, mock, 6, 0.25) == 0
        assert engine.stale_retries == 0
    finally:
        await engine.close()


def test_default_keepalive_is_below_the_engines() -> None:
    assert SGLangEngine("http://engine").keepalive_timeout == 4.0
    assert MockConfig(tokenizer_dir="t").keepalive_timeout == 5.0  # uvicorn's, SGLang's


@pytest.mark.slow
async def test_stale_keepalive_50_turns(make_mock: MakeMock,
                                        serve_in_thread: Callable[..., str]) -> None:
    """50 turns 0.5 s apart against an engine that closes idle connections after 0.3 s."""
    mock = make_mock(keepalive_timeout=0.3)
    engine = SGLangEngine(serve_in_thread(mock.app(), **mock.server_options()),
                          keepalive_timeout=10)
    try:
        assert await with_idle_gaps(engine, mock, 50, 0.5) == 0
        assert engine.stale_retries > 0
        assert rids(mock) == [f"r{i}" for i in range(50)]
    finally:
        await engine.close()


def _connection_key() -> Any:
    class Key:
        host, port, ssl = "engine", 80, False

    return Key()


def _partial_response() -> Any:
    """What aiohttp passes to ServerDisconnectedError when part of a response was parsed."""
    return object()


@pytest.mark.parametrize(("exc", "retried"), [
    (aiohttp.ServerDisconnectedError(), True),
    (aiohttp.ServerDisconnectedError(_partial_response()), False),
    (aiohttp.ClientConnectionResetError("Cannot write to closing transport"), True),
    (aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer"), True),
    (aiohttp.ClientOSError(errno.EPIPE, "Broken pipe"), True),
    (aiohttp.ClientOSError(errno.ECONNRESET, "Can not write request body for http://e"), True),
    (aiohttp.ClientOSError(None, "Can not write request body for http://e"), True),
    (aiohttp.ClientOSError(errno.ETIMEDOUT, "Can not write request body for http://e"), False),
    (aiohttp.ClientOSError(errno.EHOSTUNREACH, "No route to host"), False),
    (aiohttp.ClientOSError(None, "something else"), False),
    (aiohttp.ServerTimeoutError("read timeout"), False),
    (aiohttp.SocketTimeoutError("read timeout"), False),
    (TimeoutError(), False),
    (aiohttp.ClientPayloadError("Response payload is not completed"), False),
    (aiohttp.ClientConnectionError("Connection lost"), False),
    (ConnectionResetError("Cannot write to closing transport"), True),  # aiohttp < 3.10
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), True),
    (aiohttp.ClientConnectorError(_connection_key(), ConnectionRefusedError(
        errno.ECONNREFUSED, "refused")), False),
    (OSError(errno.ECONNREFUSED, "refused"), False),
])
def test_the_exact_list_of_retried_errors(exc: BaseException, retried: bool) -> None:
    assert sglang.closed_before_reply(exc) is retried


async def test_reset_before_any_reply_on_a_reused_connection_is_sent_once_more(
        make_mock: MakeMock, serve: Callable[..., Awaitable[str]]) -> None:
    """On the wire, a reset without a byte of response on a pooled connection looks like an
    idle close: the client sends it once more on a fresh connection (SGLang's server never
    resets a connection with a request in progress; the mock's ``reset`` fault does)."""
    mock = make_mock()
    engine = SGLangEngine(await serve(mock.app()))
    try:
        await ask(engine, mock, "SAY warm", "warm")
        with pytest.raises(EngineError, match="retried on a fresh connection after") as info:
            await ask(engine, mock, "FAULT reset", "gone")
        assert info.value.code == "engine_error" and info.value.__cause__ is not None
        assert engine.stale_retries == 1 and rids(mock) == ["warm", "gone", "gone"]
    finally:
        await engine.close()


# ---- what is never retried -----------------------------------------------------------------


async def test_request_read_then_connection_closed_is_not_retried() -> None:
    """A server that read the whole request may have started it: no second send."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        seen.append(await reader.readexactly(length))
        writer.close()  # no response

    sock = bind_tcp("127.0.0.1", 0)
    server = await asyncio.start_server(handle, sock=sock)
    engine = SGLangEngine(url_of(sock))
    try:
        with pytest.raises(EngineError, match="transport error") as info:
            await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=3), "r1")
        assert type(info.value) is EngineUnreachable and info.value.code == "engine_error"
        assert info.value.__cause__ is not None
        assert len(seen) == 1 and engine.stale_retries == 0
    finally:
        await engine.close()
        server.close()
        await server.wait_closed()


async def test_response_started_then_cut_is_not_retried(
        make_mock: MakeMock, serve: Callable[..., Awaitable[str]]) -> None:
    mock = make_mock()
    engine = SGLangEngine(await serve(mock.app()))
    try:
        await ask(engine, mock, "SAY warm", "warm")  # the next request reuses its connection
        with pytest.raises(EngineError) as info:
            await ask(engine, mock, "FAULT reset partial", "cut")
        assert info.value.code == "engine_error"
        assert isinstance(info.value.__cause__, ClientPayloadError)
        assert engine.stale_retries == 0 and rids(mock) == ["warm", "cut"]
    finally:
        await engine.close()


async def test_timeout_on_a_reused_connection_is_not_retried(
        make_mock: MakeMock, serve: Callable[..., Awaitable[str]]) -> None:
    mock = make_mock()
    engine = SGLangEngine(await serve(mock.app()), timeout=0.3)
    try:
        await ask(engine, mock, "SAY warm", "warm")
        with pytest.raises(EngineTimeout) as info:
            await ask(engine, mock, "FAULT slow 2", "slow")
        assert info.value.code == "engine_timeout"
        assert engine.stale_retries == 0 and rids(mock) == ["warm", "slow"]
        for _ in range(100):  # the client went away: the mock aborts the request
            if mock.core.log[-1]["finish_reason"] is not None:
                break
            await asyncio.sleep(0.01)
        assert mock.core.log[-1]["finish_reason"]["type"] == "abort"
    finally:
        await engine.close()


# ---- the mock's faults -> error codes ------------------------------------------------------

FAULT_CODES = [
    ("FAULT reset", "engine_error", "ClientOSError"),
    ("FAULT reset partial", "engine_error", "ClientPayloadError"),
    ("FAULT malformed_json", "engine_protocol_error", "is not JSON"),
    ("FAULT wrong_types", "engine_protocol_error", "meta_info is list, not an object"),
    ("FAULT bad_ids", "engine_protocol_error", "output_ids[0] is -1, a negative token id"),
    ("FAULT bad_ids:vocab", "engine_protocol_error", "outside the vocabulary"),
    ("FAULT bad_logprob", "engine_protocol_error", "[0][0] is 1e+300, not a log-probability"),
    ("FAULT bad_logprob 0.5", "engine_protocol_error", "[0][0] is 0.5, not a log-probability"),
    ("FAULT bad_logprob nan", "engine_protocol_error", "[0][0] is null, not a number"),
    ("FAULT bad_logprob inf", "engine_protocol_error", "[0][0] is null, not a number"),
    ("FAULT http_500", "engine_error", "engine answered HTTP 500: Internal server error"),
    ("FAULT http_500 503", "engine_error", "engine answered HTTP 503"),
    ("FAULT slow 2", "engine_timeout", "timed out after 0.3s"),
    ("SAY hi\nFAULT slow 0.05\nFAULT wrong_types\nFAULT bad_ids", "engine_protocol_error",
     "meta_info is list"),
]


@pytest.mark.parametrize(("directives", "code", "text"), FAULT_CODES,
                         ids=[c[0].replace("\n", " | ") for c in FAULT_CODES])
async def test_fault_maps_to_its_error_code(
        make_mock: MakeMock, serve: Callable[..., Awaitable[str]],
        directives: str, code: str, text: str) -> None:
    mock = make_mock()
    engine = SGLangEngine(await serve(mock.app()), timeout=0.3,
                          vocab_size=mock.tokenizer.vocab_size)
    try:
        with pytest.raises(EngineError) as info:
            await ask(engine, mock, directives, "f1")
        err = info.value
        assert err.code == code
        assert isinstance(err, EngineTimeout) == (code == "engine_timeout")
        assert text in str(err)
        assert rids(mock) == ["f1"] and engine.stale_retries == 0  # a fresh connection
        assert mock.core.log[0]["faults"]
    finally:
        await engine.close()


async def test_out_of_vocabulary_ids_need_the_vocab_size(
        make_mock: MakeMock, serve: Callable[..., Awaitable[str]]) -> None:
    mock = make_mock()
    engine = SGLangEngine(await serve(mock.app()))  # no vocab_size: ids are not bounded
    try:
        result = await ask(engine, mock, "FAULT bad_ids vocab", "v1")
        assert result.output_ids[0] == mock.tokenizer.vocab_size
    finally:
        await engine.close()


async def test_one_mock_serves_normal_and_faulty_requests(
        make_mock: MakeMock, serve: Callable[..., Awaitable[str]]) -> None:
    mock = make_mock()
    engine = SGLangEngine(await serve(mock.app()))
    try:
        assert mock.tokenizer.decode((await ask(engine, mock, "SAY one", "a")).output_ids) \
            .startswith("one")
        with pytest.raises(EngineError, match="HTTP 500"):
            await ask(engine, mock, "FAULT http_500", "b")
        assert (await ask(engine, mock, "SAY three", "c")).finish_reason == "stop"
        assert [e["faults"] for e in mock.core.log] == [[], ["http_500"], []]
    finally:
        await engine.close()


async def test_engine_wide_faults(make_mock: MakeMock,
                                  serve: Callable[..., Awaitable[str]]) -> None:
    """``--fault`` (MockConfig.faults) hits every /generate request; /health stays up."""
    mock = make_mock(faults=("slow:0.1", "bad_logprob"))
    engine = SGLangEngine(await serve(mock.app()))
    try:
        start = time.perf_counter()
        with pytest.raises(EngineError, match="not a log-probability") as info:
            await ask(engine, mock, "SAY hi", "w1")
        assert info.value.code == "engine_protocol_error"
        assert time.perf_counter() - start >= 0.1
        assert await engine.probe() is None
        assert mock.core.log[0]["faults"] == ["slow:0.1", "bad_logprob"]
    finally:
        await engine.close()


# ---- context length --------------------------------------------------------------------------


class Clock:
    """Stands in for the ``time`` module of tito.engines.sglang (monotonic is settable)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return time.perf_counter()


def models_server(answers: list[Any], requests: list[int]) -> dict[tuple[str, str], Any]:
    """``GET /v1/models`` answering ``answers`` in turn (then the last one again)."""

    async def models(request: web.Request) -> web.Response:
        answer = answers[min(len(requests), len(answers) - 1)]
        requests.append(1)
        if isinstance(answer, web.Response):
            return answer
        if isinstance(answer, bytes):
            return web.Response(body=answer, content_type="application/json")
        return web.json_response(answer)

    return {("GET", "/v1/models"): models}


def card(length: Any) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": length}]}


async def test_context_length_is_cached_only_when_valid(
        web_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(sglang, "time", clock)
    requests: list[int] = []
    answers = [web.Response(status=500, text="boom"), card(0), b"{not json", {"data": "x"},
               card(-5), card("4096"), card(True), card(4096)]
    engine = SGLangEngine(await web_server(models_server(answers, requests)))
    try:
        for n in range(1, len(answers)):
            assert await engine.context_length() is None
            assert len(requests) == n
            assert await engine.context_length() is None  # within 5 s: not asked again
            assert len(requests) == n
            clock.now += sglang.CONTEXT_RETRY_S
        assert await engine.context_length() == 4096
        clock.now += 3600
        assert await engine.context_length() == 4096
        assert len(requests) == len(answers)  # cached from then on
    finally:
        await engine.close()


async def test_context_length_of_a_down_engine_is_asked_again_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(sglang, "time", clock)
    sock = bind_tcp("127.0.0.1", 0)
    engine = SGLangEngine(url_of(sock))
    try:
        assert await engine.context_length() is None  # refused (nothing listens yet)
        async def models(request: web.Request) -> web.Response:
            return web.json_response(card(2048))

        app = web.Application()
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        try:
            assert await engine.context_length() is None  # not before 5 s
            clock.now += sglang.CONTEXT_RETRY_S
            assert await engine.context_length() == 2048
        finally:
            await runner.cleanup()
    finally:
        await engine.close()


async def test_concurrent_first_turns_share_one_models_request(web_server: Any) -> None:
    requests: list[int] = []

    async def slow_models(request: web.Request) -> web.Response:
        requests.append(1)
        await asyncio.sleep(0.05)
        return web.json_response(card(8192))

    engine = SGLangEngine(await web_server({("GET", "/v1/models"): slow_models}))
    try:
        lengths = await asyncio.gather(*(engine.context_length() for _ in range(20)))
        assert lengths == [8192] * 20 and len(requests) == 1
    finally:
        await engine.close()


# ---- health probe ----------------------------------------------------------------------------


async def test_probe_healthy_engine(web_server: Any) -> None:
    async def health(request: web.Request) -> web.Response:
        return web.Response()

    engine = SGLangEngine(await web_server({("GET", "/health"): health}))
    try:
        assert await engine.probe() is None
        assert await engine.health() is True
    finally:
        await engine.close()


async def test_probe_unhealthy_engine(web_server: Any) -> None:
    async def health(request: web.Request) -> web.Response:
        return web.json_response({"detail": "scheduler is dead"}, status=503)

    engine = SGLangEngine(await web_server({("GET", "/health"): health}))
    try:
        problem = await engine.probe()
        assert problem is not None and "HTTP 503" in problem and "scheduler is dead" in problem
        assert await engine.health() is False
    finally:
        await engine.close()


async def test_probe_slow_engine(web_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sglang, "PROBE_TIMEOUT_S", 0.1)

    async def health(request: web.Request) -> web.Response:
        await asyncio.sleep(0.4)
        return web.Response()

    engine = SGLangEngine(await web_server({("GET", "/health"): health}))
    try:
        start = time.perf_counter()
        assert await engine.probe() == f"no answer from {engine.url}/health within 0.1s"
        assert time.perf_counter() - start < 0.3
    finally:
        await engine.close()


async def test_probe_down_engine() -> None:
    sock = bind_tcp("127.0.0.1", 0)
    url = url_of(sock)
    sock.close()
    engine = SGLangEngine(url)
    try:
        problem = await engine.probe()
        assert problem is not None and problem.startswith("ClientConnectorError")
        assert len(problem) <= 300
        assert await engine.health() is False
    finally:
        await engine.close()

"""The mock engine's fault injection (``--fault``, ``FAULT`` directives) and keep-alive
timeout: parsing, the CLI flags, and what goes out on the wire (raw HTTP)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from helpers.support import start_mock, tokenizer_dir

from tito.cli import mock_engine as cli
from tito.engines.mock import FAULT_MODES, Fault, MockEngine, parse_directives, parse_fault

pytestmark = pytest.mark.slow  # real faults and their delays

MakeMock = Callable[..., MockEngine]
Serve = Callable[..., Awaitable[str]]


# ---- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "fault"), [
    ("reset", Fault("reset")), ("reset:partial", Fault("reset", "partial")),
    ("malformed_json", Fault("malformed_json")), ("wrong_types", Fault("wrong_types")),
    ("bad_ids", Fault("bad_ids")), ("bad_ids:vocab", Fault("bad_ids", "vocab")),
    ("bad_ids negative", Fault("bad_ids", "negative")),
    ("bad_logprob", Fault("bad_logprob")), ("bad_logprob:nan", Fault("bad_logprob", "nan")),
    ("http_500", Fault("http_500")), ("http_500 503", Fault("http_500", "503")),
    ("slow:2.5", Fault("slow", "2.5")), (" slow  0 ", Fault("slow", "0")),
    ("empty", Fault("empty")),
])
def test_parse_fault(spec: str, fault: Fault) -> None:
    assert parse_fault(spec) == fault
    assert parse_fault(fault.spec) == fault


def test_fault_defaults() -> None:
    assert parse_fault("slow").seconds == 1.0 and parse_fault("slow:0.25").seconds == 0.25
    assert parse_fault("http_500").status == 500 and parse_fault("http_500:503").status == 503
    assert parse_fault("bad_logprob").logprob == 1e300
    assert set(FAULT_MODES) == {"reset", "malformed_json", "wrong_types", "bad_ids",
                                "bad_logprob", "http_500", "slow", "empty"}


@pytest.mark.parametrize("spec", ["", "boom", "RESET", "reset:now", "malformed_json:1",
                                  "wrong_types x", "bad_ids:big", "bad_logprob:high",
                                  "http_500:404", "http_500:abc", "slow:-1", "slow:inf",
                                  "slow:soon", "empty:1"])
def test_parse_fault_rejects(spec: str) -> None:
    with pytest.raises(ValueError, match="fault"):
        parse_fault(spec)


def test_fault_directives() -> None:
    script = parse_directives("SAY hi\nFAULT slow 2\nFAULT nonsense\nFAULT http_500:503\n"
                              "FAULT slow:x\n  FAULT bad_ids vocab")
    assert script.say == ["hi"]
    assert script.faults == [Fault("slow", "2"), Fault("http_500", "503"),
                             Fault("bad_ids", "vocab")]
    assert not parse_directives("FAULT reset").empty


def parse_cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(["--tokenizer", "t", *argv])


def test_cli_flags() -> None:
    config = cli.config_from_args(parse_cli())
    assert config.keepalive_timeout == 5.0 and config.faults == ()
    config = cli.config_from_args(parse_cli("--keepalive-timeout", "0.5", "--fault", "slow:2",
                                            "--fault", "http_500"))
    assert config.keepalive_timeout == 0.5 and config.faults == ("slow:2", "http_500")
    assert cli.config_problem(config) is None


@pytest.mark.parametrize(("argv", "problem"), [
    (["--fault", "explode"], "--fault explode: unknown fault 'explode'"),
    (["--fault", "slow:x"], "--fault slow:x: bad argument 'x' for fault slow"),
    (["--keepalive-timeout", "0"], "--keepalive-timeout must be more than 0"),
])
def test_cli_flag_problems(argv: list[str], problem: str) -> None:
    found = cli.config_problem(cli.config_from_args(parse_cli(*argv)))
    assert found is not None and found.startswith(problem)


# ---- on the wire -----------------------------------------------------------------------------


def generate_body(mock: MockEngine, text: str, **extra: Any) -> dict[str, Any]:
    ids = mock.tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    return {"input_ids": ids, "rid": "w1", "return_logprob": True,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0}, **extra}


async def post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, \
            session.post(url + "/generate", json=body) as resp:
        return resp.status, await resp.read()


@pytest.fixture
async def wire(make_mock: MakeMock, serve: Serve) -> Callable[[str], Awaitable[Any]]:
    """``await wire(text)``: (status, raw body, the mock) of one /generate request."""

    async def send(text: str) -> tuple[int, bytes, MockEngine]:
        mock = make_mock()
        status, raw = await post(await serve(mock.app()), generate_body(mock, text))
        return status, raw, mock

    return send


async def test_wire_malformed_json(wire: Any) -> None:
    status, raw, _ = await wire("FAULT malformed_json")
    assert status == 200 and raw.startswith(b'{"text":')
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)


async def test_wire_wrong_types(wire: Any) -> None:
    status, raw, _ = await wire("FAULT wrong_types")
    data = orjson.loads(raw)
    assert status == 200 and isinstance(data["meta_info"], list)
    assert data["meta_info"][0]["finish_reason"]["type"] == "length"  # 8 tokens


async def test_wire_empty_keeps_the_stop(wire: Any) -> None:
    status, raw, _ = await wire("FAULT empty\nSAY hi")
    data = orjson.loads(raw)
    meta = data["meta_info"]
    assert status == 200 and meta["finish_reason"]["type"] == "stop"
    assert data["output_ids"] == [] and meta["output_token_logprobs"] == []
    assert meta["completion_tokens"] == 0 and data["text"] == ""


@pytest.mark.parametrize(("directive", "bad"), [("FAULT bad_ids", -1),
                                                ("FAULT bad_ids vocab", None)])
async def test_wire_bad_ids(wire: Any, directive: str, bad: int | None) -> None:
    status, raw, mock = await wire(directive)
    data = orjson.loads(raw)
    assert status == 200
    expected = mock.tokenizer.vocab_size if bad is None else bad
    assert data["output_ids"][0] == expected
    assert data["meta_info"]["output_token_logprobs"][0][1] == expected  # ids still agree
    assert mock.core.log[0]["output_ids"][0] != expected  # the log keeps the plan


@pytest.mark.parametrize(("arg", "value"), [("", 1e300), (" 0.5", 0.5), (" nan", None),
                                            (" -inf", None)])
async def test_wire_bad_logprob(wire: Any, arg: str, value: float | None) -> None:
    status, raw, _ = await wire(f"FAULT bad_logprob{arg}")
    assert status == 200
    rows = orjson.loads(raw)["meta_info"]["output_token_logprobs"]
    assert rows[0][0] == value and all(r[0] < 0 for r in rows[1:])  # NaN, inf: null


@pytest.mark.parametrize(("directive", "status"), [("FAULT http_500", 500),
                                                   ("FAULT http_500 503", 503)])
async def test_wire_http_500(wire: Any, directive: str, status: int) -> None:
    got, raw, mock = await wire(directive)
    assert got == status
    assert orjson.loads(raw) == {"detail": f"Internal server error (mock fault "
                                           f"{directive.split(' ', 1)[1].replace(' ', ':')})"}
    assert mock.core.log[0]["faults"] == [directive.split(" ", 1)[1].replace(" ", ":")]


async def test_wire_reset(make_mock: MakeMock, serve: Serve) -> None:
    mock = make_mock()
    url = await serve(mock.app())
    with pytest.raises((aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)):
        await post(url, generate_body(mock, "FAULT reset"))
    with pytest.raises(aiohttp.ClientPayloadError):
        await post(url, generate_body(mock, "FAULT reset partial", rid="w2"))
    assert [e["rid"] for e in mock.core.log] == ["w1", "w2"]
    assert (await post(url, generate_body(mock, "SAY fine", rid="w3")))[0] == 200


async def test_wire_faults_apply_to_streams_but_not_invalid_requests(
        wire: Any, make_mock: MakeMock, serve: Serve) -> None:
    mock = make_mock(faults=("http_500",))
    url = await serve(mock.app())
    status, raw = await post(url, generate_body(mock, "hi", stream=True))
    assert status == 500 and b"mock fault http_500" in raw
    status, raw = await post(url, {"input_ids": [], "sampling_params": {}})
    assert status == 400 and b"input_ids cannot be empty" in raw
    assert (await post(url, generate_body(mock, "hi")))[0] == 500


async def test_keepalive_timeout_closes_idle_connections(make_mock: MakeMock,
                                                         serve: Serve) -> None:
    mock = make_mock(keepalive_timeout=0.1)
    url = await serve(mock.app(), **mock.server_options())
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"GET /health HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        start = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), 2) == b""  # closed by the engine
        assert 0.05 < asyncio.get_running_loop().time() - start < 1.0
    finally:
        writer.close()


@pytest.mark.slow
def test_cli_serves_with_the_new_flags() -> None:
    """``tito mock-engine --keepalive-timeout --fault``: a real process."""
    proc = start_mock(tokenizer_dir("smollm2"), "chatml", "--keepalive-timeout", "0.2",
                      "--fault", "http_500:503")

    async def check() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.get(proc.url + "/health") as resp:
                assert resp.status == 200
            async with session.post(proc.url + "/generate",
                                    json={"input_ids": [1, 2, 3]}) as resp:
                assert resp.status == 503
                assert "mock fault http_500:503" in (await resp.json())["detail"]

    try:
        asyncio.run(check())
    finally:
        proc.stop()

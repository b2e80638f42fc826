"""The stack builder (tito.stack): what `tito serve`, `tito rollout` and the demo start."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest
from helpers import children

from tito.config import ServerConfig
from tito.stack import start_stack
from tito.types.errors import ConfigError


def config(qwen3_dir: Path, **overrides: object) -> ServerConfig:
    base: dict[str, object] = {"tokenizer": str(qwen3_dir), "family": "qwen3",
                               "engine": "sglang", "engine_url": "http://127.0.0.1:9",
                               "port": 0, "log_level": "warning"}
    return ServerConfig(**{**base, **overrides})  # type: ignore[arg-type]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("access_log", [True, pytest.param(False, marks=pytest.mark.slow)])
async def test_access_log_is_one_line_per_request_when_asked(qwen3_dir: Path,
                                                             access_log: bool) -> None:
    stack = await start_stack(config(qwen3_dir, access_log=access_log, log_level="info"))
    access = logging.getLogger("uvicorn.access")
    # uvicorn logs access lines only while that logger has handlers (off: it has none)
    assert access.hasHandlers() is access_log
    records = Records()
    if access_log:
        access.addHandler(records)
    try:
        async with httpx.AsyncClient(base_url=stack.url) as http:
            assert (await http.get("/metrics")).status_code == 200
            assert (await http.get("/sessions/nope")).status_code == 404
    finally:
        access.removeHandler(records)
        await stack.close()
    if access_log:
        assert len(records.lines) == 2
        assert "GET /metrics" in records.lines[0] and "200" in records.lines[0]
        assert "GET /sessions/nope" in records.lines[1] and "404" in records.lines[1]
    else:
        assert records.lines == []


@pytest.mark.slow
async def test_a_failed_start_stops_the_mock_engine_it_spawned(qwen3_dir: Path) -> None:
    """--strict-template with the shipped (not append-only) template: the stack refuses,
    and the `tito mock-engine` child it had started is stopped again."""
    before = children.of_this_process()
    with pytest.raises(ConfigError, match="append-only self-check"):
        await start_stack(config(qwen3_dir, family="default", engine="mock", engine_url=None,
                                 strict_template=True))
    assert children.of_this_process() == before


async def test_health_says_why_the_self_check_failed(qwen3_dir: Path) -> None:
    """The shipped Qwen3 template (``default``) drops earlier reasoning: served anyway
    without --strict-template, and /health's self-check names the typed reason and the
    first differing token."""
    stack = await start_stack(config(qwen3_dir, family="default"))
    try:
        async with httpx.AsyncClient(base_url=stack.url) as http:
            body = (await http.get("/health")).json()  # 503: no engine at :9, same body
    finally:
        await stack.close()
    check = body["capabilities"]["self_check"]
    assert not check["passed"] and body["capabilities"]["append_only_verified"] is False
    assert check["first_failure_reason"] == "reasoning_dropped"
    assert set(check["reasons"]) == {"reasoning_dropped"}
    divergence = check["first_failure_divergence"]
    assert divergence["reason"] == "reasoning_dropped"
    assert "<think>" in divergence["actual_text"] and "<think>" not in divergence["expected_text"]


async def test_stop_token_reaches_a_default_family_gateway(qwen3_dir: Path) -> None:
    """`tito serve --family default --stop-token T`: T is the first stop token."""
    from tito.cli import build_parser
    from tito.cli.serve import config_from_args

    args = build_parser("serve").parse_args(
        ["serve", "--engine-url", "http://127.0.0.1:9", "--tokenizer", str(qwen3_dir),
         "--family", "default", "--stop-token", "<|endoftext|>", "--port", "0"])
    stack = await start_stack(config_from_args(args))
    try:
        async with httpx.AsyncClient(base_url=stack.url) as http:
            body = (await http.get("/health")).json()
    finally:
        await stack.close()
    assert body["capabilities"]["stop_tokens"] == ["<|endoftext|>", "<|im_end|>"]


async def test_config_errors_come_before_anything_starts(qwen3_dir: Path) -> None:
    with pytest.raises(ConfigError, match="--engine sglang needs --engine-url"):
        await start_stack(config(qwen3_dir, engine_url=None))


async def idle_connection_closed(url: str, wait: float) -> bool:
    """Whether the server closes an idle keep-alive connection within ``wait`` seconds."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        try:
            return await asyncio.wait_for(reader.read(), wait) == b""
        except TimeoutError:
            return False
    finally:
        writer.close()


@pytest.mark.slow  # waits out a real keep-alive timeout
async def test_idle_client_connections_are_kept_keepalive_timeout(qwen3_dir: Path) -> None:
    """`--keepalive-timeout` is the server's idle-connection timeout; its default outlives
    the clients' 5 s (httpx, openai and anthropic SDKs)."""
    assert ServerConfig.keepalive_timeout > 15
    short = await start_stack(config(qwen3_dir, keepalive_timeout=0.2))
    default = await start_stack(config(qwen3_dir))
    try:
        assert await idle_connection_closed(short.url, 30)
        assert not await idle_connection_closed(default.url, 1)
    finally:
        await short.close()
        await default.close()

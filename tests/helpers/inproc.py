"""Talking to the real app in this process: httpx over ASGI, the openai SDK on top."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai

from tito.config import ServerConfig
from tito.engines.mock import MockConfig, MockEngine, MockModel
from tito.engines.sglang import SGLangEngine
from tito.net import AppServer, bind_tcp
from tito.render.base import TemplateRenderer
from tito.server.app import create_app
from tito.server.gateway import Gateway


def asgi_client(gateway: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(gateway)),
                             base_url="http://127.0.0.1", timeout=10)


async def new_session(http: httpx.AsyncClient) -> str:
    resp = await http.post("/sessions")
    assert resp.status_code == 200, resp.text
    return str(resp.json()["session_id"])


def openai_for(http: httpx.AsyncClient, sid: str) -> openai.AsyncOpenAI:
    """The real openai SDK, talking to the in-process app."""
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1/sessions/{sid}/v1", api_key="unused",
                              max_retries=0, http_client=http)


@contextlib.asynccontextmanager
async def gateway_over_mock_engine(tokenizer_dir: Path, renderer: TemplateRenderer,
                                   self_check: dict[str, Any], *, timeout: float,
                                   token_latency_ms: float = 0.0, family: str = "qwen3",
                                   **config: Any) -> AsyncIterator[Gateway]:
    """The gateway (in this process) over a real mock engine on 127.0.0.1, through the
    SGLang client; ``family`` names ``renderer``'s family in the configs (``config``: more
    :class:`ServerConfig` fields)."""
    mock = MockEngine(MockConfig(tokenizer_dir=str(tokenizer_dir), family=family,
                                 token_latency_ms=token_latency_ms), MockModel(renderer))
    server = AppServer(mock.app(), bind_tcp("127.0.0.1", 0))
    await server.start()
    cfg = ServerConfig(tokenizer=str(tokenizer_dir), family=family, engine="sglang",
                       engine_url=server.url, engine_timeout=timeout, **config)
    cfg.validate()
    gateway = Gateway(cfg, renderer, SGLangEngine(server.url, timeout=timeout),
                      self_check=self_check)
    try:
        yield gateway
    finally:
        await gateway.engine.close()
        await server.stop()


@contextlib.asynccontextmanager
async def over_mock_engine(tokenizer_dir: Path, renderer: TemplateRenderer,
                           self_check: dict[str, Any], *, timeout: float,
                           token_latency_ms: float = 0.0, **config: Any
                           ) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app (in this process) over a real mock engine on 127.0.0.1, through
    the SGLang client: httpx on the app (``config``: more :class:`ServerConfig` fields)."""
    async with gateway_over_mock_engine(tokenizer_dir, renderer, self_check, timeout=timeout,
                                        token_latency_ms=token_latency_ms,
                                        **config) as gateway, \
            asgi_client(gateway) as http:
        yield http

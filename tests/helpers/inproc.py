"""Talking to the real app in this process: httpx over ASGI, the openai SDK on top."""

from __future__ import annotations

import httpx
import openai

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

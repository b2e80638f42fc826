"""The entry: access rules (API key, Host allow-list, cross-origin refusal, JSON-only
bodies) and turn routes served without the router. The Origin rule is tested over a real
socket (the Host header is the one an HTTP client sends)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from helpers.inproc import asgi_client

from tito import CollectError
from tito.net import AppServer, bind_tcp
from tito.samples import decode_samples
from tito.server.app import create_app

KEY = "s3cret-key"


def client(make_gateway: Any, **config: Any) -> httpx.AsyncClient:
    return asgi_client(make_gateway(**config))


async def test_api_key_is_required_everywhere_but_health(make_gateway: Any) -> None:
    async with client(make_gateway, api_key=KEY) as http:
        assert (await http.get("/health")).status_code == 200
        for method, path in [("POST", "/sessions"), ("GET", "/metrics"),
                             ("GET", "/sessions/" + "0" * 32)]:
            resp = await http.request(method, path)
            assert resp.status_code == 401, (method, path)
            assert resp.json()["error"]["code"] == "invalid_api_key"
            assert resp.json()["error"]["type"] == "authentication_error"
        wrong = await http.post("/sessions", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = await http.post("/sessions", headers={"authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200
        sid = ok.json()["session_id"]
        assert (await http.post("/sessions", headers={"x-api-key": KEY})).status_code == 200
        # the openai SDK sends its api_key as the bearer token
        sdk = openai.AsyncOpenAI(base_url=f"http://127.0.0.1/sessions/{sid}/v1", api_key=KEY,
                                 max_retries=0, http_client=http)
        reply = await sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "ok"
        bad = openai.AsyncOpenAI(base_url=f"http://127.0.0.1/sessions/{sid}/v1",
                                 api_key="wrong", max_retries=0, http_client=http)
        with pytest.raises(openai.AuthenticationError):
            await bad.chat.completions.create(model="m",
                                              messages=[{"role": "user", "content": "hi"}])
        resp = await http.post(f"/sessions/{sid}/samples", json={},
                               headers={"authorization": f"Bearer {KEY}"})
        assert decode_samples(resp.content).samples[0].response_length > 0
        metrics = await http.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
        assert 'tito_errors_total{status="401",code="invalid_api_key",route="door"}' in metrics.text


async def test_tracer_sends_the_key(make_gateway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over a real socket: the tracer reads $TITO_API_KEY (or takes api_key=)."""
    from tito import SessionTracer

    server = AppServer(create_app(make_gateway(api_key=KEY)), bind_tcp("127.0.0.1", 0))
    await server.start()
    try:
        async with SessionTracer(server.url, api_key="wrong") as tracer:
            with pytest.raises(CollectError, match="401"):
                await tracer.create()
        monkeypatch.setenv("TITO_API_KEY", KEY)
        async with SessionTracer(server.url) as tracer:
            session = await tracer.create()
            samples = await tracer.collect(session)
            assert samples.empty_reason == "no_records"
    finally:
        await server.stop()


@pytest.mark.parametrize(("host", "status"), [
    ("127.0.0.1:8000", 200), ("localhost", 200), ("[::1]:8000", 200),
    ("evil.example", 400), ("127.0.0.1.evil.example", 400),
])
async def test_host_must_be_allowed(make_gateway: Any, host: str, status: int) -> None:
    async with client(make_gateway) as http:
        resp = await http.get("/health", headers={"host": host})
        assert resp.status_code == status
        if status == 400:
            assert resp.json()["error"]["code"] == "host_not_allowed"


async def test_allowed_hosts_option(make_gateway: Any) -> None:
    async with client(make_gateway, allowed_hosts=("gpu-node-7",)) as http:
        assert (await http.get("/health", headers={"host": "gpu-node-7:8000"})).status_code \
            == 200
        assert (await http.get("/health")).status_code == 400  # 127.0.0.1 not listed
    async with client(make_gateway, allowed_hosts=("*",)) as http:
        assert (await http.get("/health", headers={"host": "anything"})).status_code == 200


@contextlib.asynccontextmanager
async def serving(make_gateway: Any, **config: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the gateway served over a real socket on 127.0.0.1."""
    server = AppServer(create_app(make_gateway(**config)), bind_tcp("127.0.0.1", 0))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            yield http
    finally:
        await server.stop()


async def origin_status(http: httpx.AsyncClient, origin: str, host: str | None = None
                        ) -> int:
    headers = {"origin": origin} if host is None else {"origin": origin, "host": host}
    resp = await http.post("/sessions", headers=headers)
    if resp.status_code == 403:
        assert resp.json()["error"]["code"] == "cross_origin"
    return resp.status_code


async def test_cross_origin_browser_requests_are_refused(make_gateway: Any) -> None:
    """Only the gateway's own origin (scheme, host and port of its Host) by default."""
    async with serving(make_gateway) as http:
        port = http.base_url.port
        assert await origin_status(http, f"http://127.0.0.1:{port}") == 200
        assert await origin_status(http, f"HTTP://127.0.0.1:{port}") == 200
        for other in ("https://evil.example", f"http://127.0.0.1:{port + 1}",
                      "http://127.0.0.1", f"https://127.0.0.1:{port}",
                      f"http://localhost:{port}", "null"):
            assert await origin_status(http, other) == 403, other
        # as reached through another allowed name, its origin is that name's
        assert await origin_status(http, f"http://localhost:{port}",
                                   host=f"localhost:{port}") == 200


async def test_any_host_keeps_the_origin_check(make_gateway: Any) -> None:
    async with serving(make_gateway, allowed_hosts=("*",)) as http:
        port = http.base_url.port
        assert await origin_status(http, "https://evil.example") == 403
        assert await origin_status(http, f"http://127.0.0.1:{port + 1}") == 403
        assert await origin_status(http, "http://gpu-node-7:8000",
                                   host="gpu-node-7:8000") == 200


async def test_allowed_origins_option(make_gateway: Any) -> None:
    async with serving(make_gateway, allowed_origins=("http://localhost:3000",)) as http:
        port = http.base_url.port
        assert await origin_status(http, "http://localhost:3000") == 200
        assert await origin_status(http, "http://localhost:3001") == 403
        assert await origin_status(http, f"http://127.0.0.1:{port}") == 200  # its own
    async with serving(make_gateway, allowed_origins=("*",)) as http:
        assert await origin_status(http, "https://evil.example") == 200
        assert (await http.post("/sessions", headers={"host": "evil.example"})
                ).status_code == 400  # the Host rule is its own


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
async def test_non_json_bodies_are_415(make_gateway: Any, content_type: str) -> None:
    async with client(make_gateway) as http:
        resp = await http.post("/sessions", content=b"{}",
                               headers={"content-type": content_type})
        assert resp.status_code == 415
        assert resp.json()["error"]["code"] == "unsupported_media_type"
        # an empty body may carry any label (aiohttp sends one for data=b"")
        empty = await http.post("/sessions", headers={"content-type": content_type})
        assert empty.status_code == 200
        sid = empty.json()["session_id"]
        resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                               content=b'{"messages": [{"role": "user", "content": "x"}]}',
                               headers={"content-type": content_type})
        assert resp.status_code == 415
        info = (await http.get(f"/sessions/{sid}")).json()
        assert info["metadata"]["num_turns"] == 0
        ok = await http.post(f"/sessions/{sid}/v1/chat/completions",
                             content=b'{"messages": [{"role": "user", "content": "x"}]}',
                             headers={"content-type": "application/json; charset=utf-8"})
        assert ok.status_code == 200


def test_the_entry_serves_a_turn_route_only_where_the_router_would(make_gateway: Any) -> None:
    """The entry answers the turn routes without the router: for a POST to each, the
    router's first full match is that same route, and a GET to it is the router's."""
    from starlette.routing import Match

    from tito.server.app import create_app
    from tito.server.entry import EntryMiddleware

    app = create_app(make_gateway())
    entry = next(m for m in app.user_middleware if m.cls is EntryMiddleware)
    turn_routes = entry.kwargs["turn_routes"]
    assert {r.path for r in turn_routes} == {
        "/sessions/{session_id}/v1/chat/completions", "/sessions/{session_id}/v1/messages",
        "/sessions/{session_id}/v1/messages/count_tokens",
        "/sessions/{session_id}/v1/responses"}
    for route in turn_routes:
        path = route.path.replace("{session_id}", "abc")
        for method, served in (("POST", True), ("GET", False)):
            scope = {"type": "http", "method": method, "path": path, "root_path": ""}
            first = next(r for r in app.routes if r.matches(scope)[0] is Match.FULL)
            assert (first is route) is served, (method, path)


async def test_turn_routes_keep_the_routers_answers_around_them(make_gateway: Any) -> None:
    async with client(make_gateway) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        wrong_method = await http.get(f"/sessions/{sid}/v1/chat/completions")
        assert wrong_method.status_code == 404  # the sessions' catch-all, as before
        assert "error" in wrong_method.json()
        slash = await http.post(f"/sessions/{sid}/v1/chat/completions/", json={})
        assert slash.status_code in (307, 404)
        ok = await http.post(f"/sessions/{sid}/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("root_path", ["", "/prefix"])
def test_remembered_turn_route_matches_are_the_routes_own(make_gateway: Any,
                                                          root_path: str) -> None:
    """The door remembers which turn route a path matched: first and later requests to a
    path get the endpoint and path parameters ``Route.matches`` gives (a fresh dict each
    time), and paths no turn route takes stay with the app."""
    from starlette.routing import Match

    from tito.server.app import create_app
    from tito.server.entry import EntryMiddleware

    app = create_app(make_gateway())
    options = next(m for m in app.user_middleware if m.cls is EntryMiddleware).kwargs
    door = EntryMiddleware(app, **options)
    paths = [f"{root_path}/sessions/{sid}/v1/{tail}" for sid in ("abc", "s%20x", "0" * 32)
             for tail in ("chat/completions", "messages", "messages/count_tokens",
                          "responses", "chat/completions/", "models")]
    paths += [f"{root_path}/sessions", f"{root_path}/health", "/other/sessions/a/v1/messages"]
    for path in paths * 2:  # the second round is answered from what the door remembers
        scope = {"type": "http", "method": "POST", "path": path, "root_path": root_path}
        expected = next(((r, c) for r in options["turn_routes"]
                         for m, c in [r.matches(dict(scope))] if m is Match.FULL), None)
        route = door._turn_route(scope)
        if expected is None:
            assert route is None and "endpoint" not in scope, path
            continue
        assert route is expected[0], path
        assert scope["endpoint"] is expected[1]["endpoint"]
        assert scope["path_params"] == expected[1]["path_params"]
        scope2 = {**scope, "path_params": {}}
        door._turn_route(scope2)
        assert scope2["path_params"] is not scope["path_params"]  # never shared

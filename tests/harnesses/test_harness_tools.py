"""The pieces the agent CLI tests stand on, without the CLIs: the logging proxy logs and
forwards exactly, the runner refuses to run outside a loopback-only network namespace, the
pins parse, and the fixtures' ids map back for a replay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from helpers.cli_fixtures import FIXTURES, SELECTION, load, reply_ids, sequence
from helpers.cli_harness import REPO, is_model_call, loopback_only
from helpers.cli_scenarios import CLAUDE, CODEX, pinned_versions
from helpers.logging_proxy import LoggingProxy, read_log


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_proxy_forwards_and_logs(tmp_path: Path) -> None:
    async def upstream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream"):
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(3):
                await resp.write(f"data: {i}\n\n".encode())
            await resp.write_eof()
            return resp
        return web.json_response({"error": {"code": "nope", "message": "refused"}},
                                 status=400, headers={"x-up": request.headers["x-agent"]})

    app = web.Application()
    app.router.add_post("/sessions/s/v1/messages", upstream)
    up_runner, up_url = await _serve(app)
    proxy_runner, proxy_url = await _serve(LoggingProxy(up_url, tmp_path).app())
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{proxy_url}/sessions/s/v1/messages?beta=true",
                                 json={"stream": True}, headers={"x-agent": "a1"}) as resp:
                assert resp.status == 200
                assert await resp.text() == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
            async with http.post(f"{proxy_url}/sessions/s/v1/messages",
                                 json={"stream": False}, headers={"x-agent": "a2"}) as resp:
                assert resp.status == 400 and resp.headers["x-up"] == "a2"
                assert (await resp.json())["error"]["code"] == "nope"
    finally:
        await proxy_runner.cleanup()
        await up_runner.cleanup()
    first, second = read_log(tmp_path)
    assert first["path"] == "/sessions/s/v1/messages?beta=true" and first["body"] == {
        "stream": True}
    assert first["headers"]["x-agent"] == "a1" and first["status"] == 200
    assert first["reply"] == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert second["status"] == 400 and second["reply"]["error"]["message"] == "refused"
    assert is_model_call(first) and not is_model_call({"method": "HEAD", "path": "/api/hello"})


@pytest.mark.skipif(loopback_only(), reason="this process is in a loopback-only namespace")
def test_runner_refuses_outside_a_network_namespace(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "helpers.cli_harness", "spec.json",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "PATH": "/usr/bin"})
    assert proc.returncode == 2, proc.stderr
    assert "refusing to run outside a loopback-only network namespace" in proc.stderr


def test_pins_and_scenarios() -> None:
    versions = pinned_versions()
    assert set(versions) == {"claude", "codex"} and all(versions.values())
    names = [(s.cli, s.name) for s in [*CLAUDE, *CODEX]]
    assert len(set(names)) == len(names)


def test_fixtures_resolve_and_stay_small() -> None:
    for path in FIXTURES.glob("*/*.json"):
        assert path.stat().st_size < 50_000, path
    for name, (_cli, _scenario, indexes) in SELECTION.items():
        calls = sequence(name) if len(indexes) > 1 else [load(name)]
        for fixture in calls:
            assert isinstance(fixture["body"].get("tools", []), list), name
            assert "{session}" in fixture["path"], name
            assert fixture["status"] != 200 or fixture["reply_ids"], name


def test_reply_ids_in_order() -> None:
    text = json.dumps({"id": "resp_" + "a" * 32, "output": [
        {"id": "rs_" + "b" * 32}, {"call_id": "call_" + "c" * 24},
        {"id": "resp_" + "a" * 32}, {"signature": "tito-" + "d" * 32}]})
    assert reply_ids(text) == ["resp_" + "a" * 32, "rs_" + "b" * 32, "call_" + "c" * 24,
                               "tito-" + "d" * 32]
    assert reply_ids('"id": "msg_01a24343-290c-77c3"') == []  # a client's own item id

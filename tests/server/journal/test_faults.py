"""The journal's faults against real processes (`tito serve --journal` over `tito
mock-engine`): a disk that fills up mid-run, frames damaged at the head, in the middle and
at the end, zero-filled tails, configuration mismatches and a restart later than the idle
TTL. After each, every turn answered before the fault is back, and every turn after it
was either kept or refused to its client (503 ``journal_unavailable``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.support import REPO, start_gateway, start_mock

from tito.launch import ServerProcess, start_server, tito_command
from tito.server.journal import FILE
from tito.server.journal.frames import HEAD
from tito.server.journal.scan import Damage, frames, mapped

pytestmark = pytest.mark.slow

LIMITED = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
os.execv(sys.argv[2], sys.argv[2:])
"""
"""Run argv[2:] with every file it writes limited to argv[1] bytes (a disk that fills)."""


@pytest.fixture(scope="module")
def engine(qwen3_dir: Path) -> Any:
    proc = start_mock(qwen3_dir, "qwen3", "--latency-ms", "5")
    yield proc
    proc.stop()


def limited_gateway(engine_url: str, tokenizer: Path, folder: Path, limit: int
                    ) -> ServerProcess:
    return start_server("tito serve (limited)", [
        sys.executable, "-c", LIMITED, str(limit), *tito_command(
            "serve", "--engine", "sglang", "--engine-url", engine_url, "--tokenizer",
            str(tokenizer), "--family", "qwen3", "--host", "127.0.0.1", "--port", "0",
            "--journal", str(folder))], cwd=REPO, timeout=60)


async def agent(http: httpx.AsyncClient, sid: str, answered: dict[str, int],
                refused: list[Any], turns: int | None = None) -> None:
    """Turns until one is refused (or ``turns`` were answered)."""
    messages: list[Any] = [{"role": "user", "content": "SAY hello there"}]
    while turns is None or answered[sid] < turns:
        resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                               json={"messages": messages})
        if resp.status_code != 200:
            refused.append((resp.status_code, resp.json()["error"]["code"]))
            return
        answered[sid] += 1
        messages += [resp.json()["choices"][0]["message"],
                     {"role": "user", "content": f"SAY turn {answered[sid]}"}]


async def run_agents(url: str, sessions: int, turns: int | None = None
                     ) -> tuple[dict[str, int], list[Any]]:
    answered: dict[str, int] = {}
    refused: list[Any] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for _ in range(sessions):
            resp = await http.post("/sessions")
            assert resp.status_code == 200, resp.text
            answered[resp.json()["session_id"]] = 0
        await asyncio.gather(*(agent(http, sid, answered, refused, turns)
                               for sid in answered))
    return answered, refused


def num_turns(url: str, sid: str) -> int:
    resp = httpx.get(f"{url}/sessions/{sid}")
    assert resp.status_code == 200, resp.text
    return int(resp.json()["metadata"]["num_turns"])


async def test_a_disk_that_fills_up_mid_run(engine: Any, qwen3_dir: Path,
                                            tmp_path: Path) -> None:
    """The journal's file may not grow past 48 KB (RLIMIT_FSIZE, as a full disk): the
    write that crosses it fails halfway. Every turn after it is refused (503
    ``journal_unavailable``), /health is degraded; restarted with room, every answered
    turn is back, and the sessions go on."""
    gateway = limited_gateway(engine.url, qwen3_dir, tmp_path, 48 << 10)
    try:
        answered, refused = await run_agents(gateway.url, 8)
        health = httpx.get(gateway.url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        assert "File too large" in health.json()["journal"]["error"]
        assert httpx.post(gateway.url + "/sessions").json()["error"]["code"] \
            == "journal_unavailable"
    finally:
        gateway.stop()
    assert refused == [(503, "journal_unavailable")] * 8
    assert sum(answered.values()) > 8
    assert (tmp_path / FILE).stat().st_size <= 48 << 10
    restarted = start_gateway(engine.url, qwen3_dir, "qwen3", "--journal", str(tmp_path))
    try:
        for sid, count in answered.items():
            assert num_turns(restarted.url, sid) == count, sid  # kept = answered
        health = httpx.get(restarted.url + "/health").json()
        assert health["status"] == "ok" and health["journal"]["recovery"] is None
        more, refused = await run_agents(restarted.url, 2, turns=3)
        assert not refused and sum(more.values()) == 6
    finally:
        restarted.stop()


def build(engine: Any, tokenizer: Path, folder: Path, *extra: str) -> dict[str, Any]:
    """4 sessions of 3 turns each (interleaved) on a real gateway; their views."""
    gateway = start_gateway(engine.url, tokenizer, "qwen3", "--journal", str(folder), *extra)
    try:
        answered, refused = asyncio.run(run_agents(gateway.url, 4, turns=3))
        assert not refused
        return {sid: session_view(gateway.url, sid) for sid in answered}
    finally:
        gateway.stop()


def session_view(url: str, sid: str) -> Any:
    resp = httpx.get(f"{url}/sessions/{sid}", params={"include_ids": "1",
                                                     "include_messages": "1"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    body["metadata"].pop("last_active")
    return body


def damage(folder: Path, where: str, sids: list[str]) -> set[str]:
    """Damage the journal; the sessions that lose a frame."""
    path = folder / FILE
    raw = bytearray(path.read_bytes())
    with mapped(path) as buf:
        found = [(f.offset, f.size, f.sid, f.header["op"]) for f in frames(buf)
                 if not isinstance(f, Damage)]
    turns = [f for f in found if f[3] == "turn"]
    if where == "head":  # the magic, the header and the first creation
        first = next(f for f in found if f[3] == "create")
        raw[: first[0] + first[1]] = b"\xde\xad" * ((first[0] + first[1]) // 2)
        lost = {str(first[2])}
    elif where == "middle":  # a payload byte, and another frame's length field
        a, b = turns[len(turns) // 3], turns[2 * len(turns) // 3]
        raw[a[0] + HEAD.size + 7] ^= 0x55
        raw[b[0] + 4 : b[0] + 8] = b"\xff\xff\xff\x7f"
        lost = {str(a[2]), str(b[2])}
    elif where == "tail":  # the last frame torn
        raw = raw[: turns[-1][0] + turns[-1][1] // 2]
        lost = set()  # its write never finished: no client was answered
    else:  # zeros after a power loss
        raw += bytes(8) if where == "zeros" else bytes(4096)
        lost = set()
    path.write_bytes(bytes(raw))
    assert lost <= set(sids)
    return lost


@pytest.mark.parametrize("where", ["head", "middle", "tail", "zeros", "zero page"])
def test_damaged_frames(engine: Any, qwen3_dir: Path, tmp_path: Path, where: str) -> None:
    """`tito journal check` names the sessions the damage costs; a start recovers every
    other session as it was (a torn last frame: that turn was never answered, so that
    session is back without it) and answers 410 for those, naming the damage."""
    views = build(engine, qwen3_dir, tmp_path / "j")
    lost = damage(tmp_path / "j", where, list(views))
    checked = subprocess.run(tito_command("journal", "check", str(tmp_path / "j"), "--json"),
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert checked.returncode == (1 if lost else 0), checked.stderr
    gateway = start_gateway(engine.url, qwen3_dir, "qwen3", "--journal", str(tmp_path / "j"))
    try:
        for sid, view in views.items():
            if sid in lost:
                resp = httpx.get(f"{gateway.url}/sessions/{sid}")
                assert resp.status_code == 410 and "damaged in the journal" in resp.text
            elif where == "tail" and view["metadata"]["num_turns"] != \
                    session_view(gateway.url, sid)["metadata"]["num_turns"]:
                assert num_turns(gateway.url, sid) == view["metadata"]["num_turns"] - 1
            else:
                assert session_view(gateway.url, sid) == view, sid
        recovery = httpx.get(gateway.url + "/health").json()["journal"]["recovery"]
        assert sorted(recovery["affected_sessions"]) == sorted(lost)
    finally:
        gateway.stop()
    again = subprocess.run(tito_command("journal", "check", str(tmp_path / "j")), cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "clean" in again.stdout, again.stdout


@pytest.mark.parametrize(("flags", "named"), [
    (("--session-version", "v2"), "--session-version"),
    (("--family", "default"), "--family"),
    (("--workers", "2"), "--workers 1")])
def test_another_configuration_refuses_to_start(engine: Any, qwen3_dir: Path, tmp_path: Path,
                                                flags: tuple[str, ...], named: str) -> None:
    views = build(engine, qwen3_dir, tmp_path)
    before = (tmp_path / FILE).read_bytes()
    args = ["serve", "--engine", "sglang", "--engine-url", engine.url, "--tokenizer",
            str(qwen3_dir), "--family", "qwen3", "--host", "127.0.0.1", "--port", "0",
            "--journal", str(tmp_path), *flags]
    if "--workers" in flags:
        args[args.index("--port") + 1] = str(free_ports(2))
    refused = subprocess.run(tito_command(*args), cwd=REPO, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert named in refused.stderr + refused.stdout
    assert (tmp_path / FILE).read_bytes() == before
    gateway = start_gateway(engine.url, qwen3_dir, "qwen3", "--journal", str(tmp_path))
    try:
        for sid, view in views.items():
            assert session_view(gateway.url, sid) == view
    finally:
        gateway.stop()


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive free ports."""
    import socket

    for base in range(43000, 60000, 37):
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


def test_a_restart_later_than_the_idle_ttl(engine: Any, qwen3_dir: Path,
                                           tmp_path: Path) -> None:
    """Down for longer than --session-ttl: the sessions come back and their TTL counts
    from the restart (the first sweep does not expire them)."""
    views = build(engine, qwen3_dir, tmp_path, "--session-ttl", "5")
    time.sleep(6)
    gateway = start_gateway(engine.url, qwen3_dir, "qwen3", "--journal", str(tmp_path),
                            "--session-ttl", "5")
    try:
        time.sleep(2)  # the sweeper ran (every 1.25 s)
        for sid in views:
            assert httpx.get(f"{gateway.url}/sessions/{sid}").status_code == 200
    finally:
        gateway.stop()

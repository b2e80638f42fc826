"""The running journal: a failed write stops it (503 ``journal_unavailable``, /health
degraded) and keeps every answered turn; compaction while running; one process per folder;
idle TTLs from the restart; Responses ids survive a restart; an older journal is read."""

from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.inproc import asgi_client, new_session

from tito.server.gateway import Gateway
from tito.server.journal import FILE, Journal
from tito.server.journal.frames import HEAD
from tito.server.journal.scan import Damage, frames, mapped
from tito.types.errors import ConfigError


async def say(http: httpx.AsyncClient, sid: str, messages: list[Any]) -> httpx.Response:
    return await http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": messages})


async def turns(http: httpx.AsyncClient, sid: str) -> int:
    resp = await http.get(f"/sessions/{sid}")
    assert resp.status_code == 200, resp.text
    return int(resp.json()["metadata"]["num_turns"])


async def test_a_failed_write_stops_the_journal_and_loses_no_answered_turn(
        make_gateway: Any, tmp_path: Path) -> None:
    """The file is swapped for /dev/full (every write: ENOSPC): the turn that could not be
    kept is refused (503 ``journal_unavailable``, the session unchanged), and so is every
    later turn, creation and deletion; /health is degraded; reads still work. After a
    restart every answered turn is there."""
    gateway: Gateway = make_gateway(journal=str(tmp_path))
    journal = gateway.journal
    assert journal is not None
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        messages: list[Any] = [{"role": "user", "content": "go"}]
        first = await say(http, sid, messages)
        assert first.status_code == 200
        good = journal._fd
        journal._fd = os.open("/dev/full", os.O_WRONLY)
        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "on"}]
        refused = await say(http, sid, messages)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "journal_unavailable"
        assert await turns(http, sid) == 1  # unchanged
        for resp in (await say(http, sid, messages), await http.post("/sessions"),
                     await http.delete(f"/sessions/{sid}")):
            assert resp.status_code == 503 and \
                resp.json()["error"]["code"] == "journal_unavailable", resp.text
        health = await http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        assert "No space left" in health.json()["journal"]["error"]
        metrics = (await http.get("/metrics")).text
        assert "tito_journal_failed 1" in metrics
        assert (await http.post(f"/sessions/{sid}/samples", json={})).status_code == 200
    os.close(journal._fd)
    journal._fd = good
    journal.close()
    again: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(again) as http:
        assert await turns(http, sid) == 1
    assert again.journal is not None
    again.journal.close()


async def test_deleted_sessions_are_compacted_away_while_running(make_gateway: Any,
                                                                 tmp_path: Path) -> None:
    gateway: Gateway = make_gateway(journal=str(tmp_path))
    journal = gateway.journal
    assert journal is not None
    journal.compact_min_bytes = 4096
    async with asgi_client(gateway) as http:
        keep = await new_session(http)
        talk: list[Any] = [{"role": "user", "content": "keep me"}]
        reply = await say(http, keep, talk)
        assert reply.status_code == 200
        talk += [reply.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
        for n in range(40):
            sid = await new_session(http)
            assert (await say(http, sid, [{"role": "user", "content": f"t{n}"}])).status_code \
                == 200
            assert (await http.delete(f"/sessions/{sid}")).status_code == 204
        assert journal.compactions > 0
        size = (tmp_path / FILE).stat().st_size
        assert size == journal.size < 3 * journal.live_bytes + 4096 + journal.gone_bytes
        assert (await say(http, keep, talk)).status_code == 200
    journal.close()
    again: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(again) as http:
        assert await turns(http, keep) == 2
        assert (await http.get(f"/sessions/{sid}")).status_code == 410
    assert again.journal is not None
    again.journal.close()


async def test_one_gateway_per_journal_folder(make_gateway: Any, tmp_path: Path) -> None:
    first: Gateway = make_gateway(journal=str(tmp_path))
    with pytest.raises(ConfigError, match="in use by another process"):
        make_gateway(journal=str(tmp_path))
    assert first.journal is not None
    first.journal.close()
    make_gateway(journal=str(tmp_path)).journal.close()  # type: ignore[union-attr]


async def test_idle_ttls_count_from_the_restart(make_gateway: Any, tmp_path: Path) -> None:
    gateway: Gateway = make_gateway(journal=str(tmp_path), session_ttl=60.0)
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
    assert gateway.journal is not None
    gateway.journal.close()
    again: Gateway = make_gateway(journal=str(tmp_path), session_ttl=60.0)
    # an hour later: the session was idle for longer than the TTL before the restart
    assert again.store.evict_idle(now=time.time() + 59) == 0
    assert again.store.evict_idle(now=time.time() + 61) == 1
    assert again.journal is not None
    again.journal.close()
    assert sid


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_responses_ids_survive_a_restart(make_gateway: Any, tmp_path: Path,
                                               version: str) -> None:
    gateway: Gateway = make_gateway(journal=str(tmp_path), session_version=version)
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        first = await http.post(f"/sessions/{sid}/v1/responses", json={"input": "hello"})
        assert first.status_code == 200, first.text
    assert gateway.journal is not None
    gateway.journal.close()
    again: Gateway = make_gateway(journal=str(tmp_path), session_version=version)
    async with asgi_client(again) as http:
        resp = await http.post(f"/sessions/{sid}/v1/responses", json={
            "input": "and then?", "previous_response_id": first.json()["id"]})
        assert resp.status_code == 200, resp.text
        assert await turns(http, sid) == 2
        engine = again.engine
        prompt = engine.calls[-1].input_ids  # type: ignore[attr-defined]
        stored = (await http.get(f"/sessions/{sid}", params={"include_ids": "1"})).json()
        ids = [i for rec in stored["records"][:1] for i in rec["bridge_ids"] + rec["output_ids"]]
        assert prompt[: len(ids)] == ids  # the continued response extends the stored ids
    assert again.journal is not None
    again.journal.close()


async def test_session_options_survive_a_restart(make_gateway: Any, tmp_path: Path) -> None:
    """``POST /sessions``'s sampling defaults and ``evaluation`` are journaled with the
    session: after a restart its turns still get them (not silently the server's)."""
    gateway: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(gateway) as http:
        created = await http.post("/sessions", json={"temperature": 0.3, "top_k": 7,
                                                     "evaluation": True})
        assert created.status_code == 200, created.text
        sid = created.json()["session_id"]
        plain = await new_session(http)
    assert gateway.journal is not None
    gateway.journal.close()
    again: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(again) as http:
        meta = (await http.get(f"/sessions/{sid}")).json()["metadata"]
        assert meta["evaluation"] is True
        assert meta["sampling_defaults"] == {"temperature": 0.3, "top_k": 7}
        assert (await say(http, sid, [{"role": "user", "content": "hi"}])).status_code == 200
        params = again.engine.calls[-1].params  # type: ignore[attr-defined]
        assert (params.temperature, params.top_k) == (0.3, 7)
        plain_meta = (await http.get(f"/sessions/{plain}")).json()["metadata"]
        assert "sampling_defaults" not in plain_meta  # a session created without options
    assert again.journal is not None
    again.journal.close()


async def test_an_older_journal_is_read_and_rewritten(make_gateway: Any,
                                                      tmp_path: Path) -> None:
    """A journal of the previous format (``u32 length | u32 crc32 | payload``, no magic,
    no header): replayed, then rewritten in the new format."""
    gateway: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        assert (await say(http, sid, [{"role": "user", "content": "hi"}])).status_code == 200
    assert gateway.journal is not None
    gateway.journal.close()
    path = tmp_path / FILE
    old = b""
    with mapped(path) as buf:
        for item in frames(buf):
            assert not isinstance(item, Damage)
            if item.header["op"] != "header":
                payload = bytes(buf[item.offset + HEAD.size : item.offset + item.size])
                old += struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    path.write_bytes(old)
    again: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(again) as http:
        assert await turns(http, sid) == 1
        assert (await http.get("/health")).json()["journal"]["recovery"]["legacy"]
    assert again.journal is not None
    again.journal.close()
    assert path.read_bytes().startswith(b"TITOJRN")


def test_unwritable_journal_folder_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="--journal"):
        Journal(blocker / "sub")

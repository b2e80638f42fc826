"""Recovery past damage: a damaged frame is skipped and every later intact one kept; the
sessions that lost a frame come back gone (410) and are reported; damage at the end (a
torn write, zeros after a power loss) costs nothing. In process over a fake engine; the
same faults against real processes are in test_faults.py."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from helpers.inproc import asgi_client, new_session

from tito.server.gateway import Gateway
from tito.server.journal import FILE, frame
from tito.server.journal.check import check
from tito.server.journal.frames import HEAD, MAGIC
from tito.server.journal.scan import Damage, frames, mapped
from tito.server.journal.startup import DAMAGED, REPORT


async def view(http: httpx.AsyncClient, sid: str) -> Any:
    resp = await http.get(f"/sessions/{sid}", params={"include_ids": "1",
                                                     "include_messages": "1"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    body["metadata"].pop("last_active")
    return body


async def build(make_gateway: Any, folder: Path, sessions: int = 4,
                turns: int = 2) -> tuple[list[str], dict[str, Any]]:
    """``sessions`` sessions of ``turns`` turns each, their turns interleaved."""
    gateway: Gateway = make_gateway(journal=str(folder))
    async with asgi_client(gateway) as http:
        sids = [await new_session(http) for _ in range(sessions)]
        talks: dict[str, list[Any]] = {sid: [{"role": "user", "content": "go"}]
                                       for sid in sids}
        for t in range(turns):
            for sid in sids:
                resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                       json={"messages": talks[sid]})
                assert resp.status_code == 200, resp.text
                talks[sid] += [resp.json()["choices"][0]["message"],
                               {"role": "user", "content": f"more {t}"}]
        views = {sid: await view(http, sid) for sid in sids}
    assert gateway.journal is not None
    gateway.journal.close()
    return sids, views


def intact(path: Path) -> list[Any]:
    with mapped(path) as buf:
        out = []
        for item in frames(buf):
            assert not isinstance(item, Damage), item
            out.append((item.offset, item.size, item.sid, item.header["op"]))
        return out


def turn_frame_of(path: Path, sid: str, n: int = 0) -> tuple[int, int]:
    """(offset, size) of ``sid``'s ``n``-th turn frame."""
    found = [(off, size) for off, size, s, op in intact(path) if s == sid and op == "turn"]
    return found[n]


def patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


async def restarted(make_gateway: Any, folder: Path, sids: list[str], views: dict[str, Any],
                    lost: set[str]) -> dict[str, Any]:
    """Restart on ``folder``: every session but ``lost`` is back as it was, ``lost`` ones
    are 410 naming the damage; returns /health's journal view."""
    gateway: Gateway = make_gateway(journal=str(folder))
    async with asgi_client(gateway) as http:
        for sid in sids:
            if sid in lost:
                resp = await http.get(f"/sessions/{sid}")
                assert resp.status_code == 410, resp.text
                assert "damaged in the journal" in resp.json()["error"]["message"]
            else:
                assert await view(http, sid) == views[sid], sid
        health = (await http.get("/health")).json()
    assert gateway.journal is not None
    gateway.journal.close()
    assert check(folder).clean  # the start rewrote it without the damage
    return dict(health["journal"])


async def test_a_damaged_payload_in_the_middle_costs_only_its_session(
        make_gateway: Any, tmp_path: Path) -> None:
    sids, views = await build(make_gateway, tmp_path)
    path = tmp_path / FILE
    offset, _size = turn_frame_of(path, sids[1])
    patch(path, offset + HEAD.size + 5, b"\xff\xfe")
    report = check(tmp_path)
    assert report.affected.keys() == {sids[1]} and len(report.damage) == 1
    health = await restarted(make_gateway, tmp_path, sids, views, {sids[1]})
    assert health["recovery"]["affected_sessions"] == [sids[1]]
    assert (tmp_path / DAMAGED).exists()
    assert orjson.loads((tmp_path / REPORT).read_bytes())["affected_sessions"].keys() \
        == {sids[1]}


async def test_a_damaged_length_in_the_middle_is_skipped_to_the_next_frame(
        make_gateway: Any, tmp_path: Path) -> None:
    """The length field of a frame in the middle is garbage: the reader finds the next
    frame by its marker; the session is named from the damaged bytes."""
    sids, views = await build(make_gateway, tmp_path)
    path = tmp_path / FILE
    offset, _ = turn_frame_of(path, sids[2])
    patch(path, offset + 4, struct.pack("<I", 0x7FFF_FFF0))
    await restarted(make_gateway, tmp_path, sids, views, {sids[2]})


async def test_a_session_whose_frame_vanished_is_found_by_its_frame_numbers(
        make_gateway: Any, tmp_path: Path) -> None:
    """A frame zeroed out in the middle (no session id left in it): the session's next
    frame shows the gap."""
    sids, views = await build(make_gateway, tmp_path)
    path = tmp_path / FILE
    offset, size = turn_frame_of(path, sids[0], 0)
    patch(path, offset, bytes(size))
    report = check(tmp_path)
    assert report.damage[0].zeros and report.damage[0].sessions == set()
    assert "frame 1 of the session is missing" in report.affected[sids[0]]
    await restarted(make_gateway, tmp_path, sids, views, {sids[0]})


async def test_damage_at_the_head(make_gateway: Any, tmp_path: Path) -> None:
    """The magic, the header and the first session's creation are garbage: the others
    come back; the configuration could not be checked (a warning), the file is rewritten
    with a header."""
    sids, views = await build(make_gateway, tmp_path)
    path = tmp_path / FILE
    first = next(f for f in intact(path) if f[3] == "create")
    assert first[2] == sids[0]
    patch(path, 0, b"\x00garbage" * ((first[0] + first[1]) // 8))
    report = check(tmp_path)
    assert report.header is None and sids[0] in report.affected
    await restarted(make_gateway, tmp_path, sids, views, {sids[0]})
    assert (tmp_path / FILE).read_bytes().startswith(MAGIC)
    assert check(tmp_path).header is not None


@pytest.mark.parametrize("tail", ["torn", "zeros", "zero page"])
async def test_damage_at_the_end_costs_nothing(make_gateway: Any, tmp_path: Path,
                                              tail: str) -> None:
    """A write that never finished (a torn frame) or zeros after a power loss: dropped,
    every session back, no error."""
    sids, views = await build(make_gateway, tmp_path)
    path = tmp_path / FILE
    extra = {"torn": frame({"op": "create", "sid": "ab" * 16, "ts": 0})[:-3],
             "zeros": bytes(8), "zero page": bytes(4096)}[tail]
    path.write_bytes(path.read_bytes() + extra)
    report = check(tmp_path)
    assert not report.damage and not report.affected and report.tail is not None
    health = await restarted(make_gateway, tmp_path, sids, views, set())
    assert health["recovery"]["torn_tail_bytes"] == len(extra)
    assert health["recovery"]["affected_sessions"] == []


async def test_a_clean_restart_reports_nothing_and_keeps_the_file(make_gateway: Any,
                                                                  tmp_path: Path) -> None:
    sids, views = await build(make_gateway, tmp_path)
    before = (tmp_path / FILE).read_bytes()
    health = await restarted(make_gateway, tmp_path, sids, views, set())
    assert health["recovery"] is None and health["ok"]
    assert (tmp_path / FILE).read_bytes() == before  # appended to, not rewritten
    assert not (tmp_path / REPORT).exists()


async def test_an_intact_frame_that_does_not_apply_costs_only_its_session(
        make_gateway: Any, tmp_path: Path) -> None:
    """A frame that checks out but cannot be applied (written by a gateway with another
    record layout, say): its session comes back gone, the others as they were."""
    sids, views = await build(make_gateway, tmp_path)
    path = tmp_path / FILE
    offset, size = turn_frame_of(path, sids[3], 1)
    with mapped(path) as buf:
        found = next(f for f in frames(buf) if not isinstance(f, Damage) and f.offset == offset)
        header, arrays, seq = found.header, bytes(found.arrays), found.seq
    header["record"]["field_of_the_future"] = 1
    rewritten = frame(header, np.frombuffer(arrays, dtype=np.uint8), seq=seq)
    raw = path.read_bytes()
    path.write_bytes(raw[:offset] + rewritten + raw[offset + size :])
    await restarted(make_gateway, tmp_path, sids, views, {sids[3]})

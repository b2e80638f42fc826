"""``tito journal check DIR [--repair]``: the report of a journal folder, and its repair."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers.inproc import asgi_client, new_session

from tito.cli import main
from tito.server.gateway import Gateway
from tito.server.journal import FILE
from tito.server.journal.frames import HEAD
from tito.server.journal.scan import frames, mapped
from tito.server.journal.startup import DAMAGED


async def two_sessions(make_gateway: Any, folder: Path) -> list[str]:
    gateway: Gateway = make_gateway(journal=str(folder))
    async with asgi_client(gateway) as http:
        sids = [await new_session(http) for _ in range(2)]
        for sid in sids:
            resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                   json={"messages": [{"role": "user", "content": "hi"}]})
            assert resp.status_code == 200
    assert gateway.journal is not None
    gateway.journal.close()
    return sids


@pytest.mark.slow  # real journal processes
async def test_check_reports_and_repair_repairs(make_gateway: Any, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    sids = await two_sessions(make_gateway, tmp_path)
    assert main(["journal", "check", str(tmp_path)]) == 0
    assert "clean" in capsys.readouterr().out
    path = tmp_path / FILE
    with mapped(path) as buf:
        offset = next(f.offset for f in frames(buf)  # type: ignore[union-attr]
                      if f.header["op"] == "turn" and f.sid == sids[0])
    raw = bytearray(path.read_bytes())
    raw[offset + HEAD.size + 3] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert main(["journal", "check", str(tmp_path), "--json"]) == 1
    [report] = orjson.loads(capsys.readouterr().out)
    assert list(report["affected_sessions"]) == [sids[0]]
    assert report["damage"][0]["start"] == offset
    assert main(["journal", "check", str(tmp_path), "--repair"]) == 0
    out = capsys.readouterr().out
    assert f"session {sids[0]} comes back as gone (410)" in out
    assert (tmp_path / DAMAGED).read_bytes() == bytes(raw)
    assert main(["journal", "check", str(tmp_path)]) == 0
    gateway: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(gateway) as http:
        assert (await http.get(f"/sessions/{sids[0]}")).status_code == 410
        assert (await http.get(f"/sessions/{sids[1]}")).status_code == 200
        # a gateway holds the folder: a check reads, a repair is refused
        assert main(["journal", "check", str(tmp_path)]) == 0
        assert main(["journal", "check", str(tmp_path), "--repair"]) == 2
        assert "in use by another process" in capsys.readouterr().err
    assert gateway.journal is not None
    gateway.journal.close()


def test_a_folder_without_a_journal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["journal", "check", str(tmp_path)]) == 2
    assert "no journal" in capsys.readouterr().err


async def test_check_reads_every_workers_journal(make_gateway: Any, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    await two_sessions(make_gateway, tmp_path / "one")
    for i in range(2):
        (tmp_path / "j" / f"worker-{i}").mkdir(parents=True)
        (tmp_path / "j" / f"worker-{i}" / FILE).write_bytes((tmp_path / "one" / FILE)
                                                            .read_bytes())
    assert main(["journal", "check", str(tmp_path / "j"), "--json"]) == 0
    reports = orjson.loads(capsys.readouterr().out)
    assert [Path(r["path"]).parent.name for r in reports] == ["worker-0", "worker-1"]
    assert all(r["turns"] == 2 for r in reports)

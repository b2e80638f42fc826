"""Finish snapshots in the journal: after a restart a sealed snapshot is still there (the
same id, completeness and reply), admission stays closed, a repeated export answers the
same bytes and other parameters are still 409; a snapshot sealed but not yet exported is
rebuilt from the turns committed when it was sealed, and a journal compaction keeps it.
Generation ids and links are replayed with their turns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from helpers.inproc import asgi_client, new_session

from tito.samples import decode_samples
from tito.server.gateway import Gateway

HI = [{"role": "user", "content": "hi"}]


async def say(http: httpx.AsyncClient, sid: str, messages: list[Any]) -> httpx.Response:
    resp = await http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": messages})
    assert resp.status_code == 200, resp.text
    return resp


async def two_turns(http: httpx.AsyncClient) -> str:
    sid = await new_session(http)
    first = await say(http, sid, HI)
    await say(http, sid, [*HI, first.json()["choices"][0]["message"],
                          {"role": "user", "content": "more"}])
    return sid


def restart(make_gateway: Any, gateway: Gateway, tmp_path: Path, **config: Any) -> Gateway:
    assert gateway.journal is not None
    gateway.journal.close()
    again: Gateway = make_gateway(journal=str(tmp_path), **config)
    return again


async def test_an_exported_snapshot_answers_the_same_bytes_after_a_restart(
        make_gateway: Any, tmp_path: Path) -> None:
    gateway: Gateway = make_gateway(journal=str(tmp_path))
    body: dict[str, Any] = {"max_seq_len": 4096, "metadata": {"reward": 1.0, "b": [1, 2]}}
    async with asgi_client(gateway) as http:
        sid = await two_turns(http)
        reply = (await http.post(f"/sessions/{sid}/finish",
                                 json={"producer_finished": True, "timeout": 5})).json()
        body["snapshot_id"] = reply["snapshot_id"]
        first = await http.post(f"/sessions/{sid}/samples", json=body)
        assert first.status_code == 200, first.text
    again = restart(make_gateway, gateway, tmp_path)
    async with asgi_client(again) as http:
        meta = (await http.get(f"/sessions/{sid}")).json()["metadata"]
        assert meta["finish"] == reply
        repeat = await http.post(f"/sessions/{sid}/finish",
                                 json={"producer_finished": True, "timeout": 5})
        assert repeat.json() == reply  # the same snapshot, not a new seal
        reordered = {"metadata": {"b": [1, 2], "reward": 1.0}, "max_seq_len": 4096,
                     "snapshot_id": reply["snapshot_id"]}
        retry = await http.post(f"/sessions/{sid}/samples", json=reordered)
        assert retry.status_code == 200, retry.text
        assert retry.content == first.content
        other = await http.post(f"/sessions/{sid}/samples", json={**body, "max_seq_len": 8})
        assert other.status_code == 409
        assert other.json()["error"]["code"] == "export_conflict"
        refused = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                  json={"messages": HI})
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "session_finished"
        assert (await http.delete(f"/sessions/{sid}")).status_code == 204
    assert again.journal is not None
    again.journal.close()


async def test_a_sealed_snapshot_is_rebuilt_from_the_turns_before_its_seal(
        make_gateway: Any, tmp_path: Path) -> None:
    """Sealed, not exported, then a restart: the export is what the older lifecycle
    collected at the seal; a compaction in between keeps the snapshot."""
    gateway: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(gateway) as http:
        sid = await two_turns(http)
        other = await two_turns(http)  # another session's frames after the seal
        live = await http.post(f"/sessions/{sid}/samples", json={"max_seq_len": 4096})
        reply = (await http.post(f"/sessions/{sid}/finish", json={"timeout": 1})).json()
        await say(http, await new_session(http), HI)
        assert (await http.delete(f"/sessions/{other}")).status_code == 204
    again = restart(make_gateway, gateway, tmp_path)
    assert again.journal is not None
    again.journal._compact()  # the live sessions' frames only, the finish among them
    again = restart(make_gateway, again, tmp_path)
    async with asgi_client(again) as http:
        got = await http.post(f"/sessions/{sid}/samples",
                              json={"snapshot_id": reply["snapshot_id"], "max_seq_len": 4096})
        assert got.status_code == 200, got.text
        assert got.content == live.content
        sample = decode_samples(got.content).samples
        assert len(sample) == 1 and sample[0].metadata["num_turns"] == 2
    assert again.journal is not None
    again.journal.close()


async def test_generation_links_and_ids_survive_a_restart(make_gateway: Any,
                                                          tmp_path: Path) -> None:
    """A replayed turn keeps its generation id and links: a previous response named
    after the restart is found (v1 and v2), and the links are still in the records."""
    for version in ("v1", "v2"):
        gateway: Gateway = make_gateway(journal=str(tmp_path / version),
                                        session_version=version)
        main = {"X-Miles-Agent-Run-Id": "main", "X-Miles-Context-Id": "c1"}
        async with asgi_client(gateway) as http:
            sid = await new_session(http)
            first = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                    json={"messages": HI}, headers=main)
            gid = first.headers["x-miles-generation-id"]
            again = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                    json={"messages": HI},
                                    headers={**main, "X-Miles-Retry-Of": gid})
            assert again.status_code == 200, again.text
        restarted = restart(make_gateway, gateway, tmp_path / version,
                            session_version=version)
        async with asgi_client(restarted) as http:
            records = (await http.get(f"/sessions/{sid}?context=c1&include_requests=1")
                       ).json()["records"]
            assert records[-1]["retry_of"] == gid
            latest = records[-1]["generation_id"]
            assert latest == again.headers["x-miles-generation-id"]
            grown = [*HI, again.json()["choices"][0]["message"],
                     {"role": "user", "content": "more"}]
            resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                   json={"messages": grown},
                                   headers={**main, "X-Miles-Previous-Response-Id": latest})
            assert resp.status_code == 200, resp.text
        assert restarted.journal is not None
        restarted.journal.close()

"""A journal replays only under the configuration it was written under: its header
records the session version, family, template and tokenizer fingerprints and the worker
layout; a mismatch refuses to start naming the flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.inproc import asgi_client, new_session

from tito.server.gateway import Gateway
from tito.server.journal import FILE
from tito.server.journal.header import check, check_layout
from tito.types.errors import ConfigError


async def journal_of_one_session(make_gateway: Any, folder: Path, **config: Any) -> str:
    gateway: Gateway = make_gateway(journal=str(folder), **config)
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
    assert gateway.journal is not None
    gateway.journal.close()
    return sid


async def test_another_session_version_is_refused(make_gateway: Any, tmp_path: Path) -> None:
    await journal_of_one_session(make_gateway, tmp_path)
    with pytest.raises(ConfigError, match="--session-version: the journal has 'v1', this "
                                          "gateway 'v2'"):
        make_gateway(journal=str(tmp_path), session_version="v2")
    before = (tmp_path / FILE).read_bytes()
    make_gateway(journal=str(tmp_path)).journal.close()  # type: ignore[union-attr]
    assert (tmp_path / FILE).read_bytes() == before  # the refusal changed nothing


def test_every_recorded_field_names_its_flag(tmp_path: Path) -> None:
    wanted = {"session_version": "v1", "family": "qwen3", "template": "a", "tokenizer": "b",
              "workers": 1}
    for field, flag in [("family", "--family"), ("template", "--chat-template"),
                        ("tokenizer", "--tokenizer"), ("workers", "--workers")]:
        with pytest.raises(ConfigError, match=flag):
            check({**wanted, field: "other"}, wanted, tmp_path)
    check({**wanted, "template": None}, wanted, tmp_path)  # unknown: not checked


async def test_the_worker_layout_is_checked(make_gateway: Any, tmp_path: Path) -> None:
    await journal_of_one_session(make_gateway, tmp_path)
    with pytest.raises(ConfigError, match="start with --workers 1"):
        check_layout(tmp_path, 2)
    (tmp_path / FILE).unlink()
    for i in range(2):
        (tmp_path / f"worker-{i}").mkdir()
        (tmp_path / f"worker-{i}" / FILE).write_bytes(b"x")
    with pytest.raises(ConfigError, match="start with --workers 2"):
        check_layout(tmp_path, 1)
    check_layout(tmp_path, 2)
    (tmp_path / "worker-2").mkdir()
    (tmp_path / "worker-2" / FILE).write_bytes(b"x")
    with pytest.raises(ConfigError, match="more workers"):
        check_layout(tmp_path, 2)

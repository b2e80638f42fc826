"""v1 pinned byte for byte: the prompt ids sent to the engine, the session view and the
samples payload of scripted conversations (tool calls, retries, rollbacks, appends of
every role, a length cut, truncation at collection) must not change when the session
core is refactored.

Time and ids are frozen, so the payload bytes are reproducible. To accept an intended
change, run with ``TITO_REGEN_GOLDEN=1`` and explain the change in the commit.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.fakes import ModelEngine
from helpers.inproc import asgi_client, new_session
from helpers.scripted import WEATHER_TOOLS, first_turn_retry, length_cut, weather_agent

from tito.config import ServerConfig
from tito.render.base import TemplateRenderer
from tito.samples import decode_samples
from tito.server.gateway import Gateway

GOLDEN = Path(__file__).with_name("v1_golden.json")
SCRIPTS = {"weather": weather_agent, "first_turn_retry": first_turn_retry,
           "length_cut": length_cut}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:24]


def _ids_digest(ids: Any) -> str:
    return _digest(np.asarray(ids, dtype=np.int64).tobytes())


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every wall clock reads 1e9; every uuid4 and every ``os.urandom`` (the gateway's
    response and request ids) is the next of one fixed sequence."""
    import time

    counter = itertools.count(1)
    monkeypatch.setattr(time, "time", lambda: 1e9)
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=next(counter)))
    monkeypatch.setattr(os, "urandom", lambda n: next(counter).to_bytes(n, "big"))


def make(renderer: TemplateRenderer, qwen3_dir: Path, self_check: dict[str, Any],
         **config: Any) -> Gateway:
    cfg = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                       engine_url="http://fake", **config)
    cfg.validate()
    gateway = Gateway(cfg, renderer, ModelEngine(renderer), self_check=self_check)
    gateway.instance_id = "0" * 32
    return gateway


async def run_script(gateway: Gateway, http: httpx.AsyncClient, name: str
                     ) -> dict[str, Any]:
    sid = await new_session(http)
    statuses: list[int] = []

    async def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
        resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                               json={"messages": messages, "tools": WEATHER_TOOLS})
        statuses.append(resp.status_code)
        assert resp.status_code == 200, resp.text
        return dict(resp.json()["choices"][0]["message"])

    await SCRIPTS[name](chat, 0)
    # a divergence deeper than one turn: 400 in v1, the session unchanged
    view = (await http.get(f"/sessions/{sid}", params={"include_messages": "1"})).json()
    first_user = [m for m in view["messages"] if m["role"] == "user"][:1]
    deep = await http.post(f"/sessions/{sid}/v1/chat/completions",
                           json={"messages": [*first_user,
                                              {"role": "user", "content": "something else"}]})
    statuses.append(deep.status_code)
    assert isinstance(gateway.engine, ModelEngine)
    out: dict[str, Any] = {
        "statuses": statuses,
        "prompts": [_ids_digest(c.input_ids) for c in gateway.engine.calls],
    }
    view = (await http.get(f"/sessions/{sid}", params={"include_ids": "1",
                                                       "include_messages": "1"})).json()
    out["view"] = _digest(json.dumps(view, sort_keys=True).encode())
    out["records"] = [{k: r[k] for k in ("turn", "prompt_len", "bridge_len", "drop",
                                         "output_len", "finish_reason", "rolled_back")}
                      for r in view["records"]]
    for label, body in (("samples", {}), ("samples_cut", {"max_seq_len": 300}),
                        ("samples_meta", {"metadata": {"reward": 1.0, "task": "t"}})):
        resp = await http.post(f"/sessions/{sid}/samples", json=body)
        assert resp.status_code == 200, resp.text
        decoded = decode_samples(resp.content)
        out[label] = {
            "payload": _digest(resp.content),
            "samples": [{"tokens": _ids_digest(s.tokens), "len": len(s.tokens),
                         "response_length": s.response_length, "status": s.status,
                         "loss_mask": _digest(np.asarray(s.loss_mask).tobytes()),
                         # the engine's values (float32-exact; float64 on the wire)
                         "logprobs": _digest(np.asarray(s.rollout_log_probs,
                                                        np.float32).tobytes()),
                         "weight_versions": s.weight_versions}
                        for s in decoded.samples],
            "empty_reason": decoded.empty_reason,
        }
    return out


@pytest.mark.parametrize("name", sorted(SCRIPTS))
async def test_v1_is_pinned(name: str, frozen: None, qwen3_renderer: TemplateRenderer,
                            qwen3_dir: Path, qwen3_self_check: dict[str, Any]) -> None:
    gateway = make(qwen3_renderer, qwen3_dir, qwen3_self_check)
    async with asgi_client(gateway) as http:
        got = await run_script(gateway, http, name)
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("TITO_REGEN_GOLDEN"):
        golden[name] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    assert name in golden, "no golden yet: run with TITO_REGEN_GOLDEN=1"
    expected = golden[name]
    for key in ("statuses", "prompts", "records", "samples", "samples_cut", "samples_meta",
                "view"):
        assert got[key] == expected[key], key

"""``tito view``: the viewer over a samples.parquet. In-process, over a file written by the
rollout writer from a live session's samples: the same JSON as the gateway's own strip.
As processes (slow): a real `tito rollout` run on the mock engine, then `tito view` on its
output folder, read over HTTP and in headless Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.fakes import FakeEngine
from helpers.scripted import WEATHER_TOOLS
from helpers.support import REPO, start_tito

from tito.cli import main as cli_main
from tito.cli.view import find_tokenizer, text_of
from tito.client.writers import write_samples_parquet
from tito.render.base import TemplateRenderer
from tito.samples import decode_samples
from tito.server.ui.parquet import ParquetSource
from tito.server.ui.viewer import viewer_app
from tito.types.tokenizer import load_tokenizer

TOOLS = WEATHER_TOOLS
CALL = {"role": "assistant", "content": "", "reasoning_content": "Look it up.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


async def chat(http: httpx.AsyncClient, sid: str, messages: list[dict[str, Any]]
               ) -> dict[str, Any]:
    resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                           json={"messages": messages, "tools": TOOLS})
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["choices"][0]["message"])


def viewer(source: ParquetSource) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=viewer_app(source)),
                             base_url="http://127.0.0.1", timeout=10)


async def test_a_file_shows_what_the_gateway_showed(client: httpx.AsyncClient,
                                                    engine: FakeEngine, tmp_path: Path,
                                                    qwen3_renderer: TemplateRenderer) -> None:
    engine.script(CALL, "Sunny.")
    sid = (await client.post("/sessions")).json()["session_id"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    messages.append(await chat(client, sid, messages))
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": "24 C"})
    await chat(client, sid, messages)
    (sample,) = decode_samples((await client.post(f"/sessions/{sid}/samples", json={})
                                ).content).samples
    sample.reward = 1.0
    path = tmp_path / "samples.parquet"
    write_samples_parquet(path, [(0, 0, sample)])
    source = ParquetSource(path, texts=text_of(qwen3_renderer.tokenizer), tokenizer="qwen3")
    live = (await client.get(f"/ui/api/sessions/{sid}/tokens")).json()
    async with viewer(source) as view:
        page = (await view.get("/ui/api/sessions/0/tokens")).json()
        for key in ("total", "ids", "text", "origin", "mask", "logprob"):
            assert page[key] == live[key], key
        def turns(p: dict[str, Any]) -> list[Any]:
            return [(t["start"], t["gen_start"], t["end"], t["finish_reason"])
                    for t in p["turns"]]
        assert turns(page) == turns(live)
        assert [(b["kind"], b["start"], b["end"]) for b in page["blocks"]] == \
            [(b["kind"], b["start"], b["end"]) for b in live["blocks"]]
        listed = (await view.get("/ui/api/sessions")).json()
        assert listed["source"]["kind"] == "file" and listed["source"]["has_text"]
        assert [(s["id"], s["turns"], s["tokens"], s["status"], s["reward"])
                for s in listed["sessions"]] == [("0", 2, len(sample.tokens), "completed", 1.0)]
        preview = (await view.get("/ui/api/sessions/0/samples")).json()
        live_preview = (await client.get(f"/ui/api/sessions/{sid}/samples")).json()
        keys = ("tokens", "prompt_length", "response_length", "loss_mask_ones", "status",
                "mismatch", "num_turns")
        assert [{k: s[k] for k in keys} for s in preview["samples"]] == \
            [{k: s[k] for k in keys} for s in live_preview["samples"]]
        overview = (await view.get("/ui/api/sessions/0")).json()
        assert overview["version"] == "file" and overview["tree"] is None
        for row in ("1", "x", "-1"):
            resp = await view.get(f"/ui/api/sessions/{row}/tokens")
            assert resp.status_code == 404 and \
                resp.json()["error"]["code"] == "session_not_found"
        assert (await view.get("/ui/api/sessions/0/tokens",
                               params={"limit": 0})).status_code == 400
        assert (await view.get("/ui/", headers={"host": "evil.example"})).status_code == 400
        assert (await view.get("/ui/api/sessions",
                               headers={"origin": "https://evil.example"})).status_code == 403
        for origin, status in (("http://127.0.0.1", 200), ("http://127.0.0.1:8080", 403)):
            assert (await view.get("/ui/api/sessions", headers={"origin": origin})
                    ).status_code == status  # its own origin only: another port is another
        assert (await view.get("/ui/")).headers["content-type"].startswith("text/html")
        assert (await view.get("/health")).json()["status"] == "ok"
        assert (await view.get("/")).headers["location"] == "/ui/"
        assert (await view.get("/ui/nothing")).json()["error"]["code"] == "unknown_route"


async def test_without_a_tokenizer_ids_are_shown(client: httpx.AsyncClient, engine: FakeEngine,
                                                 tmp_path: Path) -> None:
    sid = (await client.post("/sessions")).json()["session_id"]
    await chat(client, sid, [{"role": "user", "content": "hi"}])
    (sample,) = decode_samples((await client.post(f"/sessions/{sid}/samples", json={})
                                ).content).samples
    write_samples_parquet(tmp_path / "samples.parquet", [(3, 1, sample)])
    async with viewer(ParquetSource(tmp_path / "samples.parquet")) as view:
        page = (await view.get("/ui/api/sessions/0/tokens")).json()
        assert page["text"] is None and page["blocks"] == []
        assert page["ids"] == sample.tokens.tolist()
        item = (await view.get("/ui/api/sessions")).json()["sessions"][0]
        assert item["label"] == "prompt 3 · sample 1"


def test_tokenizer_of_the_rollout(tmp_path: Path, qwen3_dir: Path) -> None:
    samples = tmp_path / "samples.parquet"
    assert find_tokenizer(samples, None) == (None, "no tokenizer named")
    (tmp_path / "summary.json").write_text(json.dumps({"config": {
        "engine": "mock", "tokenizer": str(qwen3_dir)}}))
    tokenizer, origin = find_tokenizer(samples, None)
    assert tokenizer is not None and origin == str(qwen3_dir)
    (tmp_path / "summary.json").write_text(json.dumps({"config": {"tokenizer": "/gone"}}))
    assert find_tokenizer(samples, None) == (None, "the rollout's tokenizer '/gone' is not here")


def test_bad_paths_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["view", str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "samples.parquet").write_text("not parquet")
    assert cli_main(["view", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert cli_main(["view", str(tmp_path), "--tokenizer", str(tmp_path / "nope")]) == 2


# -- as processes: a real rollout, then `tito view` ---------------------------------------------
@pytest.fixture(scope="module")
def rollout_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("rollout") / "out"
    done = subprocess.run(
        [sys.executable, "-m", "tito.cli", "rollout", "--engine", "mock", "--tokenizer",
         str(qwen3_dir), "--family", "qwen3", "--agent", "tito.examples.scripted_agent:run_agent",
         "--out", str(out), "--limit", "3", "--session-version", "v2"],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def view_url(rollout_dir: Path) -> Iterator[str]:
    proc = start_tito("view", str(rollout_dir), "--port", "0")
    try:
        yield proc.url
    finally:
        proc.stop()


@pytest.mark.slow
def test_tito_view_on_a_rollout(view_url: str, rollout_dir: Path, qwen3_dir: Path) -> None:
    summary = json.loads((rollout_dir / "summary.json").read_text())
    listed = httpx.get(view_url + "/ui/api/sessions").json()
    assert listed["source"]["tokenizer"] == str(qwen3_dir)
    assert len(listed["sessions"]) == summary["samples"] == 3
    tokenizer = load_tokenizer(qwen3_dir)
    for item in listed["sessions"]:
        page = httpx.get(f"{view_url}/ui/api/sessions/{item['id']}/tokens").json()
        assert page["total"] == item["tokens"] == len(page["ids"])
        assert "".join(page["text"]) == tokenizer.decode(page["ids"])
        assert [t["node_id"] for t in page["turns"]] == item["leaf_path"]
        assert {b["kind"] for b in page["blocks"]} >= {"tool_call", "tool_result"}
        assert page["mask"].count("1") == page["origin"].count("g")


@pytest.mark.slow
def test_tito_view_in_the_browser(view_url: str) -> None:
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="needs the playwright package (pip install playwright)")
    first = httpx.get(view_url + "/ui/api/sessions").json()["sessions"][0]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 950})
            page.goto(view_url + "/ui/")
            page.wait_for_selector('body[data-source="file"]')
            assert page.locator("#sessions tbody tr").count() == 3
            assert page.inner_text("#sessions-title") == "Samples"
            page.locator("#sessions tbody tr").first.click()
            page.wait_for_selector('body[data-state="ready"]')
            page.wait_for_selector('#strip .chunk[data-state="rendered"]')
            tokens = page.evaluate('document.querySelectorAll("#strip [data-origin]").length')
            assert tokens == first["tokens"]
            assert page.locator("#strip .turn-sep").count() == 2
            assert page.locator("#strip .blk-tool_call").count() == 1
            assert page.locator("#samples tbody tr").count() == 1
            folder = Path(os.environ.get("TITO_TEST_ARTIFACTS") or REPO / "tests" / "artifacts")
            folder.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(folder / "ui_tito_view.png"))
        finally:
            browser.close()

"""The viewer in a real headless Chromium (Debian's /usr/bin/chromium driven by the
playwright package; its own browser downloads are never used) against live gateways over
the mock engine: the strip of a scripted tool-calling conversation, the --api-key form,
the v2 tree with a retry, and a 100,000-token strip that loads and scrolls. Screenshots
go to tests/artifacts/ (or $TITO_TEST_ARTIFACTS)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.support import REPO, Proc, start_gateway, start_mock

from tito.samples import decode_samples
from tito.types.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow  # processes and a browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
KEY = "browser-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
COUNTS = """() => {
  const q = (s) => document.querySelectorAll("#strip " + s).length;
  return {total: q("[data-origin]"), prompt: q("[data-origin=prompt]"),
          bridge: q("[data-origin=bridge]"), generated: q("[data-origin=generated]"),
          mask1: q('[data-mask="1"]'), mask0: q('[data-mask="0"]'), logprobs: q("[data-logprob]"),
          turns: q(".turn-sep"), calls: q(".blk-tool_call"), results: q(".blk-tool_result"),
          thinking: q(".blk-think"), folded: q(".blk.folded")};
}"""
ORDER = """() => Array.from(document.querySelectorAll("#strip [data-i]"))
  .sort((a, b) => a.dataset.i - b.dataset.i)
  .map((t) => [t.dataset.origin[0], t.dataset.mask, t.textContent])"""


def artifacts() -> Path:
    folder = Path(os.environ.get("TITO_TEST_ARTIFACTS") or REPO / "tests" / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="needs the playwright package (pip install playwright)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class Servers:
    engine: Proc
    v1: Proc
    """--api-key KEY"""
    v2: Proc
    """--session-version v2"""


@pytest.fixture(scope="module")
def servers(qwen3_dir: Path) -> Iterator[Servers]:
    engine = start_mock(qwen3_dir, "qwen3", "--context-length", "200000")
    started = [engine]
    try:
        v1 = start_gateway(engine.url, qwen3_dir, "qwen3", "--api-key", KEY)
        started.append(v1)
        v2 = start_gateway(engine.url, qwen3_dir, "qwen3", "--session-version", "v2")
        started.append(v2)
        yield Servers(engine, v1, v2)
    finally:
        for proc in reversed(started):
            proc.stop()


def open_viewer(browser: Any, url: str, fragment: str, *, key: str | None = KEY) -> Any:
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    if key is not None:
        context.add_cookies([{"name": "tito_api_key", "value": key, "url": url}])
    page = context.new_page()
    page.goto(f"{url}/ui/{fragment}")
    return page


def wait_ready(page: Any) -> None:
    page.wait_for_selector('body[data-state="ready"]')
    page.wait_for_selector('#strip .chunk[data-state="rendered"]')


def chat(url: str, sid: str, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    resp = httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", headers=AUTH,
                      json={"messages": messages, "tools": TOOLS, **body}, timeout=120)
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["choices"][0]["message"])


def session(url: str) -> str:
    resp = httpx.post(url + "/sessions", headers=AUTH)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["session_id"])


def test_strip_of_a_tool_calling_conversation(browser: Any, servers: Servers,
                                              qwen3_dir: Path) -> None:
    url = servers.v1.url
    sid = session(url)
    messages: list[dict[str, Any]] = [{"role": "user", "content":
                                       "THINK The user wants the weather\n"
                                       'CALL get_weather {"city": "Paris"}'}]
    messages.append(chat(url, sid, messages))
    call_id = messages[-1]["tool_calls"][0]["id"]
    messages.append({"role": "tool", "tool_call_id": call_id,
                     "content": "Sunny, 24 C\nSAY It is sunny in Paris."})
    messages.append(chat(url, sid, messages))
    messages.append({"role": "user", "content": "SAY Goodbye!"})
    chat(url, sid, messages)
    view = httpx.get(f"{url}/sessions/{sid}", params={"include_ids": "true"},
                     headers=AUTH).json()
    records = view["records"]
    origins = "p" * records[0]["bridge_len"] + "g" * records[0]["output_len"] + "".join(
        "b" * r["bridge_len"] + "g" * r["output_len"] for r in records[1:])
    ids = [i for r in records for i in r["bridge_ids"] + r["output_ids"]]
    (sample,) = decode_samples(httpx.post(f"{url}/sessions/{sid}/samples", json={},
                                          headers=AUTH).content).samples
    masks = "-" * sample.prompt_length + "".join(str(int(m)) for m in sample.loss_mask)

    page = open_viewer(browser, url, f"#s={sid}")
    wait_ready(page)
    counts = page.evaluate(COUNTS)
    assert counts["total"] == len(ids) == view["metadata"]["num_tokens"]
    assert (counts["prompt"], counts["bridge"], counts["generated"]) == \
        (origins.count("p"), origins.count("b"), origins.count("g"))
    assert counts["logprobs"] == counts["generated"] == counts["mask1"] == \
        int(sample.loss_mask.sum())
    assert counts["mask0"] == origins.count("b")
    assert counts["turns"] == 3
    assert (counts["calls"], counts["results"]) == (1, 1)
    assert counts["thinking"] >= 1
    assert counts["folded"] == 2  # tool call and tool result start folded
    order = page.evaluate(ORDER)
    assert "".join(o for o, _, _ in order) == origins
    assert "".join(m for _, m, _ in order) == masks
    assert "".join(t for _, _, t in order) == load_tokenizer(qwen3_dir).decode(ids)
    separators = page.locator("#strip .turn-sep").all_inner_texts()
    assert all("finish stop" in s for s in separators), separators
    head = page.locator("#strip .blk-tool_call > .blk-head")
    assert "get_weather" in head.inner_text()
    result = page.locator("#strip .blk-tool_result")
    assert "get_weather" in result.locator(".blk-head").inner_text()
    assert not page.locator("#strip .blk-tool_result > .t").first.is_visible()
    result.locator(".blk-head").click()
    assert "Sunny, 24 C" in result.inner_text()
    page.locator('#strip [data-origin="generated"]').nth(3).hover()
    assert "logprob" in page.locator("#tip").inner_text()
    assert page.locator("#samples tbody tr").count() == 1
    assert page.locator("#samples tbody tr td").nth(2).inner_text() == "completed"
    assert page.locator(f'#sessions tr[data-sid="{sid}"]').count() == 1
    page.screenshot(path=str(artifacts() / "ui_tool_calls.png"))
    page.select_option("#colour", "logprob")
    assert page.locator("#strip.heat").count() == 1
    page.screenshot(path=str(artifacts() / "ui_tool_calls_heat.png"))
    page.context.close()


def test_api_key_form_in_the_browser(browser: Any, servers: Servers) -> None:
    url = servers.v1.url
    page = open_viewer(browser, url, "", key=None)
    assert page.locator("#login").count() == 1
    page.fill("#key", "not-the-key")
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert "refused" in page.inner_text("body")
    page.fill("#key", KEY)
    with page.expect_navigation():
        page.click("button[type=submit]")
    page.wait_for_selector('body[data-source="gateway"]')
    assert "gateway" in page.inner_text("#source")
    page.context.close()


def test_tree_of_a_v2_session_with_a_retry(browser: Any, servers: Servers) -> None:
    url = servers.v2.url
    sid = session(url)
    start = [{"role": "user", "content": "SAY Hello there"}]
    history = [*start, chat(url, sid, start),
               {"role": "user", "content": 'CALL get_weather {"city": "Oslo"}'}]
    chat(url, sid, history)  # node 1
    retried = chat(url, sid, history)  # node 2: the agent re-sent the request
    chat(url, sid, [*history, retried, {"role": "tool", "tool_call_id":
                                        retried["tool_calls"][0]["id"],
                                        "content": "Rain\nSAY It rains in Oslo."}])  # node 3
    tree = httpx.get(f"{url}/sessions/{sid}").json()["metadata"]["tree"]
    assert [n["parent"] for n in tree["nodes"]] == [None, 0, 0, 2]

    page = open_viewer(browser, url, f"#s={sid}", key=None)
    wait_ready(page)
    items = page.locator("#tree li")
    assert items.count() == 4
    assert page.locator('#tree li[data-state="kept"]').get_attribute("data-node") == "3"
    assert page.locator('#tree li[data-state="dropped"]').get_attribute("data-node") == "1"
    assert page.locator("#tree li.selected").get_attribute("data-node") == "3"
    assert page.locator("#samples tbody tr").count() == 1
    kept = page.evaluate(COUNTS)
    assert kept["total"] == tree["nodes"][3]["num_tokens"] and kept["turns"] == 3
    assert "node #2" in page.locator("#strip .turn-sep").nth(1).inner_text()
    page.screenshot(path=str(artifacts() / "ui_tree_kept_leaf.png"))
    page.locator('#tree li[data-node="1"]').click()
    page.wait_for_function("""() => document.body.dataset.state === "ready" &&
        document.querySelector("#tree li.selected").dataset.node === "1" &&
        document.querySelector('#strip .chunk[data-state="rendered"]') !== null""")
    dropped = page.evaluate(COUNTS)
    assert dropped["total"] == tree["nodes"][1]["num_tokens"] and dropped["turns"] == 2
    assert "node #1" in page.locator("#strip .turn-sep").nth(1).inner_text()
    assert dropped["mask1"] > 0  # the dropped leaf's own sample, before the picker
    page.screenshot(path=str(artifacts() / "ui_tree_dropped_leaf.png"))
    page.context.close()


def test_agent_contexts_one_at_a_time(browser: Any, servers: Servers) -> None:
    """A main agent and a Claude Code sub-agent on one session: the summary's agent
    context picker shows the sub-agent's strip and samples."""
    url = servers.v2.url
    sid = session(url)
    chat(url, sid, [{"role": "user", "content": 'CALL get_weather {"city": "Rome"}'}])
    sub = httpx.post(f"{url}/sessions/{sid}/v1/chat/completions",
                     headers={"x-claude-code-agent-id": "0123456789abcdef0"},
                     json={"messages": [{"role": "user", "content": "SAY Rome is sunny."}]})
    assert sub.status_code == 200, sub.text
    contexts = httpx.get(f"{url}/sessions/{sid}").json()["metadata"]["contexts"]
    helper = next(c for c in contexts if c["context_id"] == "0123456789abcdef0")

    page = open_viewer(browser, url, f"#s={sid}", key=None)
    wait_ready(page)
    assert page.locator("#context option").count() == 2
    assert page.locator("#context").input_value() == "main"
    page.select_option("#context", "0123456789abcdef0")
    page.wait_for_function("""() => document.body.dataset.state === "ready" &&
        location.hash.includes("ctx=0123456789abcdef0") &&
        document.querySelector('#strip .chunk[data-state="rendered"]') !== null""")
    counts = page.evaluate(COUNTS)
    assert counts["total"] == helper["num_tokens"] and counts["turns"] == 1
    assert page.locator("#context").input_value() == "0123456789abcdef0"
    assert page.locator("#samples tbody tr").count() == 1
    page.screenshot(path=str(artifacts() / "ui_agent_context.png"))
    page.context.close()


def test_a_100k_token_strip_loads_and_scrolls(browser: Any, servers: Servers) -> None:
    url = servers.v1.url
    sid = session(url)
    chat(url, sid, [{"role": "user", "content": "LONG 100000"}], max_tokens=100_000)
    total = httpx.get(f"{url}/sessions/{sid}", headers=AUTH).json()["metadata"]["num_tokens"]
    assert total > 100_000

    started = time.monotonic()
    page = open_viewer(browser, url, f"#s={sid}")
    wait_ready(page)
    assert time.monotonic() - started < 30
    assert page.get_attribute("#strip", "data-total") == str(total)
    in_page = page.evaluate(COUNTS)["total"]
    assert 0 < in_page <= 16_384, in_page  # a few chunks, not the trajectory
    last = page.locator("#strip .chunk").count() - 1
    deadline = time.monotonic() + 60
    while page.locator(f'#strip .chunk[data-chunk="{last}"][data-state="rendered"]').count() == 0:
        assert time.monotonic() < deadline, "the last chunk never rendered"
        page.eval_on_selector("#strip", "e => { e.scrollTop = e.scrollHeight; }")
        page.wait_for_timeout(200)
    assert page.locator(f'#strip [data-i="{total - 1}"]').count() == 1
    assert page.locator('#strip [data-i="0"]').count() == 0  # the first chunk was dropped
    assert page.evaluate(COUNTS)["total"] <= 16_384
    assert "finish length" in page.locator("#strip .turn-sep").last.inner_text()
    frame = page.evaluate("""() => new Promise((done) => {
        const t0 = performance.now();
        requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now() - t0)));
    })""")
    assert frame < 1000, f"the page is not responsive: {frame:.0f} ms per frame"
    page.screenshot(path=str(artifacts() / "ui_100k_end.png"))
    page.context.close()

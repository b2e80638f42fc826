"""``GET /metrics`` read with the Prometheus client's own text parser, from a real
``tito serve`` over the mock engine: histograms per turn, mismatch classes, errors by
code and route, engine figures."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import asgi_client
from helpers.inproc import new_session as inproc_session
from helpers.support import Proc, new_session

from tito.samples import decode_samples
from tito.server.gateway import Gateway
from tito.server.metrics import FOLD_EVERY, Histogram, Metrics
from tito.types.engine import GenerateResult

parser = pytest.importorskip("prometheus_client.parser",
                             reason="needs prometheus-client (a test dependency)")

HISTOGRAMS = ("tito_turn_latency_seconds", "tito_engine_seconds",
              "tito_gateway_overhead_seconds", "tito_turn_prompt_tokens",
              "tito_turn_bridge_tokens", "tito_turn_generated_tokens",
              "tito_prefix_cache_hit_ratio")


def parser_families(text: str) -> dict[str, Any]:
    """Every family by name (the parser's names: a counter loses its ``_total``)."""
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def scrape(url: str) -> dict[str, Any]:
    resp = httpx.get(url + "/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parser_families(resp.text)


def value(families: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    """A sample's value, 0 when the series does not exist yet."""
    if family not in families:
        return 0.0
    for s in families[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    return 0.0


def chat(url: str, sid: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    resp = httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", timeout=30,
                      json={"model": "m", "messages": messages, "max_tokens": 64})
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["choices"][0]["message"])


def test_histograms_count_every_turn_and_parse(stack: tuple[Proc, Proc]) -> None:
    _, gateway = stack
    url = gateway.url
    before = scrape(url)
    sid = new_session(url)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "THINK pondering\nSAY hi"}]
    for n in range(3):
        reply = chat(url, sid, messages)
        messages += [{"role": "assistant", "content": reply["content"]},
                     {"role": "user", "content": f"SAY again {n}"}]
    after = scrape(url)
    for name in HISTOGRAMS:
        assert after[name].type == "histogram", name
        counted = value(after, name, name + "_count") - value(before, name, name + "_count")
        assert counted == 3, name
        buckets = [s for s in after[name].samples if s.name == name + "_bucket"]
        values = [s.value for s in buckets]
        assert values == sorted(values) and buckets[-1].labels["le"] == "+Inf"
        assert buckets[-1].value == value(after, name, name + "_count")
    generated = value(after, "tito_turn_generated_tokens", "tito_turn_generated_tokens_sum") \
        - value(before, "tito_turn_generated_tokens", "tito_turn_generated_tokens_sum")
    assert generated == value(after, "tito_generated_tokens", "tito_generated_tokens_total") \
        - value(before, "tito_generated_tokens", "tito_generated_tokens_total") > 0
    # the gateway's time is part of the turn's, the engine's too
    latency = value(after, "tito_turn_latency_seconds", "tito_turn_latency_seconds_sum")
    parts = value(after, "tito_engine_seconds", "tito_engine_seconds_sum") + value(
        after, "tito_gateway_overhead_seconds", "tito_gateway_overhead_seconds_sum")
    assert parts == pytest.approx(latency, rel=1e-6)
    assert after["tito_sessions"].type == "gauge"


async def test_mismatch_classes_are_counted_as_samples_report_them(
        gateway: Gateway, engine: FakeEngine) -> None:
    """The model says "hello " with a trailing space, which the parser strips: the
    re-rendered history differs in assistant text, the sample reports an
    ``assistant_text`` mismatch, and ``/metrics`` counts it."""
    tok = gateway.renderer.tokenizer
    word, spaced = tok.encode("hello"), tok.encode("hello ")
    scripted = engine.generate

    async def spelled(*args: Any, **kwargs: Any) -> GenerateResult:
        result = await scripted(*args, **kwargs)
        ids = list(result.output_ids)
        at = next((k for k in range(len(ids)) if ids[k:k + len(word)] == word), None)
        if at is None:
            return result
        ids[at:at + len(word)] = spaced
        return replace(result, output_ids=ids, logprobs=[-0.25] * len(ids))

    engine.generate = spelled  # type: ignore[method-assign]
    engine.script("hello", "bye")
    async with asgi_client(gateway) as http:
        sid = await inproc_session(http)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        for _ in range(2):
            resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                   json={"model": "m", "messages": messages})
            assert resp.status_code == 200, resp.text
            messages += [resp.json()["choices"][0]["message"],
                         {"role": "user", "content": "more"}]
        before = parser_families((await http.get("/metrics")).text)
        resp = await http.post(f"/sessions/{sid}/samples", json={})
        sample = decode_samples(resp.content).samples[0]
        after = parser_families((await http.get("/metrics")).text)
    report = Counter(item["type"] for item in sample.metadata["tito_session_mismatch"])
    assert report["assistant_text"] >= 1
    for kind, n in report.items():
        delta = value(after, "tito_mismatches", "tito_mismatches_total", type=kind) - \
            value(before, "tito_mismatches", "tito_mismatches_total", type=kind)
        assert delta == n, kind


def test_errors_by_code_and_route(stack: tuple[Proc, Proc]) -> None:
    _, gateway = stack
    url = gateway.url
    route = "/sessions/{session_id}/v1/chat/completions"
    before = scrape(url)
    sid = new_session(url)
    bad = httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", json={"model": "m"})
    assert bad.status_code == 400
    gone = httpx.post(f"{url}/sessions/{'f' * 32}/v1/chat/completions",
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert gone.status_code == 404
    after = scrape(url)

    def delta(status: str, code: str) -> float:
        labels = {"status": status, "code": code, "route": route}
        return value(after, "tito_errors", "tito_errors_total", **labels) - \
            value(before, "tito_errors", "tito_errors_total", **labels)

    assert delta("404", "session_not_found") == 1
    assert sum(delta("400", code) for code in {
        s.labels["code"] for s in after["tito_errors"].samples
        if s.labels.get("status") == "400" and s.labels.get("route") == route}) == 1


def test_histogram_buckets_are_cumulative_and_le_inclusive() -> None:
    h = Histogram("x_seconds", "help", (0.1, 1.0))
    h.observe_many(np.array([0.1, 0.5]))
    h.observe_many(np.array([1.0, 3.0]))
    text = "\n".join(h.render()) + "\n"
    family = next(parser.text_string_to_metric_families(text))
    got = {s.labels.get("le"): s.value for s in family.samples if s.name == "x_seconds_bucket"}
    assert got == {"0.1": 1, "1.0": 3, "+Inf": 4}
    assert h.total == pytest.approx(4.6) and h.count == 4


def test_turns_are_binned_before_every_render() -> None:
    """Turns wait in rows until FOLD_EVERY of them or a render: none is lost either way."""
    m = Metrics()
    for i in range(FOLD_EVERY + 3):
        m.turn(latency=0.002, engine=0.001, overhead=0.001, prompt=i % 2 * 100, bridge=10,
               generated=64, cached=50)
    families = {f.name: f for f in parser.text_string_to_metric_families(m.render({}))}
    count = {s.name: s.value for s in families["tito_turn_latency_seconds"].samples}
    assert count["tito_turn_latency_seconds_count"] == FOLD_EVERY + 3
    hits = {s.name: s.value for s in families["tito_prefix_cache_hit_ratio"].samples}
    assert hits["tito_prefix_cache_hit_ratio_count"] == (FOLD_EVERY + 3) // 2  # prompt 0: none
    assert hits["tito_prefix_cache_hit_ratio_sum"] == pytest.approx(0.5 * ((FOLD_EVERY + 3) // 2))


def test_labels_are_escaped() -> None:
    m = Metrics()
    m.error(400, 'odd"code', "/a\\b")
    families = list(parser.text_string_to_metric_families(m.render({})))
    errors = next(f for f in families if f.name == "tito_errors")
    assert errors.samples[0].labels == {"status": "400", "code": 'odd"code', "route": "/a\\b"}


@pytest.mark.slow  # starts two engines and a gateway of its own
def test_the_grafana_dashboard_queries_metrics_the_gateway_exports(qwen3_dir: Any) -> None:
    """Every series docs/grafana-dashboard.json queries exists on a live gateway in front
    of two engines (a pool: the per-engine series too), after one turn."""
    import json
    import re

    from helpers.support import REPO, start_gateway, start_mock

    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    wanted = {name for e in exprs for name in re.findall(r"\btito_[a-z0-9_]+", e)}
    engines = [start_mock(qwen3_dir, "qwen3") for _ in range(2)]
    try:
        gateway = start_gateway(engines[0].url, qwen3_dir, "qwen3",
                                "--engine-url", engines[1].url)
        try:
            sid = new_session(gateway.url)
            chat(gateway.url, sid, [{"role": "user", "content": "SAY hi"}])
            httpx.post(f"{gateway.url}/sessions/{sid}/samples", json={})
            httpx.get(f"{gateway.url}/sessions/{'0' * 32}")  # one error series
            text = httpx.get(gateway.url + "/metrics").text
        finally:
            gateway.stop()
    finally:
        for engine in engines:
            engine.stop()
    exported = set(re.findall(r"^(tito_[a-z0-9_]+)", text, flags=re.MULTILINE))
    missing = sorted(wanted - exported)
    assert not missing, f"the dashboard queries series /metrics does not export: {missing}"
    assert len(dashboard["panels"]) >= 10

"""Time to first token: streamed through the gateway (Chat Completions, Anthropic
Messages, Responses) next to the engine's own ``/generate`` stream.

``tito mock-engine`` runs with a prefill latency and a per-token latency (so the first
token has a known floor); the same prompt is streamed ``--repeat`` times each way, one
request at a time, in fresh sessions, with thinking off (so the first generated token
is text). For each: the median and p90 of the time from sending the request to the
first generated text, and of the time to the end of the stream.

    python benchmarks/ttft.py
"""

from __future__ import annotations

import argparse
import http.client
import json
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _paths import QWEN3_DIR
from _processes import start_gateway, start_mock
from _tables import fmt, median, percentile, print_table

PROMPT = "Tell me about the weather.\nSAY " + " ".join(["sunny and warm today"] * 16)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--repeat", type=int, default=20, help="streams per row")
    p.add_argument("--latency-ms", type=float, default=20.0, help="mock prefill latency")
    p.add_argument("--token-latency-ms", type=float, default=5.0,
                   help="mock latency per output token")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens per reply")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def sse(url: str, path: str, body: dict[str, Any]) -> Iterator[tuple[float, bytes]]:
    """(seconds since the request was sent, data payload) per server-sent event."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    start = time.perf_counter()
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status} {resp.read()[:300]!r}")
    try:
        for line in resp:
            if line.startswith(b"data:"):
                yield time.perf_counter() - start, line[5:].strip()
    finally:
        conn.close()


def engine_text(data: bytes) -> bool:
    if data == b"[DONE]":
        return False
    return bool(json.loads(data).get("output_ids"))


def chat_text(data: bytes) -> bool:
    if data == b"[DONE]":
        return False
    choices = json.loads(data).get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content"))


def messages_text(data: bytes) -> bool:
    event = json.loads(data)
    return event.get("type") == "content_block_delta"


def responses_text(data: bytes) -> bool:
    return json.loads(data).get("type") in ("response.output_text.delta",
                                            "response.reasoning_summary_text.delta")


def measure(stream: Callable[[], Iterator[tuple[float, bytes]]],
            is_text: Callable[[bytes], bool], repeat: int) -> tuple[list[float], list[float]]:
    first, total = [], []
    for _ in range(repeat):
        t_first = t_end = None
        for t, data in stream():
            if t_first is None and is_text(data):
                t_first = t
            t_end = t
        assert t_first is not None and t_end is not None, "no text in the stream"
        first.append(t_first * 1000)
        total.append(t_end * 1000)
    return first, total


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from tito.render import build_renderer

    renderer = build_renderer("qwen3", args.tokenizer)
    # thinking off: the first generated token is text (no empty think block to hold back)
    prompt_ids = [int(i) for i in renderer.render_prompt(
        [{"role": "user", "content": PROMPT}], template_kwargs={"enable_thinking": False})]
    engine = start_mock(args.tokenizer, latency_ms=args.latency_ms,
                        token_latency_ms=args.token_latency_ms)
    gateway = start_gateway(args.tokenizer, engine.url)
    rows: list[list[str]] = []
    figures: dict[str, Any] = {}
    try:
        def new_session() -> str:
            conn_url = urllib.parse.urlsplit(gateway.url)
            conn = http.client.HTTPConnection(conn_url.hostname, conn_url.port, timeout=30)
            conn.request("POST", "/sessions")
            sid: str = json.loads(conn.getresponse().read())["session_id"]
            conn.close()
            return sid

        user = [{"role": "user", "content": PROMPT}]
        cases: dict[str, tuple[Callable[[], Iterator[tuple[float, bytes]]],
                               Callable[[bytes], bool]]] = {
            "engine /generate stream": (lambda: sse(engine.url, "/generate", {
                "input_ids": prompt_ids, "stream": True, "return_logprob": True,
                "sampling_params": {"max_new_tokens": args.max_tokens,
                                    "temperature": 0}}), engine_text),
            "gateway chat, first turn": (lambda: sse(
                gateway.url, f"/sessions/{new_session()}/v1/chat/completions",
                {"messages": user, "max_tokens": args.max_tokens, "stream": True,
                 "chat_template_kwargs": {"enable_thinking": False}}),
                chat_text),
            "gateway messages, first turn": (lambda: sse(
                gateway.url, f"/sessions/{new_session()}/v1/messages",
                {"model": "m", "messages": user, "max_tokens": args.max_tokens,
                 "stream": True, "thinking": {"type": "disabled"}}), messages_text),
            "gateway responses, first turn": (lambda: sse(
                gateway.url, f"/sessions/{new_session()}/v1/responses",
                {"input": user, "max_output_tokens": args.max_tokens, "stream": True,
                 "reasoning": {"effort": "none"}}), responses_text),
        }
        for name, (stream, is_text) in cases.items():
            first, total = measure(stream, is_text, args.repeat)
            figures[name] = {"ttft_ms": first, "total_ms": total}
            rows.append([name, fmt(median(first)), fmt(percentile(first, 90)),
                         fmt(median(total)), fmt(percentile(total, 90))])
        base = median(figures["engine /generate stream"]["ttft_ms"])
        for name in list(figures)[1:]:
            figures[name]["ttft_over_engine_ms"] = median(figures[name]["ttft_ms"]) - base
    finally:
        gateway.stop()
        engine.stop()
    print_table(f"time to first token (ms): mock prefill {args.latency_ms} ms + "
                f"{args.token_latency_ms} ms/token, {args.max_tokens} tokens, "
                f"{args.repeat} streams per row",
                ["stream", "TTFT p50", "TTFT p90", "end p50", "end p90"], rows,
                caption="TTFT: request sent -> first generated text (engine: first chunk "
                        "with ids; chat: first content/reasoning delta; messages: first "
                        "content_block_delta; responses: first text delta).")
    for name, fig in list(figures.items())[1:]:
        print(f"{name}: TTFT {fmt(fig['ttft_over_engine_ms'])} ms over the engine's own")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

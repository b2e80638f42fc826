"""Soak: every committed turn is in a sample, through three doors, with length cuts.

Starts ``tito mock-engine`` and ``tito serve`` (Qwen3 tokenizer, family qwen3, the flags
given after ``--``), then runs S sessions of T turns each, C sessions at a time, over
plain HTTP (httpx): a session speaks one door (OpenAI chat, Anthropic Messages or OpenAI
Responses, in turn), each turn is streamed or not at random, and about ``--cut-share`` of
the turns but the first and the last are cut by their token limit (``LONG`` with a
smaller ``max_tokens``); the others answer a ``SAY``, and about ``--fault-share`` of those
carry a ``FAULT`` directive: the mock engine fails that reply (a reset, an HTTP 500,
malformed JSON, bad ids or logprobs, an empty stop), streamed or not, and the client must
be told (a 502, or the API's error event in a stream) with nothing committed; it then
sends the turn again without it. The client replays each reply as
the API returned it (rebuilt from the stream events when streamed). After its last turn a
session collects its samples, checks them (:func:`tito.client.checks.sample_violations`;
one sample whose ``lifecycle`` has one segment per committed turn, whose
``length_cut_turns`` are the turns the client saw cut and whose status is the last
turn's) and deletes itself.

Asserted (exit status 1 otherwise): turns committed == turns in samples, no TITO
violation, no unexpected answer (any non-200 under ``keep``; under ``--after-length-cut
refuse`` only 409 ``truncated_generation``, after which the client retries the cut turn
with another draw), every engine fault told to its client, and no other answer >= 500.

    python benchmarks/soak.py                                 # 300 sessions x 30 turns, C=32
    python benchmarks/soak.py --sessions 30 --turns 10        # a quick check
    python benchmarks/soak.py -- --after-length-cut refuse    # the reference's rule
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _paths import QWEN3_DIR
from _processes import Proc, start_gateway, start_mock
from _tables import fmt, print_table

from tito import decode_samples
from tito.client.checks import sample_violations

DOORS = ("chat", "messages", "responses")
CUT_AT = 6
"""``max_tokens`` of a cut turn (its ``LONG`` asks for more)."""
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet".split()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sessions", "-S", type=int, default=300, help="sessions in all")
    p.add_argument("--turns", "-T", type=int, default=30, help="turns per session")
    p.add_argument("--concurrency", "-C", type=int, default=32, help="sessions at a time")
    p.add_argument("--cut-share", type=float, default=0.15,
                   help="share of turns cut by their token limit")
    p.add_argument("--fault-share", type=float, default=0.05,
                   help="share of turns the mock engine fails (a FAULT directive); the "
                        "client must be told (502, or an error event in a stream) and "
                        "nothing committed; it then sends the turn again without it")
    p.add_argument("--seed", type=int, default=0, help="the script's random seed")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("gateway_flags", nargs="*", help="extra `tito serve` flags (after --)")
    return p.parse_args(argv)


# -- one turn per door -------------------------------------------------------------------
@dataclass
class Reply:
    status: int
    cut: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)
    """What the client appends to its history (chat, messages); Responses: unused."""
    response_id: str | None = None
    code: str | None = None
    stream_error: bool = False
    """A 200 stream that ended with an error event."""


def _events(text: str) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE body (``[DONE]`` left out)."""
    out = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            out.append(json.loads(line[5:]))
    return out


def _stream_failed(events: list[dict[str, Any]]) -> bool:
    """Whether a stream ended with its API's error event (Chat ``{"error"}``, Messages
    ``{"type": "error"}``, Responses ``error`` / ``response.failed``)."""
    return any(("error" in e and not e.get("type")) or e.get("type") in (
        "error", "response.failed") for e in events)


def _error_code(resp: httpx.Response) -> str | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    message = str(error.get("message") or "")
    if not error.get("code") and message.startswith("["):  # Anthropic: "[code] message"
        return message[1 : message.find("]")]
    return error.get("code") or error.get("type")


async def chat_turn(http: httpx.AsyncClient, base: str, history: list[dict[str, Any]],
                    max_tokens: int | None, stream: bool) -> Reply:
    body: dict[str, Any] = {"model": "m", "messages": history, "stream": stream}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    resp = await http.post(f"{base}/v1/chat/completions", json=body)
    if resp.status_code != 200:
        return Reply(resp.status_code, code=_error_code(resp))
    if not stream:
        choice = resp.json()["choices"][0]
        message = {k: v for k, v in choice["message"].items() if v is not None}
        return Reply(200, choice["finish_reason"] == "length", [message])
    text, finish = "", None
    events = _events(resp.text)
    if _stream_failed(events):
        return Reply(200, stream_error=True)
    for event in events:
        for choice in event.get("choices") or ():
            text += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
    return Reply(200, finish == "length", [{"role": "assistant", "content": text}])


async def messages_turn(http: httpx.AsyncClient, base: str, history: list[dict[str, Any]],
                        max_tokens: int | None, stream: bool) -> Reply:
    body = {"model": "m", "messages": history, "max_tokens": max_tokens or 256,
            "stream": stream}
    resp = await http.post(f"{base}/v1/messages", json=body)
    if resp.status_code != 200:
        return Reply(resp.status_code, code=_error_code(resp))
    if not stream:
        data = resp.json()
        content = [b for b in data["content"] if b["type"] == "text"]
        return Reply(200, data["stop_reason"] == "max_tokens",
                     [{"role": "assistant", "content": content}])
    text, stop = "", None
    events = _events(resp.text)
    if _stream_failed(events):
        return Reply(200, stream_error=True)
    for event in events:
        if event.get("type") == "content_block_delta":
            text += event["delta"].get("text") or ""
        elif event.get("type") == "message_delta":
            stop = event["delta"].get("stop_reason")
    return Reply(200, stop == "max_tokens",
                 [{"role": "assistant", "content": [{"type": "text", "text": text}]}])


async def responses_turn(http: httpx.AsyncClient, base: str, previous: str | None,
                         user: str, max_tokens: int | None, stream: bool) -> Reply:
    body: dict[str, Any] = {"model": "m", "input": [{"role": "user", "content": user}],
                            "stream": stream}
    if previous is not None:
        body["previous_response_id"] = previous
    if max_tokens is not None:
        body["max_output_tokens"] = max_tokens
    resp = await http.post(f"{base}/v1/responses", json=body)
    if resp.status_code != 200:
        return Reply(resp.status_code, code=_error_code(resp))
    events = _events(resp.text) if stream else []
    if _stream_failed(events):
        return Reply(200, stream_error=True)
    data = resp.json() if not stream else next(
        e["response"] for e in reversed(events)
        if e.get("type") in ("response.completed", "response.incomplete"))
    return Reply(200, data["status"] == "incomplete", response_id=data["id"])


# -- one session ---------------------------------------------------------------------------
@dataclass
class Tally:
    committed: int = 0
    in_samples: int = 0
    cuts_seen: int = 0
    cuts_listed: int = 0
    refused: int = 0
    faults: int = 0
    faults_told: int = 0
    streamed: int = 0
    by_door: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


class Conversation:
    """One session's client: its door, its history and what it saw."""

    def __init__(self, http: httpx.AsyncClient, base: str, door: str) -> None:
        self.http, self.base, self.door = http, base, door
        self.history: list[dict[str, Any]] = []
        self.response_ids: list[str | None] = []
        """Responses: each turn's response id (the next turn continues the last)."""
        self.cuts: list[int] = []
        self.turns = 0
        self.last_cut = False

    async def send(self, user: str, max_tokens: int | None, stream: bool) -> Reply:
        if self.door == "responses":
            previous = self.response_ids[-1] if self.response_ids else None
            return await responses_turn(self.http, self.base, previous, user,
                                        max_tokens, stream)
        history = [*self.history, {"role": "user", "content": user}]
        turn = chat_turn if self.door == "chat" else messages_turn
        return await turn(self.http, self.base, history, max_tokens, stream)

    def keep(self, user: str, reply: Reply) -> None:
        if self.door == "responses":
            self.response_ids.append(reply.response_id)
        else:
            self.history += [{"role": "user", "content": user}, *reply.history]
        if reply.cut:
            self.cuts.append(self.turns)
        self.turns += 1
        self.last_cut = reply.cut

    def drop_last(self) -> None:
        """Forget the last turn (the client retries it)."""
        self.history, self.response_ids = self.history[:-2], self.response_ids[:-1]
        self.turns -= 1
        self.cuts = [k for k in self.cuts if k < self.turns]


FAULTS = ("reset", "http_500", "malformed_json", "wrong_types", "bad_ids", "bad_ids:int32",
          "bad_logprob", "empty")
"""Mock engine faults a turn may meet (each a failed engine reply: 502 to the client)."""


def _user(rng: random.Random, cut: bool, fault: str | None = None) -> str:
    if cut:
        return f"{rng.choice(WORDS)}\nLONG 40"
    text = "SAY " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
    return text if fault is None else f"{text}\nFAULT {fault.replace(':', ' ')}"


async def run_session(http: httpx.AsyncClient, url: str, index: int, args: argparse.Namespace,
                      tally: Tally) -> None:
    rng = random.Random(args.seed * 1_000_003 + index)
    resp = await http.post(f"{url}/sessions")
    sid = resp.json()["session_id"]
    door = DOORS[index % len(DOORS)]
    conv = Conversation(http, f"{url}/sessions/{sid}", door)
    try:
        while conv.turns < args.turns:
            # never the first turn (a retry of it under refuse would open another
            # conversation: another agent context) nor the last
            cut = rng.random() < args.cut_share and 0 < conv.turns < args.turns - 1
            fault = rng.choice(FAULTS) if not cut and rng.random() < args.fault_share \
                else None
            user, stream = _user(rng, cut, fault), rng.random() < 0.5
            reply = await conv.send(user, CUT_AT if cut else None, stream)
            if reply.status == 409 and reply.code == "truncated_generation":
                tally.statuses[reply.status] += 1
                tally.refused += 1  # refuse: told so; the cut turn is retried (another draw)
                conv.drop_last()
                continue
            if fault is not None:  # told (a 502 or an error event), nothing committed
                tally.faults += 1
                if reply.status >= 500 or reply.stream_error:
                    tally.faults_told += 1
                    continue  # the client sends the turn again (another draw)
                tally.unexpected.append(f"{door} turn {conv.turns}: FAULT {fault} answered "
                                        f"{reply.status} without an error")
                return
            tally.statuses[reply.status] += 1
            if reply.status != 200:
                tally.unexpected.append(f"{door} turn {conv.turns}: {reply.status} "
                                        f"{reply.code}")
                return
            if cut and not reply.cut:
                tally.unexpected.append(f"{door} turn {conv.turns}: not cut")
            tally.streamed += stream
            conv.keep(user, reply)
        await check_samples(http, url, sid, conv, tally)
    finally:
        await http.delete(f"{url}/sessions/{sid}")
        tally.by_door[door] += 1


async def check_samples(http: httpx.AsyncClient, url: str, sid: str, conv: Conversation,
                        tally: Tally) -> None:
    view = (await http.get(f"{url}/sessions/{sid}")).json()
    committed = int(view["metadata"]["num_turns"])
    tally.committed += committed
    tally.cuts_seen += len(conv.cuts)
    resp = await http.post(f"{url}/sessions/{sid}/samples", json={})
    if resp.status_code != 200:
        tally.unexpected.append(f"samples {resp.status_code}: {resp.text[:200]}")
        return
    samples = decode_samples(resp.content).samples
    where = f"session {sid} ({conv.door})"
    if len(samples) != 1:
        tally.violations.append(f"{where}: {len(samples)} samples")
        return
    sample = samples[0]
    meta = sample.metadata
    turns = len(meta["lifecycle"])
    tally.in_samples += turns
    listed = [c["turn"] for c in meta.get("length_cut_turns", [])]
    tally.cuts_listed += len(listed)
    problems = list(sample_violations(sample))
    if committed != conv.turns or turns != committed:
        problems.append(f"{conv.turns} turns answered, {committed} committed, {turns} in "
                        "the sample")
    if listed != conv.cuts:
        problems.append(f"length_cut_turns {listed}, the client saw cuts at {conv.cuts}")
    if sample.status != ("truncated" if conv.last_cut else "completed"):
        problems.append(f"status {sample.status} after a last turn cut={conv.last_cut}")
    tally.violations += [f"{where}: {p}" for p in problems]


async def run(url: str, args: argparse.Namespace) -> tuple[Tally, float]:
    tally = Tally()
    semaphore = asyncio.Semaphore(args.concurrency)
    # idle connections expire before the server's 5 s keep-alive closes them (no race
    # between a reused connection and the server's close)
    limits = httpx.Limits(max_connections=args.concurrency * 2,
                          max_keepalive_connections=args.concurrency * 2, keepalive_expiry=2.0)

    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        async def one(index: int) -> None:
            async with semaphore:
                try:
                    await run_session(http, url, index, args, tally)
                except Exception as exc:  # a script bug or a transport error: reported
                    tally.unexpected.append(f"session {index}: {type(exc).__name__}: {exc}")

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(args.sessions)))
        return tally, time.perf_counter() - started


def report(tally: Tally, wall: float, args: argparse.Namespace) -> dict[str, Any]:
    answered = sum(tally.statuses.values())
    figures = {
        "sessions": args.sessions, "turns_per_session": args.turns,
        "gateway_flags": args.gateway_flags, "turns_committed": tally.committed,
        "turns_in_samples": tally.in_samples, "length_cuts_seen": tally.cuts_seen,
        "length_cuts_listed": tally.cuts_listed, "refused_409": tally.refused,
        "engine_faults": tally.faults, "engine_faults_told": tally.faults_told,
        "streamed_turns": tally.streamed, "requests": answered,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "sessions_by_door": dict(tally.by_door),
        "unexpected": len(tally.unexpected), "unexpected_at_least_500": sum(
            v for k, v in tally.statuses.items() if k >= 500),
        "violations": len(tally.violations), "wall_s": round(wall, 2),
        "turns_per_s": round(answered / wall, 1) if wall else None,
        "examples": (tally.unexpected + tally.violations)[:5],
    }
    rows = [(k, fmt(v) if isinstance(v, float) else v) for k, v in figures.items()
            if k != "examples"]
    print_table("soak: turns committed vs turns in samples", ["figure", "value"], rows)
    for line in figures["examples"]:
        print("  ", line)
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine: Proc = start_mock(args.tokenizer)
    try:
        gateway = start_gateway(args.tokenizer, engine.url, *args.gateway_flags)
        try:
            tally, wall = asyncio.run(run(gateway.url, args))
        finally:
            gateway.stop()
    finally:
        engine.stop()
    figures = report(tally, wall, args)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    ok = (tally.committed == tally.in_samples and not tally.unexpected
          and not tally.violations and figures["unexpected_at_least_500"] == 0
          and tally.faults == tally.faults_told)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

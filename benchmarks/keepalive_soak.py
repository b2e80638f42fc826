"""Keep-alive soak: many clients that each send one request every 5–6 s, on pooled
connections, and count every client error.

httpx (and the openai/anthropic SDKs built on it) drop a pooled connection idle for 5 s;
uvicorn closes one idle for ``timeout_keep_alive`` (5 s unless told). When both are 5 s, a
client that pauses about 5 s sometimes sends its request on a connection the server is
closing at that instant ("Server disconnected without sending a response"): the client's
idle clock starts when it has read the reply, the server's when it has sent it, so the
client thinks the connection alive a little longer than the server keeps it. The gateway
keeps idle connections ``--keepalive-timeout`` (75 s by default) so this never happens.

Starts ``tito mock-engine`` and, for each ``--keepalive`` value, ``tito serve
--keepalive-timeout S``; then ``--clients`` clients, each a plain ``httpx.AsyncClient``
(default limits: 5 s keep-alive expiry, no retries), send ``--requests`` requests in all:
one every ``--gap`` seconds (start to start, uniform), cycling create session, one chat
turn, ``GET`` the session, collect its samples, delete it. ``--resend`` sends the
idempotent ones (all but the turn) through the client library's stale-connection resend
(:mod:`tito.client.stale`).

Printed per keep-alive: requests, client errors (by kind), error rate, connections opened,
requests sent on a reused connection after an idle gap under 5 s (the ones exposed to the
race), wall time. Exit status 1 when the gateway's default keep-alive saw an error.

    python benchmarks/keepalive_soak.py                         # 10,000 requests, 400 clients
    python benchmarks/keepalive_soak.py --keepalive 5,75        # the race, then the fix
    python benchmarks/keepalive_soak.py --requests 40 --clients 8 --gap 0.2 0.3  # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _paths import QWEN3_DIR
from _processes import start_gateway, start_mock
from _tables import fmt, print_table

from tito.client.stale import MAX_STALE_RETRIES, send_idempotent

CLIENT_EXPIRY = 5.0
"""httpx's (and the SDKs') keep-alive expiry: connections idle longer are not reused."""
DEFAULT_KEEPALIVE = 75.0
CYCLE = ("create", "turn", "view", "collect", "delete")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR)
    p.add_argument("--requests", type=int, default=10_000, help="requests in all, per run")
    p.add_argument("--clients", type=int, default=400, help="concurrent sequential clients")
    p.add_argument("--gap", type=float, nargs=2, default=(5.0, 6.0), metavar=("MIN", "MAX"),
                   help="seconds from one request's start to the next one's, per client")
    p.add_argument("--keepalive", default=str(DEFAULT_KEEPALIVE),
                   help="the gateway's --keepalive-timeout, one run each (comma-separated)")
    p.add_argument("--resend", action="store_true",
                   help="send create/view/collect/delete through tito.client.stale")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


@dataclass
class Tally:
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    connections: int = 0
    exposed: int = 0
    """Requests sent on a reused connection after an idle gap under CLIENT_EXPIRY."""
    resent: int = 0
    """Requests ``--resend`` sent again (a stale pooled connection failed them)."""


class Resends(logging.Handler):
    """Counts the client library's "sending it again" log lines."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(logging.INFO)
        self.tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        if "sending it again" in record.getMessage():
            self.tally.resent += 1


class Client:
    """One sequential client: its own pool, its session, when its last reply ended."""

    def __init__(self, url: str, tally: Tally, resend: bool) -> None:
        self.http = httpx.AsyncClient(base_url=url, timeout=60)
        self.tally = tally
        self.resend = resend
        self.sid: str | None = None
        self.last_end: float | None = None

    async def step(self, kind: str) -> None:
        if kind != "create" and self.sid is None:
            kind = "create"  # the session could not be created: try again
        method, path, body = self._request(kind)
        opened = False

        async def trace(name: str, info: dict[str, Any]) -> None:
            nonlocal opened
            if name.startswith("connection.connect_tcp.started"):
                opened = True
                self.tally.connections += 1

        idle = None if self.last_end is None else time.monotonic() - self.last_end
        self.tally.requests += 1
        try:
            send = send_idempotent if self.resend and kind != "turn" else _send
            resp = await send(self.http, method, path, json=body,
                              extensions={"trace": trace})
            if resp.status_code >= 400:
                self.tally.errors[f"HTTP {resp.status_code}"] += 1
            elif kind == "create":
                self.sid = resp.json()["session_id"]
            elif kind == "delete":
                self.sid = None
        except httpx.HTTPError as exc:
            self.tally.errors[f"{type(exc).__name__}: {exc}"[:80]] += 1
        finally:
            self.last_end = time.monotonic()
        if not opened and idle is not None and idle < CLIENT_EXPIRY:
            self.tally.exposed += 1

    def _request(self, kind: str) -> tuple[str, str, Any]:
        session = f"/sessions/{self.sid}"
        return {
            "create": ("POST", "/sessions", None),
            "turn": ("POST", f"{session}/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "SAY ok"}]}),
            "view": ("GET", session, None),
            "collect": ("POST", f"{session}/samples", {}),
            "delete": ("DELETE", session, None),
        }[kind]


async def _send(http: httpx.AsyncClient, method: str, url: str, **kwargs: Any
                ) -> httpx.Response:
    return await http.request(method, url, **kwargs)


async def run_client(client: Client, n: int, gap: tuple[float, float],
                     rng: random.Random) -> None:
    await asyncio.sleep(rng.uniform(0, gap[1]))  # spread the clients' phases
    try:
        for i in range(n):
            started = time.monotonic()
            await client.step(CYCLE[i % len(CYCLE)])
            await asyncio.sleep(max(0.0, started + rng.uniform(*gap) - time.monotonic()))
    finally:
        await client.http.aclose()


async def soak(url: str, args: argparse.Namespace) -> tuple[Tally, float]:
    tally = Tally()
    client_log = logging.getLogger("tito.client")
    client_log.setLevel(logging.INFO)
    client_log.addHandler(Resends(tally))
    rng = random.Random(args.seed)
    per, extra = divmod(args.requests, args.clients)
    clients = [Client(url, tally, args.resend) for _ in range(args.clients)]
    started = time.monotonic()
    await asyncio.gather(*(run_client(c, per + (i < extra), tuple(args.gap),
                                      random.Random(rng.random()))
                           for i, c in enumerate(clients)))
    return tally, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    keepalives = [float(k) for k in args.keepalive.split(",")]
    engine = start_mock(args.tokenizer, log_size=8)
    rows, figures = [], []
    try:
        for keepalive in keepalives:
            gateway = start_gateway(args.tokenizer, engine.url,
                                    "--keepalive-timeout", str(keepalive))
            try:
                tally, wall = asyncio.run(soak(gateway.url, args))
            finally:
                gateway.stop()
            errors = sum(tally.errors.values())
            rows.append([f"{keepalive:g}", tally.requests, errors,
                         fmt(100 * errors / max(1, tally.requests), 3), tally.connections,
                         tally.exposed, tally.resent if args.resend else "-", fmt(wall, 0)])
            figures.append({"keepalive_timeout": keepalive, "requests": tally.requests,
                            "errors": dict(tally.errors), "connections": tally.connections,
                            "exposed": tally.exposed, "resent": tally.resent,
                            "wall_s": wall})
            for kind, count in tally.errors.most_common(5):
                print(f"  keep-alive {keepalive:g} s: {count} x {kind}")
    finally:
        engine.stop()
    gap = f"{args.gap[0]:g}-{args.gap[1]:g} s"
    print_table(f"keep-alive soak: {args.clients} clients, one request every {gap}"
                + (", idempotent requests resent" if args.resend else ""),
                ["gateway keep-alive (s)", "requests", "client errors", "error %",
                 "connections", "reused after < 5 s idle", "resent", "wall (s)"], rows,
                caption="clients: httpx.AsyncClient, default limits (5 s keep-alive "
                        "expiry), no retries"
                + (f" (but --resend's, at most {MAX_STALE_RETRIES} per request)"
                   if args.resend else ""))
    if args.json is not None:
        args.json.write_text(json.dumps({"clients": args.clients, "gap": args.gap,
                                         "resend": args.resend, "runs": figures}, indent=1))
    default_errors = [f for f in figures if f["keepalive_timeout"] == DEFAULT_KEEPALIVE
                      and f["errors"]]
    return 1 if default_errors else 0


if __name__ == "__main__":
    sys.exit(main())

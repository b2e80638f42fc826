"""``tito serve --workers N``: the supervisor process.

The ``tito serve`` the user starts serves nothing itself: it starts workers 0 .. N-1
(``tito serve`` with the same arguments plus ``--port P+i --worker-index i``), one after
the other (so the first one's configuration errors come first), relays their output
prefixed ``[worker i]``, and prints ``tito serve listening on URL0 (workers: ...)`` once
all are up. A worker that exits while the supervisor runs is started again on its port
(with ``--journal DIR`` it resumes its sessions from ``DIR/worker-i``): at once when it
had run :data:`STABLE_S` seconds, else after the next of :data:`RESTART_DELAYS_S` (a
worker that keeps dying, or fails to start, waits longer each time). SIGTERM or SIGINT
stops every worker; a worker whose supervisor is gone (kill -9) stops by itself.

The API key never goes on a worker's command line (``ps`` shows every process's
arguments to every user): ``--api-key`` is taken out of the workers' arguments and
handed over as ``TITO_API_KEY`` in their environment (readable only by the same user).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from tito.config import ServerConfig
from tito.launch import ServerProcess, start_server, tito_command

log = logging.getLogger("tito.serve")
POLL_S = 0.2
"""Seconds between two looks at the workers' processes."""
RESTART_DELAYS_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Wait before restarting a worker that died (or failed to start) k times in a row, each
within :data:`STABLE_S` seconds of its start (the last one repeats)."""
STABLE_S = 60.0
"""A worker that ran this long before it died is restarted at once again."""
START_TIMEOUT_S = 180.0
STOP_WAIT_S = 5.0
"""How long stopping waits for a restart under way to finish (and be stopped)."""
SECRET_FLAG = "--api-key"


def without_api_key(argv: Sequence[str]) -> list[str]:
    """``argv`` less ``--api-key KEY`` / ``--api-key=KEY`` (and argparse's abbreviations of
    the flag, ``--api KEY`` ...)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name, eq, _ = arg.partition("=")
        if len(name) >= 4 and SECRET_FLAG.startswith(name):  # "--a" is ambiguous
            skip = not eq
            continue
        out.append(arg)
    return out


def worker_argv(argv: Sequence[str], config: ServerConfig, index: int) -> list[str]:
    """The arguments of worker ``index``: the user's (less the API key), its port, its
    index."""
    return [*without_api_key(argv), "--port", str(config.port + index),
            "--worker-index", str(index)]


def worker_env(config: ServerConfig) -> dict[str, str]:
    """The key goes to the workers in their environment, never in their arguments."""
    return {"TITO_API_KEY": config.api_key} if config.api_key else {}


class Supervisor:
    """Workers 0 .. N-1 of ``config`` (see the module doc)."""

    def __init__(self, config: ServerConfig, argv: Sequence[str]) -> None:
        self.config = config
        self.argv = list(argv)
        self.workers: list[ServerProcess | None] = [None] * config.workers
        self.started_at = [0.0] * config.workers
        self.quick_deaths = [0] * config.workers
        self.restarts = 0
        self.stopping = threading.Event()
        self._restarting: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()

    def start(self, index: int) -> ServerProcess:
        worker = start_server(
            f"tito serve worker {index}",
            tito_command(*worker_argv(self.argv, self.config, index)),
            env=worker_env(self.config), timeout=START_TIMEOUT_S, echo=f"[worker {index}] ")
        self.started_at[index] = time.monotonic()
        return worker

    def start_all(self) -> None:
        """Start every worker in order; RuntimeError (the others stopped) if one fails."""
        for index in range(self.config.workers):
            if self.stopping.is_set():  # a signal while they start
                return
            try:
                self.workers[index] = self.start(index)
            except Exception as exc:
                self.stop()
                raise RuntimeError(f"worker {index} of {self.config.workers} did not "
                                   f"start: {exc}") from exc

    def watch(self) -> None:
        """Until :meth:`stop`: restart each worker that exited (in a thread of its own)."""
        while not self.stopping.wait(POLL_S):
            for index, worker in enumerate(self.workers):
                if worker is None or worker.process.poll() is None:
                    continue
                with self._lock:
                    if index in self._restarting or self.stopping.is_set():
                        continue
                    thread = threading.Thread(target=self._restart, args=(index, worker),
                                              name=f"restart-worker-{index}", daemon=True)
                    self._restarting[index] = thread
                thread.start()

    def _restart(self, index: int, dead: ServerProcess) -> None:
        lived = time.monotonic() - self.started_at[index]
        self.quick_deaths[index] = 0 if lived >= STABLE_S else self.quick_deaths[index] + 1
        journal = "" if self.config.journal is None else \
            f", resuming from {os.path.join(self.config.journal, f'worker-{index}')}"
        log.warning("worker %d (pid %d, port %d) exited with status %s; restarting it%s",
                    index, dead.pid, self.config.port + index, dead.process.returncode,
                    journal)
        try:
            while not self.stopping.is_set():
                delays = RESTART_DELAYS_S
                if self.stopping.wait(delays[min(self.quick_deaths[index], len(delays) - 1)]):
                    return
                try:
                    worker = self.start(index)
                except Exception as exc:
                    self.quick_deaths[index] += 1
                    log.warning("worker %d did not start again: %s", index, exc)
                    continue
                self._adopt(index, worker)
                return
        finally:
            with self._lock:
                self._restarting.pop(index, None)

    def _adopt(self, index: int, worker: ServerProcess) -> None:
        with self._lock:
            stopped = self.stopping.is_set()
            if not stopped:
                self.workers[index] = worker
                self.restarts += 1
        if stopped:
            worker.stop()
            return
        log.warning("worker %d is back on %s (pid %d)", index, worker.url, worker.pid)

    def stop(self) -> None:
        """Stop every worker (and any restart under way)."""
        self.stopping.set()
        for thread in list(self._restarting.values()):  # a worker still starting that
            thread.join(STOP_WAIT_S)  # outlives us sees its supervisor gone and stops
        running = [w for w in self.workers if w is not None and w.process.poll() is None]
        for worker in running:  # all at once: each gets its graceful shutdown in parallel
            worker.process.terminate()
        for worker in running:
            worker.stop()


def supervise(config: ServerConfig, argv: Sequence[str]) -> int:
    """``tito serve --workers N``: start the workers, restart those that die, stop them on
    SIGTERM or SIGINT. 2 when a worker did not start, else 0."""
    supervisor = Supervisor(config, argv)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        supervisor.stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        supervisor.start_all()
    except RuntimeError as exc:
        print(f"tito serve: {exc}", file=sys.stderr)
        return 2
    if supervisor.stopping.is_set():
        supervisor.stop()
        return 0
    urls = [w.url for w in supervisor.workers if w is not None]
    print(f"tito serve listening on {urls[0]} (workers: {', '.join(urls)})", flush=True)
    try:
        supervisor.watch()
    finally:
        supervisor.stop()
    return 0

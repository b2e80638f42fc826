"""Engine control behind the gateway (design §8.1): pause and continue generation, the
weight version, the engine's health probe, and aborting a request nobody waits for.

While the engine is paused, turns that arrive are held (:meth:`EngineControl.wait_unpaused`),
not failed.
"""

from __future__ import annotations

import asyncio
import logging
import time

from tito.config import ServerConfig
from tito.server.metrics import Metrics
from tito.types.engine import Engine, PauseMode

log = logging.getLogger("tito.server")
PROBE_EVERY_S = 1.0
PROBE_TIMEOUT_S = 5.0


class EngineControl:
    def __init__(self, engine: Engine, config: ServerConfig, metrics: Metrics) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self.pause_mode: PauseMode | None = None
        """The mode of the pause in force (None: not paused)."""
        self._probed_at = -PROBE_EVERY_S
        self._engine_error: str | None = None
        self._background: set[asyncio.Task[None]] = set()

    # -- pause ------------------------------------------------------------------------------
    async def pause(self, mode: PauseMode | None = None) -> PauseMode:
        """Pause the engine (default: ``--pause-generation-mode``); turns that arrive
        meanwhile are held until :meth:`resume`, not failed."""
        mode = mode or self.config.pause_generation_mode  # type: ignore[assignment]
        assert mode is not None
        self._unpaused.clear()
        try:
            await self.engine.pause(mode)
        except BaseException:
            if self.pause_mode is None:
                self._unpaused.set()
            raise
        self.pause_mode = mode
        self.metrics.inc("engine_pauses_total")
        return mode

    async def resume(self) -> None:
        await self.engine.resume()
        self.pause_mode = None
        self._unpaused.set()

    async def wait_unpaused(self) -> float:
        """Wait while the engine is paused (the turn is held); the seconds waited."""
        if self._unpaused.is_set():
            return 0.0
        self.metrics.inc("turns_held_total")
        waited = time.perf_counter()
        await self._unpaused.wait()
        return time.perf_counter() - waited

    async def update_weight_version(self, version: str) -> None:
        await self.engine.update_weight_version(version)

    # -- health -----------------------------------------------------------------------------
    async def engine_state(self, *, refresh: bool = False) -> str | None:
        """None when the engine is up, else why not (probed at most once a second)."""
        now = time.monotonic()
        if refresh or now - self._probed_at >= PROBE_EVERY_S:
            try:
                self._engine_error = await asyncio.wait_for(self.engine.probe(),
                                                            PROBE_TIMEOUT_S)
            except Exception as exc:  # a probe that itself fails says the engine is down
                self._engine_error = f"{type(exc).__name__}: {exc}"
            self._probed_at = time.monotonic()
        return self._engine_error

    # -- abort ------------------------------------------------------------------------------
    def abort_later(self, rid: str) -> None:
        """Abort ``rid`` on the engine without waiting (the caller is being cancelled)."""

        async def abort() -> None:
            try:
                await self.engine.abort(rid)
            except Exception:
                log.warning("aborting %s on the engine failed", rid, exc_info=True)

        task = asyncio.create_task(abort())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        self.metrics.inc("engine_aborts_total")

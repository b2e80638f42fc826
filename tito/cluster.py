"""Rollouts on a Ray cluster: ``tito rollout --ray ADDRESS`` (Ray is an optional extra).

One :class:`GatewayActor` per alive node serves a gateway (engine + ``tito`` gateway, as
``tito rollout`` starts locally) on that node's address, unless the run uses external
gateways (``--gateway URL``). One :class:`TrajectoryRunner` per node runs trajectories as
Ray actor tasks, many at once on its event loop, against its own node's gateway (or the
external ones, placed by a stable hash). The driver keeps ``concurrency`` trajectories in
flight over the runners (least loaded first) and streams each result back as it lands.

Faults: a node that dies takes its runner and gateway with it; the trajectories it was
running fail with a Ray actor error and are queued again on the other nodes (at most
``max_attempts`` runs each). A runner whose gateway stops answering reports
:class:`GatewayLost` the same way. Results are keyed by (prompt, sample) index and a key
is recorded once, so a finished trajectory is never written twice. When a runner is lost
the driver looks for alive nodes without one (a replaced node) and starts them there.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tito.client.agent import resolve_agent
from tito.client.prompts import PromptItem
from tito.client.results import RolloutResult, TrajectoryResult
from tito.client.rollout import run_trajectory
from tito.client.settings import RolloutSettings
from tito.client.tracer import SessionTracer
from tito.config import ServerConfig

log = logging.getLogger("tito.rollout.ray")

LOCAL_NODE_IP = "127.0.0.1"
"""The address of the one-node cluster ``--ray local`` starts: its raylet, object store
and gateway stay on loopback (Ray would otherwise advertise the machine's own address)."""
RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray reads this once, when imported: ``0`` keeps a node started on 127.0.0.1 there (by
default Ray swaps 127.0.0.1 for the machine's address); it also refuses ``ray start`` of
more nodes, which a one-node cluster never needs."""
MAX_ATTEMPTS = 3
"""A trajectory whose node (or gateway) is lost is run again, at most this many runs."""
HEALTH_TIMEOUT = 5.0


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached or used."""


class GatewayLost(RuntimeError):
    """A runner's gateway stopped answering: its trajectory is to be run elsewhere."""


def import_ray(*, loopback: bool = False) -> Any:
    """``ray``; ``loopback``: nodes this process starts stay on :data:`LOCAL_NODE_IP`
    (when Ray is not imported yet: see :data:`RAY_LOOPBACK_ENV`)."""
    if loopback and "ray" not in sys.modules:
        os.environ.setdefault(RAY_LOOPBACK_ENV, "0")
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray: pip install 'tito-gateway[ray]' "
                             "(or pip install ray)") from None
    return ray


def agent_spec_for_workers(spec: str) -> str:
    """``path/to/agent.py:fn`` with an absolute path (Ray workers start elsewhere); a
    module spec is left as it is (it must be importable on every node)."""
    module, sep, function = spec.rpartition(":")
    if not sep:
        module, function = spec, ""
    if module.endswith(".py") and Path(module).is_file():
        module = str(Path(module).resolve())
    return f"{module}:{function}" if function else module


async def _check_reachable(address: str) -> None:
    """A ``HOST:PORT`` address must accept a connection (``ray.init`` retries for minutes
    against a closed port)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # auto, local, ray://: Ray reports those itself
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 10)
    except (OSError, TimeoutError) as exc:
        raise RayUnavailable(f"cannot join the Ray cluster at {address!r}: nothing answers "
                             f"there ({exc}); start it with `ray start --head`") from None
    writer.close()


# -- actors (plain classes; ray.remote is applied when a run starts) -------------------------
class GatewayActor:
    """An engine + gateway stack on this node (:func:`tito.stack.start_stack`)."""

    def __init__(self) -> None:
        self.stack: Any = None

    async def start(self, config: ServerConfig) -> str:
        from tito.stack import start_stack

        ray = import_ray()
        host = ray.util.get_node_ip_address()
        self.stack = await start_stack(replace(config, host=host, port=0))
        return str(self.stack.url)

    async def stop(self) -> None:
        if self.stack is not None:
            stack, self.stack = self.stack, None
            await stack.close()


class TrajectoryRunner:
    """Runs trajectories on this node; ``gateways`` are the URLs its sessions go to."""

    def __init__(self, agent_spec: str, gateways: list[str], settings: RolloutSettings) -> None:
        self.agent, self.abort_hook = resolve_agent(agent_spec)
        self.gateways = gateways
        self.settings = settings
        self.tracer: SessionTracer | None = None

    async def run(self, prompt: PromptItem, k: int) -> TrajectoryResult:
        if self.tracer is None:
            self.tracer = SessionTracer(self.gateways, timeout=self.settings.collect_timeout)
        result = await run_trajectory(self.tracer, self.agent, prompt, k, self.settings)
        if _maybe_lost(result):
            dead = await self._dead_gateway()
            if dead is not None:
                raise GatewayLost(f"gateway {dead} stopped answering during {result.label}")
        return result

    async def _dead_gateway(self) -> str | None:
        async with httpx.AsyncClient(timeout=HEALTH_TIMEOUT) as http:
            for url in self.gateways:
                try:
                    await http.get(url + "/health")
                except httpx.HTTPError:
                    return url
        return None

    async def abort(self) -> bool:
        """Call the agent module's ``abort()`` (Ctrl-C on the driver)."""
        if self.abort_hook is None:
            return False
        outcome = self.abort_hook()
        if asyncio.iscoroutine(outcome):
            await outcome
        return True

    async def close(self) -> None:
        if self.tracer is not None:
            await self.tracer.aclose()


def _maybe_lost(result: TrajectoryResult) -> bool:
    """An agent error or a failed collect: worth checking that the gateway is alive."""
    if result.error is not None:
        return True
    return any(str(s.metadata.get("aborted_reason") or "").startswith("collect failed")
               for s in result.samples)


# -- the driver --------------------------------------------------------------------------------
@dataclass(slots=True)
class _Node:
    node_id: str
    runner: Any
    gateway: Any = None
    """The node's GatewayActor (None with external gateways)."""
    url: str | None = None
    inflight: int = 0


@dataclass(frozen=True, slots=True)
class _Job:
    prompt: PromptItem
    k: int
    attempt: int = 1

    @property
    def key(self) -> tuple[int, int]:
        return self.prompt.index, self.k


class RayRolloutDriver:
    """:class:`tito.client.rollout.RolloutDriver`'s interface, over a Ray cluster.

    ``address``: what ``ray.init`` takes (``auto``, ``HOST:PORT``, ``ray://...``), or
    ``local`` to start a one-node cluster in this process (on :data:`LOCAL_NODE_IP`).
    ``gateways``: external gateway URLs; None: one gateway per node from ``config``.
    """

    def __init__(self, address: str, agent_spec: str, prompts: list[PromptItem],
                 settings: RolloutSettings, *, config: ServerConfig | None = None,
                 gateways: list[str] | None = None,
                 on_result: Callable[[TrajectoryResult], None] | None = None,
                 max_attempts: int = MAX_ATTEMPTS) -> None:
        if (config is None) == (gateways is None):
            raise ValueError("give a gateway config or external gateway URLs, not both")
        self.address = address
        self.agent_spec = agent_spec_for_workers(agent_spec)
        self.prompts = prompts
        self.settings = settings
        self.config = config
        self.gateways = gateways
        self.on_result = on_result
        self.max_attempts = max_attempts
        self.nodes: dict[str, _Node] = {}
        self.lost_nodes = 0
        self._interrupted = False
        self._abort_called = False
        self._wake = asyncio.Event()
        self._ray: Any = None

    @property
    def total(self) -> int:
        return len(self.prompts) * self.settings.n_per_prompt

    @property
    def description(self) -> str:
        hosts = sorted({urlsplit(n.url).hostname or "?" for n in self.nodes.values() if n.url})
        where = "external gateways" if self.gateways else "a gateway per node" + (
            f" (on {', '.join(hosts)})" if hosts else "")
        return f"Ray cluster {self.address}: {len(self.nodes)} node(s), {where}"

    def interrupt(self) -> None:
        """Stop: the agent's ``abort()`` on every runner, cancel what is in flight."""
        if not self._interrupted:
            self._interrupted = True
            self._wake.set()

    async def connect(self) -> None:
        """Join (or start) the cluster and start the actors on every alive node."""
        local = self.address == "local"
        ray = self._ray = import_ray(loopback=local)
        env = {"env_vars": {k: v for k, v in os.environ.items()
                            if k in ("TITO_API_KEY", "HF_HUB_OFFLINE", "PYTHONPATH")}}
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False,
                                  "runtime_env": env}
        kwargs["address"] = self.address  # local: a new cluster, even beside another one
        if local:
            kwargs.update(include_dashboard=False, _node_ip_address=LOCAL_NODE_IP)
        await _check_reachable(self.address)
        try:
            ray.init(**kwargs)  # in this thread: Ray installs its signal handlers here
        except Exception as exc:
            raise RayUnavailable(f"cannot join the Ray cluster at {self.address!r}: "
                                 f"{type(exc).__name__}: {exc}") from exc
        await self._ensure_nodes()
        if not self.nodes:
            raise RayUnavailable(f"no alive node of the Ray cluster {self.address!r} could "
                                 "start a gateway and a runner (see the log)")

    async def _ensure_nodes(self) -> None:
        """An actor pair on every alive node that has none yet."""
        ray = self._ray
        alive = [n["NodeID"] for n in await asyncio.to_thread(ray.nodes) if n.get("Alive")]
        fresh = [node_id for node_id in alive if node_id not in self.nodes]
        started = await asyncio.gather(*(self._start_node(node_id) for node_id in fresh),
                                       return_exceptions=True)
        for node_id, outcome in zip(fresh, started, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("node %s: cannot start its gateway/runner: %s", node_id[:12],
                            outcome)
            else:
                self.nodes[node_id] = outcome

    async def _start_node(self, node_id: str) -> _Node:
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        pinned = {"num_cpus": 0, "max_restarts": 0,
                  "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
        gateway = url = None
        urls = self.gateways
        if urls is None:
            assert self.config is not None
            gateway = ray.remote(GatewayActor).options(**pinned).remote()
            try:
                url = await gateway.start.remote(self.config)
            except BaseException:
                ray.kill(gateway)
                raise
            urls = [url]
        runner = ray.remote(TrajectoryRunner).options(
            max_concurrency=self.settings.concurrency + 8, **pinned,
        ).remote(self.agent_spec, urls, self.settings)
        return _Node(node_id, runner, gateway, url)

    async def run(self) -> RolloutResult:
        """Run every trajectory (after :meth:`connect`); stops the actors at the end."""
        start = time.monotonic()
        pending = collections.deque(_Job(p, k) for p in self.prompts
                                    for k in range(self.settings.n_per_prompt))
        done: dict[tuple[int, int], TrajectoryResult] = {}
        flying: dict[asyncio.Future[Any], tuple[_Job, _Node, Any]] = {}
        result = RolloutResult(trajectories=[], requested=self.total)
        try:
            while (pending or flying) and not self._interrupted:
                self._launch(pending, flying, done)
                if not flying:  # nothing could be placed: no node left
                    for job in pending:
                        self._record(done, result, _failed(job, "no alive Ray node left"))
                    pending.clear()
                    break
                await self._land(pending, flying, done, result)
        finally:
            if self._interrupted:
                await self._stop_flying(flying)
            await self.shutdown()
        result.trajectories = list(done.values())
        result.cancelled = self.total - len(done)
        result.interrupted = self._interrupted
        result.abort_hook_called = self._abort_called
        result.wall_time = time.monotonic() - start
        return result

    def _launch(self, pending: collections.deque[_Job],
                flying: dict[asyncio.Future[Any], tuple[_Job, _Node, Any]],
                done: dict[tuple[int, int], TrajectoryResult]) -> None:
        while pending and len(flying) < self.settings.concurrency and self.nodes:
            job = pending.popleft()
            if job.key in done:
                continue
            node = min(self.nodes.values(), key=lambda n: n.inflight)
            ref = node.runner.run.remote(job.prompt, job.k)
            node.inflight += 1
            flying[asyncio.wrap_future(ref.future())] = (job, node, ref)

    async def _land(self, pending: collections.deque[_Job],
                    flying: dict[asyncio.Future[Any], tuple[_Job, _Node, Any]],
                    done: dict[tuple[int, int], TrajectoryResult],
                    result: RolloutResult) -> None:
        """Wait for a result (or an interrupt) and take in every one that landed."""
        self._wake.clear()
        wake = asyncio.ensure_future(self._wake.wait())
        landed, _ = await asyncio.wait([*flying, wake], return_when=asyncio.FIRST_COMPLETED)
        wake.cancel()
        lost_runner = False
        for future in landed:
            if future is wake:
                continue
            job, node, _ = flying.pop(future)
            node.inflight -= 1
            try:
                self._record(done, result, future.result())
            except Exception as exc:
                lost_runner |= self._on_failure(exc, job, node, pending, done, result)
        if lost_runner:
            await self._ensure_nodes()

    def _on_failure(self, exc: Exception, job: _Job, node: _Node,
                    pending: collections.deque[_Job],
                    done: dict[tuple[int, int], TrajectoryResult],
                    result: RolloutResult) -> bool:
        """A run that gave no result: queue it again if its node or gateway was lost
        (True: a runner was retired), else record the error."""
        ray = self._ray
        lost = isinstance(exc, GatewayLost | ray.exceptions.RayActorError
                          | ray.exceptions.NodeDiedError | ray.exceptions.WorkerCrashedError
                          | ray.exceptions.ObjectLostError | ray.exceptions.OwnerDiedError)
        if not lost:
            self._record(done, result, _failed(job, f"{type(exc).__name__}: {exc}"))
            return False
        retired = self._retire(node, exc)
        if job.key in done:
            return retired
        if job.attempt >= self.max_attempts:
            self._record(done, result, _failed(job, f"lost its node or gateway "
                                                    f"{job.attempt} times; last: {exc}"))
        else:
            result.requeued += 1
            pending.appendleft(replace(job, attempt=job.attempt + 1))
        return retired

    def _retire(self, node: _Node, exc: Exception) -> bool:
        if self.nodes.pop(node.node_id, None) is None:
            return False
        self.lost_nodes += 1
        log.warning("node %s lost (%s): its trajectories run again elsewhere",
                    node.node_id[:12], type(exc).__name__)
        for actor in (node.runner, node.gateway):
            if actor is not None:
                self._ray.kill(actor)
        return True

    def _record(self, done: dict[tuple[int, int], TrajectoryResult], result: RolloutResult,
                trajectory: TrajectoryResult) -> None:
        key = (trajectory.prompt_index, trajectory.sample_index)
        if key in done:
            result.duplicates_dropped += 1
            return
        done[key] = trajectory
        if self.on_result is not None:
            self.on_result(trajectory)

    async def _stop_flying(self,
                           flying: dict[asyncio.Future[Any], tuple[_Job, _Node, Any]]) -> None:
        ray = self._ray
        calls = [node.runner.abort.remote() for node in self.nodes.values()]
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            self._abort_called |= outcome is True
        for _, _, ref in flying.values():
            ray.cancel(ref)
        await asyncio.wait(list(flying), timeout=10)

    async def shutdown(self) -> None:
        ray = self._ray
        if ray is None:
            return
        closing = [n.runner.close.remote() for n in self.nodes.values()]
        closing += [n.gateway.stop.remote() for n in self.nodes.values() if n.gateway]
        if closing:
            await asyncio.wait([asyncio.wrap_future(r.future()) for r in closing], timeout=30)
        for node in self.nodes.values():
            for actor in (node.runner, node.gateway):
                if actor is not None:
                    ray.kill(actor)
        self.nodes.clear()
        await asyncio.to_thread(ray.shutdown)


def _failed(job: _Job, error: str) -> TrajectoryResult:
    return TrajectoryResult(job.prompt.index, job.k, error=error)

"""The tracer: create a session, hand its URL to an agent, collect its samples.

``collect`` is one ``POST /sessions/<id>/samples`` followed by a ``DELETE`` in
``finally`` (design §7): a session must never outlive its collection. A timeout or
transport error during the POST turns the trajectory into one ABORTED sample; any other
failure raises. Create, collect and delete are sent again when a stale pooled connection
failed them before the gateway read them (:mod:`tito.client.stale`): a request the
gateway never ran, not a retry of one it answered.

Over the workers of ``tito serve --workers N`` (whose supervisor restarts a worker that
dies), the tracer works around a dead worker: a new session whose worker refuses the
connection goes to the next worker (and that worker is skipped for :data:`DOWN_FOR_S`
seconds), and a collection whose worker refuses the connection (the request never left)
is tried again every :data:`RETRY_EVERY_S` seconds until the worker is back or
``worker_wait`` seconds have passed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import httpx
import numpy as np

from tito.client.stale import send_idempotent
from tito.samples import DecodedSamples, Sample, decode_samples
from tito.types.placement import gateway_for, gateway_of

log = logging.getLogger("tito.client")
DOWN_FOR_S = 5.0
"""A worker that failed to create a session gets no new sessions for this long (unless
every worker is down)."""
RETRY_EVERY_S = 0.5
"""A collection on a worker that refuses connections is tried again this often."""
WORKER_WAIT_S = 60.0
"""Default wait for a dead worker to come back (several workers; one gateway: none)."""
WAIT_FOR = (httpx.ConnectError, httpx.ConnectTimeout)
"""Transport failures that show the request never reached the gateway."""


@dataclass(frozen=True, slots=True)
class TracedSession:
    session_id: str
    base_url: str
    """``<gateway>/sessions/<id>``: what the agent uses as its API base (append ``/v1``)."""


class CollectError(RuntimeError):
    """The gateway refused to create a session or to assemble samples (e.g. 422); the
    message has its reply, ``status`` its HTTP status."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def aborted_sample(reason: str, metadata: dict[str, Any] | None = None) -> Sample:
    """An empty ABORTED sample standing for a trajectory that produced no training data."""
    return Sample(
        tokens=np.zeros(0, dtype=np.int64), response_length=0,
        loss_mask=np.zeros(0, dtype=np.uint8), rollout_log_probs=np.zeros(0, dtype=np.float64),
        status="aborted", metadata={**(metadata or {}), "aborted_reason": reason},
    )


class SessionTracer:
    def __init__(self, gateway_url: str | Sequence[str], *, timeout: float = 120.0,
                 client: httpx.AsyncClient | None = None,
                 api_key: str | None = None, worker_wait: float | None = None) -> None:
        """``gateway_url``: one gateway, or the workers of ``tito serve --workers N`` (a
        list, or URLs separated by commas, in worker order): each new session goes to
        one of them (:meth:`create`). ``api_key``: the gateway's ``--api-key`` (default:
        ``$TITO_API_KEY``), sent as ``Authorization: Bearer`` by a client the tracer
        creates. ``worker_wait``: seconds a collection waits for its dead worker to come
        back (default :data:`WORKER_WAIT_S` with several workers, 0 with one gateway:
        nothing restarts it)."""
        urls = gateway_url.split(",") if isinstance(gateway_url, str) else list(gateway_url)
        self.gateway_urls = [u.strip().rstrip("/") for u in urls if u.strip()]
        if not self.gateway_urls:
            raise ValueError("SessionTracer needs a gateway URL")
        self.gateway_url = self.gateway_urls[0]
        self._next = itertools.count()
        self._down: dict[str, float] = {}
        """Worker URL -> until when it gets no new sessions."""
        self.worker_wait = worker_wait if worker_wait is not None else \
            WORKER_WAIT_S if len(self.gateway_urls) > 1 else 0.0
        self.timeout = timeout
        key = api_key if api_key is not None else os.environ.get("TITO_API_KEY")
        headers = {"authorization": f"Bearer {key}"} if key else None
        self._client = client or httpx.AsyncClient(timeout=timeout, headers=headers)
        self._owns_client = client is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    def place(self, key: object = None) -> str:
        """The gateway for a new session: by a stable hash of ``key`` (the same key, the
        same worker), else in turn (:meth:`create` moves on from a dead one)."""
        if len(self.gateway_urls) == 1:
            return self.gateway_url
        if key is None:
            return self.gateway_urls[next(self._next) % len(self.gateway_urls)]
        return gateway_for(key, self.gateway_urls)

    def url_of(self, session_id: str) -> str:
        """``<gateway>/sessions/<id>`` of a session, its worker read from its id."""
        return f"{gateway_of(session_id, self.gateway_urls)}/sessions/{session_id}"

    def _candidates(self, first: str) -> list[str]:
        """Every gateway from ``first`` on, in worker order: the live ones first."""
        urls = self.gateway_urls
        start = urls.index(first)
        ring = urls[start:] + urls[:start]
        now = time.monotonic()
        return [u for u in ring if self._down.get(u, 0.0) <= now] + \
            [u for u in ring if self._down.get(u, 0.0) > now]

    async def create(self, key: object = None, options: dict[str, Any] | None = None
                     ) -> TracedSession:
        """A new session on one of the gateways (see :meth:`place`); a worker that cannot
        be reached is passed over for the next (its transport error is raised when no
        worker can be reached). ``options``: the ``POST /sessions`` body (sampling defaults,
        ``evaluation``)."""
        candidates = self._candidates(self.place(key))
        for gateway in candidates:
            try:
                resp = await send_idempotent(self._client, "POST", f"{gateway}/sessions",
                                             json=options)
            except httpx.TransportError as exc:
                if gateway == candidates[-1]:
                    raise
                self._down[gateway] = time.monotonic() + DOWN_FOR_S
                log.warning("creating a session on %s failed (%s); trying the next worker",
                            gateway, exc)
                continue
            self._down.pop(gateway, None)
            if resp.status_code != 200:
                raise CollectError(f"POST /sessions failed with {resp.status_code}: "
                                   f"{resp.text}", status=resp.status_code)
            session_id = resp.json()["session_id"]
            return TracedSession(session_id, f"{gateway}/sessions/{session_id}")
        raise AssertionError("unreachable: the last candidate raises")

    async def delete(self, session: TracedSession) -> None:
        try:
            await send_idempotent(self._client, "DELETE", session.base_url)
        except httpx.HTTPError as exc:  # the session expires by TTL anyway
            log.warning("DELETE %s failed: %s", session.base_url, exc)

    async def finish(self, session: TracedSession, *, producer_finished: bool = True,
                     timeout: float = 60.0) -> dict[str, Any]:
        """``POST /sessions/<id>/finish``: close admission, wait for the admitted turns,
        seal a snapshot; its reply (``snapshot_id``, ``complete`` ...)."""
        resp = await send_idempotent(self._client, "POST", f"{session.base_url}/finish",
                                     json={"producer_finished": producer_finished,
                                           "timeout": timeout})
        if resp.status_code != 200:
            raise CollectError(f"POST {session.base_url}/finish failed with "
                               f"{resp.status_code}: {resp.text[:2000]}",
                               status=resp.status_code)
        return dict(resp.json())

    async def collect(self, session: TracedSession, *, max_seq_len: int | None = None,
                      metadata: dict[str, Any] | None = None,
                      include_response: bool = True,
                      abort_on_transport_error: bool = True,
                      snapshot_id: str | None = None,
                      weight_versions_format: str | None = None) -> DecodedSamples:
        """Assemble and fetch the samples, then delete the session (always).

        ``include_response=False`` leaves the decoded response text out of the payload
        (``Sample.response`` is None): the reply is then the tensors plus small JSON.
        ``abort_on_transport_error=False`` raises the timeout or transport error instead
        of returning one ABORTED sample. ``snapshot_id``: the snapshot a :meth:`finish`
        sealed (the newer lifecycle). ``weight_versions_format``: ``versions`` or
        ``spans`` (``Sample.weight_version_calls`` filled); None: the gateway's default.
        """
        body: dict[str, Any] = {"max_seq_len": max_seq_len}
        if snapshot_id is not None:
            body["snapshot_id"] = snapshot_id
        if metadata is not None:
            body["metadata"] = metadata
        if not include_response:
            body["include_response"] = False
        if weight_versions_format is not None:
            body["weight_versions_format"] = weight_versions_format
        try:
            try:
                resp = await self._post_samples(session, body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                if not abort_on_transport_error:
                    raise
                log.warning("collecting %s failed: %s", session.session_id, exc)
                return DecodedSamples([aborted_sample(f"collect failed: {exc!r}")], {}, None)
            if resp.status_code != 200:
                raise CollectError(
                    f"POST {session.base_url}/samples failed with {resp.status_code}: "
                    f"{resp.text[:2000]}", status=resp.status_code)
            return decode_samples(resp.content)
        finally:
            await self.delete(session)

    async def _post_samples(self, session: TracedSession, body: dict[str, Any]
                            ) -> httpx.Response:
        """The collection, tried again while its worker refuses connections (it never
        received the request), for up to :attr:`worker_wait` seconds."""
        deadline = time.monotonic() + self.worker_wait
        while True:
            try:
                return await send_idempotent(self._client, "POST",
                                             f"{session.base_url}/samples", json=body)
            except WAIT_FOR as exc:
                if time.monotonic() + RETRY_EVERY_S > deadline:
                    if not self.worker_wait:
                        raise
                    raise type(exc)(f"the gateway worker of session {session.session_id} "
                                    f"({session.base_url}) stayed down for "
                                    f"{self.worker_wait:g}s: {exc}",
                                    request=exc.request) from exc
            await asyncio.sleep(RETRY_EVERY_S)

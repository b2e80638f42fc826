"""How the mock streams a ``/generate`` request (``stream: true``), as SGLang does.

Generation runs as a task of its own (:meth:`Lifecycle.drive`, tokens at the configured
latency by the wall clock) while the writer sends chunks, so a reader that is behind gets
SGLang's coalescing (``tokenizer_manager._wait_one_response``):

- **cumulative** (SGLang's default): each chunk holds every id so far, its logprob
  entries and text; chunks that queued while the reader was behind are dropped but the
  newest;
- **incremental** (``--incremental-streaming-output``, :attr:`MockConfig.
  incremental_streaming_output`): each chunk holds the ids, entries and text since the
  previous chunk; queued chunks are joined.

Chunks come every ``stream_interval`` ids (a sampling parameter; SGLang's server default
is 1); ``meta_info.completion_tokens`` counts all ids so far in both modes. The last chunk
has the finish reason (whole fields but, in incremental mode, the ids, logprobs and text
since the previous chunk), then ``data: [DONE]``. A client that goes away aborts the
request. The request log entry (``GET /mock/requests``) counts the chunks sent
(``stream_chunks``).

Faults (:mod:`tito.engines.mock.faults`) apply to streams too: ``http_500`` and ``reset``
answer as for a plain request (no stream is started); ``slow`` delays the first byte;
``bad_ids``, ``bad_logprob`` and ``wrong_types`` change the first chunk sent and the final
one; ``malformed_json`` cuts the final chunk's JSON in half; ``reset:partial`` closes the
connection after the first chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request

from tito.engines.mock.faults import Fault, corrupt, fault_delay, terminal_fault
from tito.engines.mock.faulty import connection_transport
from tito.engines.mock.lifecycle import Lifecycle, ReqState
from tito.engines.mock.replies import Replies

DONE = b"data: [DONE]\n\n"


def streams_normally(faults: Sequence[Fault]) -> bool:
    """Whether a streamed request with ``faults`` gets a stream (not an error status or
    a reset before any byte)."""
    terminal = terminal_fault(faults)
    return terminal is None or terminal.mode == "malformed_json" or (
        terminal.mode == "reset" and terminal.arg == "partial")


@dataclass
class _Progress:
    latest: int = 0
    done: bool = False
    event: asyncio.Event = field(default_factory=asyncio.Event)


async def _produce(core: Lifecycle, req: ReqState, progress: _Progress) -> None:
    try:
        async for n in core.drive(req):
            progress.latest = n
            progress.event.set()
    finally:
        progress.done = True
        progress.event.set()


def _sse(chunk: dict[str, Any], *, cut: bool = False) -> bytes:
    body = orjson.dumps(chunk)
    return b"data: " + (body[: len(body) // 2] if cut else body) + b"\n\n"


@dataclass
class MockStream:
    """One streamed request: its generation task and the chunks it sends."""

    core: Lifecycle
    replies: Replies
    req: ReqState
    faults: tuple[Fault, ...]
    incremental: bool
    request: Request

    async def events(self) -> AsyncIterator[bytes]:
        progress = _Progress()
        await self.core.sleep(self.req, fault_delay(self.faults))
        task = asyncio.create_task(_produce(self.core, self.req, progress))
        sent = 0
        try:
            async for upto in self._boundaries(progress):
                chunk = self.replies.chunk(self.req, self.core.weight_version, sent, upto,
                                           incremental=self.incremental)
                if sent == 0:
                    corrupt(chunk, self.faults, vocab_size=self.replies.tokenizer.vocab_size)
                self.req.log["stream_chunks"] = self.req.log.get("stream_chunks", 0) + 1
                yield _sse(chunk)
                if sent == 0 and self._partial_reset():
                    return
                sent = upto
            await task
            self.core.finish(self.req)
            self.req.log["stream_chunks"] = self.req.log.get("stream_chunks", 0) + 1
            yield self._final(sent)
            yield DONE
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if not self.req.finished:  # the client went away: abort, as SGLang does
                self.core.abort(self.req)
                self.core.finish(self.req)

    async def _boundaries(self, progress: _Progress) -> AsyncIterator[int]:
        """The id counts to send a chunk after: the newest multiple of the stream
        interval each time the reader is ready, until the request ends."""
        interval = max(1, self.req.sampling_params.get("stream_interval") or 1)
        sent = 0
        while True:
            await progress.event.wait()
            progress.event.clear()
            if progress.done:
                return
            total = len(self.req.plan.output_ids) if self.req.plan else 0
            upto = progress.latest - progress.latest % interval
            if sent < upto < total:
                sent = upto
                yield upto

    def _final(self, sent: int) -> bytes:
        final = self.replies.final_chunk(self.req, self.core.weight_version, sent,
                                         incremental=self.incremental)
        corrupt(final, self.faults, vocab_size=self.replies.tokenizer.vocab_size)
        return _sse(final, cut=any(f.mode == "malformed_json" for f in self.faults))

    def _partial_reset(self) -> bool:
        """``reset:partial``: close the connection now (after the first chunk)."""
        if not any(f.mode == "reset" and f.arg == "partial" for f in self.faults):
            return False
        transport = connection_transport(self.request)
        if transport is not None:
            transport.close()
        return True

"""sse_data: the ``data:`` payloads of a server-sent event stream, whatever the network
reads it comes in (lines across many reads are joined once from views of them)."""

from __future__ import annotations

import asyncio
import itertools
import socket

from aiohttp import StreamReader
from aiohttp.base_protocol import BaseProtocol
from helpers.support import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from tito.engines.transport import sse_data


def payload(line: bytes) -> bytes | None:
    """The server-sent events rule for one line, written plainly."""
    rest = line.lstrip(b" \t\r")
    if not rest.startswith(b"data:"):
        return None
    return rest[5:].lstrip(b" \t").rstrip(b" \t\r")


async def read(stream: bytes, cuts: list[int]) -> list[bytes]:
    """``sse_data`` over an aiohttp StreamReader fed ``stream`` in the pieces ``cuts``
    make, one network read at a time."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()  # a real connection for the reader's protocol
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    protocol = BaseProtocol(loop)
    protocol.connection_made(transport)
    reader = StreamReader(protocol, 1 << 16, loop=loop)
    bounds = [0, *sorted(set(cuts)), len(stream)]

    async def feed() -> None:
        for a, b in itertools.pairwise(bounds):
            if b > a:
                reader.feed_data(stream[a:b])
                for _ in range(3):  # the reader takes it before the next piece comes
                    await asyncio.sleep(0)
        reader.feed_eof()

    task = asyncio.create_task(feed())
    try:
        got = [data async for data in sse_data(reader)]
        await task
    finally:
        transport.close()
        theirs.close()
    return got


_blank = st.sampled_from([b"", b" ", b"\t", b"\r", b" \r", b"\t \t"])
_text = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"."))
_body = st.one_of(_text, st.builds(lambda t, n: t * n, _text, st.integers(1, 60)),
                  st.just(b" " * 70), st.just(b"\r" * 80))
_line = st.one_of(
    st.builds(lambda a, sp, body, z: a + b"data:" + sp + body + z, _blank,
              st.sampled_from([b"", b" ", b"  ", b"\t", b" " * 70]), _body, _blank),
    st.builds(lambda a, body: a + body, _blank, _body),  # a comment, a field, blanks
    st.builds(lambda n: b" " * n + b"data: x", st.integers(0, 100)),
)


@settings(max_examples=examples(300), deadline=None)
@given(lines=st.lists(_line, max_size=8), end=st.booleans(),
       cuts=st.lists(st.integers(0, 4000), max_size=30))
async def test_payloads_are_the_plain_rule_s_whatever_the_reads(
        lines: list[bytes], end: bool, cuts: list[int]) -> None:
    stream = b"\n".join(lines) + (b"\n" if end else b"")
    cuts = [c % (len(stream) + 1) for c in cuts]
    want = [p for p in map(payload, stream.split(b"\n")) if p is not None]
    assert await read(stream, cuts) == want


async def test_a_long_line_over_many_reads_is_one_payload() -> None:
    body = bytes(range(256)).replace(b"\n", b"") * 4000  # ~1 MB
    stream = b"data: " + body + b" \r\n\r\ndata:[DONE]\n\n"
    cuts = list(range(1, len(stream), 4093))
    assert await read(stream, cuts) == [body, b"[DONE]"]

"""TCP_NODELAY on the sockets our servers accept, for every entry point.

Without it every small response waits ~40 ms for a delayed ACK (Nagle). asyncio sets it
only on ``IPPROTO_TCP`` listening sockets, which :func:`tito.net.bind_tcp` makes. We open
a keep-alive connection, then look at the server's end of it: in this process for the
in-process stack (``tito rollout`` and the demo start it), in the child for ``tito serve``
and ``tito mock-engine`` (a duplicate of its descriptor, with ``pidfd_getfd``).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from helpers.support import start_gateway, start_mock

from tito.config import ServerConfig
from tito.stack import start_stack

pytestmark = pytest.mark.slow  # real server processes

SYS_PIDFD_GETFD = 438  # x86_64 and aarch64


@contextmanager
def open_connection(url: str) -> Iterator[socket.socket]:
    """A keep-alive connection that has been served one request."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: keep-alive\r\n\r\n")
        assert conn.recv(65536).startswith(b"HTTP/1.1 200")
        yield conn


def _dup_fd(pid: int, fd: int) -> int:
    if pid == os.getpid():
        return os.dup(fd)
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        new = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
    finally:
        os.close(pidfd)
    if new < 0:
        err = ctypes.get_errno()
        if err in (errno.EPERM, errno.ENOSYS, errno.EACCES):
            pytest.skip(f"pidfd_getfd is not permitted here ({os.strerror(err)})")
        raise OSError(err, os.strerror(err))
    return int(new)


def accepted_nodelay(pid: int, client: socket.socket) -> int:
    """TCP_NODELAY of the socket in ``pid`` whose peer is ``client``."""
    ours = client.getsockname()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                continue
        except OSError:
            continue
        sock = socket.socket(fileno=_dup_fd(pid, int(name)))
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and \
                    sock.type == socket.SOCK_STREAM and sock.getpeername() == ours:
                return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        except OSError:
            pass
        finally:
            sock.close()
    raise AssertionError(f"no socket of pid {pid} is connected to {ours}")


def server_nodelay(url: str, pid: int) -> int:
    """TCP_NODELAY of the server's end of a fresh connection to ``url`` (served by ``pid``)."""
    with open_connection(url) as conn:
        return accepted_nodelay(pid, conn)


def test_tito_serve_and_mock_engine_processes(qwen3_dir: Path) -> None:
    engine = start_mock(qwen3_dir, "qwen3")
    try:
        gateway = start_gateway(engine.url, qwen3_dir, "qwen3")
        try:
            for proc in (gateway, engine):
                assert server_nodelay(proc.url, proc.pid) == 1, proc.name
        finally:
            gateway.stop()
    finally:
        engine.stop()


async def test_in_process_stack_of_rollout_and_demo(qwen3_dir: Path) -> None:
    stack = await start_stack(ServerConfig(tokenizer=str(qwen3_dir), family="qwen3",
                                           engine="mock", port=0, log_level="warning"))
    try:
        assert stack.engine_process is not None
        for url, pid in ((stack.url, os.getpid()),
                         (stack.engine_process.url, stack.engine_process.pid)):
            # blocking socket work off the loop: the in-process server must keep serving
            assert await asyncio.to_thread(server_nodelay, url, pid) == 1, url
    finally:
        await stack.close()


def test_plain_socket_would_have_nagle_on() -> None:
    """The check itself can fail: an ``AF_INET`` socket without the protocol has it off."""
    server = socket.socket(socket.AF_INET)
    server.bind(("127.0.0.1", 0))
    server.listen()
    with socket.create_connection(server.getsockname()) as client:
        accepted, _ = server.accept()
        with accepted:
            assert accepted_nodelay(os.getpid(), client) == 0
    server.close()

"""The harness suite's guard: while a harness runs, nothing but loopback is reachable.

The socket functions under the guard are replaced by recorders first, so that even a
broken guard sends nothing off the machine: the test then sees the recorder reached.
"""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest
from helpers.harness import HarnessStack, loopback_only


def test_names_and_addresses_off_the_machine_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reached: list[Any] = []

    def recorder(*args: Any, **kwargs: Any) -> Any:
        reached.append(args)
        raise ConnectionRefusedError("recorder: not sent")

    monkeypatch.setattr(socket, "getaddrinfo", recorder)
    monkeypatch.setattr(socket, "gethostbyname", recorder)
    monkeypatch.setattr(socket.socket, "connect", recorder)
    monkeypatch.setattr(socket.socket, "connect_ex", recorder)
    with loopback_only():
        with pytest.raises(OSError, match="offline"):
            socket.getaddrinfo("api.openai.com", 443)
        with pytest.raises(OSError, match="offline"):
            socket.gethostbyname("api.anthropic.com")
        with pytest.raises(httpx.ConnectError, match="offline"):
            httpx.get("https://api.openai.com/v1/models")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            with pytest.raises(OSError, match="offline"):
                sock.connect(("192.0.2.1", 443))
            with pytest.raises(OSError, match="offline"):
                sock.connect_ex(("2001:db8::1", 443))
        assert reached == []
        # loopback goes through to the (recorded) functions
        with pytest.raises(ConnectionRefusedError):
            socket.getaddrinfo("localhost", 80)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            with pytest.raises(ConnectionRefusedError):
                sock.connect(("127.0.0.1", 9))
    assert len(reached) == 2
    assert socket.getaddrinfo is recorder  # the guard put back what it found


@pytest.mark.slow
def test_a_gateway_on_loopback_stays_reachable(harness: HarnessStack) -> None:
    with loopback_only():
        assert httpx.get(harness.gateways["v1"].url + "/health").status_code == 200

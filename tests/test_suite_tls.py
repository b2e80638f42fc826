"""The suite's shared TLS context (tests/helpers/tls.py, installed by conftest.py) is in
effect: without it every httpx client loads the CA bundle again (~20 ms each, ~700 clients,
15% of the fast tier's CPU). An httpx upgrade that drops the hook fails here, not silently."""

from __future__ import annotations

import ssl

import httpx


def _context(client: httpx.Client) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # type: ignore[attr-defined]


def test_default_clients_share_one_context() -> None:
    with httpx.Client() as a, httpx.Client(timeout=3) as b:
        assert _context(a) is _context(b)
        assert _context(a).verify_mode == ssl.CERT_REQUIRED


def test_other_verify_settings_get_their_own_context() -> None:
    with httpx.Client() as shared, httpx.Client(verify=False) as loose:
        assert _context(loose) is not _context(shared)
        assert _context(loose).verify_mode == ssl.CERT_NONE

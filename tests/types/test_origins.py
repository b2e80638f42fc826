"""Web origins compare as (scheme, host, port), the port defaulting to the scheme's."""

from __future__ import annotations

import pytest

from tito.types.origins import bad_origin, origin_set, parse_origin


@pytest.mark.parametrize(("text", "origin"), [
    ("http://127.0.0.1:8000", ("http", "127.0.0.1", 8000)),
    ("HTTP://LocalHost", ("http", "localhost", 80)),
    ("https://example.org", ("https", "example.org", 443)),
    ("https://example.org:443", ("https", "example.org", 443)),
    ("http://[::1]:9000", ("http", "::1", 9000)),
])
def test_parse_origin(text: str, origin: tuple[str, str, int]) -> None:
    assert parse_origin(text) == origin


@pytest.mark.parametrize("text", ["null", "", "localhost:8000", "ftp://x", "http://",
                                  "http://x:99999", "http://x:port", "http://x/path",
                                  "http://x?q", "http://u@x", "file:///etc/passwd"])
def test_not_origins(text: str) -> None:
    assert parse_origin(text) is None


def test_origin_lists() -> None:
    assert bad_origin(["*", "http://a:1", "https://b/"]) is None
    assert bad_origin(["http://a:1", "a:1"]) == "a:1"
    assert origin_set(None) == frozenset()
    assert origin_set([" http://a:1 ", "https://b/"]) == {("http", "a", 1),
                                                          ("https", "b", 443)}
    assert origin_set(["http://a:1", "*"]) is None  # any origin

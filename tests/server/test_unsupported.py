"""Hosted tools and images: one wording of the refusal, the marker, one warning a tool."""

from __future__ import annotations

import logging

import pytest

from tito.server.unsupported import (
    IMAGE_MARKER,
    hosted_tools_refused,
    image_text,
    warn_hosted_once,
)
from tito.types.errors import BadRequest


def test_an_image_is_refused_by_default_and_a_marker_under_placeholder() -> None:
    with pytest.raises(BadRequest, match=r"messages\[1\].content\[0\] is an image") as info:
        image_text("reject", "messages[1].content[0]")
    assert info.value.code == "unsupported_content"
    assert "--images placeholder" in info.value.message
    assert image_text("placeholder", "x") == IMAGE_MARKER


def test_hosted_tools_are_refused_only_under_error() -> None:
    hosted_tools_refused("drop", ["web_search"], "tools")
    hosted_tools_refused("error", [], "tools")
    with pytest.raises(BadRequest, match="web_search, mcp") as info:
        hosted_tools_refused("error", ["web_search", "mcp"], "tools")
    assert info.value.code == "unsupported_tool"


def test_a_hosted_tool_is_logged_once_per_session(caplog: pytest.LogCaptureFixture) -> None:
    warned: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="tito.server"):
        warn_hosted_once(warned, "s1", ["web_search"])
        warn_hosted_once(warned, "s1", ["web_search"])
        warn_hosted_once(warned, "s1", ["web_search", "mcp"])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "web_search" in lines[0] and "mcp" in lines[1]
    assert "web_search" not in lines[1]

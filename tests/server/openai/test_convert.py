"""The Chat body -> core turn conversion: image parts past the stored prefix."""

from __future__ import annotations

from typing import Any

import pytest

from tito.server.openai.convert import image_markers, turn_request
from tito.server.openai.models import validate_chat
from tito.types.errors import BadRequest

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}


def user(text: str, image: bool = False) -> dict[str, Any]:
    parts: list[Any] = [{"type": "text", "text": text}]
    return {"role": "user", "content": [*parts, IMAGE] if image else parts}


def test_the_scan_starts_past_the_prefix_known_to_have_no_image() -> None:
    messages = [user("a"), {"role": "assistant", "content": "b"}, user("c", image=True)]
    for start in range(3):
        got, replaced = image_markers(messages, "placeholder", start=start)
        assert (got, replaced) == image_markers(messages, "placeholder")
        assert replaced == 1 and got[0] is messages[0] and got[2] is not messages[2]
    assert image_markers(messages, "placeholder", start=3) == (messages, 0)
    with pytest.raises(BadRequest, match=r"messages\[2\]\.content\[1\]"):
        image_markers(messages, "reject", start=2)


def test_a_turn_scans_only_past_its_verified_stored_prefix() -> None:
    stored: list[Any] = [user("a"), {"role": "assistant", "content": "b"}]
    data = {"messages": [*stored, user("c", image=True)]}
    chat, verified = validate_chat(data, stored=stored)
    assert verified
    turn = turn_request(data, chat, stored_prefix=stored, images="placeholder")
    whole = turn_request(data, chat, images="placeholder")
    assert turn.messages == whole.messages and turn.notes == whole.notes == {
        "images_replaced": 1}

"""Images in Chat Completions (``image_url`` parts in user and tool messages), through the
real ``openai`` SDK against real ``tito serve`` + ``tito mock-engine`` processes: 400
``unsupported_content`` by default, the marker in place under ``--images placeholder``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers.support import Proc, engine_log, new_session, start_gateway

from tito.samples import decode_samples
from tito.server.unsupported import IMAGE_MARKER
from tito.types.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow  # a gateway over the real mock engine per case

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
READ = [{"type": "function", "function": {"name": "read", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def placeholder(qwen3_stack: tuple[Proc, Proc], qwen3_dir: Path) -> Iterator[Proc]:
    engine, _ = qwen3_stack
    gateway = start_gateway(engine.url, qwen3_dir, "qwen3", "--images", "placeholder")
    try:
        yield gateway
    finally:
        gateway.stop()


def client(url: str, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x", max_retries=0)


def history(first: Any) -> list[dict[str, Any]]:
    call = first.tool_calls[0]
    return [{"role": "user", "content": 'CALL read {"path": "shot.png"}'},
            first.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": [IMAGE]},
            {"role": "user", "content": [{"type": "text", "text": "What is it? "}, IMAGE,
                                         {"type": "text", "text": "\nSAY A screenshot."}]}]


def first_turn(url: str, sid: str) -> Any:
    reply = client(url, sid).chat.completions.create(
        model="m", max_tokens=32, tools=READ,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": 'CALL read {"path": "shot.png"}'}])
    return reply.choices[0].message


def test_an_image_is_refused_by_default(stack: Any) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    messages = history(first_turn(gateway.url, sid))
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway.url, sid).chat.completions.create(
            model="m", max_tokens=16, tools=READ, messages=messages)  # type: ignore[arg-type]
    assert caught.value.code == "unsupported_content"
    assert "messages[2].content[0] is an image" in caught.value.message
    assert httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]["num_turns"] == 1


def test_images_become_markers_under_images_placeholder(
        placeholder: Proc, qwen3_stack: tuple[Proc, Proc], qwen3_dir: Path) -> None:
    engine, _ = qwen3_stack
    sid = new_session(placeholder.url)
    sdk = client(placeholder.url, sid)
    messages = history(first_turn(placeholder.url, sid))
    reply = sdk.chat.completions.create(model="m", max_tokens=16, tools=READ,  # type: ignore[arg-type]
                                        messages=messages)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "A screenshot."
    text = load_tokenizer(qwen3_dir).decode(engine_log(engine.url, sid)[-1]["input_ids"])
    assert f"<tool_response>\n{IMAGE_MARKER}\n</tool_response>" in text
    assert f"What is it? {IMAGE_MARKER}\nSAY A screenshot." in text
    # the same history again, one turn longer: it matches what was stored
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "SAY Done."}]
    sdk.chat.completions.create(model="m", max_tokens=16, tools=READ,  # type: ignore[arg-type]
                                messages=messages)  # type: ignore[arg-type]
    resp = httpx.post(f"{placeholder.url}/sessions/{sid}/samples", json={})
    (sample,) = decode_samples(resp.content).samples
    assert sample.metadata["num_turns"] == 3
    assert sample.metadata["tito_turn_notes"] == [{"turn": 1, "images_replaced": 2},
                                                  {"turn": 2, "images_replaced": 2}]


def test_an_image_in_an_assistant_message_is_a_400(placeholder: Proc) -> None:
    sid = new_session(placeholder.url)
    with pytest.raises(openai.BadRequestError) as caught:
        client(placeholder.url, sid).chat.completions.create(
            model="m", max_tokens=16, messages=[  # type: ignore[misc]
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [IMAGE]},  # type: ignore[list-item]
                {"role": "user", "content": "SAY x"}])
    assert "only user and tool messages" in caught.value.message

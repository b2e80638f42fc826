"""Decoding a Responses body past the session's last one gives what decoding it whole
gives (request, chat messages, errors), with the earlier items' conversion reused."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from tito.server.api_state import ApiState
from tito.server.responses.decode import LastBody, decode_responses
from tito.types.errors import BadRequest

TEXT = "the quick brown fox jumps over the lazy dog "


def body(items: list[dict[str, Any]], **rest: Any) -> bytes:
    return orjson.dumps({"model": "m", "input": items, **rest})


def reasoning(k: int) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{k}",
            "summary": [{"type": "summary_text", "text": f"plan {k}"}]}


def said(k: int) -> dict[str, Any]:
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": TEXT + str(k)}]}


def call(k: int) -> dict[str, Any]:
    return {"type": "function_call", "call_id": f"call_{k}", "name": "bash",
            "arguments": '{"cmd": "ls"}'}


def output(k: int) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": f"call_{k}", "output": TEXT * 2}


def looked(k: int) -> dict[str, Any]:
    """A user message and a function call's output, with images."""
    return {"type": "function_call_output", "call_id": f"call_{k}", "output": [
        {"type": "input_text", "text": "see"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}


def decoded(raw: bytes, state: ApiState | None,
            known: list[dict[str, Any]] | None = None) -> tuple[Any, ...]:
    images: list[str] = []
    try:
        request, messages = decode_responses(raw, 64, state=state, stored=known,
                                             images=images)
    except BadRequest as exc:
        return "error", exc.message
    return request.model_dump(), messages, images


def test_a_growing_input_decodes_as_whole_and_reuses_the_earlier_conversion() -> None:
    state = ApiState()
    items: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    previous: LastBody | None = None
    for k in range(6):
        raw = body(items, instructions="be brief")
        assert decoded(raw, state) == decoded(raw, None)
        last: LastBody = state.responses_body
        if previous is not None:  # the earlier messages were not converted again
            kept = previous.open_chat
            assert all(a is b for a, b in zip(last.chat[:kept], previous.chat[:kept],
                                              strict=True))
        # the state keeps placeholders and the items of the open tail only
        assert last.parsed is not None and set(last.parsed.items) == {None}
        assert last.request.input == [] and len(last.open_items) <= 4
        previous = last
        items += [reasoning(k), said(k), call(k), output(k)]


def test_an_assistant_turn_continued_across_bodies_is_one_message() -> None:
    """A body that ends inside an assistant turn (a prefill), extended by the rest of the
    turn: the conversion resumes before the turn, which stays one message."""
    state = ApiState()
    items = [{"role": "user", "content": "start"}, reasoning(0), said(0)]
    assert decoded(body(items), state) == decoded(body(items), None)
    items += [call(0), output(0)]
    got = decoded(body(items), state)
    assert got == decoded(body(items), None)
    assert [m["role"] for m in got[1]] == ["user", "assistant", "tool"]
    assert got[1][1]["tool_calls"][0]["id"] == "call_0"


def test_the_stored_messages_replace_the_same_json() -> None:
    state = ApiState()
    first = [{"role": "user", "content": "start"}]
    _, messages = decode_responses(body(first, instructions="be brief"), 64, state=state)
    turn = [{"role": "system", "content": "be brief"}, *messages]
    items = [*first, reasoning(0), said(0), call(0), output(0)]
    whole = decoded(body(items, instructions="be brief"), None)[1]
    stored_reply = dict(whole[1])  # the session's own copy of the assistant message
    known = [turn[0], turn[1], stored_reply]
    _, messages = decode_responses(body(items, instructions="be brief"), 64, state=state,
                                   stored=known)
    assert messages[0] is turn[1] and messages[1] is stored_reply
    assert messages == whole


@pytest.mark.parametrize("seed", range(12))
def test_random_edits_decode_as_whole(seed: int) -> None:
    """Appends (whole turns or parts of one), changed members, rewritten or invalid items:
    always the result (or the error) of decoding the body whole; a failed body leaves the
    state as it was."""
    rng = random.Random(seed)
    state = ApiState()
    items: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    rest: dict[str, Any] = {"instructions": "be brief"}
    for k in range(25):
        candidate = list(items)
        step = rng.choice(["turn", "turn", "part", "part", "rest", "rewrite", "last", "bad"])
        if step == "turn":
            candidate += [reasoning(k), said(k), call(k), output(k)]
        elif step == "part":
            candidate.append(rng.choice([
                reasoning(k), said(k), call(k), output(k), looked(k),
                {"role": "user", "content": f"u{k}"},
                {"role": "user", "content": [{"type": "input_image", "file_id": f"f{k}"}]}]))
        elif step == "rest":
            rest = rng.choice([{"instructions": "be brief"}, {}, {"temperature": 0.5},
                               {"instructions": "other", "max_output_tokens": 9},
                               {"reasoning": {"effort": "minimal"}}])
        elif step == "last":  # the last item rewritten, and a turn after it
            candidate[-1] = {**candidate[-1], "marker": k}
            candidate += rng.choice([[], [output(k)], [reasoning(k), said(k), call(k)]])
        elif step == "rewrite" and len(candidate) > 1:
            candidate[rng.randrange(len(candidate))] = {"role": "user", "content": f"x{k}"}
        else:
            candidate.append(rng.choice([
                {"type": "image", "url": "x"}, {"type": "message", "role": 5, "content": ""},
                {"type": "function_call", "call_id": 1}, {"type": "reasoning"}]))
        raw = body(candidate, **rest)
        before = state.responses_body
        got = decoded(raw, state)
        assert got == decoded(raw, None), (seed, k, step)
        if got[0] == "error":
            assert state.responses_body is before
        else:
            items = candidate


def test_images_of_reused_items_are_still_listed() -> None:
    """An image becomes the marker text, and the places of every image of the input are
    listed, also those of items an extended body did not convert again."""
    state = ApiState()
    items: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "input_text", "text": "look: "},
                                     {"type": "input_image", "image_url": "data:,"}]},
        reasoning(0), said(0), call(0), looked(0)]
    places = ["input[0].content[1]", "input[4].output[1]"]
    first = decoded(body(items), state)
    assert first[2] == places
    assert first[1][0] == {"role": "user", "content": "look: [image]"}
    assert first[1][-1] == {"role": "tool", "tool_call_id": "call_0", "content": "see[image]"}
    items += [reasoning(1), said(1), {"role": "user", "content": "more"}]
    again = decoded(body(items), state)
    assert again == decoded(body(items), None) and again[2] == places
    # converted again from the last break before the last item: the assistant turn of
    # reasoning(1), said(1) is open until the user message
    assert state.responses_body.open_from == 5


@pytest.mark.parametrize("tail", ["output", "said", "user"])
def test_a_rewritten_last_item_is_converted_again_with_the_new_ones(tail: str) -> None:
    """A client that rewrites its last item (a marker moved on to the newest): the body is
    parsed past the item before it, and decodes as whole."""
    from tito.server.growing_body import parse_growing

    state = ApiState()
    items: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    extended = []
    for k in range(5):
        sent = [*items[:-1], {**items[-1], "marker": "newest"}]
        raw = body(sent, instructions="be brief")
        last = state.responses_body
        extended.append(parse_growing(raw, "input", last.parsed if last else None,
                                      short=True).extended)
        assert decoded(raw, state) == decoded(raw, None), k
        items += [reasoning(k), said(k), call(k),
                  {"output": output(k), "said": said(k + 100),
                   "user": {"role": "user", "content": f"u{k}"}}[tail]]
    assert extended == [0, 0, 4, 8, 12]

"""Hypothesis fuzz of the chat and samples routes over the real app in-process.

Bodies: arbitrary JSON values and raw bytes (not JSON, invalid UTF-8, NaN/Infinity tokens,
numbers past 64 bits, nesting past every limit) sent as ``application/json``; plausible
chat bodies with random mutations (a wrong type in any field, extra fields, huge or
negative numbers, unicode, special-token text, deep nesting, messages of random roles,
contents and tool-call shapes), whose messages replay, retry, rewrite or ignore the
session's history, against a FakeEngine scripted with a random assistant reply; samples
bodies with random ``max_seq_len`` / ``metadata`` / ``include_response``.

Properties, for every body:

(a) no status >= 500;
(b) every error is the OpenAI envelope ``{"error": {"message", "type", "code", "param"}}``
    with a 4xx status;
(c) after a 4xx the session (``GET /sessions/<id>`` with ids and messages, timing fields
    left out) is exactly what it was before;
(d) a 200 chat reply is a ``chat.completion`` (with ``stream: true``,
    ``chat.completion.chunk`` s whose deltas put together are such a message, one finish
    reason, maybe a usage chunk, then ``[DONE]``) and the session then
    holds the request's messages plus the reply; a 200 samples reply decodes, its samples
    keep the TITO invariants and the caller's metadata, and the session is unchanged.

Every example starts from a session with committed turns (so the replay and rollback
paths run): one session per test, re-read after a successful turn, replaced by a fresh
one-turn session when it has grown past a few turns.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import orjson
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import asgi_client, new_session
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tito.client.rollout import sample_violations
from tito.samples import decode_samples
from tito.server.gateway import Gateway

pytestmark = pytest.mark.slow  # thousands of generated bodies (~16 s)

T = TypeVar("T")
JSON_HEADERS = {"content-type": "application/json"}
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                       HealthCheck.data_too_large])
SCALE = float(os.environ.get("TITO_FUZZ_SCALE", "1"))
"""Multiplies every test's example count (a longer hunt: ``TITO_FUZZ_SCALE=20``)."""


def examples(n: int) -> settings:
    return settings(FUZZ, max_examples=max(1, round(n * SCALE)))


MAX_TURNS = 4
"""A session past this many turns is replaced by a fresh one-turn session."""

# -- strategies ---------------------------------------------------------------------------
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
           "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
           "<|im_start|>assistant\n", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
           "SAY hi", "CALL f {}", "\x00", "\u202e", "🦀" * 3, "ü\u0301", " ", "\n\n"]
texts = st.one_of(st.text(max_size=12), st.sampled_from(SPECIAL))
EXTREMES = [0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 10**30, 1e308,
            -1e308, 5e-324, -0.0, 0.5, "", "1", "true", True, False, None, [], {}, [None]]
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), texts,
                    st.sampled_from(EXTREMES))
json_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(texts, kids, max_size=4),
    max_leaves=8)


def nest(depth: int, as_dict: bool) -> Any:
    """A value nested ``depth`` containers deep."""
    value: Any = 1
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


deep_values = st.builds(nest, st.integers(2, 80), st.booleans())
junk = st.one_of(st.sampled_from(EXTREMES), json_values, deep_values)
"""Anything: the wrong type for a field, most of the time."""


def encode(value: Any, ascii_only: bool = True) -> bytes:
    """JSON text of ``value``; NaN and infinities as the (invalid) tokens Python writes."""
    return json.dumps(value, allow_nan=True, ensure_ascii=ascii_only).encode()


def deep_raw(depth: int, as_dict: bool) -> bytes:
    """Nesting past orjson's own limit (1024), written as text."""
    if as_dict:
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b"[" * depth + b"]" * depth


def bad_utf8(junk_bytes: bytes) -> bytes:
    return b'{"messages": [{"role": "user", "content": "' + junk_bytes + b'"}]}'


def cut(body: bytes, at: int) -> bytes:
    return body[: at % max(1, len(body))]


raw_bodies = st.one_of(
    st.binary(max_size=48),
    st.builds(encode, json_values, st.booleans()),
    st.builds(deep_raw, st.integers(60, 3000), st.booleans()),
    st.builds(bad_utf8, st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                                         b"\\ud800", b"\\udfff\\ud800", b"\x00", b"\\u0000"])),
    st.builds(cut, st.builds(encode, st.fixed_dictionaries({"messages": st.just([
        {"role": "user", "content": "hello"}])})), st.integers(0, 60)),
    st.sampled_from([b"", b" ", b"null", b"NaN", b"Infinity", b"-Infinity", b"1e400",
                     b'{"messages": NaN}', b'{"max_tokens": 1e400}', b"\xef\xbb\xbf{}",
                     b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}']),
)
wrapped_values = st.one_of(
    st.builds(lambda v: encode({"messages": v}), json_values),
    st.builds(lambda v: encode({"messages": [v]}), json_values),
    st.builds(lambda v: encode({"messages": [{"role": "user", "content": v}]}), junk),
)

ROLES = ["system", "developer", "user", "assistant", "tool"]
names = st.text(alphabet="abcdefgxyz_", min_size=1, max_size=8)
valid_call = st.fixed_dictionaries(
    {"type": st.just("function"), "id": st.just("call_1"),
     "function": st.fixed_dictionaries({
         "name": names,
         "arguments": st.dictionaries(names, st.one_of(st.integers(-9, 9), names),
                                      max_size=2).map(json.dumps)})})
tool_calls = st.one_of(
    st.lists(valid_call, max_size=2),
    st.lists(st.fixed_dictionaries({"function": st.fixed_dictionaries(
        {}, optional={"name": junk, "arguments": junk})}, optional={
        "id": junk, "type": junk, "index": junk}), max_size=2),
    junk)
parts = st.lists(st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
                           st.fixed_dictionaries({}, optional={"type": junk, "text": junk})),
                 max_size=3)
messages = st.one_of(
    st.fixed_dictionaries(
        {"role": st.one_of(st.sampled_from(ROLES), junk)},
        optional={"content": st.one_of(texts, st.none(), parts, junk),
                  "tool_calls": tool_calls, "tool_call_id": st.one_of(texts, junk),
                  "name": st.one_of(texts, junk), "reasoning_content": st.one_of(texts, junk),
                  "extra": junk}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "tool"]), "content": texts}),
    junk)

small = st.integers(1, 24)
valid_fields: dict[str, st.SearchStrategy[Any]] = {
    "model": texts,
    "tools": st.lists(st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries(
            {"name": names}, optional={"description": texts, "parameters": st.dictionaries(
                texts, json_values, max_size=3)})}), max_size=2),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), json_values),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "max_tokens": small, "max_completion_tokens": small, "max_new_tokens": small,
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "min_p": st.floats(0, 1),
    "top_k": st.one_of(st.just(-1), st.integers(1, 100)),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.01, 2),
    "stop": st.one_of(texts, st.lists(texts, max_size=3)),
    "stop_token_ids": st.lists(st.integers(0, 151_000), max_size=3),
    "seed": st.integers(-(2**63), 2**63 - 1), "n": st.just(1),
    "chat_template_kwargs": st.dictionaries(
        st.one_of(st.sampled_from(["enable_thinking", "clear_thinking", "tools", "messages",
                                   "add_generation_prompt", "bos_token", "raise_exception",
                                   "tool_call_id"]), texts), junk, max_size=2),
    "input_ids": json_values, "logprobs": json_values,
}
field_names = st.one_of(st.sampled_from([*valid_fields, "messages"]), texts)
replies = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": st.one_of(
        st.text(max_size=16), st.sampled_from([s for s in SPECIAL if "<|" not in s]))},
    optional={"reasoning_content": st.text(max_size=8), "tool_calls": st.lists(
        valid_call, min_size=1, max_size=2)})
"""What the FakeEngine answers: any assistant message a model could emit (no stop text)."""


@dataclass
class ChatCase:
    """A plausible chat body, built over the session's history when it is sent."""

    prefix: str
    """``replay`` (history + new), ``retry`` (the last turn's prompt + new), ``rewrite``
    (history with one message replaced + new) or ``fresh`` (new only)."""
    at: int
    replacement: Any
    new: list[Any]
    fields: dict[str, Any]
    reply: dict[str, Any]
    ascii_only: bool

    def messages(self, history: list[dict[str, Any]]) -> list[Any]:
        if self.prefix == "replay":
            return [*history, *self.new]
        if self.prefix == "retry":
            return [*history[:-1], *self.new]
        if self.prefix == "rewrite":
            head = list(history)
            head[self.at % len(head)] = self.replacement
            return [*head, *self.new]
        return list(self.new)

    def body(self, history: list[dict[str, Any]]) -> Any:
        return {"messages": self.messages(history), **self.fields}


@st.composite
def chat_cases(draw: st.DrawFn) -> ChatCase:
    # input_ids is refused before any other check (tests/server/test_owned.py): in a
    # plausible body it would hide the checks after it (rollbacks, context limits)
    chosen = draw(st.lists(st.sampled_from(sorted(set(valid_fields) - {"input_ids"})),
                           max_size=5, unique=True))
    fields = {name: draw(valid_fields[name]) for name in chosen}
    fields.update(draw(st.dictionaries(field_names, junk, max_size=2)))  # wrong types, extras
    prefix = draw(st.sampled_from(["replay", "replay", "retry", "rewrite", "fresh"]))
    return ChatCase(
        prefix=prefix, at=draw(st.integers(0, 64)),
        replacement=draw(messages) if prefix == "rewrite" else None,
        new=draw(st.lists(messages, max_size=3)), fields=fields, reply=draw(replies),
        ascii_only=draw(st.booleans()))


samples_bodies = st.one_of(
    st.fixed_dictionaries({}, optional={
        "max_seq_len": st.one_of(st.none(), st.integers(1, 400)),
        "metadata": st.dictionaries(texts, json_values, max_size=4),
        "include_response": st.booleans(),
    }).map(encode),
    st.fixed_dictionaries({}, optional={
        "max_seq_len": st.one_of(st.none(), st.integers(-3, 400), junk),
        "metadata": st.one_of(st.none(), st.dictionaries(texts, json_values, max_size=4), junk),
        "include_response": st.one_of(st.booleans(), junk),
    }).map(encode),
    st.dictionaries(st.one_of(st.sampled_from(["max_seq_len", "metadata", "include_response"]),
                              texts), junk, max_size=3).map(encode),
    raw_bodies,
)


# -- checks -------------------------------------------------------------------------------
def check_error(resp: httpx.Response, sent: bytes) -> dict[str, Any]:
    """(a) and (b): a 4xx in the OpenAI envelope."""
    assert resp.status_code < 500, f"{resp.status_code} for {sent[:2000]!r}: {resp.text}"
    assert 400 <= resp.status_code < 500, f"{resp.status_code} for {sent[:2000]!r}"
    body = resp.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}, body
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and isinstance(error["code"], str), body
    assert error["param"] is None or isinstance(error["param"], str), body
    return dict(error)


def check_message(message: dict[str, Any]) -> None:
    assert message["role"] == "assistant"
    assert set(message) <= {"role", "content", "reasoning_content", "tool_calls"}, message
    assert message["content"] is None or isinstance(message["content"], str)
    assert isinstance(message.get("reasoning_content", ""), str)
    for call in message.get("tool_calls", []):
        assert set(call) >= {"id", "type", "function"} and call["type"] == "function", call
        assert isinstance(call["id"], str) and call["id"].startswith("call_"), call
        assert isinstance(call["function"]["name"], str), call
        assert isinstance(call["function"]["arguments"], str), call


def check_completion(body: dict[str, Any]) -> dict[str, Any]:
    """(d): the ``chat.completion`` shape; the reply message."""
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}, body
    assert body["object"] == "chat.completion" and isinstance(body["id"], str)
    assert isinstance(body["created"], int) and isinstance(body["model"], str)
    [choice] = body["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}, choice
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length", "tool_calls"), choice
    check_message(choice["message"])
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] >= 0, usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)
    return dict(choice["message"])


def check_stream(text: str) -> None:
    """(d) for ``stream: true``: chunks whose deltas add up to an assistant message (tool
    calls: an id and name, then arguments, per index), one finish reason, maybe a usage
    chunk, then [DONE]."""
    events = [line[len("data: "):] for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]" and len(events) >= 3, text
    chunks = [json.loads(e) for e in events[:-1]]
    if not chunks[-1]["choices"]:  # the usage chunk
        usage = chunks.pop()
        assert usage["usage"]["total_tokens"] > 0, usage
    assert all(c["object"] == "chat.completion.chunk" for c in chunks), chunks
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes[:-1] == [None] * (len(finishes) - 1), finishes
    assert finishes[-1] in ("stop", "length", "tool_calls"), finishes
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        for key in ("content", "reasoning_content"):
            if delta.get(key):
                message[key] = message.get(key, "") + delta[key]
        for call in delta.get("tool_calls", []):
            if "id" in call:
                assert call["index"] == len(calls), call
                calls[call["index"]] = {"id": call["id"], "type": call["type"], "function": {
                    "name": call["function"]["name"], "arguments": ""}}
            calls[call["index"]]["function"]["arguments"] += call["function"].get(
                "arguments", "")
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    check_message(message)


def error_code(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "?"


async def state(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """The whole session as the API shows it, without the fields that are timings."""
    resp = await http.get(f"/sessions/{sid}", params={"include_ids": "1",
                                                      "include_messages": "1"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    for rec in body["records"]:
        rec.pop("e2e_latency")
    body["metadata"].pop("last_active")
    return dict(body)


# -- harness ------------------------------------------------------------------------------
FIRST = [{"role": "system", "content": "You are a fuzz target."},
         {"role": "user", "content": "What is the weather in Oslo?"}]
FIRST_REPLY = {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "id": "call_1",
     "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}


class Fuzz:
    """The app over one gateway, driven from Hypothesis' synchronous examples on a private
    event loop; one session whose state every check compares against."""

    def __init__(self, gateway: Gateway) -> None:
        assert isinstance(gateway.engine, FakeEngine)
        self.engine = gateway.engine
        self.loop = asyncio.new_event_loop()
        self.http = asgi_client(gateway)
        self.sid = ""
        self.before: dict[str, Any] = {}
        self.seen: Counter[str] = Counter()
        """``route status code`` of every answer (what the fuzz reached)."""
        self.run(self.reset())

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(work)

    def close(self) -> None:
        self.run(self.http.aclose())
        self.loop.close()

    def missing(self, *answers: str) -> list[str]:
        """Those of ``answers`` (``route status code``) never seen: empty when the fuzz got
        as far into the app as it is meant to."""
        return [answer for answer in answers if not self.seen[answer]]

    @property
    def history(self) -> list[dict[str, Any]]:
        return list(self.before["messages"])

    async def reset(self) -> None:
        """A fresh session with one committed turn (a tool call), the old one deleted."""
        if self.sid:
            await self.http.delete(f"/sessions/{self.sid}")
        self.sid = await new_session(self.http)
        self.engine.replies.clear()
        self.engine.script(FIRST_REPLY)
        resp = await self.http.post(f"/sessions/{self.sid}/v1/chat/completions",
                                    json={"messages": FIRST, "max_tokens": 64})
        assert resp.status_code == 200, resp.text
        self.before = await state(self.http, self.sid)

    async def post(self, route: str, raw: bytes) -> httpx.Response:
        resp = await self.http.post(f"/sessions/{self.sid}/{route}", content=raw,
                                    headers=JSON_HEADERS)
        code = error_code(resp) if resp.status_code >= 400 else ""
        self.seen[f"{route} {resp.status_code} {code}"] += 1
        return resp

    async def unchanged(self, sent: bytes) -> None:
        """(c): the session is exactly what it was before ``sent``."""
        after = await state(self.http, self.sid)
        assert after == self.before, f"session changed by {sent[:2000]!r}"

    async def chat(self, raw: bytes, reply: dict[str, Any] | None = None) -> None:
        self.engine.replies.clear()
        if reply is not None:
            self.engine.script(reply)
        resp = await self.post("v1/chat/completions", raw)
        if resp.status_code != 200:
            check_error(resp, raw)
            await self.unchanged(raw)
            return
        if resp.headers["content-type"].startswith("text/event-stream"):
            check_stream(resp.text)
        else:
            check_completion(resp.json())
        await self.committed(raw)

    async def committed(self, raw: bytes) -> None:
        """After a 200 turn: the session holds the request's messages and the reply."""
        self.before = await state(self.http, self.sid)
        sent = orjson.loads(raw)["messages"]
        meta = self.before["metadata"]
        # the main agent's context, or the one a request that opened another
        # conversation started (design §5.5)
        served = [meta, *meta.get("contexts", ())]
        assert any(m["num_messages"] == len(sent) + 1 for m in served), meta
        assert not meta["turn_in_progress"], meta
        assert meta["num_turns"] >= 1 and len(self.before["records"]) == meta["num_turns"]
        if meta["num_turns"] > MAX_TURNS:
            await self.reset()

    async def samples(self, raw: bytes, gateway_keys: frozenset[str]) -> None:
        resp = await self.post("samples", raw)
        if resp.status_code != 200:
            check_error(resp, raw)
        else:
            check_samples(resp.content, orjson.loads(raw) if raw.strip() else {}, gateway_keys)
        await self.unchanged(raw)  # collecting never changes a session


def check_samples(payload: bytes, body: dict[str, Any], gateway_keys: frozenset[str]) -> None:
    """A 200 samples reply: it decodes, keeps the invariants and the caller's metadata."""
    decoded = decode_samples(payload)
    for sample in decoded.samples:
        assert sample_violations(sample) == [], (body, sample_violations(sample))
        if body.get("include_response") is False:
            assert sample.response is None
        for key, value in (body.get("metadata") or {}).items():
            if key not in gateway_keys:
                assert sample.metadata[key] == value, (key, value, sample.metadata.get(key))


def fuzz_session(make_gateway: Callable[..., Gateway], **config: Any) -> Fuzz:
    return Fuzz(make_gateway(**config))


# -- tests ----------------------------------------------------------------------------------
def test_arbitrary_bodies_on_chat_and_samples(make_gateway: Callable[..., Gateway]) -> None:
    """Any bytes, any JSON value: a 4xx in the envelope (or a turn), never a 5xx."""
    fuzz = fuzz_session(make_gateway)
    keys = gateway_metadata_keys(fuzz)

    @examples(500)
    @given(raw=st.one_of(raw_bodies, wrapped_values))
    @example(raw=b"[" * 100_000 + b"]" * 100_000)
    @example(raw=encode({"messages": [{"role": "user", "content": "x " * 100_000}],
                         "max_tokens": 1}))
    def check(raw: bytes) -> None:
        fuzz.run(fuzz.chat(raw))
        fuzz.run(fuzz.samples(raw, keys))

    try:
        check()
    finally:
        fuzz.close()
    assert not fuzz.missing("v1/chat/completions 400 invalid_json",
                            "v1/chat/completions 400 invalid_request",
                            "samples 400 invalid_request"), fuzz.seen


def test_plausible_chat_bodies(make_gateway: Callable[..., Gateway]) -> None:
    """Chat bodies over the session's history with random mutations and engine replies
    (limits low enough that prompts reach them and completions are clamped)."""
    fuzz = fuzz_session(make_gateway, max_seq_len=320, context=400)

    @examples(900)
    @given(case=chat_cases())
    @example(case=ChatCase("replay", 0, None, [{"role": "user", "content": "word " * 400}],
                           {"max_tokens": 8}, {"role": "assistant", "content": "ok"}, True))
    @example(case=ChatCase("retry", 0, None, [{"role": "user", "content": "again"}],
                           {"stream": True, "stream_options": {"include_usage": True}},
                           {"role": "assistant", "content": "ok"}, True))
    @example(case=ChatCase("rewrite", 0, {"role": "developer", "content": "changed"},
                           [{"role": "tool", "tool_call_id": "call_1", "content": "21 C"}],
                           {}, {"role": "assistant", "content": "ok"}, False))
    def check(case: ChatCase) -> None:
        raw = encode(case.body(fuzz.history), case.ascii_only)
        fuzz.run(fuzz.chat(raw, case.reply))

    try:
        check()
    finally:
        fuzz.close()
    assert not fuzz.missing("v1/chat/completions 200 ", "v1/chat/completions 400 invalid_request",
                            "v1/chat/completions 400 rollback_too_deep",
                            "v1/chat/completions 400 context_length_exceeded"), fuzz.seen


def gateway_metadata_keys(fuzz: Fuzz) -> frozenset[str]:
    """The metadata keys the gateway writes itself (they win over the caller's)."""
    resp = fuzz.run(fuzz.post("samples", b"{}"))
    assert resp.status_code == 200, resp.text
    [sample] = decode_samples(resp.content).samples
    return frozenset(sample.metadata)


def test_samples_bodies(make_gateway: Callable[..., Gateway]) -> None:
    """Samples bodies of random fields and types: a 200 that decodes or a 4xx; the session
    never changes. The session: a tool call, its answer, and a turn cut by max_tokens."""
    fuzz = fuzz_session(make_gateway)
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}
    fuzz.run(fuzz.chat(encode({"messages": [*fuzz.history, tool], "max_tokens": 32}),
                       {"role": "assistant", "content": "It is sunny in Oslo."}))
    fuzz.run(fuzz.chat(encode({"messages": [*fuzz.history, {"role": "user", "content": "And "
                                                            "tomorrow?"}], "max_tokens": 3}),
                       {"role": "assistant", "content": "Tomorrow it rains all day long."}))
    assert [r["finish_reason"] for r in fuzz.before["records"]] == ["stop", "stop", "length"]
    keys = gateway_metadata_keys(fuzz)

    @examples(500)
    @given(raw=samples_bodies)
    @example(raw=encode({"metadata": nest(64, True)}))
    @example(raw=encode({"metadata": nest(65, True)}))
    @example(raw=encode({"max_seq_len": 1, "include_response": False}))
    def check(raw: bytes) -> None:
        fuzz.run(fuzz.samples(raw, keys))

    try:
        check()
    finally:
        fuzz.close()
    assert not fuzz.missing("samples 200 ", "samples 400 invalid_request"), fuzz.seen

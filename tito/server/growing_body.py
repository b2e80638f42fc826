"""Parse a session's request body in O(new bytes) when it extends the previous one.

An agent resends its whole history every turn: turn n's body is turn n-1's with a few
messages appended, and the SDKs serialize the earlier messages byte for byte the same
(the OpenAI SDK writes ``{"messages": [...], "model": ...}`` from the same dicts every
turn). Parsing, comparing and freeing that history again on every turn is the largest
per-turn cost that grows with the context.

:func:`parse_growing` parses ``body`` to exactly what ``orjson.loads(body)`` returns, but
when ``body`` starts with the bytes of the previous body up to the end of the last element
of its array member ``key``, it parses only what follows: the new elements and the other
members. The earlier elements are the same objects as last turn (they are never mutated:
the session keeps the client's dicts as sent). That prefix is recognized by its length and
its 128-bit xxh3 digest, not kept (hashing is far cheaper than parsing): a session's
state costs no
copy of its history (as :class:`~tito.server.idempotency.RetryKey`'s digests, a collision
would have to be crafted by the client against its own session).

Exactness (every case the fast path is not sure of falls back to ``orjson.loads``; the
prefix digest aside):

- the boundary is found once, by walking the top-level object with the standard library's
  C scanner, on the full parse of a body; a body with a duplicate top-level member keeps
  no state;
- the new elements are delimited by that scanner and parsed by ``orjson`` (one call for
  all of them; a count mismatch or any ``orjson`` error falls back), so the values and the
  errors are ``orjson``'s own;
- after the array, the members are parsed by ``orjson`` as an object of their own; one
  that repeats a member of the known part falls back;
- invalid UTF-8 or anything unexpected between the tokens falls back.

A client may also rewrite the last element of the previous body: Claude Code puts its
``cache_control`` marker on the newest message's last block and takes it off the
message it marked the turn before. With ``short=True`` the state is also matched up to
the end of its *next-to-last* element (:attr:`GrowingBody.short`); then every element
from the previous last one on is parsed as new (:attr:`Parsed.extended` is one less than
the previous body's element count), so that rewrite costs one element's parse, not the
whole body's. When the previous array had one element (a Messages session's first body),
that "next-to-last" end is the array's ``[``: the second body is parsed from there,
all its elements as new (``extended`` 0), and with ``same_rest`` when the members after
the array are the first body's (Claude Code's system prompt and tools: not parsed again).

Pure: no I/O. The state is per session (:attr:`Session.api_state`); a body that does not
extend it (a rollback, a rewritten history) is parsed whole and becomes the new state.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson
from xxhash import xxh3_128, xxh3_128_intdigest

_scan_value: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder())  # type: ignore[arg-type]  # the C scanner when available
_scan_string: Callable[[str, int], tuple[str, int]] = \
    json.decoder.scanstring  # type: ignore[attr-defined]
_WS = re.compile(r"[ \t\n\r]*")
_WS_BYTES = b" \t\n\r"
_CLOSE, _COMMA = ord("]"), ord(",")

ESTABLISH_MISSES = 2
"""Bodies in a row that may fail to extend the state and still set up a new one; past
that, a new one is set up every :data:`RETRY_EVERY` bodies (finding the array's end costs
about two parses: a client that rewrites its history every turn should not pay it)."""
RETRY_EVERY = 8


def _skip(text: str, i: int) -> int:
    end = _WS.match(text, i)
    return i if end is None else end.end()


@dataclass(slots=True)
class GrowingBody:
    """What a parsed body extends to the next one (never changed once made)."""

    key: str
    """The growing array member."""
    head: int
    """The length of the body through the end of the array's last element (0: none is
    known, after too many misses)."""
    digest: int
    """The xxh3-128 digest of those bytes."""
    items: list[Any]
    """The array's elements (as ``orjson`` parsed them)."""
    before: dict[str, Any]
    """The members before the array, in order."""
    tail: bytes
    """The body after the array's closing bracket."""
    data: dict[str, Any]
    """The whole parsed body (a copy: what the caller does with its own is not seen)."""
    misses: int = 0
    """Bodies in a row that did not extend the state before this one."""
    short: int = 0
    """The length of the body through the end of the array's next-to-last element, or
    through its ``[`` when it has one element (0: not found) ..."""
    short_digest: int = 0
    """... and the xxh3-128 digest of those bytes."""


@dataclass(slots=True)
class Parsed:
    data: Any
    """``orjson.loads(body)``."""
    state: GrowingBody | None
    """For the next body (None: nothing to extend)."""
    extended: int
    """How many leading elements were taken from the previous state (0: parsed whole, or
    from the array's ``[`` of a one-element previous array)."""
    same_rest: bool
    """Every member other than the array is byte for byte the previous body's."""


def parse_growing(body: bytes, key: str, previous: GrowingBody | None, *,
                  short: bool = False) -> Parsed:
    """``orjson.loads(body)`` (its errors included), in O(new bytes) when ``body`` extends
    ``previous``; ``short``: or when it extends all of it but its last element (see the
    module docstring)."""
    if previous is not None and previous.key == key:
        parsed = _extend_from(body, previous, short)
        if parsed is not None:
            return parsed
    data = orjson.loads(body)
    misses = 0 if previous is None else previous.misses + 1
    if misses > ESTABLISH_MISSES and misses % RETRY_EVERY:
        return Parsed(data, GrowingBody(key, 0, 0, [], {}, b"", {}, misses), 0, False)
    state = _establish(body, key, data)
    return Parsed(data, None if state is None else replace(state, misses=misses), 0, False)


def covered(body: bytes, state: GrowingBody | None) -> int:
    """How many leading bytes of ``body`` are ``state``'s (its head, else its short head,
    by length and digest): what a parse past ``state`` would not parse again; 0: none."""
    if state is None:
        return 0
    for length, digest in ((state.head, state.digest), (state.short, state.short_digest)):
        if 0 < length < len(body) and xxh3_128_intdigest(memoryview(body)[:length]) == digest:
            return length
    return 0


def same_json(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same JSON value with the same Python types and the
    same key order: what ``orjson.loads`` would give for either's text (``1 == 1.0``,
    ``True == 1``, ``0.0 == -0.0`` and dicts that differ in key order are not the same
    here). Equal as Python values *and* written alike by ``orjson`` (which keeps key order
    and writes ``1``, ``1.0``, ``true`` and ``-0.0`` apart): two C-level passes, where a
    recursive walk in Python cost about four times as much for a message."""
    if a is b:
        return True
    try:
        return bool(a == b) and orjson.dumps(a) == orjson.dumps(b)
    except TypeError:  # not JSON (orjson refuses it): not the same as any parsed value
        return False


def share(parsed: Parsed, index: int, value: Any) -> bool:
    """Put ``value`` in place of the array's element ``index``, in the parsed data and in
    the state, when it is the same JSON (:func:`same_json`): e.g. a session's own copy of
    a message the client sent back, so that the state keeps no second copy. The data stays
    exactly what ``orjson.loads`` gave. False (nothing changed) when it is not the same."""
    state = parsed.state
    if state is None or index >= len(state.items) or not same_json(state.items[index], value):
        return False  # (a state that backs off after misses keeps no elements)
    state.items[index] = value
    data = parsed.data[state.key]
    if data[index] is not value:
        data[index] = value
    return True


def without_elements(state: GrowingBody | None) -> GrowingBody | None:
    """``state`` with a placeholder (None) for each element of its array, for a caller
    that keeps what it derived from them and reads only the new elements of the next body:
    the next :func:`parse_growing` that extends it returns None at the reused places
    (:attr:`Parsed.extended` of them), so that data is *not* ``orjson.loads(body)`` — a
    caller that needs the whole body (to word an error) parses it again. The state then
    holds 8 bytes per element instead of the parsed elements."""
    if state is None or not state.items:
        return state
    holes: list[Any] = [None] * len(state.items)
    data = dict(state.data)
    data[state.key] = holes
    return replace(state, items=holes, data=data)


def share_stored(values: list[Any], start: int, stored: list[Any], shift: int = 0) -> None:
    """Replace each ``values[j]``, ``j >= start``, that is the same JSON as
    ``stored[j + shift]`` (:func:`same_json`) by that stored object: a session's own copy
    of a message the client sent back, so that comparisons are by identity and one copy is
    kept."""
    for j in range(start, min(len(values), len(stored) - shift)):
        kept = stored[j + shift]
        if values[j] is not kept and same_json(values[j], kept):
            values[j] = kept


def _extend_from(body: bytes, prev: GrowingBody, short: bool) -> Parsed | None:
    """The parse of ``body`` past ``prev``'s head, else past its short head (``short``)."""
    if 0 < prev.head < len(body):
        hasher = xxh3_128(memoryview(body)[:prev.head])  # continued for the new head
        if hasher.intdigest() == prev.digest:
            parsed = _extend(body, prev, hasher)
            if parsed is not None:
                return parsed
    if short and 0 < prev.short < len(body) and prev.items:
        hasher = xxh3_128(memoryview(body)[:prev.short])
        if hasher.intdigest() == prev.short_digest:
            return _extend(body, replace(prev, head=prev.short, digest=prev.short_digest,
                                         items=prev.items[:-1], short=0), hasher)
    return None


def _extend(body: bytes, prev: GrowingBody, hasher: Any) -> Parsed | None:
    rest = body[prev.head:]
    tail = prev.tail
    close = len(rest) - len(tail) - 1  # where the array's "]" is when the rest is unchanged
    if close >= 0 and rest[close] == _CLOSE and rest.endswith(tail):
        parsed = _extend_same_rest(body, rest, close, prev, hasher)
        if parsed is not None:
            return parsed
    return _extend_scanned(body, rest, prev, hasher)


def _head(body: bytes, length: int, prev: GrowingBody, hasher: Any, new: list[Any]
          ) -> tuple[int, int, int, int]:
    """(length, digest, short, short digest) of the body through its array's last
    element and through the one before it (:attr:`GrowingBody.short`); ``new``: the
    elements after ``prev``'s head, which end at ``length``. ``hasher`` has hashed the
    previous head's bytes (only the new ones are hashed)."""
    if not new:
        return prev.head, prev.digest, prev.short, prev.short_digest
    if len(new) == 1:
        short, short_digest = prev.head, prev.digest
    else:
        short = _before_last(body, prev.head, length, new[-1], opening=not prev.items)
        if short > 0:
            hasher.update(memoryview(body)[prev.head:short])
            short_digest = hasher.intdigest()
            hasher.update(memoryview(body)[short:length])
            return length, hasher.intdigest(), short, short_digest
        short_digest = 0
    hasher.update(memoryview(body)[prev.head:length])
    return length, hasher.intdigest(), short, short_digest


def _before_last(body: bytes, start: int, end: int, last: Any, *, opening: bool = False
                 ) -> int:
    """The end of the element before the array's last one, which ends at ``end`` and is
    ``last`` as parsed; ``start``: where an earlier element ends (``opening``: the
    array's ``[``, its first element follows). 0 when not found.

    Written compactly (``orjson``, JavaScript's ``JSON.stringify``, httpx), the last
    element's bytes are its ``orjson`` serialization: a comparison finds it. Otherwise
    the elements after ``start`` are delimited by the C scanner (O(new bytes))."""
    try:
        own = orjson.dumps(last)
    except TypeError:
        own = b""
    i = end - len(own)
    if own and i > start and body[i:end] == own:
        return _comma_before(body, i, start)
    try:
        text = body[start:end].decode()
        i, first = _skip(text, 0), -1
        if opening:  # the first element: no comma before it
            _, i = _scan_value(text, i)
            i = _skip(text, i)
        while i < len(text) and text[i] == ",":
            first = _skip(text, i + 1)
            _, i = _scan_value(text, first)
            i = _skip(text, i)
    except (IndexError, StopIteration, ValueError, RecursionError, UnicodeDecodeError):
        return 0
    if first < 0 or i != len(text):
        return 0
    return _comma_before(body, start + len(text[:first].encode()), start)


def _comma_before(body: bytes, i: int, start: int) -> int:
    """The end of the element before the ``,`` that precedes position ``i``; 0 if none."""
    while i > start and body[i - 1] in _WS_BYTES:
        i -= 1
    if i <= start or body[i - 1] != _COMMA:
        return 0
    i -= 1
    while i > start and body[i - 1] in _WS_BYTES:
        i -= 1
    return i


def _extend_same_rest(body: bytes, rest: bytes, close: int, prev: GrowingBody,
                      hasher: Any) -> Parsed | None:
    """``rest`` is ``[, new elements] "]" + prev.tail``: the body is the previous one with
    elements inserted before its array's end. ``orjson`` parses the new elements as an
    array of their own; if they are valid, the body's one parse is that (what precedes
    them and what follows are bytes a parse already accepted in the same places)."""
    first = 0
    while rest[first] in _WS_BYTES:
        first += 1
    opening = not prev.items  # the head ends at the array's "[": no comma before
    if first == close:  # no new element
        new: list[Any] = []
        end = 0
    elif rest[first] == _COMMA or opening:
        try:  # the elements, their "]" included
            new = orjson.loads(b"[" + rest[first + (not opening):close + 1])
        except orjson.JSONDecodeError:
            return None
        if not new:  # "[..., ]": a trailing comma
            return None
        end = close
        while rest[end - 1] in _WS_BYTES:
            end -= 1
    else:
        return None
    items = prev.items + new
    data = dict(prev.data)
    data[prev.key] = list(items)
    head, digest, short, short_digest = _head(body, prev.head + end, prev, hasher, new)
    state = GrowingBody(prev.key, head, digest, items, prev.before, prev.tail, dict(data),
                        short=short, short_digest=short_digest)
    return Parsed(data, state, len(prev.items), True)


def _extend_scanned(body: bytes, raw: bytes, prev: GrowingBody, hasher: Any
                    ) -> Parsed | None:
    """Other members changed: the new elements are delimited by the C scanner, and what
    follows the array is parsed as an object of its own."""
    try:
        rest = raw.decode()
    except UnicodeDecodeError:
        return None
    first = last = -1
    count = 0
    i = _skip(rest, 0)
    comma = bool(prev.items)  # none before the first element when the head ends at "["
    try:
        while rest[i] == "," if comma else rest[i] != "]":
            start = _skip(rest, i + 1) if comma else i
            comma = True
            _, last = _scan_value(rest, start)
            if first < 0:
                first = start
            count += 1
            i = _skip(rest, last)
        if rest[i] != "]":
            return None
    except (IndexError, StopIteration, ValueError, RecursionError):
        return None
    try:
        new = orjson.loads(f"[{rest[first:last]}]") if count else []
    except orjson.JSONDecodeError:
        return None
    after = _members(rest[i + 1:])
    if len(new) != count or after is None or prev.key in after \
            or not after.keys().isdisjoint(prev.before):
        return None
    items = prev.items + new
    data = {**prev.before, prev.key: list(items), **after}
    end = len(rest[:last].encode()) if count else 0
    head, digest, short, short_digest = _head(body, prev.head + end, prev, hasher, new)
    state = GrowingBody(prev.key, head, digest, items, prev.before, rest[i + 1:].encode(),
                        dict(data), short=short, short_digest=short_digest)
    return Parsed(data, state, len(prev.items), False)


def _members(tail: str) -> dict[str, Any] | None:
    """The members in ``tail`` (``, "k": v ... }`` or ``}``) as a dict; None if invalid."""
    i = _skip(tail, 0)
    if tail.startswith(",", i):
        i = _skip(tail, i + 1)
        if not tail.startswith('"', i):  # no trailing comma before "}"
            return None
    elif not tail.startswith("}", i):
        return None
    try:
        after = orjson.loads("{" + tail[i:])
    except orjson.JSONDecodeError:
        return None
    return after if isinstance(after, dict) else None


def _establish(body: bytes, key: str, data: Any) -> GrowingBody | None:
    """The state of a fully parsed ``body``: the end of the last element of its top-level
    ``key`` array; from the serialization's lengths when ``body`` is written compactly
    (:func:`_establish_compact`), else found by walking the object with the C scanner
    (O(body) in Python-level steps, once)."""
    if not (isinstance(data, dict) and isinstance(data.get(key), list) and data[key]):
        return None
    compact = _establish_compact(body, key, data)
    return compact if compact is not None else _establish_walked(body, key, data)


def _establish_walked(body: bytes, key: str, data: dict[str, Any]) -> GrowingBody | None:
    """:func:`_establish` by walking the body (any JSON whitespace and escapes)."""
    text = body.decode()  # orjson accepted it: valid UTF-8
    try:
        names, head_end, tail_start, short_end = _walk(text, key)
    except (IndexError, StopIteration, ValueError, RecursionError):
        return None
    if head_end <= 0 or len(set(names)) != len(names):
        return None  # a duplicate member: what it overrides is not worth tracking
    before = {name: data[name] for name in names[:names.index(key)]}
    head = len(text[:head_end].encode())
    short = len(text[:short_end].encode()) if short_end > 0 else 0
    return GrowingBody(key, head, xxh3_128_intdigest(memoryview(body)[:head]),
                       list(data[key]), before, text[tail_start:].encode(), dict(data),
                       short=short,
                       short_digest=xxh3_128_intdigest(memoryview(body)[:short]) if short else 0)


def _establish_compact(body: bytes, key: str, data: dict[str, Any]) -> GrowingBody | None:
    """:func:`_establish` of a body that is byte for byte ``orjson``'s serialization of
    what it parses to (as the SDKs write JSON: compact, keys in order, no duplicate
    member): every position follows from the lengths of the parts' serializations (one
    serialization of the whole to compare, a C-level pass, where the walk costs about
    fifteen parses). None: the body is written otherwise (or is not JSON ``orjson``
    writes back, e.g. a float it prints differently)."""
    try:
        if orjson.dumps(data) != body:
            return None
        names = list(data)
        at = names.index(key)
        after = {name: data[name] for name in names[at + 1:]}
        items = data[key]
        # the body ends with "]" + ("," + the members after it + "}", or "}")
        head = len(body) - 1 - (len(orjson.dumps(after)) if after else 1)
        # through the element before the last one and its comma, or through the "["
        short = head - len(orjson.dumps(items[-1])) - (len(items) > 1)
    except TypeError:
        return None
    return GrowingBody(key, head, xxh3_128_intdigest(memoryview(body)[:head]), list(items),
                       {name: data[name] for name in names[:at]}, body[head + 1:],
                       dict(data), short=short,
                       short_digest=xxh3_128_intdigest(memoryview(body)[:short]))


def _walk(text: str, key: str) -> tuple[list[str], int, int, int]:
    """(the member names of the object ``text`` in order, the end of the last element of
    its ``key`` array, the index after that array, the end of the element before the last
    one (after the ``[`` when it has one)); ValueError if not an object."""
    names: list[str] = []
    head_end = tail_start = -1
    short_end = 0
    i = _skip(text, 0)
    if text[i] != "{":
        raise ValueError("not an object")
    i = _skip(text, i + 1)
    while True:
        if text[i] != '"':
            raise ValueError("expected a member name")
        name, i = _scan_string(text, i + 1)
        names.append(name)
        i = _skip(text, i)
        if text[i] != ":":
            raise ValueError("expected :")
        i = _skip(text, i + 1)
        if name == key and text[i] == "[":
            head_end, short_end, i = _array_end(text, i)
            tail_start = i
        else:
            _, i = _scan_value(text, i)
        i = _skip(text, i)
        if text[i] == "}":
            return names, head_end, tail_start, short_end
        if text[i] != ",":
            raise ValueError("expected , or }")
        i = _skip(text, i + 1)


def _array_end(text: str, i: int) -> tuple[int, int, int]:
    """(end of the last element, end of the one before it (after the ``[``: none),
    index after the ``]``) of the array opening at ``i``, its elements delimited one by
    one."""
    ends: list[int] = []
    opened = i + 1
    i = _skip(text, opened)
    if text[i] == "]":
        return i, 0, i + 1
    while True:
        _, i = _scan_value(text, i)
        ends.append(i)
        i = _skip(text, i)
        if text[i] == "]":
            return ends[-1], ends[-2] if len(ends) > 1 else opened, i + 1
        if text[i] != ",":
            raise ValueError("expected , or ]")
        i = _skip(text, i + 1)

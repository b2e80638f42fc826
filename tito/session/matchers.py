"""Replay matchers (design §5.3): is a replayed message the same as the stored one?

Harnesses re-serialize history (drop ``index`` on tool calls, re-dump arguments, turn
``None`` into ``""``, leave out the reasoning, regenerate call ids). A matcher decides
equivalence only; it never repairs a message, and on a match the stored message stays
authoritative. Match sets are monotonic: ``strict`` ⊆ ``loose_tool_call`` ⊆ ``harness``,
and ``strict`` ⊆ ``loose_tool_call`` ⊆ ``role_content_only``. ``harness`` (the default)
says which differences it tolerated (:func:`tolerated`), so that they are counted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from tito.types.errors import ConfigError, ErrorKind, TitoError
from tito.types.hooks import load_function
from tito.types.messages import Message

Matcher = Callable[[Message, Message], bool]


def _text(value: Any) -> Any:
    """``None``, ``""`` and ``[]`` are one value; a list of text parts is its joined text."""
    if value is None or value == "" or value == []:
        return ""
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       for p in value):
        return "".join(p.get("text", "") for p in value)
    return value


def _calls(message: Message) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") or []
    return [{k: v for k, v in call.items() if k != "index"} for call in calls]


def strict(stored: Message, replayed: Message) -> bool:
    """role, content, reasoning_content and tool_calls (tool-call ``index`` ignored)."""
    return (
        stored.get("role") == replayed.get("role")
        and _text(stored.get("content")) == _text(replayed.get("content"))
        and _text(stored.get("reasoning_content")) == _text(replayed.get("reasoning_content"))
        and _calls(stored) == _calls(replayed)
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite JSON number {name}")


def _json_object(arguments: Any) -> Any:
    """Arguments as a JSON object for comparison; ``_RAW`` when they are not one."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        return _RAW

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate key")
        return dict(pairs)

    try:
        value = json.loads(arguments, object_pairs_hook=no_duplicates,
                           parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return _RAW
    return value if isinstance(value, dict) else _RAW


_RAW = object()


def _json_equal(a: Any, b: Any) -> bool:
    """Equality of parsed JSON values with type sensitivity (``true != 1``, ``1 == 1.0``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isfinite(a) and math.isfinite(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _call_equal_loose(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two tool calls (``index`` already dropped): equal key by key, the ``function``
    compared by :func:`_function_equal_loose`."""
    if a.keys() != b.keys():
        return False
    for key in a:
        if key == "function":
            if not _function_equal_loose(a[key], b[key]):
                return False
        elif a[key] != b[key]:
            return False
    return True


def _function_equal_loose(fa: Any, fb: Any) -> bool:
    """Two ``function`` members (None is ``{}``): same keys, equal values, ``arguments``
    compared by :func:`_arguments_equal_loose`."""
    fa, fb = fa or {}, fb or {}
    if not isinstance(fa, dict) or not isinstance(fb, dict) or fa.keys() != fb.keys():
        return False
    for key in fa:
        if key == "arguments":
            if not _arguments_equal_loose(fa[key], fb[key]):
                return False
        elif fa[key] != fb[key]:
            return False
    return True


def _arguments_equal_loose(a: Any, b: Any) -> bool:
    """Equal as JSON objects; when either is not one, equal as raw values of the same type."""
    ja, jb = _json_object(a), _json_object(b)
    if ja is _RAW or jb is _RAW:
        return type(a) is type(b) and a == b
    try:
        return _json_equal(ja, jb)
    except RecursionError:
        return False


def loose_tool_call(stored: Message, replayed: Message) -> bool:
    """strict, or equal with tool-call arguments compared as JSON objects."""
    if strict(stored, replayed):
        return True
    if stored.get("role") != replayed.get("role"):
        return False
    if _text(stored.get("content")) != _text(replayed.get("content")):
        return False
    if _text(stored.get("reasoning_content")) != _text(replayed.get("reasoning_content")):
        return False
    a, b = _calls(stored), _calls(replayed)
    return len(a) == len(b) and all(_call_equal_loose(x, y) for x, y in zip(a, b, strict=True))


def role_content_only(stored: Message, replayed: Message) -> bool:
    """role and content only (high risk: ignores tool calls and reasoning)."""
    return stored.get("role") == replayed.get("role") and \
        _text(stored.get("content")) == _text(replayed.get("content"))


_THINK = re.compile(r"\s*<think>(.*?)</think>\s*(.*)\Z", re.DOTALL)


def _reasoning_in_content(stored: Message, replayed: Message) -> bool:
    """The replayed content is the stored reasoning as a ``<think>`` block, then the
    stored content (a client that echoes the reasoning as text)."""
    content = replayed.get("content")
    found = _THINK.match(content) if isinstance(content, str) else None
    if found is None:
        return False
    reasoning = _text(stored.get("reasoning_content"))
    return isinstance(reasoning, str) and found.group(1).strip() == reasoning.strip() and \
        found.group(2).strip() == str(_text(stored.get("content"))).strip()


def _call_differences(a: dict[str, Any], b: dict[str, Any], call_ids_rendered: bool
                      ) -> list[str] | None:
    """What the harness matcher tolerates between two tool calls (None: they differ)."""
    found: list[str] = []
    fa, fb = a.get("function") or {}, b.get("function") or {}
    if not isinstance(fa, dict) or not isinstance(fb, dict) or fa.get("name") != fb.get("name"):
        return None
    if fa.get("arguments") != fb.get("arguments"):
        if not _arguments_equal_loose(fa.get("arguments"), fb.get("arguments")):
            return None
        found.append("arguments_reformatted")
    if a.get("id") != b.get("id"):
        if call_ids_rendered:
            return None
        found.append("call_id_changed")
    if a.get("type", "function") != b.get("type", "function"):
        return None
    return found


TOLERATED_KINDS = ("reasoning_dropped", "reasoning_in_content", "arguments_reformatted",
                   "call_id_changed")
"""What the ``harness`` matcher tolerates, by kind (see :func:`tolerated`)."""


def tolerated(stored: Message, replayed: Message, *, call_ids_rendered: bool = True
              ) -> list[str] | None:
    """The differences of ``replayed`` from ``stored`` that the ``harness`` matcher
    tolerates, by kind (``[]``: equal under ``strict``); None: not the same message.

    Tolerated: the reasoning left out (``reasoning_dropped``) or echoed as a ``<think>``
    block in the content (``reasoning_in_content``); tool-call arguments equal as JSON
    (``arguments_reformatted``); tool-call ids changed where the family's template does
    not render them (``call_id_changed``). Like ``strict``: extra keys, ``None`` = ``""`` =
    ``[]``, text parts = their text, tool-call ``index``."""
    if strict(stored, replayed):
        return []
    if stored.get("role") != replayed.get("role"):
        return None
    found: list[str] = []
    reasoning, echoed = _text(stored.get("reasoning_content")), \
        _text(replayed.get("reasoning_content"))
    if _text(stored.get("content")) != _text(replayed.get("content")):
        if echoed or not _reasoning_in_content(stored, replayed):
            return None
        found.append("reasoning_in_content")
    elif reasoning != echoed:
        if echoed:
            return None
        found.append("reasoning_dropped")
    a, b = _calls(stored), _calls(replayed)
    if len(a) != len(b):
        return None
    for x, y in zip(a, b, strict=True):
        kinds = _call_differences(x, y, call_ids_rendered)
        if kinds is None:
            return None
        found += [k for k in kinds if k not in found]
    return found


def harness_matcher(call_ids_rendered: bool = True) -> Matcher:
    """The ``harness`` matcher of a family (``call_ids_rendered``: whether its template
    renders tool-call ids, which then must be kept)."""

    def harness(stored: Message, replayed: Message) -> bool:
        return tolerated(stored, replayed, call_ids_rendered=call_ids_rendered) is not None

    harness.call_ids_rendered = call_ids_rendered  # type: ignore[attr-defined]
    return harness


harness = harness_matcher()
"""The ``harness`` matcher of a family that renders tool-call ids."""


def differing_fields(stored: Message, replayed: Message) -> list[str]:
    """Which fields of ``replayed`` differ from ``stored`` (as ``strict`` compares them),
    for a log line or a report: ``role``, ``content``, ``reasoning_content``,
    ``tool_calls`` (count), ``tool_calls[i].<key>``."""
    fields = [name for name in ("role", "content", "reasoning_content")
              if _text(stored.get(name)) != _text(replayed.get(name))]
    a, b = _calls(stored), _calls(replayed)
    if len(a) != len(b):
        return [*fields, "tool_calls"]
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        fx, fy = x.get("function") or {}, y.get("function") or {}
        for key in ("name", "arguments"):
            if isinstance(fx, dict) and isinstance(fy, dict) and fx.get(key) != fy.get(key):
                fields.append(f"tool_calls[{i}].function.{key}")
        fields += [f"tool_calls[{i}].{key}" for key in sorted((set(x) | set(y)) - {"function"})
                   if x.get(key) != y.get(key)]
    return fields


BUILTIN: dict[str, Matcher] = {
    "strict": strict,
    "loose_tool_call": loose_tool_call,
    "harness": harness,
    "role_content_only": role_content_only,
}
DEFAULT = "harness"


class MatcherError(TitoError):
    """A user matcher raised or returned a non-bool (a server-side configuration bug)."""

    kind = ErrorKind.INTERNAL
    code = "matcher_failed"


def _checked(name: str, fn: Matcher) -> Matcher:
    def run(stored: Message, replayed: Message) -> bool:
        try:
            result = fn(stored, replayed)
        except Exception as exc:
            raise MatcherError(f"message matcher {name!r} raised {type(exc).__name__}: {exc}") \
                from exc
        if not isinstance(result, bool):
            raise MatcherError(
                f"message matcher {name!r} must return bool, got {type(result).__name__}"
            )
        return result

    run.__name__ = f"checked_{getattr(fn, '__name__', 'matcher')}"
    return run


def resolve_matcher(spec: str, *, call_ids_rendered: bool = True) -> Matcher:
    """A built-in name (exact, case-sensitive) or a trusted ``module:function`` / dotted path.
    ``call_ids_rendered``: whether the family's template renders tool-call ids (the
    ``harness`` matcher then keeps them).

    Only called at startup from the command line, never from a request.
    """
    if spec == "harness":
        return harness if call_ids_rendered else harness_matcher(False)
    if spec in BUILTIN:
        return BUILTIN[spec]
    if "." not in spec and ":" not in spec:
        raise ConfigError(
            f"unknown message matcher {spec!r}; use one of {sorted(BUILTIN)} or a dotted path"
        )
    fn = load_function(spec, "message matcher")
    return _checked(spec, fn)

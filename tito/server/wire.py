"""What every API shares on the wire: response types serialized with orjson (checked by
pydantic under ``TITO_CHECK_WIRE=1``), and request validation errors in one readable line."""

from __future__ import annotations

import os
from typing import Generic, TypeVar

import orjson
from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")


def describe_validation_error(exc: ValidationError) -> str:
    """One readable line per problem: ``messages.2.role: Input should be ...``."""
    parts = []
    for err in exc.errors()[:8]:
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        parts.append(f"{loc}: {err['msg']}")
    more = len(exc.errors()) - 8
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts)


CHECK_WIRE = os.environ.get("TITO_CHECK_WIRE") == "1"
"""``TITO_CHECK_WIRE=1`` (the test suite sets it): every response body is validated
against its declared type before it is sent."""


class Wire(Generic[T]):
    """A response type on the wire, serialized with orjson.

    mypy checks every key the serving modules write (the types are TypedDicts). Validating
    each body at run time as well would cost time on every reply, so only
    ``TITO_CHECK_WIRE=1`` does it (pydantic, strict: a wrong type or a missing key
    raises); the bytes sent are the same either way."""

    def __init__(self, kind: type[T]) -> None:
        self.adapter: TypeAdapter[T] = TypeAdapter(kind)

    def dump(self, value: T) -> bytes:
        if CHECK_WIRE:
            self.adapter.validate_python(value, strict=True)
        return orjson.dumps(value)

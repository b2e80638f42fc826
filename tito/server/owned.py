"""Request fields the gateway owns: a turn request that sends one is refused (400
``gateway_owned_field``), the prompt's ids come from the session, never from the client.

The check is part of each API's request model (:class:`RefusesOwnedFields`, a base of
Chat's, Responses' and Messages' request models), so it runs once, when a body's top-level
members are validated, and costs a dict lookup; a body whose members other than its
messages are byte for byte the last one's reuses that validation (and so that check).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, model_validator

from tito.types.errors import BadRequest

OWNED_FIELDS = ("input_ids",)
"""Top-level request fields the gateway owns."""


def refuse_owned(data: Any) -> None:
    """400 ``gateway_owned_field`` when the body ``data`` has a field the gateway owns
    (whatever its value, ``null`` included)."""
    if not isinstance(data, dict):
        return
    for name in OWNED_FIELDS:
        if name in data:
            raise BadRequest(f"{name} is owned by the gateway (the session renders the "
                             "prompt's ids) and cannot be sent by the client",
                             code="gateway_owned_field")


class RefusesOwnedFields(BaseModel):
    """A turn request model: validating a body that sends an owned field raises
    :class:`~tito.types.errors.BadRequest` (``gateway_owned_field``), not a validation
    error, so that the route answers with that code."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_owned(cls, data: Any) -> Any:
        refuse_owned(data)
        return data

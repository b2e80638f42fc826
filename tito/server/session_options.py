"""What ``POST /sessions`` may ask for (the reference framework's newer contract, design
§7): session-level sampling defaults, filled only into the turns that leave them out, and
whether the session is an ``evaluation`` rollout (reported in its metadata)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tito.server.http import decode_json
from tito.types.engine import SamplingParams
from tito.types.errors import BadRequest

SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k")
"""The sampling fields a session may set defaults for."""


@dataclass(frozen=True, slots=True)
class SessionOptions:
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    evaluation: bool = False

    def view(self) -> dict[str, Any]:
        """As ``GET /sessions/<id>`` and the samples' session metadata show them."""
        defaults = {k: getattr(self, k) for k in SAMPLING_DEFAULTS
                    if getattr(self, k) is not None}
        return {"evaluation": self.evaluation, "sampling_defaults": defaults}

    def to_json(self) -> dict[str, Any]:
        """As the journal keeps them (:meth:`from_json` reads them back)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "evaluation": self.evaluation}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionOptions:
        return cls(temperature=data.get("temperature"), top_p=data.get("top_p"),
                   top_k=data.get("top_k"), evaluation=bool(data.get("evaluation")))

    def fill(self, params: SamplingParams, request: object) -> SamplingParams:
        """``params`` with this session's defaults for the fields ``request`` (the API's
        decoded body) leaves out."""
        given = {k: getattr(self, k) for k in SAMPLING_DEFAULTS
                 if getattr(self, k) is not None and getattr(request, k, None) is None}
        return replace(params, **given) if given else params


def session_options(raw: bytes) -> SessionOptions:
    """The ``POST /sessions`` body (empty: no options); a bad one is a 400."""
    data = decode_json(raw, allow_empty=True)
    if not isinstance(data, dict):
        raise BadRequest("the POST /sessions body must be a JSON object")
    unknown = set(data) - {*SAMPLING_DEFAULTS, "evaluation"}
    if unknown:
        raise BadRequest(f"unknown session field(s): {sorted(unknown)}; a session takes "
                         f"{', '.join(SAMPLING_DEFAULTS)} and evaluation")
    evaluation = data.get("evaluation", False)
    if not isinstance(evaluation, bool):
        raise BadRequest("evaluation must be true or false")
    values: dict[str, Any] = {}
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not low <= value <= high:
            raise BadRequest(f"{name} must be a number from {low:g} to {high:g}")
        values[name] = float(value)
    top_k = data.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or (top_k < 1 and top_k != -1):
            raise BadRequest("top_k must be a positive integer or -1 (no limit)")
        values["top_k"] = top_k
    return SessionOptions(evaluation=evaluation, **values)

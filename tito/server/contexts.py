"""``POST /sessions/<id>/contexts`` (the reference framework's explicit contexts): create
an agent context before its first model call, with the identity its requests' headers
will repeat — ``{"agent_run_id", "context_id", "parent_agent_run_id",
"parent_tool_call_id", "derived_from_context_id"}`` (the first two required).

Idempotent: the same identity again answers 200 with ``created: false``; another identity
for a known context id is 409 ``context_conflict``; a parent agent that names no agent of
the session is 400 ``unknown_parent_agent``; a finished session is 409
``session_finished``. A bad body is 400 and creates nothing. Errors are in the session
routes' shape (OpenAI's; the reference's under ``--compat miles``).
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tito.server.finish import check_admission
from tito.server.gateway import Gateway
from tito.server.http import json_response, read_json
from tito.session.agents import ContextInfo
from tito.types.errors import BadRequest
from tito.types.messages import AgentRef

BODY_BYTES = 16 * 1024
FIELDS = {"agent_run_id": "agent_id", "context_id": "context_id",
          "parent_agent_run_id": "parent_agent_id",
          "parent_tool_call_id": "parent_tool_call_id",
          "derived_from_context_id": "derived_from"}
"""The body's fields (the reference framework's names) -> :class:`AgentRef`'s."""
_ID = re.compile(r"[!-~]{1,256}")


def context_ref(data: Any) -> AgentRef:
    """The registration body as the agent headers would name it; 400 on a bad one."""
    if not isinstance(data, dict):
        raise BadRequest("a context body must be a JSON object with agent_run_id and "
                         "context_id")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise BadRequest(f"unknown context field(s): {unknown} (known: {sorted(FIELDS)})")
    ref: dict[str, str] = {}
    for name, field in FIELDS.items():
        value = data.get(name)
        if value is None and name in ("agent_run_id", "context_id"):
            raise BadRequest(f"{name} is required", code="invalid_request")
        if value is None:
            continue
        if not isinstance(value, str) or _ID.fullmatch(value) is None:
            raise BadRequest(f"{name} must be 1 to 256 printable ASCII characters without "
                             f"spaces (got {str(value)[:40]!r})", code="invalid_request")
        ref[field] = value
    if ref.get("parent_agent_id") == ref["agent_id"]:
        raise BadRequest("an agent cannot be its own parent", code="invalid_request")
    if "parent_tool_call_id" in ref and "parent_agent_id" not in ref:
        raise BadRequest("parent_tool_call_id needs parent_agent_run_id",
                         code="invalid_request")
    return AgentRef(**ref, header="X-Miles-Agent-Run-Id")


def context_view(info: ContextInfo) -> dict[str, Any]:
    """A context in the reference framework's names, with tito's role and source."""
    view = {"agent_run_id": info.agent_id, "context_id": info.id,
            "parent_agent_run_id": info.parent_agent_id,
            "parent_tool_call_id": info.parent_tool_call_id,
            "derived_from_context_id": info.derived_from}
    return {**{k: v for k, v in view.items() if v is not None}, "role": info.role,
            "source": info.source}


async def register_context(gateway: Gateway, request: Request) -> Response:
    session = gateway.session(request.path_params["session_id"])
    ref = context_ref(await read_json(request, min(BODY_BYTES, gateway.config.max_body_bytes)))
    check_admission(session)
    info, created = session.register(ref)
    return json_response({"session_id": session.session_id, "created": created,
                          "context": context_view(info)})

"""What a request may carry that the gateway cannot give the model as such, and what it
becomes (design §7): hosted tools (``--hosted-tools``), images (``--images``) and a
structured-output schema that the engine cannot enforce.

Each API's converter calls these, so the three APIs word the same refusal the same way and
note the same facts in the turn (:attr:`tito.types.messages.TurnRequest.notes`).
"""

from __future__ import annotations

import logging

from tito.types.engine import SamplingParams
from tito.types.errors import BadRequest
from tito.types.messages import TurnRequest

log = logging.getLogger("tito.server")

IMAGE_MARKER = "[image]"
"""The text an image becomes under ``--images placeholder``."""
NOTE_IMAGES = "images_replaced"
"""The turn note: how many images of the request became :data:`IMAGE_MARKER`."""
NOTE_HOSTED_TOOLS = "hosted_tools_left_out"
"""The turn note: the hosted tools (by type or name) left out of the render."""
NOTE_STRUCTURED_OUTPUT = "structured_output"
"""The turn note ``"not_enforced"``: the request asked for a JSON schema that the engine
cannot constrain decoding to (the embedded engine); the turn ran unconstrained."""


def image_text(policy: str, where: str) -> str:
    """The text the image at ``where`` (e.g. ``messages[3].content[1]``) becomes:
    :data:`IMAGE_MARKER` under ``--images placeholder``; else 400 ``unsupported_content``."""
    if policy == "placeholder":
        return IMAGE_MARKER
    raise BadRequest(f"{where} is an image, and the gateway renders text only; start tito "
                     f"serve with --images placeholder to render each image as the marker "
                     f"{IMAGE_MARKER!r} (noted in the samples' tito_turn_notes)",
                     code="unsupported_content")


def hosted_tools_refused(policy: str, names: list[str], where: str) -> None:
    """400 ``unsupported_tool`` naming ``names`` under ``--hosted-tools error``."""
    if policy == "error" and names:
        raise BadRequest(f"{where} declares hosted tool(s) {', '.join(names)} that the gateway "
                         "cannot run (tito serve --hosted-tools error); start it with "
                         "--hosted-tools drop to leave them out of the render",
                         code="unsupported_tool")


def warn_hosted_once(warned: set[str], session_id: str, names: list[str]) -> None:
    """Log once per session and tool the hosted tools left out (``warned``: the session's
    :attr:`tito.server.api_state.ApiState.hosted_warned`)."""
    new = [n for n in names if n not in warned]
    if new:
        warned.update(new)
        log.warning("session %s: hosted tool(s) %s left out of the render (the gateway "
                    "cannot run them; --hosted-tools error refuses them instead)",
                    session_id, ", ".join(new))


def note_unenforced(engine: object, turn: TurnRequest, params: SamplingParams) -> None:
    """Note in ``turn`` a JSON schema (``params.json_schema``) that ``engine`` does not
    enforce: an engine enforces one when its ``enforces_json_schema`` attribute is true."""
    if params.json_schema is not None and not getattr(engine, "enforces_json_schema", False):
        turn.notes = {**(turn.notes or {}), NOTE_STRUCTURED_OUTPUT: "not_enforced"}

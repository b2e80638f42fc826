"""Generation links (the reference framework's ``X-Miles-Previous-Response-Id``,
``X-Miles-Retry-Of`` and ``X-Miles-Supersedes``, :class:`~tito.types.messages.TurnLinks`):
each names an earlier generation — a reply's generation id — of the agent context the
request is routed to, checked when the turn is claimed, before the engine is called.

- a name that no context of the session holds is 409 ``unknown_generation``; one that
  another context holds is 409 ``generation_context_mismatch`` (a link stays inside its
  context);
- a previous response whose messages (the path up to its reply) the request does not
  start with is 409 ``previous_response_mismatch``; v2 then attaches the turn under
  that very node (:func:`pinned_parent`), not the deepest match.

v1 looks a generation up on its context's path (a rolled-back turn is gone), v2 in its
whole tree. Pure: reads the contexts, changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from tito.session.base import TurnSession
from tito.session.matchers import Matcher
from tito.session.nodes import Node
from tito.session.turns import match_len
from tito.types.errors import Conflict
from tito.types.messages import Message, TurnRequest

_HEADERS = {"previous_response_id": "X-Miles-Previous-Response-Id",
            "retry_of": "X-Miles-Retry-Of", "supersedes": "X-Miles-Supersedes"}


def check_links(request: TurnRequest, own: tuple[str, TurnSession],
                others: Iterable[tuple[str, TurnSession]], matcher: Matcher) -> None:
    """Check ``request``'s links against its context ``own`` (its id and its session)
    and the session's ``others``."""
    links = request.links
    if links is None:
        return
    context, session = own
    for field, gid in links.to_json().items():
        messages = session.response_messages(gid)
        if messages is None:
            holder = next((cid for cid, other in others
                           if other.response_messages(gid) is not None), None)
            header = _HEADERS[field]
            if holder is not None:
                raise Conflict(f"{header} {gid!r} is a generation of agent context "
                               f"{holder!r}, not of {context!r}: a link must name a "
                               "generation of the same context",
                               code="generation_context_mismatch")
            raise Conflict(f"{header} {gid!r} names no generation of agent context "
                           f"{context!r} (a generation id is a reply's "
                           "X-Miles-Generation-Id; v1 keeps those of its current path)",
                           code="unknown_generation")
        if field == "previous_response_id":
            _check_prefix(gid, messages, request.messages, matcher)


def _check_prefix(gid: str, stored: list[Message], messages: list[Message],
                  matcher: Matcher) -> None:
    if len(messages) <= len(stored) or match_len(matcher, stored, messages) < len(stored):
        raise Conflict(f"previous response {gid!r} ends a conversation of {len(stored)} "
                       f"messages that the request's {len(messages)} messages do not start "
                       "with (and go on after): send its messages, its reply included, "
                       "then the new ones", code="previous_response_mismatch")


def pinned_parent(nodes: list[Node], request: TurnRequest) -> tuple[int, int] | None:
    """v2: ``(node id, messages its path covers)`` of the previous response a request
    names (None: it names none, or the tree does not hold it)."""
    links = request.links
    gid = None if links is None else links.previous_response_id
    if gid is None:
        return None
    for node in reversed(nodes):
        if node.response_id == gid:
            return node.id, node.path_messages
    return None

"""``previous_response_id`` (design §7.3): a response continues an earlier one *of the same
session*. Each session remembers, for its latest :data:`MAX_REMEMBERED` responses, the
whole chat message list of that turn (the request's messages and the assistant message
produced); a session that keeps every response's messages itself (a v2 tree: its nodes)
is asked for one the map forgot.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from tito.server.api_state import ApiState
from tito.session import Session
from tito.types.errors import BadRequest
from tito.types.messages import Message

MAX_REMEMBERED = 256
"""Responses per session that ``previous_response_id`` can continue."""


@dataclass
class ResponseHistory:
    """Per session: response id -> the chat messages of that turn, its reply included."""

    turns: OrderedDict[str, list[Message]] = field(default_factory=OrderedDict)

    @classmethod
    def of(cls, session: Session) -> ResponseHistory:
        state = ApiState.of(session)
        if state.responses is None:
            state.responses = cls()
            for response_id, messages in state.restored_responses.items():  # a replay's
                state.responses.remember(response_id, messages)
            state.restored_responses = {}
        return state.responses

    def remember(self, response_id: str, messages: list[Message]) -> None:
        self.turns[response_id] = messages
        while len(self.turns) > MAX_REMEMBERED:
            self.turns.popitem(last=False)

    def messages_of(self, session: Session, response_id: str) -> list[Message]:
        """The messages ``response_id`` ended with (BadRequest when this session has no
        such response)."""
        messages = self.turns.get(response_id)
        if messages is None:
            messages = session.response_messages(response_id)
        if messages is not None:
            return messages
        raise BadRequest(f"previous response {response_id!r} is not known in session "
                         f"{session.session_id} (a response can only be continued in the "
                         f"session that produced it, and only its latest {MAX_REMEMBERED} "
                         "responses are kept)", code="previous_response_not_found")

"""What the API layer keeps per session, typed: the retry answers, each API's last body
(what the next body of that API may extend, :mod:`tito.server.growing_body`) per agent
its headers name, and the Responses API's remembered responses. A session of any version
carries one (:attr:`tito.session.Session.api_state`), given when the gateway creates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tito.server.growing_body import covered
from tito.server.idempotency import TurnReplies
from tito.session import Session
from tito.types.messages import Message

if TYPE_CHECKING:
    from tito.server.anthropic.decode import LastBody as MessagesBody
    from tito.server.finish import FinishState
    from tito.server.openai.decode import LastBody as ChatBody
    from tito.server.responses.decode import LastBody as ResponsesBody
    from tito.server.responses.history import ResponseHistory
    from tito.server.session_options import SessionOptions


MAX_AGENT_BODIES = 32
"""Agents whose last bodies a session keeps besides its unnamed one (the oldest named
agent's are dropped past it: its next body is decoded whole)."""


@dataclass(slots=True)
class LastBodies:
    """One agent's last valid body of each API (each agent of a session grows its own)."""

    chat_body: ChatBody | None = None
    """The last valid Chat Completions body."""
    messages_body: MessagesBody | None = None
    """The last valid Anthropic Messages body."""
    responses_body: ResponsesBody | None = None
    """The last valid Responses body (with its whole conversation as input)."""

    def covered(self, body: bytes) -> int:
        """How many leading bytes of ``body`` one of these last bodies covers (what its
        decode will not parse again, :func:`~tito.server.growing_body.covered`)."""
        return max((covered(body, last.parsed) for last in
                    (self.chat_body, self.messages_body, self.responses_body)
                    if last is not None), default=0)


@dataclass(slots=True)
class ApiState(LastBodies):
    """Its own :class:`LastBodies` are those of requests that name no agent."""

    replies: TurnReplies = field(default_factory=TurnReplies)
    """The running and the last answered turns (idempotent retries)."""
    named_bodies: dict[str, LastBodies] = field(default_factory=dict)
    """The last bodies of each agent a request's headers named (at most
    :data:`MAX_AGENT_BODIES`, the most recent)."""
    responses: ResponseHistory | None = None
    """Responses that ``previous_response_id`` can continue (made at the first one)."""
    restored_responses: dict[str, list[Message]] = field(default_factory=dict)
    """Responses a journal replay brought back (the Responses history takes them in)."""
    hosted_warned: set[str] = field(default_factory=set)
    """Hosted tools already logged as left out (one warning per session and tool)."""
    options: SessionOptions | None = None
    """What ``POST /sessions`` asked for: sampling defaults, ``evaluation``."""
    finish: FinishState | None = None
    """Its finish, once ``POST /sessions/<id>/finish`` was called (admission closed)."""

    def last_bodies(self, agent: str | None) -> LastBodies:
        """The last bodies of the agent context ``agent`` names (None: no header)."""
        if agent is None:
            return self
        bodies = self.named_bodies.pop(agent, None)
        if bodies is None:
            bodies = LastBodies()
            if len(self.named_bodies) >= MAX_AGENT_BODIES:
                del self.named_bodies[next(iter(self.named_bodies))]
        self.named_bodies[agent] = bodies  # the most recent last
        return bodies

    @staticmethod
    def of(session: Session) -> ApiState:
        """``session``'s state (made here for a session created without one)."""
        state = session.api_state
        if isinstance(state, ApiState):
            return state
        state = session.api_state = ApiState()
        return state

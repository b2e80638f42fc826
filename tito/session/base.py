"""The session protocol (design §5): what the server asks of a session, whatever its
version, and the base that v1 and v2 sessions share.

A turn is two steps around the engine call: :meth:`Session.plan` (validated, prompt ids
computed, the session claimed and otherwise unchanged) and :meth:`Session.apply` of a
:class:`~tito.session.turns.TurnCommit` built by :meth:`Session.prepare_commit` (or
:meth:`Session.release` when the turn failed: the session is exactly as before). Around
that: a copy of what is committed for a sample collection (:meth:`Session.collection`),
the bytes it stores, the messages an API response ended with, and what ``GET
/sessions/<id>`` and the viewer show of it. The server never asks which version a session
is; anything session-like (a v1 path, a v2 tree, a context inside a session) that keeps
this protocol can stand behind the API routes.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from tito.render.base import TemplateRenderer
from tito.session.agents import ContextInfo
from tito.session.collect import Collection
from tito.session.matchers import Matcher
from tito.session.turns import TurnCommit, TurnPlan, build_commit, exact_matches
from tito.types.engine import CheckedOutput, GenerateResult
from tito.types.messages import AgentRef, Message, TurnRequest
from tito.types.records import TurnRecord


@dataclass(frozen=True, slots=True)
class StoredBytes:
    """What a session holds (gauges of ``/metrics``)."""

    tokens: int
    """Token ids of its active path."""
    ids: int
    """Bytes of its stored token ids (a v1 session of a family without trailing trim
    keeps them once, in its snapshot)."""
    logprobs: int
    routing: int
    """Bytes of routing and indexer rows."""


class TurnSession(Protocol):
    """A session-like object: a v1 path, a v2 tree, or one agent context inside a
    session (:mod:`tito.session.contexts`)."""

    session_id: str
    closed: bool
    created_at: float
    last_active: float
    api_state: object
    """What the API layer keeps per session (:class:`tito.server.api_state.ApiState`)."""

    @property
    def version(self) -> str:
        """``v1`` or ``v2``."""
        ...

    @property
    def in_flight(self) -> bool: ...

    @property
    def records(self) -> list[TurnRecord]:
        """The records of the active path."""
        ...

    @property
    def messages(self) -> list[Message]:
        """The messages of the active path."""
        ...

    @property
    def num_tokens(self) -> int: ...

    def plan(self, request: TurnRequest) -> TurnPlan: ...

    def begin(self, request: TurnRequest) -> None:
        """Claim the session for ``request``'s turn (a session of agent contexts: the
        context it routes to, named in ``request.context``)."""
        ...

    def prepare(self, request: TurnRequest) -> TurnPlan: ...

    def release(self, plan: TurnPlan | None = None, *,
                request: TurnRequest | None = None) -> None:
        """Give up a claim: the failed turn's ``plan``, or its ``request`` when it failed
        before it had one."""
        ...

    def prepare_commit(self, plan: TurnPlan, result: GenerateResult, output: CheckedOutput,
                       message: Message, *, routed: np.ndarray | None = None,
                       routed_start: int = 0, indexer: np.ndarray | None = None
                       ) -> TurnCommit: ...

    def apply(self, turn: TurnCommit, plan: TurnPlan | None) -> None: ...

    def rebuild_snapshot(self) -> None: ...

    def collection(self) -> Collection: ...

    def stored_bytes(self) -> StoredBytes: ...

    def response_messages(self, response_id: str) -> list[Message] | None: ...

    def details(self) -> dict[str, Any]: ...

    def counts(self) -> dict[str, int]: ...

    def view_key(self) -> Hashable: ...


class Session(TurnSession, Protocol):
    """A live session, as the server uses it: turns are routed to its agent contexts
    (:class:`tito.session.contexts.ContextSession`)."""

    def agent_context(self, context_id: str) -> TurnSession:
        """One of its agent contexts, by id (400 ``unknown_context`` when it has none)."""
        ...

    def register(self, agent: AgentRef) -> tuple[ContextInfo, bool]:
        """Create the agent context ``agent`` names before its first turn (idempotent):
        its identity and whether it was created."""
        ...


class SessionBase(ABC):
    """What v1 and v2 sessions share: identity, times, the API state, planning around a
    claim, and building a commit."""

    version: ClassVar[str]

    def __init__(self, session_id: str, renderer: TemplateRenderer, matcher: Matcher,
                 api_state: object = None, *, after_length_cut: str = "keep") -> None:
        self.session_id = session_id
        self.after_length_cut = after_length_cut
        """``keep``: a turn may extend a reply cut by ``finish_reason=length``; ``refuse``:
        409 ``truncated_generation`` (:func:`tito.session.turns.check_after_cut`)."""
        self.renderer = renderer
        self.matcher = matcher
        self._exact = exact_matches(matcher)
        self.closed = False
        self.api_state = api_state
        """What the API layer keeps per session (given by the session's creator)."""
        self.created_at = time.time()
        self.last_active = self.created_at

    # -- planning -------------------------------------------------------------------------
    def plan(self, request: TurnRequest) -> TurnPlan:
        """Validate ``request`` and compute its prompt ids; raises before any mutation."""
        self.begin(request)
        try:
            return self.prepare(request)
        except BaseException:
            self.release(request=request)
            raise

    @abstractmethod
    def begin(self, request: TurnRequest | None = None) -> None:
        """Claim the session for one turn."""

    @abstractmethod
    def prepare(self, request: TurnRequest) -> TurnPlan:
        """The plan of a claimed turn (:meth:`begin`): reads the session, changes nothing,
        so it may run in a worker thread while the session is claimed."""

    @abstractmethod
    def release(self, plan: TurnPlan | None = None, *,
                request: TurnRequest | None = None) -> None:
        """The turn failed (or the claim is given up): the session is as before."""

    # -- commit ---------------------------------------------------------------------------
    def prepare_commit(self, plan: TurnPlan, result: GenerateResult, output: CheckedOutput,
                       message: Message, *, routed: np.ndarray | None = None,
                       routed_start: int = 0, indexer: np.ndarray | None = None
                       ) -> TurnCommit:
        """The committed turn, built without changing the session (it may fail)."""
        return build_commit(plan, result, output, message, routed=routed,
                            routed_start=routed_start, indexer=indexer)

    def commit(self, plan: TurnPlan, result: GenerateResult, output: CheckedOutput,
               message: Message) -> TurnRecord:
        """Store the generation, atomically."""
        turn = self.prepare_commit(plan, result, output, message)
        self.apply(turn, plan)
        return turn.record

    @abstractmethod
    def apply(self, turn: TurnCommit, plan: TurnPlan | None) -> None:
        """Apply a prepared turn (``plan`` None: a journal replay; the snapshot is rebuilt
        by :meth:`rebuild_snapshot` afterwards)."""

    # -- views ----------------------------------------------------------------------------
    def response_messages(self, response_id: str) -> list[Message] | None:
        """The messages the turn answered by ``response_id`` ended with, its reply
        included, when the session keeps them (None: it does not)."""
        return None

    def details(self) -> dict[str, Any]:
        """What ``GET /sessions/<id>`` adds to its metadata for this version."""
        return {}

    def counts(self) -> dict[str, int]:
        """What the viewer's session list adds for this version."""
        return {}

    @staticmethod
    def routing_bytes(records: list[TurnRecord]) -> int:
        return sum(rows.nbytes for rec in records
                   for rows in (rec.routed_experts, rec.indexer_topk, rec.sampling_mask_ids,
                                rec.sampling_mask_offsets) if rows is not None)

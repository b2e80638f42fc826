"""A session of agent contexts (design §5.5): the main agent, its sub-agents and side
requests share one session URL, each in a context of its own — a v1 path or a v2 tree —
with its own turn claim, so a sub-agent runs while the main agent waits on its tool call.

:class:`ContextSession` keeps the :class:`~tito.session.base.Session` protocol for the
server and routes each turn to a context when it claims it (:meth:`ContextSession.begin`,
on the event loop):

1. **agent headers** (:attr:`TurnRequest.agent`): the context they name, created on its
   first turn; a parent agent id must name an agent of this session (400
   ``unknown_parent_agent``), and a context's identity never changes (409
   ``context_conflict``);
2. a **side request** (no tools, and a structured-output or title-like request, on a
   session whose main agent has tools): a side context (role ``side``);
3. otherwise **inferred**: the context whose conversation the request continues (the
   same opening message, :func:`tito.session.agents.opening`) among those that no header
   named; a request that opens another conversation starts a new context (role
   ``subagent``). Within a context the version's own rules hold (v1: bounded rollback,
   409 while its turn runs; v2: a tree).

A context exists once its first turn is committed: a refused or failed first turn leaves
no trace. Its samples carry its lineage (:meth:`ContextInfo.lineage`); a session whose
only context is its main one is exactly a v1 path or a v2 tree, bytes included.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tito.session.agents import (
    MAIN,
    MAIN_INFO,
    MAX_CONTEXTS,
    ContextInfo,
    opening,
    spawning_call,
    title_like,
)
from tito.session.base import StoredBytes, TurnSession
from tito.session.collect import Collection, ContextsCollection
from tito.session.links import check_links
from tito.session.matchers import Matcher
from tito.session.turns import TurnCommit, TurnPlan
from tito.types.engine import CheckedOutput, GenerateResult
from tito.types.errors import BadRequest, Conflict
from tito.types.messages import AgentRef, Message, TurnRequest
from tito.types.records import TurnRecord

__all__ = ["AgentContext", "ContextSession"]


@dataclass(slots=True)
class AgentContext:
    """One context: its identity, its session (a path or a tree) and what routing reads."""

    info: ContextInfo
    session: TurnSession
    turns: int = 0
    """Turns committed to it."""
    claims: int = 0
    """Turns claimed and not yet committed or released."""
    tool_claims: int = 0
    """... of which declare tools."""
    has_tools: bool = False
    """A committed turn declared tools."""
    openings: list[Message] = field(default_factory=list)
    """The opening messages of its first turns (v1: the path's; v2: its roots')."""
    registered: bool = False
    """Created by ``POST /sessions/<id>/contexts`` (it exists before its first turn)."""

    def opens(self, message: Message | None, matcher: Matcher) -> bool:
        """Whether a request opening with ``message`` continues this conversation."""
        if message is None:
            return False
        for known in self.openings:  # a loop, not any(): this runs on every turn
            if known is message or known == message or matcher(known, message):
                return True
        return False

    @property
    def used(self) -> bool:
        return self.turns > 0 or self.claims > 0 or self.registered


class ContextSession:
    """A live session of one or more agent contexts (see the module docstring)."""

    def __init__(self, session_id: str, new_context: Callable[[], TurnSession], *,
                 matcher: Matcher, side_requests: str = "drop",
                 api_state: object = None) -> None:
        self.session_id = session_id
        self._new_context = new_context
        self._main = AgentContext(MAIN_INFO, new_context())
        self.contexts: dict[str, AgentContext] = {MAIN: self._main}
        """Every context, the main one first, then in creation order."""
        self.matcher = matcher
        self.side_requests = side_requests
        self.closed = False
        self.api_state = api_state
        self.created_at = self._main.session.created_at
        self._last_active = self.created_at

    # -- the view: the primary context ----------------------------------------------------
    @property
    def version(self) -> str:
        return self._main.session.version

    def primary(self) -> AgentContext:
        """The main agent's context: the session's first one, unless it was never used
        and a header named the main agent (its first committed parentless context)."""
        main = self._main
        if main.used or len(self.contexts) == 1:
            return main
        return next((c for c in self.contexts.values() if c.info.role == "main" and c.turns),
                    main)

    @property
    def last_active(self) -> float:
        if len(self.contexts) == 1:
            return max(self._last_active, self._main.session.last_active)
        return max(self._last_active, *(c.session.last_active for c in self.contexts.values()))

    @last_active.setter
    def last_active(self, value: float) -> None:
        self._last_active = value

    @property
    def in_flight(self) -> bool:
        if len(self.contexts) == 1:
            return self._main.session.in_flight
        return any(c.session.in_flight for c in self.contexts.values())

    @property
    def records(self) -> list[TurnRecord]:
        return self.primary().session.records

    @property
    def messages(self) -> list[Message]:
        return self.primary().session.messages

    @property
    def num_tokens(self) -> int:
        return self.primary().session.num_tokens

    def agent_context(self, context_id: str) -> TurnSession:
        ctx = self.contexts.get(context_id)
        if ctx is None or (not ctx.turns and ctx is not self._main):
            known = ", ".join(c.info.id for c in self.contexts.values() if c.turns) or "none"
            raise BadRequest(f"session {self.session_id} has no agent context "
                             f"{context_id!r} (contexts: {known})", code="unknown_context")
        return ctx.session

    def ordered(self) -> Iterator[AgentContext]:
        """The primary context first, then the others in creation order."""
        primary = self.primary()
        yield primary
        yield from (c for c in self.contexts.values() if c is not primary)

    def multi(self) -> bool:
        """Whether any context besides the session's first one has turns or runs one (a
        header named an agent, or a request opened another conversation): then the views
        list the contexts and the samples carry lineage."""
        if len(self.contexts) == 1:
            return False
        main = self._main
        return any(c.used for c in self.contexts.values() if c is not main)

    # -- routing (on the event loop) ------------------------------------------------------
    def plan(self, request: TurnRequest) -> TurnPlan:
        self.begin(request)
        try:
            return self.prepare(request)
        except BaseException:
            self.release(request=request)
            raise

    def begin(self, request: TurnRequest) -> None:
        """Route ``request`` to its context (:attr:`TurnRequest.context`) and claim it
        there; a refusal leaves the session as it was."""
        ctx = self._route(request)
        try:
            if request.links is not None:
                check_links(request, (ctx.info.id, ctx.session),
                            ((c.info.id, c.session) for c in self.contexts.values()
                             if c is not ctx), self.matcher)
            ctx.session.begin(request)
        except Conflict as exc:
            self._forget_unused(ctx)
            if ctx is not self._main and exc.code == "turn_in_progress":
                raise Conflict(f"agent context {ctx.info.id!r} of session {self.session_id} "
                               "has a turn in progress; wait for its reply before sending "
                               "its next request", code="turn_in_progress") from exc
            raise
        except BaseException:
            self._forget_unused(ctx)
            raise
        ctx.claims += 1
        if request.tools:
            ctx.tool_claims += 1
        request.context = ctx.info.id

    def _route(self, request: TurnRequest) -> AgentContext:
        if request.agent is not None:
            return self._named(request.agent, request)
        if not request.tools and self._side(request):
            return self._side_context(request)
        return self._inferred(request)

    def _inferred(self, request: TurnRequest) -> AgentContext:
        """The context a request without agent headers continues (see the module): the
        session's first context until it has a turn (unless a header named the main agent
        elsewhere), then the one with the request's opening among those no header named."""
        main = self._main
        if not main.turns and (main.claims or self.primary() is main):
            return main
        first = opening(request.messages)
        for ctx in self.contexts.values():
            if ctx.info.source != "header" and ctx.opens(first, self.matcher):
                return ctx
        if first is None:
            return main  # no messages: the plan refuses it
        parent = self.primary()
        return self._create(ContextInfo(
            self._fresh_id("agent"), "", "subagent", parent.info.agent_id,
            spawning_call(_last_call(parent), first), "inferred"))

    def _side(self, request: TurnRequest) -> bool:
        primary = self.primary()
        if not (primary.has_tools or primary.tool_claims):
            return False
        return request.structured or title_like(request.messages)

    def _side_context(self, request: TurnRequest) -> AgentContext:
        first = opening(request.messages)
        for ctx in self.contexts.values():
            if ctx.info.role == "side" and ctx.opens(first, self.matcher):
                return ctx
        return self._create(ContextInfo(self._fresh_id("side"), "", "side",
                                        self.primary().info.agent_id, None, "side"))

    def register(self, agent: AgentRef) -> tuple[ContextInfo, bool]:
        """``POST /sessions/<id>/contexts``: the context ``agent`` names, created now
        (before its first turn) unless it exists; ``(its identity, whether it was
        created)``. Idempotent: the same identity again changes nothing; another one is
        409 ``context_conflict``, as a header's would be."""
        existing = self.contexts.get(agent.key or "")
        created = existing is None or not existing.used
        ctx = self._named(agent, None)
        ctx.registered = True
        return ctx.info, created

    def _named(self, agent: AgentRef, request: TurnRequest | None) -> AgentContext:
        """The context an agent header names; a new one is checked first: its parent must
        be an agent of this session (``request`` None: a registration, no turn)."""
        key = agent.key
        if key is None:
            raise BadRequest(f"{agent.header or 'the agent headers'} name a parent but no "
                             "agent: send the agent's own id too", code="invalid_agent_header")
        ctx = self.contexts.get(key)
        if ctx is not None:
            self._check_identity(ctx, agent)
            return ctx
        agent_id = agent.agent_id or key
        self._check_source(agent, agent_id, key)
        sibling = next((c for c in self.contexts.values() if c.info.agent_id == agent_id
                        and c.used), None)
        if sibling is not None:  # another context of a known agent (e.g. after compaction)
            self._check_identity(sibling, agent, derived=False)
            return self._create(replace(sibling.info, id=key, source="header",
                                        derived_from=agent.derived_from))
        parent = self._parent(agent, agent_id)
        tool = agent.parent_tool_call_id
        if tool is None and parent is not None and request is not None:
            tool = spawning_call(_last_call(parent), opening(request.messages))
        return self._create(ContextInfo(
            key, agent_id, "main" if parent is None else "subagent",
            None if parent is None else parent.info.agent_id, tool, "header",
            agent.derived_from))

    def _check_source(self, agent: AgentRef, agent_id: str, key: str) -> None:
        """A context derives from one of its own agent's (a known context of another agent
        is 409 ``context_conflict``; an unknown one is lineage only, as the reference
        framework's merged contract has it: no order of registration)."""
        source = agent.derived_from
        if source is None:
            return
        known = self.contexts.get(source)
        if source == key or (known is not None and known.used
                             and known.info.agent_id != agent_id):
            raise Conflict(f"agent context {key!r} cannot derive from context {source!r}: "
                           "a context derives from an earlier context of its own agent "
                           f"({agent_id!r})", code="context_conflict")

    def _parent(self, agent: AgentRef, agent_id: str) -> AgentContext | None:
        """The parent of a new named agent: the one its header names, else the main
        agent's context (None: it is the session's first agent, the main one)."""
        name = agent.parent_agent_id
        if name is None:
            primary = self.primary()
            first = not primary.used and not any(c.used for c in self.contexts.values())
            return None if first else primary
        if name == agent_id:
            raise BadRequest(f"agent {agent_id!r} names itself as its parent",
                             code="invalid_agent_header")
        parent = next((c for c in self.contexts.values() if c.info.agent_id == name
                       and (c.used or c is self._main)), None)
        if parent is None:
            known = sorted({c.info.agent_id for c in self.contexts.values()
                            if c.used or c is self._main})
            raise BadRequest(
                f"parent agent {name!r} names no agent of session {self.session_id} "
                f"(its agents: {', '.join(known)}); a parent must have sent a request on "
                "this session first", code="unknown_parent_agent")
        return parent

    def _check_identity(self, ctx: AgentContext, agent: AgentRef, *,
                        derived: bool = True) -> None:
        info = ctx.info
        changed = [name for name, given, kept in (
            ("agent id", agent.agent_id, info.agent_id),
            ("parent agent id", agent.parent_agent_id, info.parent_agent_id),
            ("source context", agent.derived_from if derived else None, info.derived_from))
            if given is not None and given != kept]
        if changed:
            raise Conflict(f"agent context {info.id!r} of session {self.session_id} has "
                           f"another {' and '.join(changed)} ({info.agent_id!r}, parent "
                           f"{info.parent_agent_id!r}); a context's identity never changes: "
                           "use a new context id", code="context_conflict")

    def _create(self, info: ContextInfo) -> AgentContext:
        if len(self.contexts) >= MAX_CONTEXTS:
            raise Conflict(f"session {self.session_id} holds {MAX_CONTEXTS} agent contexts, "
                           "its cap; start a new session", code="context_cap_reached")
        if not info.agent_id:
            info = replace(info, agent_id=info.id)
        ctx = AgentContext(info, self._new_context())
        self.contexts[info.id] = ctx
        return ctx

    def _fresh_id(self, prefix: str) -> str:
        n = len(self.contexts)
        while f"{prefix}-{n}" in self.contexts:
            n += 1
        return f"{prefix}-{n}"

    def _forget_unused(self, ctx: AgentContext) -> None:
        """A context whose first turn never committed leaves no trace."""
        if ctx is not self._main and not ctx.used:
            self.contexts.pop(ctx.info.id, None)

    def _claimed(self, key: str | None) -> AgentContext:
        return self._main if key is None else self.contexts[key]

    # -- the turn (``prepare`` may run in a worker thread) ---------------------------------
    def prepare(self, request: TurnRequest) -> TurnPlan:
        ctx = self._claimed(request.context)
        plan = ctx.session.prepare(request)
        plan.context = ctx.info
        return plan

    def release(self, plan: TurnPlan | None = None, *,
                request: TurnRequest | None = None) -> None:
        req = plan.request if plan is not None else request
        ctx = self._claimed(None if req is None else req.context)
        ctx.session.release(plan, request=req)
        if req is not None:
            self._unclaim(ctx, req)
            self._forget_unused(ctx)

    def _unclaim(self, ctx: AgentContext, request: TurnRequest) -> None:
        ctx.claims -= 1
        if request.tools:
            ctx.tool_claims -= 1

    def prepare_commit(self, plan: TurnPlan, result: GenerateResult, output: CheckedOutput,
                       message: Message, *, routed: np.ndarray | None = None,
                       routed_start: int = 0, indexer: np.ndarray | None = None
                       ) -> TurnCommit:
        session = self._claimed(plan.request.context).session
        return session.prepare_commit(plan, result, output, message, routed=routed,
                                      routed_start=routed_start, indexer=indexer)

    def apply(self, turn: TurnCommit, plan: TurnPlan | None) -> None:
        """Apply a prepared turn to its context (a journal replay creates the context on
        its first turn)."""
        info = turn.context
        ctx = self.contexts.get(MAIN if info is None else info.id)
        if ctx is None:
            assert info is not None and plan is None, "a planned turn's context is claimed"
            ctx = self._create(info)
        ctx.session.apply(turn, plan)
        ctx.turns += 1
        if turn.tools:
            ctx.has_tools = True
        if turn.keep_records == 0:
            first = opening(turn.appended) if turn.appended else turn.message
            if first is not None and not ctx.opens(first, self.matcher):
                ctx.openings.append(first)
        if plan is not None:
            self._unclaim(ctx, plan.request)

    def rebuild_snapshot(self) -> None:
        for ctx in self.contexts.values():
            ctx.session.rebuild_snapshot()

    # -- views -----------------------------------------------------------------------------
    def collection(self) -> Collection:
        if not self.multi():
            return self._main.session.collection()
        used = [c for c in self.ordered() if c.turns]
        return ContextsCollection(
            self.session_id, self.version, [(c.info, c.session.collection()) for c in used],
            [self.entry(c) for c in used], self.side_requests, self.in_flight)

    def entry(self, ctx: AgentContext) -> dict[str, Any]:
        """A context as ``GET /sessions/<id>`` and the samples' session metadata list it."""
        session = ctx.session
        return {**ctx.info.lineage(), "source": ctx.info.source,
                "num_turns": len(session.records), "num_messages": len(session.messages),
                "num_tokens": session.num_tokens, "turn_in_progress": session.in_flight,
                **session.details()}

    def stored_bytes(self) -> StoredBytes:
        if len(self.contexts) == 1:
            return self._main.session.stored_bytes()
        parts = [c.session.stored_bytes() for c in self.contexts.values()]
        return StoredBytes(tokens=sum(p.tokens for p in parts), ids=sum(p.ids for p in parts),
                           logprobs=sum(p.logprobs for p in parts),
                           routing=sum(p.routing for p in parts))

    def response_messages(self, response_id: str) -> list[Message] | None:
        for ctx in self.contexts.values():
            found = ctx.session.response_messages(response_id)
            if found is not None:
                return found
        return None

    def details(self) -> dict[str, Any]:
        details = self.primary().session.details()
        if self.multi():
            details["contexts"] = [self.entry(c) for c in self.ordered() if c.used]
        return details

    def counts(self) -> dict[str, int]:
        counts = self.primary().session.counts()
        if self.multi():
            counts["contexts"] = sum(1 for c in self.contexts.values() if c.used)
        return counts

    def view_key(self) -> Hashable:
        if len(self.contexts) == 1:
            return self._main.session.view_key()
        return tuple((c.info.id, c.session.view_key()) for c in self.contexts.values())


def _last_call(ctx: AgentContext) -> Message | None:
    """The latest assistant message of a context's view that called tools (where a
    sub-agent's spawning call is)."""
    for message in reversed(ctx.session.messages[-8:]):
        if message.get("role") == "assistant" and message.get("tool_calls"):
            return message
    return None

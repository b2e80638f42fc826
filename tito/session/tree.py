"""v2 tree sessions (design §5.2): every lineage is kept, nothing is rejected for
divergence.

A request attaches to the deepest node whose whole root→node message path prefixes it
(under the matcher; ties → the latest commit; the search never mutates), and its
unmatched suffix plus the generated assistant message become a new child — or a new root
when nothing matches. Retries, deep divergences, compaction (a rewritten assistant stops
the match before it and joins the new node's messages as history) and sub-agents
(zero overlap: new roots) all grow the forest. A node whose generation ended with
``finish_reason=length`` is extended like any other (its leaf's sample holds every turn),
unless ``--after-length-cut refuse``: then 409 ``truncated_generation``, and branching
before the cut works. Concurrent requests on one session commit as siblings.

The view (:attr:`records`, :attr:`messages`, :attr:`snapshot`) is the path of the last
committed node, the *active leaf*; a failed request never moves it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import numpy as np

from tito.render.base import TemplateRenderer
from tito.session.base import SessionBase, StoredBytes
from tito.session.collect import TreeCollection
from tito.session.idbuffer import IdBuffer
from tito.session.links import pinned_parent
from tito.session.matchers import Matcher
from tito.session.metadata import tree_view
from tito.session.nodes import Node, leaves_of, path_messages, path_of
from tito.session.options import keep_options, options_change
from tito.session.turns import (
    TurnCommit,
    TurnPlan,
    check_after_cut,
    divergence,
    extend_in_place,
    extended_snapshot,
    extension,
    first_turn,
    match_len,
    tolerated_counts,
)
from tito.types.errors import BadRequest, Conflict
from tito.types.messages import Message, TurnRequest
from tito.types.records import TurnRecord, snapshot_ids

__all__ = ["MAX_NODES", "Node", "TreeSession", "attach_point", "leaves_of", "path_messages",
           "path_of"]

MAX_NODES = 1024


def attach_point(nodes: list[Node], request: list[Message], matcher: Matcher, *,
                 exact: bool = False) -> tuple[int | None, int]:
    """(the deepest node whose root→node message path prefixes ``request``, the number of
    messages that path covers); ``(None, 0)`` when no root matches. A node is entered only
    when its parent's messages matched in full; ties at equal depth go to the latest
    commit. Iterative (a 1,024-deep chain is no recursion problem); reads only."""
    best: int | None = None
    best_depth, best_len = -1, 0
    stack = [(n.id, 0) for n in nodes if n.parent is None]
    while stack:
        node_id, start = stack.pop()
        node = nodes[node_id]
        end = start + len(node.delta)
        if end > len(request) or match_len(matcher, node.delta, request, start,
                                            exact=exact) < len(node.delta):
            continue  # a partial match of a node's messages disqualifies its subtree
        if node.depth > best_depth or (node.depth == best_depth and best is not None
                                       and node_id > best):
            best, best_depth, best_len = node_id, node.depth, end
        stack.extend((child, end) for child in node.children if child < len(nodes))
    return best, best_len


class TreeSession(SessionBase):
    """The state of one v2 trajectory tree."""

    version: ClassVar[str] = "v2"

    def __init__(self, session_id: str, renderer: TemplateRenderer, matcher: Matcher,
                 *, max_nodes: int = MAX_NODES, api_state: object = None,
                 after_length_cut: str = "keep") -> None:
        super().__init__(session_id, renderer, matcher, api_state,
                         after_length_cut=after_length_cut)
        self.max_nodes = max_nodes
        self.nodes: list[Node] = []
        self._active: tuple[int | None, IdBuffer] = (None, IdBuffer())
        """(the active leaf, its path's token ids): swapped as one value, so a plan made
        in a worker thread never pairs a leaf with another leaf's ids."""
        self._running = 0
        self._reserved = 0

    # -- the view (the active path) -------------------------------------------------------
    @property
    def active_leaf(self) -> int | None:
        """The last committed node: the view follows its path."""
        return self._active[0]

    @property
    def snapshot(self) -> IdBuffer:
        """Token ids of the active leaf's path."""
        return self._active[1]

    @property
    def in_flight(self) -> bool:
        return self._running > 0

    @property
    def active_path(self) -> list[Node]:
        return [] if self.active_leaf is None else path_of(self.nodes, self.active_leaf)

    @property
    def records(self) -> list[TurnRecord]:
        return [n.record for n in self.active_path]

    @property
    def messages(self) -> list[Message]:
        return path_messages(self.active_path)

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        for node in reversed(self.active_path):
            if node.tools is not None:
                return node.tools
        return None

    @property
    def num_tokens(self) -> int:
        return len(self.snapshot)

    # -- positioning ----------------------------------------------------------------------
    def attach_point(self, request: list[Message]) -> tuple[int | None, int]:
        """See :func:`attach_point`."""
        return attach_point(self.nodes, request, self.matcher, exact=self._exact)

    def begin(self, request: TurnRequest | None = None) -> None:
        """Claim room for one more node (concurrent turns are allowed: they commit as
        siblings). The node cap is checked here, before the engine is called."""
        if len(self.nodes) + self._reserved >= self.max_nodes:
            raise Conflict(
                f"node cap reached ({self.max_nodes}, --max-nodes): session "
                f"{self.session_id} cannot branch or extend further; this almost always "
                "means the harness is not replaying history verbatim (check "
                "--message-matcher)",
                code="node_cap_reached",
            )
        self._running += 1
        self._reserved += 1

    def prepare(self, request: TurnRequest) -> TurnPlan:
        """The plan of a claimed turn: reads the tree, changes nothing (it may run in a
        worker thread while turns of this session commit on the event loop)."""
        messages = request.messages
        if not messages:
            raise BadRequest("messages must contain at least one message")
        nodes = self.nodes[:]  # commits append on the loop meanwhile: read a stable list
        parent, covered = self._parent_of(nodes, request)
        rolled_back = self._abandoned(nodes, parent)
        plan = self._plan_at(nodes, parent, covered, request, rolled_back)
        if rolled_back:
            active = path_messages(path_of(nodes, self.active_leaf)) \
                if self.active_leaf is not None else []
            matched = match_len(self.matcher, active, messages, exact=self._exact)
            plan.divergence = {"discarded": rolled_back,
                               **divergence(active, messages, matched)}
        elif parent is not None:
            delta = nodes[parent].delta
            plan.tolerated = tolerated_counts(self.matcher, delta,
                                              messages[covered - len(delta):covered],
                                              0, len(delta))
        if parent is not None:
            plan.rewrote = self._rewritten(nodes, parent, covered, messages) or None
        return plan

    def _parent_of(self, nodes: list[Node], request: TurnRequest) -> tuple[int | None, int]:
        """Where a request attaches: the previous response it names (checked when it was
        claimed, :mod:`tito.session.links`), else the deepest match — a new root when the
        request changes the render options of that match's path."""
        pinned = pinned_parent(nodes, request)
        if pinned is not None:
            change = self._render_change(nodes, pinned[0], request)
            if change is not None:
                raise BadRequest(f"the request changes {change} of the previous response "
                                 "it names; start a new agent context for that",
                                 code="render_changed")
            return pinned
        parent, covered = attach_point(nodes, request.messages, self.matcher,
                                       exact=self._exact)
        if parent is not None and self._render_change(nodes, parent, request) is not None:
            return None, 0  # other tools or options: a new root
        return parent, covered

    def _rewritten(self, nodes: list[Node], parent: int, covered: int,
                   messages: list[Message]) -> list[int]:
        """Children of ``parent`` whose reply the request holds in a copy the matcher did
        not accept, and goes on after: it continues them (a harness that rewrites replies),
        it does not retry them."""
        found = []
        for child in nodes[parent].children:
            delta = nodes[child].delta if child < len(nodes) else []
            at = covered + len(delta) - 1  # where the child's reply stands in the request
            if delta and len(messages) > at + 1 and messages[at].get("role") == "assistant" \
                    and match_len(self.matcher, delta[:-1], messages, covered,
                                  exact=self._exact) == len(delta) - 1:
                found.append(child)
        return found

    def _render_change(self, nodes: list[Node], parent: int, request: TurnRequest
                       ) -> str | None:
        """What ``request`` changes in the render options of ``parent``'s path."""
        path = path_of(nodes, parent)
        tools = next((n.tools for n in reversed(path) if n.tools is not None), None)
        kwargs = nodes[parent].record.request.get("chat_template_kwargs")
        return options_change(tools, kwargs, request, self.renderer)

    def _plan_at(self, nodes: list[Node], parent: int | None, covered: int,
                 request: TurnRequest, rolled_back: int) -> TurnPlan:
        if parent is None:
            return first_turn(self.renderer, request, rolled_back=rolled_back)
        node = nodes[parent]
        check_after_cut(node.record, self.after_length_cut, f"the matched node {parent}",
                        "branch before the cut instead")
        keep_options(node.record.request.get("chat_template_kwargs"), request, self.renderer)
        base = self._snapshot_of(nodes, parent)
        return extension(self.renderer, request, base, node.delta[-1],
                         keep_records=node.depth + 1, keep_messages=covered,
                         rolled_back=rolled_back, parent=parent)

    def _abandoned(self, nodes: list[Node], parent: int | None) -> int:
        """Generated turns of the active path the new node does not extend (a retry: 1)."""
        if self.active_leaf is None or self.active_leaf >= len(nodes):
            return 0
        active = path_of(nodes, self.active_leaf)
        ancestors = {n.id for n in path_of(nodes, parent)} if parent is not None else set()
        return sum(1 for n in active if n.id not in ancestors)

    def _snapshot_of(self, nodes: list[Node], node_id: int) -> np.ndarray:
        """The token ids of ``node_id``'s path (the active buffer when it is the active
        leaf; else rebuilt from the path's records)."""
        leaf, ids = self._active
        if node_id == leaf:
            return ids.view()
        return snapshot_ids([n.record for n in path_of(nodes, node_id)])

    # -- commit / release -----------------------------------------------------------------
    def release(self, plan: TurnPlan | None = None, *,
                request: TurnRequest | None = None) -> None:
        """The turn failed or was given up: the tree is exactly as before."""
        self._running -= 1
        self._reserved -= 1

    def apply(self, turn: TurnCommit, plan: TurnPlan | None) -> None:
        """Add the turn's node under its parent and make it the active leaf. With its
        ``plan`` the token snapshot follows (room allocated first); without (journal
        replay), :meth:`rebuild_snapshot` rebuilds it afterwards."""
        parent = turn.parent
        depth = 0 if parent is None else self.nodes[parent].depth + 1
        node = Node(id=len(self.nodes), parent=parent, depth=depth,
                    delta=[*turn.appended, turn.message], tools=turn.tools,
                    record=turn.record, path_messages=turn.keep_messages
                    + len(turn.appended) + 1, response_id=turn.response_id)
        snapshot = self.snapshot
        in_place = False
        if plan is not None:
            # in place only when no other turn of this session runs: a plan being made
            # in a worker thread may be reading the buffer
            in_place = parent is not None and parent == self.active_leaf and \
                self._running == 1
            snapshot = extended_snapshot(snapshot if in_place else None, plan,
                                         turn.record.output_ids)
        siblings = self.nodes[parent].children if parent is not None else None
        # -- no failure past this line ----------------------------------------------------
        if in_place and plan is not None:
            extend_in_place(snapshot, plan, turn.record.output_ids)
        self.nodes.append(node)
        if siblings is not None:
            siblings.append(node.id)
        self._active = (node.id, snapshot)
        self.last_active = turn.record.commit_ts
        if plan is not None:
            self.release(plan)

    def rebuild_snapshot(self) -> None:
        """The active leaf's token snapshot from the records (after a journal replay)."""
        self._active = (self.active_leaf, IdBuffer(snapshot_ids(self.records)))

    # -- views ----------------------------------------------------------------------------
    def collection(self) -> TreeCollection:
        return TreeCollection(self.session_id, self.version, self.nodes[:], self.active_leaf,
                              self.in_flight)

    def stored_bytes(self) -> StoredBytes:
        records = [n.record for n in self.nodes]
        return StoredBytes(
            tokens=self.num_tokens,
            ids=sum(rec.bridge_ids.nbytes + rec.output_ids.nbytes for rec in records),
            logprobs=sum(rec.logprobs.nbytes for rec in records),
            routing=self.routing_bytes(records))

    def response_messages(self, response_id: str) -> list[Message] | None:
        """A tree keeps every node's response id: the messages of that node's path."""
        nodes = self.nodes
        for node in reversed(nodes):
            if node.response_id == response_id:
                return path_messages(path_of(nodes, node.id))
        return None

    def details(self) -> dict[str, Any]:
        return {"tree": tree_view(self.nodes, self.active_leaf)}

    def counts(self) -> dict[str, int]:
        return {"nodes": len(self.nodes), "leaves": len(leaves_of(self.nodes))}

    def view_key(self) -> Hashable:
        return ("v2", len(self.nodes), self.in_flight)

"""The viewer's source on a running gateway: its live sessions.

The samples preview and each strip's loss mask come from the code that answers
``POST /sessions/<id>/samples`` (:func:`tito.samples.assemble`; for a v2 tree every leaf,
then the gateway's picker and postprocessor), run on copies taken on the event loop and
computed in the gateway's worker pool; nothing is encoded and nothing is counted in the
samples metrics. Models are cached per session state, so paging through a long strip
assembles and decodes once.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from tito.samples import assemble
from tito.samples.sample import Sample
from tito.samples.tree import LeafPath, assemble_leaves, run_hooks
from tito.server.ui.blocks import Hints
from tito.server.ui.model import ModelCache, SessionModel
from tito.server.ui.strip import Texts, from_records
from tito.server.ui.text import decoder_of, token_texts
from tito.server.ui.views import leaf_states, preview_json, session_item, tree_json
from tito.session import LinearSession, Session, TreeSession
from tito.session.tree import Node, leaves_of, path_of
from tito.types.errors import TitoError
from tito.types.messages import Message
from tito.types.records import TurnRecord

if TYPE_CHECKING:
    from tito.server.gateway import Gateway

T = TypeVar("T")
_SOURCES: weakref.WeakKeyDictionary[Gateway, LiveSource] = weakref.WeakKeyDictionary()


def live_source(gateway: Gateway) -> LiveSource:
    """The gateway's viewer source (one per gateway, with its model cache)."""
    source = _SOURCES.get(gateway)
    if source is None:
        source = _SOURCES[gateway] = LiveSource(gateway)
    return source


class LiveSource:
    kind = "gateway"

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.cache = ModelCache()
        decode = decoder_of(gateway.renderer.tokenizer)
        self.texts: Texts = lambda ids: token_texts(ids.tolist(), decode)

    def describe(self) -> dict[str, Any]:
        g = self.gateway
        return {"kind": self.kind, "name": g.model_name, "family": g.renderer.family,
                "session_version": g.config.session_version,
                "max_seq_len": g.config.max_seq_len, "has_text": True}

    def sessions(self) -> list[dict[str, Any]]:
        """Live sessions, most recently active first."""
        items = [session_item(s) for s in self.gateway.store.values() if not s.closed]
        return sorted(items, key=lambda item: item["last_active"], reverse=True)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.gateway.offload(fn, *args)

    async def model(self, session_id: str) -> SessionModel:
        session = self.gateway.session(session_id)  # 404 / 410 in OpenAI's shape
        state = _state(session)
        model = self.cache.get(session_id, state)
        if model is None:
            if isinstance(session, TreeSession):
                nodes = session.nodes[:]
                model = await self.run(self._tree_model, session, nodes,
                                       session.active_leaf, session.in_flight)
            else:
                view = _LinearCopy(session.records[:], session.messages[:],
                                   session.checkpoint_ends[:],
                                   session.snapshot.view().copy(), session.tools,
                                   session.in_flight)
                model = await self.run(self._linear_model, session, view)
            self.cache.put(session_id, state, model)
        return model

    # -- in the worker pool ----------------------------------------------------------------
    def _linear_model(self, session: LinearSession, view: _LinearCopy) -> SessionModel:
        g = self.gateway
        meta = g.path_metadata(session, view.records, view.messages, view.ids, view.tools)
        sample_meta = dict(meta)  # as the samples route: the payload's key, not a sample's
        meta["turn_in_progress"] = view.running
        samples: list[Sample] = []
        empty: str | None = None
        error: str | None = None
        try:
            result = assemble(view.records, decode=g.renderer.tokenizer.decode,
                              max_seq_len=g.config.max_seq_len, metadata=sample_meta,
                              routing=g.config.routing_replay,
                              indexer=g.config.indexer_replay)
            samples, empty = result.samples, result.empty_reason
        except TitoError as exc:
            error = exc.message
        hints = linear_hints(view.records, view.messages, view.ends)
        sample = samples[0] if samples else None
        records = view.records
        return SessionModel(
            id=session.session_id, version=session.version,
            summary=_summary(session, len(view.ids)),
            preview=preview_json(samples, empty, meta, error),
            build=lambda node: from_records(records, hints, sample, self.texts))

    def _tree_model(self, session: TreeSession, nodes: list[Node], active: int | None,
                    running: bool) -> SessionModel:
        g = self.gateway
        meta = g.session_metadata(session, nodes)
        meta["turn_in_progress"] = running
        leaves = leaves_of(nodes)
        assembled: dict[int, Sample] = {}
        picked: list[Sample] = []
        error: str | None = None
        try:
            samples = assemble_leaves(
                [LeafPath([n.id for n in path], [n.record for n in path], leaf.parent,
                          leaf.response_id)
                 for leaf in leaves for path in [path_of(nodes, leaf.id)]],
                decode=g.renderer.tokenizer.decode, max_seq_len=g.config.max_seq_len,
                metadata_of=lambda leaf: g.trajectory_metadata(
                    session, [nodes[i] for i in leaf.path_node_ids]),
                routing=g.config.routing_replay, indexer=g.config.indexer_replay)
            assembled = {_leaf_of(s): s for s in samples}
            if samples:
                picked = run_hooks(list(samples), picker=g.picker,
                                   postprocessor=g.postprocessor, names=g.hook_names,
                                   session_metadata=meta, agent_metadata={})
        except TitoError as exc:
            error = exc.message
        empty = None if picked or error else ("no_records" if not nodes else "all_truncated")
        final = {**assembled, **{_leaf_of(s): s for s in picked}}
        states = leaf_states([leaf.id for leaf in leaves],
                             {leaf.id: leaf.record.checkpoint_len for leaf in leaves},
                             assembled, {_leaf_of(s) for s in picked})
        default = active if active is not None and active < len(nodes) else \
            (len(nodes) - 1 if nodes else None)
        summary = {**_summary(session, 0), "default_leaf": default}
        if default is not None:
            summary["num_tokens"] = nodes[default].record.checkpoint_len

        def build(node: int | None) -> Any:
            target = default if node is None else node
            path = [] if target is None else path_of(nodes, target)
            return from_records([n.record for n in path], tree_hints(path),
                                final.get(target) if target is not None else None,
                                self.texts, [n.id for n in path])

        return SessionModel(id=session.session_id, version=session.version,
                            summary=summary, preview=preview_json(picked, empty, meta, error),
                            build=build, tree=tree_json(nodes, active, states),
                            nodes=len(nodes))


@dataclass(frozen=True, slots=True)
class _LinearCopy:
    records: list[TurnRecord]
    messages: list[Message]
    ends: list[int]
    ids: np.ndarray
    tools: list[dict[str, Any]] | None
    running: bool


def _state(session: Session) -> Hashable:
    """Changes whenever what the viewer shows of ``session`` may change."""
    if isinstance(session, TreeSession):
        return ("v2", len(session.nodes), session.in_flight)
    last = session.records[-1] if session.records else None
    return ("v1", len(session.records), None if last is None else last.commit_ts,
            session.in_flight)


def _summary(session: Session, num_tokens: int) -> dict[str, Any]:
    item = session_item(session)
    return {**item, "num_tokens": num_tokens or item["tokens"], "now": time.time()}


def _leaf_of(sample: Sample) -> int:
    leaf = sample.metadata.get("leaf")
    return int(leaf["node_id"]) if isinstance(leaf, dict) else -1


def linear_hints(records: Sequence[TurnRecord], messages: Sequence[Message],
                 ends: Sequence[int]) -> list[tuple[Hints, Hints]]:
    """(bridge, output) hints per record of a v1 session: its messages between two
    checkpoints are the appended ones, then the generated assistant."""
    if len(ends) != len(records):
        return []
    names: dict[str, str] = {}
    out: list[tuple[Hints, Hints]] = []
    start = 0
    for end in ends:
        turn = list(messages[start:end])
        start = end
        out.append(turn_hints(turn[:-1], turn[-1] if turn else None, names))
    return out


def tree_hints(path: Sequence[Node]) -> list[tuple[Hints, Hints]]:
    names: dict[str, str] = {}
    return [turn_hints(node.delta[:-1], node.delta[-1] if node.delta else None, names)
            for node in path]


def turn_hints(appended: Sequence[Message], assistant: Message | None,
               names: dict[str, str]) -> tuple[Hints, Hints]:
    """Tool results among ``appended`` (named by the call they answer) and the names of
    ``assistant``'s tool calls; ``names`` maps call ids to names along the path."""
    results: list[tuple[str, str]] = []
    for message in appended:
        if message.get("role") == "tool":
            name = message.get("name") or names.get(str(message.get("tool_call_id")), "")
            results.append((str(name), _text(message.get("content"))))
        _remember_calls(message, names)
    calls = _remember_calls(assistant, names) if assistant is not None else []
    return Hints(tool_results=tuple(results)), Hints(tool_calls=tuple(calls))


def _remember_calls(message: Message, names: dict[str, str]) -> list[str]:
    found: list[str] = []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        name = str(function.get("name", "")) if isinstance(function, dict) else ""
        found.append(name)
        if isinstance(call, dict) and call.get("id"):
            names[str(call["id"])] = name
    return found


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tito.samples.sample import Sample
from tito.server.samples import collect_settings
from tito.server.ui.blocks import Hints
from tito.server.ui.model import ModelCache, SessionModel
from tito.server.ui.strip import Texts, from_records
from tito.server.ui.text import decoder_of, token_texts
from tito.server.ui.views import (
    context_list,
    leaf_states,
    preview_json,
    session_item,
    tree_json,
)
from tito.session import TurnSession
from tito.session.collect import CollectSettings, LinearCollection, TreeCollection
from tito.session.nodes import Node, leaves_of, path_of
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

    async def model(self, session_id: str, context: str | None = None) -> SessionModel:
        """``context``: one agent context's view (None: the main agent's)."""
        session = self.gateway.session(session_id)  # 404 / 410 in OpenAI's shape
        shown: TurnSession = session if context is None else session.agent_context(context)
        state = (context, shown.view_key())
        key = session_id if context is None else f"{session_id}#{context}"
        cached = self.cache.get(key, state)
        if cached is not None:
            return cached
        builder = _ModelBuilder(self, collect_settings(self.gateway),
                                {**session_item(session), **context_list(session, context)})
        model: SessionModel = await self.run(shown.collection().visit, builder)
        self.cache.put(key, state, model)
        return model


@dataclass(frozen=True, slots=True)
class _ModelBuilder:
    """A session's viewer model from its collection, in the worker pool: the samples
    preview as the samples route assembles it (a tree: every leaf, then the picker and the
    postprocessor), and the strip of a path."""

    source: LiveSource
    settings: CollectSettings
    item: dict[str, Any]
    """The session in the list (taken on the event loop)."""

    def summary(self, num_tokens: int) -> dict[str, Any]:
        return {**self.item, "num_tokens": num_tokens or self.item["tokens"],
                "now": time.time()}

    def linear(self, view: LinearCollection) -> SessionModel:
        meta = view.metadata(self.settings.describer)
        samples: list[Sample] = []
        empty: str | None = None
        error: str | None = None
        try:
            collected = view.collect(self.settings, meta)
            samples, empty = collected.samples, collected.empty_reason
        except TitoError as exc:
            error = exc.message
        meta["turn_in_progress"] = view.running
        hints = linear_hints(view.records, view.messages, view.ends)
        sample = samples[0] if samples else None
        records, texts = view.records, self.source.texts
        return SessionModel(
            id=view.session_id, version=view.version, summary=self.summary(len(view.ids)),
            preview=preview_json(samples, empty, meta, error),
            build=lambda node: from_records(records, hints, sample, texts))

    def tree(self, view: TreeCollection) -> SessionModel:
        nodes, active = view.nodes, view.active_leaf
        meta = view.metadata(self.settings.describer)
        meta["turn_in_progress"] = view.running
        leaves = leaves_of(nodes)
        assembled: dict[int, Sample] = {}
        picked: list[Sample] = []
        error: str | None = None
        try:
            samples = view.leaf_samples(self.settings)
            assembled = {_leaf_of(s): s for s in samples}
            picked = view.picked(list(samples), self.settings, meta)
        except TitoError as exc:
            error = exc.message
        empty = None if picked or error else ("no_records" if not nodes else "all_truncated")
        final = {**assembled, **{_leaf_of(s): s for s in picked}}
        states = leaf_states([leaf.id for leaf in leaves],
                             {leaf.id: leaf.record.checkpoint_len for leaf in leaves},
                             assembled, {_leaf_of(s) for s in picked})
        default = active if active is not None and active < len(nodes) else \
            (len(nodes) - 1 if nodes else None)
        summary = {**self.summary(0), "default_leaf": default}
        if default is not None:
            summary["num_tokens"] = nodes[default].record.checkpoint_len
        texts = self.source.texts

        def build(node: int | None) -> Any:
            target = default if node is None else node
            path = [] if target is None else path_of(nodes, target)
            return from_records([n.record for n in path], tree_hints(path),
                                final.get(target) if target is not None else None,
                                texts, [n.id for n in path])

        return SessionModel(id=view.session_id, version=view.version,
                            summary=summary, preview=preview_json(picked, empty, meta, error),
                            build=build, tree=tree_json(nodes, active, states),
                            nodes=len(nodes))


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

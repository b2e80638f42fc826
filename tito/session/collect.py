"""Collecting a session's samples (design §6): copies of what is committed, taken on the
event loop (:meth:`Session.collection`), assembled later in a worker thread.

A v1 session gives one path, assembled into at most one sample (:func:`tito.samples.assemble`);
a v2 tree gives one sample per leaf, then the picker and the postprocessor
(:func:`tito.samples.tree.run_hooks`). Either way the result is a :class:`Collected`: the
samples, the payload's session metadata and why it is empty, if it is. Committed records
never change, so turns go on while a collection runs.

A reader that needs the version's own shape (the viewer) visits the collection
(:meth:`Collection.visit`) instead of asking which version it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import numpy as np

from tito.samples import assemble
from tito.samples.sample import Sample
from tito.samples.tree import LeafPath, Picker, Postprocessor, assemble_leaves, run_hooks
from tito.session.agents import ContextInfo
from tito.session.metadata import Describer
from tito.session.nodes import Node, leaves_of, path_of
from tito.types.messages import Message
from tito.types.records import TurnRecord

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True)
class Hooks:
    """A v2 collection's picker and postprocessor, with the names they were loaded by."""

    picker: Picker
    postprocessor: Postprocessor
    names: tuple[str, str]


@dataclass(frozen=True, slots=True)
class CollectSettings:
    """How to collect: what the samples route and the gateway's flags ask for."""

    describer: Describer
    hooks: Hooks
    max_seq_len: int | None = None
    include_response: bool = True
    routing: bool = False
    indexer: bool = False
    sampling_mask: bool = False
    agent_metadata: dict[str, Any] = field(default_factory=dict)
    """The collector's ``metadata`` (merged into every sample's)."""


@dataclass(slots=True)
class Collected:
    samples: list[Sample]
    session_metadata: dict[str, Any]
    """The payload's metadata (``turn_in_progress`` included)."""
    empty_reason: str | None
    leaf_samples: int = 0
    """Samples assembled before the picker (v2: one per leaf)."""


class CollectionVisitor(Protocol[T_co]):
    """What a reader does with each version's collection."""

    def linear(self, collection: LinearCollection) -> T_co: ...

    def tree(self, collection: TreeCollection) -> T_co: ...


class Collection(Protocol):
    """A session's committed state, copied for a collection."""

    @property
    def session_id(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def running(self) -> bool:
        """A turn was in progress when the copy was taken (it is not in the samples)."""
        ...

    def metadata(self, describer: Describer) -> dict[str, Any]:
        """The session's metadata (a tree's: of its active path, and ``tree``)."""
        ...

    def collect(self, settings: CollectSettings) -> Collected: ...

    def visit(self, visitor: CollectionVisitor[T]) -> T: ...


@dataclass(frozen=True, slots=True)
class LinearCollection:
    """A v1 session's path: its records, messages, checkpoint ends, ids and tools."""

    session_id: str
    version: str
    records: list[TurnRecord]
    messages: list[Message]
    ends: list[int]
    """Message count at each checkpoint (record ``k`` ends at ``ends[k]``)."""
    ids: np.ndarray
    tools: list[dict[str, Any]] | None
    running: bool

    def metadata(self, describer: Describer) -> dict[str, Any]:
        return describer.path(self.session_id, self.version, self.records, self.messages,
                              self.ids, self.tools)

    def collect(self, settings: CollectSettings,
                metadata: dict[str, Any] | None = None) -> Collected:
        """The path's sample; ``metadata``: the path's, when already described."""
        session_meta = dict(metadata) if metadata is not None else \
            self.metadata(settings.describer)
        sample_meta = {**settings.agent_metadata, **session_meta}
        session_meta["turn_in_progress"] = self.running  # the payload's, not each sample's
        result = assemble(self.records, decode=settings.describer.renderer.tokenizer.decode,
                          max_seq_len=settings.max_seq_len, metadata=sample_meta,
                          include_response=settings.include_response,
                          routing=settings.routing, indexer=settings.indexer,
                          sampling_mask=settings.sampling_mask)
        return Collected(result.samples, session_meta, result.empty_reason)

    def visit(self, visitor: CollectionVisitor[T]) -> T:
        return visitor.linear(self)


@dataclass(frozen=True, slots=True)
class TreeCollection:
    """A v2 session's nodes and active leaf."""

    session_id: str
    version: str
    nodes: list[Node]
    active_leaf: int | None
    running: bool

    def metadata(self, describer: Describer) -> dict[str, Any]:
        return describer.tree(self.session_id, self.nodes, self.active_leaf)

    def leaf_samples(self, settings: CollectSettings) -> list[Sample]:
        """One sample per leaf, assembled as v1 assembles a path."""
        nodes, describer = self.nodes, settings.describer
        leaves = [LeafPath([n.id for n in path], [n.record for n in path], leaf.parent,
                           leaf.response_id)
                  for leaf in leaves_of(nodes) for path in [path_of(nodes, leaf.id)]]

        def metadata_of(leaf: LeafPath) -> dict[str, Any]:
            path = [nodes[i] for i in leaf.path_node_ids]
            return {**settings.agent_metadata,
                    **describer.trajectory(self.session_id, path)}

        return assemble_leaves(leaves, decode=describer.renderer.tokenizer.decode,
                               max_seq_len=settings.max_seq_len, metadata_of=metadata_of,
                               include_response=settings.include_response,
                               routing=settings.routing, indexer=settings.indexer,
                               sampling_mask=settings.sampling_mask)

    def picked(self, samples: list[Sample], settings: CollectSettings,
               session_meta: dict[str, Any]) -> list[Sample]:
        """The picker and the postprocessor over the leaves' samples (design §6)."""
        if not samples:
            return samples
        hooks = settings.hooks
        return run_hooks(samples, picker=hooks.picker, postprocessor=hooks.postprocessor,
                         names=hooks.names, session_metadata=session_meta,
                         agent_metadata=settings.agent_metadata)

    def collect(self, settings: CollectSettings) -> Collected:
        session_meta = self.metadata(settings.describer)
        session_meta["turn_in_progress"] = self.running
        assembled = self.leaf_samples(settings)
        samples = self.picked(assembled, settings, session_meta)
        empty = None if samples else ("no_records" if not self.nodes else "all_truncated")
        return Collected(samples, session_meta, empty, len(assembled))

    def visit(self, visitor: CollectionVisitor[T]) -> T:
        return visitor.tree(self)


@dataclass(frozen=True, slots=True)
class ContextsCollection:
    """A session of several agent contexts (design §5.5): each context's collection, the
    main agent's first. v1: one sample per context; v2: the leaves of every context, then
    one picker and postprocessor over them all. Every sample carries its context's lineage;
    side requests' samples are left out unless ``--side-requests keep``."""

    session_id: str
    version: str
    parts: list[tuple[ContextInfo, Collection]]
    entries: list[dict[str, Any]]
    """The contexts as the session metadata lists them (``contexts``)."""
    side_requests: str
    running: bool

    def metadata(self, describer: Describer) -> dict[str, Any]:
        """The main agent's metadata, and the contexts."""
        return self._listed(self.parts[0][1].metadata(describer))

    def _listed(self, meta: dict[str, Any]) -> dict[str, Any]:
        meta["contexts"] = [dict(entry) for entry in self.entries]
        if any(info.role == "side" for info, _ in self.parts):
            meta["side_requests"] = self.side_requests
        return meta

    def collect(self, settings: CollectSettings) -> Collected:
        parts = [coll.visit(_PartSamples(replace(settings, agent_metadata={
            **settings.agent_metadata, **info.lineage()}), first=k == 0))
                 for k, (info, coll) in enumerate(self.parts)]
        session_meta = self._listed(parts[0][0].session_metadata)
        session_meta["turn_in_progress"] = self.running
        samples = [s for part, _ in parts for s in part.samples]
        leaves = sum(len(part.samples) for part, tree in parts if tree)
        if samples and any(tree for _, tree in parts):
            hooks = settings.hooks
            samples = run_hooks(samples, picker=hooks.picker,
                                postprocessor=hooks.postprocessor, names=hooks.names,
                                session_metadata=session_meta,
                                agent_metadata=settings.agent_metadata)
        if self.side_requests == "drop":
            samples = [s for s in samples if s.metadata.get("role") != "side"]
        trained = any(info.role != "side" or self.side_requests == "keep"
                      for info, _ in self.parts)
        empty = None if samples else ("all_truncated" if trained else "no_records")
        return Collected(samples, session_meta, empty, leaves)

    def visit(self, visitor: CollectionVisitor[T]) -> T:
        """The main agent's context, in its version's shape."""
        return self.parts[0][1].visit(visitor)


@dataclass(frozen=True, slots=True)
class _PartSamples:
    """One context's samples inside a session of contexts (v2: before the picker), and
    whether they are a tree's leaves; ``first``: the main agent's, whose metadata is the
    payload's."""

    settings: CollectSettings
    first: bool

    def linear(self, collection: LinearCollection) -> tuple[Collected, bool]:
        return collection.collect(self.settings), False

    def tree(self, collection: TreeCollection) -> tuple[Collected, bool]:
        meta = collection.metadata(self.settings.describer) if self.first else {}
        return Collected(collection.leaf_samples(self.settings), meta, None), True

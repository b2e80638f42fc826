"""A session's samples as the samples route sends them (design §6), and what the live
sessions store (the ``/metrics`` gauges).

The collection reads copies taken on the event loop (:meth:`Session.collection`) and runs
in the gateway's worker pool, so turns go on meanwhile: a turn still running (or one sent
meanwhile) is not in the samples, and the session metadata says ``turn_in_progress: true``
(a collector that gave up on its agent still gets the trajectory so far).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tito.samples import encode_samples
from tito.samples.codec import WEIGHT_VERSIONS_FORMATS
from tito.samples.sample import Sample
from tito.server.http import check_depth, decode_json
from tito.session import Session
from tito.session.collect import Collection, CollectSettings
from tito.session.metadata import Describer
from tito.types.errors import BadRequest

if TYPE_CHECKING:
    from tito.server.gateway import Gateway


@dataclass(frozen=True, slots=True)
class SamplesQuery:
    """What a samples request body asks for."""

    max_seq_len: int | None = None
    metadata: dict[str, Any] | None = None
    include_response: bool = True
    snapshot_id: str | None = None
    """The snapshot a finish sealed (None: what is committed now)."""
    weight_versions_format: str | None = None
    """``versions`` or ``spans`` (None: ``--weight-versions-format``)."""

    def export_params(self) -> tuple[Any, ...]:
        """What a snapshot's repeated export must ask again."""
        return (self.max_seq_len, self.metadata, self.include_response,
                self.weight_versions_format)


def samples_query(raw: bytes, *, max_depth: int) -> SamplesQuery:
    """The samples request body (empty: the defaults), checked; a bad one is a 400. Pure
    (a big ``metadata`` is decoded and walked in the worker pool)."""
    data = decode_json(raw, allow_empty=True)
    if not isinstance(data, dict):
        raise BadRequest("samples body must be a JSON object")
    unknown = set(data) - {"max_seq_len", "metadata", "include_response", "snapshot_id",
                           "weight_versions_format"}
    if unknown:
        raise BadRequest(f"unknown samples field(s): {sorted(unknown)}")
    max_seq_len = data.get("max_seq_len")
    if max_seq_len is not None and (not isinstance(max_seq_len, int)
                                    or isinstance(max_seq_len, bool) or max_seq_len < 1):
        raise BadRequest("max_seq_len must be a positive integer or null")
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("metadata must be an object")
    check_depth(data, max_depth)
    include_response = data.get("include_response", True)
    if not isinstance(include_response, bool):
        raise BadRequest("include_response must be true or false")
    snapshot_id = data.get("snapshot_id")
    if snapshot_id is not None and (not isinstance(snapshot_id, str) or not snapshot_id):
        raise BadRequest("snapshot_id must be the string a finish returned, or null")
    wv_format = data.get("weight_versions_format")
    if wv_format is not None and wv_format not in WEIGHT_VERSIONS_FORMATS:
        raise BadRequest(f"weight_versions_format must be one of "
                         f"{list(WEIGHT_VERSIONS_FORMATS)} or null, got {wv_format!r}")
    return SamplesQuery(max_seq_len, metadata, include_response, snapshot_id, wv_format)


def collect_settings(gateway: Gateway, *, max_seq_len: int | None = None,
                     include_response: bool = True,
                     agent_metadata: dict[str, Any] | None = None) -> CollectSettings:
    """How ``gateway`` collects (``max_seq_len`` None: ``--max-seq-len``)."""
    config = gateway.config
    return CollectSettings(
        gateway.describer, gateway.hooks,
        max_seq_len=max_seq_len if max_seq_len is not None else config.max_seq_len,
        include_response=include_response, routing=config.routing_replay,
        indexer=config.indexer_replay, sampling_mask=config.sampling_mask_replay,
        agent_metadata=agent_metadata or {})


async def samples_payload(gateway: Gateway, session: Session, max_seq_len: int | None,
                          metadata: dict[str, Any] | None, *,
                          include_response: bool = True,
                          collection: Collection | None = None,
                          incomplete: bool = False, instance_id: str | None = None,
                          weight_versions_format: str | None = None) -> bytes:
    """Assemble and encode the session's samples from what is committed (or from
    ``collection``, a finish's snapshot; ``incomplete``: no samples, empty_reason
    ``incomplete``; ``instance_id``: the gateway instance that sealed it, before a
    restart); ``weight_versions_format`` None: ``--weight-versions-format``."""
    settings = collect_settings(gateway, max_seq_len=max_seq_len,
                                include_response=include_response, agent_metadata=metadata)
    if instance_id is not None and instance_id != gateway.instance_id:
        settings = replace(settings, describer=Describer(gateway.renderer, instance_id))
    wv_format = weight_versions_format or gateway.config.weight_versions_format
    return await gateway.offload(_encoded, gateway, collection or session.collection(),
                                 settings, incomplete, wv_format)


def _encoded(gateway: Gateway, collection: Collection, settings: CollectSettings,
             incomplete: bool = False, weight_versions_format: str = "versions") -> bytes:
    collected = collection.collect(settings)
    if incomplete:  # an incomplete trace trains nothing (the reference's rule)
        return encode_samples([], session_metadata=collected.session_metadata,
                              empty_reason="incomplete")
    if collected.leaf_samples:
        gateway.metrics.inc("leaf_samples_total", collected.leaf_samples)
    count_samples(gateway, collected.samples)
    return encode_samples(collected.samples, session_metadata=collected.session_metadata,
                          empty_reason=collected.empty_reason,
                          weight_versions_format=weight_versions_format)


def count_samples(gateway: Gateway, samples: list[Sample]) -> None:
    """``samples_total`` and the mismatch classes of the samples collected."""
    gateway.metrics.inc("samples_total", len(samples))
    for sample in samples:
        report = sample.metadata.get("tito_session_mismatch")
        if isinstance(report, list) and report:
            gateway.metrics.mismatch([str(item.get("type")) for item in report
                                      if isinstance(item, dict)])


def stored_sizes(gateway: Gateway) -> dict[str, float]:
    """What the live sessions hold: token ids (of their active paths), and the bytes of
    their stored ids, logprobs and routing rows (gauges of ``/metrics``). Walks every live
    record: run it in the worker pool."""
    tokens = stored = routing = 0
    for session in gateway.store.values():
        held = session.stored_bytes()
        tokens += held.tokens
        stored += held.ids + held.logprobs
        routing += held.routing
    return {"stored_tokens": tokens, "stored_bytes": stored + routing,
            "stored_routing_bytes": routing}

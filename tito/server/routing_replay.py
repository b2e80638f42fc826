"""Routing and indexer replay of a turn (design §8.1, R3): what the engine is asked to
return, and its rows as int32 views of the engine's bytes."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import orjson

from tito.config import ServerConfig
from tito.session.turns import TurnPlan, replay_start
from tito.types.engine import (
    CheckedOutput,
    GenerateResult,
    ReplayRequest,
    SamplingMask,
    SamplingParams,
)
from tito.types.errors import BadRequest, ConfigError, EngineError
from tito.types.replay import check_sampling_mask, decode_rows


class RoutingReplay:
    """``--routing-replay`` / ``--indexer-replay`` of one gateway."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.layers, self.top_k = routing_shape(config)

    def request(self, plan: TurnPlan) -> ReplayRequest | None:
        """What the engine must return for the turn (None: replay is off)."""
        if not (self.config.replay or self.config.sampling_mask_replay):
            return None
        start = replay_start(plan) if self.config.incremental_routing else 0
        return ReplayRequest(routed_experts=self.config.routing_replay,
                             indexer_topk=self.config.indexer_replay,
                             sampling_mask=self.config.sampling_mask_replay, start_len=start)

    @staticmethod
    def mask(replay: ReplayRequest | None, result: GenerateResult,
             output: CheckedOutput) -> SamplingMask | None:
        """The turn's sampling mask, checked against its output (None: not asked for)."""
        if replay is None or not replay.sampling_mask:
            return None
        return check_sampling_mask(result.sampling_mask, output.ids)

    def rows(self, replay: ReplayRequest | None, result: GenerateResult, plan: TurnPlan,
             output: CheckedOutput) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The turn's routing and indexer rows (int32 views of the engine's bytes)."""
        if replay is None or not (replay.routed_experts or replay.indexer_topk):
            return None, None
        rows = max(len(plan.prompt_ids) + len(output.ids) - 1 - replay.start_len, 0)
        routed = None if not replay.routed_experts else decode_rows(
            result.routed_experts, rows=rows, layers=self.layers or 1,
            top_k=self.top_k, field="routed_experts")
        indexer = None
        if replay.indexer_topk and result.indexer_topk is not None:
            layers = result.indexer_topk_num_layers
            if layers is None or layers < 1:
                raise EngineError("meta_info.indexer_topk came without a positive "
                                  "indexer_topk_num_layers", code="engine_protocol_error")
            indexer = decode_rows(result.indexer_topk, rows=rows, layers=layers, top_k=None,
                                  field="indexer_topk")
        return routed, indexer


def routing_shape(config: ServerConfig) -> tuple[int | None, int | None]:
    """(layers, top_k) of routing rows: ``--routing-layers``, else ``num_hidden_layers`` of
    the model's ``config.json`` in the tokenizer folder; top_k from its
    ``num_experts_per_tok`` when present (None: inferred from each payload)."""
    if not config.routing_replay:
        return None, None
    model: dict[str, Any] = {}
    path = os.path.join(config.tokenizer or "", "config.json")
    if config.tokenizer and os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                loaded = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        model = loaded.get("text_config", loaded) if isinstance(loaded, dict) else {}
    layers = config.routing_layers or model.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        raise ConfigError("--routing-replay needs the number of layers per routing row: pass "
                          "--routing-layers N, or put the model's config.json (with "
                          "num_hidden_layers) in the --tokenizer folder")
    top_k = model.get("num_experts_per_tok")
    return layers, top_k if isinstance(top_k, int) and top_k > 0 else None


def check_truncated(params: SamplingParams) -> None:
    """Sampling-mask replay needs a distribution that sampling truncates (a finite
    ``top_k``, ``top_p < 1``, or greedy): without truncation every token of the
    vocabulary is kept, which SGLang refuses to return. 400 ``sampling_mask_untruncated``."""
    if params.temperature < 1e-6 or 0 < params.top_k < 1 << 30 or params.top_p < 1.0:
        return
    raise BadRequest("--sampling-mask-replay needs sampling that truncates the "
                     "distribution: set top_p below 1 or a positive top_k (without either, "
                     "every token of the vocabulary is kept, and the engine does not return "
                     "such a mask)", code="sampling_mask_untruncated")

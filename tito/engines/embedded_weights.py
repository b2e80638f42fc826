"""Loading the embedded model's fp32 weights: GGUF via ``transformers`` once, then a cache.

fp32 on purpose: the GGUF's Q4_1 blocks dequantize to fp32, and running in bf16 makes
re-scored logprobs drift from the recorded ones by ~0.36 nats, which an RL trainer would
see as off-policy noise.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from tito.engines.embedded_files import cache_dir, find_gguf, read_cached, write_cached
from tito.engines.embedded_model import LlamaModel, ModelConfig
from tito.types.errors import EngineError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedWeights:
    """fp32 tensors in ``transformers``' naming, the model config, and how they were got."""

    cfg: ModelConfig
    hf_config: dict[str, Any]
    state: dict[str, torch.Tensor]
    from_cache: bool
    seconds: float


def _hf_from_gguf(gguf: Path) -> PreTrainedModel:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise EngineError(
            "converting the embedded model needs transformers, gguf and accelerate "
            "(pip install 'tito-gateway[embedded]')"
        ) from exc
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
    except Exception as exc:
        raise EngineError(f"could not load {gguf.name} with transformers: {exc}") from exc
    return model.eval()


def load_weights(
    gguf_path: str | os.PathLike[str] | None = None, *, cache_root: Path | None = None
) -> LoadedWeights:
    """fp32 weights from the safetensors cache, converting the GGUF on first use."""
    start = time.perf_counter()
    gguf = find_gguf(gguf_path)
    folder = cache_dir(gguf, "model", cache_root)
    if read_cached(folder) is not None:
        try:
            hf_config = json.loads((folder / "hf_config.json").read_text())
            state = load_file(str(folder / "model.safetensors"))
            cfg = ModelConfig.from_hf_dict(hf_config)
            return LoadedWeights(cfg, hf_config, state, True, time.perf_counter() - start)
        except (OSError, ValueError, KeyError, RuntimeError):
            pass  # damaged cache: convert again
    log.warning("converting %s to fp32 safetensors (once, ~20 s) into %s", gguf.name, folder)
    model = _hf_from_gguf(gguf)
    hf_config = model.config.to_dict()
    cfg = ModelConfig.from_hf_dict(hf_config)
    params = dict(model.state_dict())
    if hf_config.get("tie_word_embeddings"):
        params.pop("lm_head.weight", None)
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in params.items()}

    def write(tmp: Path) -> None:
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "hf_config.json").write_text(json.dumps(hf_config, indent=1, default=str))

    write_cached(folder, write, {"source": str(gguf), "dtype": "float32"})
    return LoadedWeights(cfg, hf_config, state, False, time.perf_counter() - start)


def load_model(
    gguf_path: str | os.PathLike[str] | None = None,
    *,
    cache_root: Path | None = None,
    linear: str = "auto",
    split_head: bool = False,
) -> tuple[LlamaModel, LoadedWeights]:
    """Our ragged-batch forward model over the loaded weights (``linear``, ``split_head``:
    see :class:`LlamaModel`)."""
    weights = load_weights(gguf_path, cache_root=cache_root)
    return LlamaModel(weights.cfg, weights.state, linear, split_head), weights


def hf_model(weights: LoadedWeights) -> torch.nn.Module:
    """A ``transformers`` ``LlamaForCausalLM`` sharing ``weights`` (for reference scoring
    and the ``generate()`` baseline of the benchmark)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    raw = {k: v for k, v in weights.hf_config.items() if k != "quantization_config"}
    config = LlamaConfig.from_dict(raw)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(weights.state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # The rotary buffers were created on the meta device: make a real rotary module.
    model.model.rotary_emb = LlamaRotaryEmbedding(config)
    return model.eval()

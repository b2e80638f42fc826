"""The embedded model as a Hugging Face model folder, for engines that load one (vLLM).

SmolLM2-135M-Instruct from the GGUF the embedded engine already converts (no download):
its fp32 ``model.safetensors``, a ``config.json`` (``LlamaForCausalLM``), the
``tokenizer.json`` with a ``tokenizer_config.json`` carrying the chat template and the
special tokens, and a ``generation_config.json``. Both engines then serve the same
weights and tokenizer, so their outputs can be compared token for token.

    python -m tito.engines.embedded_export DIR
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from tito.engines.embedded_files import cache_dir, find_gguf
from tito.engines.embedded_tokenizer import load_tokenizer_parts
from tito.engines.embedded_weights import load_weights

FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "generation_config.json")


def export_model_dir(dest: str | os.PathLike[str]) -> Path:
    """Write the folder (again only when a file is missing); return it."""
    out = Path(dest)
    if all((out / name).is_file() for name in FILES):
        return out
    out.mkdir(parents=True, exist_ok=True)
    weights = load_weights()  # converts the GGUF once, then reads the cached safetensors
    backend, meta = load_tokenizer_parts()
    model_cache = cache_dir(find_gguf(), "model")
    shutil.copyfile(model_cache / "model.safetensors", out / "model.safetensors")
    config = {k: v for k, v in weights.hf_config.items()  # the weights are fp32 now
              if not k.startswith("_") and k not in ("transformers_version",
                                                     "quantization_config")}
    config.update(architectures=["LlamaForCausalLM"], model_type="llama",
                  torch_dtype="float32", eos_token_id=meta.eos_token_id,
                  bos_token_id=meta.bos_token_id)
    (out / "config.json").write_text(json.dumps(config, indent=1, default=str))
    backend.save(str(out / "tokenizer.json"))
    eos = backend.id_to_token(meta.eos_token_id)
    bos = backend.id_to_token(meta.bos_token_id) if meta.bos_token_id is not None else None
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": meta.chat_template,
        "eos_token": eos, "bos_token": bos, "pad_token": eos,
        "additional_special_tokens": [t for t in meta.special_tokens if t not in (eos, bos)],
        "model_max_length": config.get("max_position_embeddings", 8192),
        "add_bos_token": False, "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": meta.eos_token_id, "bos_token_id": meta.bos_token_id}, indent=1))
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tito.engines.embedded_export DIR", file=sys.stderr)
        return 2
    print(export_model_dir(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Evaluate the PyPI ``renderers`` package (Apache-2.0) with TITO's verification pool.

Run in an environment that has ``renderers`` (and ``transformers`` for the tokenizer
wrapper): ``python scripts/eval_renderers.py [--version-note]``. For each family with a
``renderers`` counterpart and an offline tokenizer, over the pool of ``tito.render.verify``
(thinking on where the family has a switch): the completion of every generated assistant is
what ``renderers`` renders for it; at each later split ``bridge_to_next_turn`` must return
ids that decode to ``renderers``' own full render (``None`` = the bridge declines = a
re-render, TITO lost for that turn), and ``parse_response`` must give the message back.
Prints one JSON line per family; docs/families.md records the result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TOK = REPO.parent / "shared" / "fixtures" / "tokenizers"

# tito family -> (renderers config class, fixture folder, config kwargs)
TARGETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3": ("Qwen3RendererConfig", "qwen3", {}),
    "qwen35": ("Qwen35RendererConfig", "qwen3.5", {}),
    "deepseek_v4": ("DeepSeekV4RendererConfig", "deepseek-v4", {}),
    "llama3": ("Llama3RendererConfig", "llama-3.1", {}),
    "gpt_oss": ("GptOssRendererConfig", "gpt-oss", {}),
    "deepseek_v31": ("DeepSeekV3RendererConfig", "deepseek-v3.1", {}),
}


def hf_tokenizer(family: str, folder: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    from tito.render.families import build_renderer

    ours = build_renderer(family, TOK / folder)
    tok = PreTrainedTokenizerFast(tokenizer_object=ours.tokenizer.backend,
                                  eos_token=ours.stop_texts[0])
    tok.name_or_path = folder
    tok.chat_template = ours.template
    return tok, ours


def bridge_turn(r: Any, tok: Any, prompt: list[int], completion: list[int],
                messages: list[dict[str, Any]], pos: int, nxt: int, tools: Any,
                stats: dict[str, Any]) -> list[int]:
    """Bridge from the turn at ``pos`` to the one at ``nxt``, counting a decline or a render
    that differs from ``renderers``' full render; returns the next turn's prompt."""
    appended = messages[pos + 1 : nxt]
    stats["bridges"] += 1
    bridged = r.bridge_to_next_turn(prompt, completion, appended, tools=tools)
    canonical = r.render_ids(messages[:nxt], tools=tools, add_generation_prompt=True)
    if bridged is None:
        stats["declined"] += 1
        key = ",".join(m["role"] for m in appended)
        stats["declined_roles"][key] = stats["declined_roles"].get(key, 0) + 1
        return canonical
    ids = list(bridged.token_ids)
    if tok.decode(ids) != tok.decode(canonical):
        stats["differs_from_full_render"] += 1
    return ids


def replay(r: Any, tok: Any, messages: list[dict[str, Any]], gen: list[int], tools: Any,
           stats: dict[str, Any]) -> None:
    """Render, parse back and bridge every generated assistant turn of one trajectory."""
    prompt = r.render_ids(messages[: gen[0]], tools=tools, add_generation_prompt=True)
    for n, pos in enumerate(gen):
        full = r.render_ids(messages[: pos + 1], tools=tools)
        completion = full[len(prompt):]
        parsed = r.parse_response(completion, tools=tools, prompt_ids=prompt)
        if (parsed.content or "").strip() != (messages[pos].get("content") or "").strip():
            stats["parse_failures"] += 1
        if n + 1 == len(gen):
            break
        prompt = bridge_turn(r, tok, prompt, completion, messages, pos, gen[n + 1], tools,
                             stats)


def evaluate(family: str, retention: str | None) -> dict[str, Any]:
    import renderers
    from renderers import configs

    from tito.render.verify import _generated_positions, adapt, trajectory_pool

    cls_name, folder, kw = TARGETS[family]
    tok, ours = hf_tokenizer(family, folder)
    cfg_cls = getattr(configs, cls_name)
    extra = dict(kw)
    if retention is not None:
        extra["thinking_retention"] = retention
    try:
        r = renderers.create_renderer(tok, cfg_cls(**extra))
    except Exception as exc:
        return {"family": family, "error": f"{type(exc).__name__}: {exc}"[:200]}
    stats = {"family": family, "renderer": cls_name, "retention": retention, "bridges": 0,
             "declined": 0, "declined_roles": {}, "differs_from_full_render": 0,
             "parse_failures": 0, "errors": 0}
    for _name, raw, tools in trajectory_pool():
        messages = adapt(raw, ours, True)
        if messages is None:
            continue
        gen = _generated_positions(messages)
        try:
            replay(r, tok, messages, gen, tools, stats)
        except Exception as exc:
            stats["errors"] += 1
            stats.setdefault("first_error", f"{type(exc).__name__}: {exc}"[:200])
    return stats


def main() -> int:
    import renderers

    print(json.dumps({"renderers_version": getattr(renderers, "__version__", "?")}))
    for family in TARGETS:
        for retention in (None, "all"):
            print(json.dumps(evaluate(family, retention)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

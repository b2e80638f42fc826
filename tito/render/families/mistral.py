"""``mistral``: Mistral NeMo-generation models (Tekken tokenizer).

- Template: ours, after the publisher's NeMo template: system prompt and tool list at the
  top (upstream moves them into the last user turn: not append-only), later system messages
  in place, roles need not alternate. No reasoning.
- Junction: concatenation after ``</s>``. All roles append.
- Tool-call ids must be 9 alphanumerics: other ids (e.g. an agent's ``call_…``) are mapped
  to 9-character ids deterministically before rendering; the parser keeps a valid
  model-emitted id and makes one otherwise.
- Tokenizer: ``tekken_240718.json`` (mistral-common), converted.
"""

from __future__ import annotations

import hashlib
import re
import string
from typing import Any

from tito.parse.mistral import MistralParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = "mistral"
_VALID = re.compile(r"^[A-Za-z0-9]{9}$")
_ALPHABET = string.ascii_letters + string.digits


def nine_char_id(call_id: str) -> str:
    """``call_id`` if already valid, else a deterministic 9-alphanumeric id derived from it."""
    if _VALID.match(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, r = divmod(n, len(_ALPHABET))
        out.append(_ALPHABET[r])
    return "".join(out)


class MistralRenderer(TemplateRenderer):
    def prepare_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for m in messages:
            if m.get("tool_calls"):
                m = {**m, "tool_calls": [{**c, "id": nine_char_id(str(c.get("id") or ""))}
                                         for c in m["tool_calls"]]}
            if m.get("role") == "tool":
                m = {**m, "tool_call_id": nine_char_id(str(m.get("tool_call_id") or ""))}
            out.append(m)
        return out


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="mistral",
        template=template or bundled_template("mistral.jinja"),
        assistant_start=None,
        stop_tokens=("</s>",),
        bos_token="<s>",
        eos_token="</s>",
        reasoning=False,
        turn_openers=("[INST]", "[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                      "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
        assistant_openers=("[/INST]", "[/TOOL_RESULTS]", "[/SYSTEM_PROMPT]"),
    )
    parser = MistralParser(tokenizer, stop_texts=("</s>",), think_start=None, think_end=None)
    return MistralRenderer(tokenizer, spec, parser)

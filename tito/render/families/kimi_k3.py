"""``kimi_k3``: Kimi K3 ("XTML" framing ``<|open|>TAG attrs<|sep|>…<|close|>TAG<|sep|>``).

- Template: llama.cpp's Jinja port of the K3 format (bundled unchanged). Not the
  publisher's file (K3's format is defined by its Python encoder, not available offline):
  to be checked against golden encoder output when there is some.
- Pinned: nothing. Append-only as published: reasoning is kept in every assistant turn (an
  empty ``think`` section when there is none).
- Thinking per request (``thinking``, default on; Anthropic ``thinking``): the prompt opens
  ``think`` (or ``response``). ``thinking_effort`` (``low``/``high``/``max``, default
  ``max``) is a system message at the top; OpenAI's effort sets it (``EFFORTS``: ``low`` ->
  low, ``medium``/``high`` -> high, ``xhigh`` -> max; ``none``/``minimal`` switch thinking
  off). The effort message is rendered only with thinking on, so both the effort and the
  thinking switch are session options: a turn that changes either is a 400
  ``render_changed`` (v1) or a new root (v2), a turn that leaves them out keeps them, and
  the top message does not change under a session (an explicit ``xhigh`` equals the
  default ``max``).
- Refused (400 ``template_kwarg_not_append_only``): ``chat_template_kwargs`` that make the
  template add a system message *after the last message* (``tool_choice`` ``required`` /
  ``none``, ``response_format`` ``json_object`` / ``json_schema``, ``response_schema``):
  the stored turn would keep that message where the next turn's render has none.
  Tolerated: the values that render nothing (``tool_choice: auto``, ``response_format``
  ``text``). The API's own ``tool_choice`` / ``response_format`` never reach the template
  (``response_format`` constrains the engine), so they are unaffected.
- Junction: concatenation: every message ends with ``<|end_of_msg|>``, the model's stop.
  All roles append. Tool results are matched to the calls by id (ids are not rendered,
  parsed calls get new ones) and rendered in the calls' order, named after them.
- Calls: ``<|open|>call tool="NAME" index="I"<|sep|>`` with typed arguments
  (:mod:`tito.parse.xtml`); reasoning and content are kept exactly (rendered unstripped).
- Tokenizer: not available offline: a stand-in with K3's added tokens (``[BOS]``,
  ``[EOS]``, ``<|end_of_msg|>``, ``<|open|>``, ``<|close|>``, ``<|sep|>``; the real K3 marks
  the last three non-special, the stand-in keeps them special). The comparator segments at
  ``<|end_of_msg|>`` only, as with the real tokenizer's special set.
"""

from __future__ import annotations

from typing import Any

from tito.parse.xtml import XtmlParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.errors import BadRequest
from tito.types.tokenizer import Tokenizer

FIXTURE = None
TEMPLATE_FIXTURE = ("kimi-k3", "chat_template_llamacpp-port.jinja")
"""The fixture template the bundled one is a copy of (checked by the tests)."""
STOPS = ("<|end_of_msg|>",)
STANDIN = ("[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>")
STANDIN_EOS = "<|end_of_msg|>"
EFFORTS = {"low": "low", "medium": "high", "high": "high", "xhigh": "max"}
"""OpenAI reasoning efforts -> ``thinking_effort`` (the port accepts low, high and max)."""


def trailing_system_kwargs(kwargs: dict[str, Any]) -> list[str]:
    """The kwargs among ``kwargs`` that make the template add a system message after the
    last message (its ``tool-choice`` and ``response-format`` messages)."""
    found = []
    if kwargs.get("tool_choice") in ("required", "none"):
        found.append("tool_choice")
    fmt = kwargs.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if kind in ("json_object", "json_schema"):
        found.append("response_format")
    if "response_schema" in kwargs:
        found.append("response_schema")
    return found


class KimiK3Renderer(TemplateRenderer):
    def effective_kwargs(self, request_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        merged = super().effective_kwargs(request_kwargs)
        bad = trailing_system_kwargs(merged)
        if bad:
            raise BadRequest(
                f"chat_template_kwargs {', '.join(bad)}: the {self.family!r} template renders "
                "it as a system message after the last message, which the next turn's render "
                "does not keep (not append-only); use the request's own field instead",
                code="template_kwarg_not_append_only")
        return merged


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="kimi_k3",
        template=template or bundled_template("kimi_k3.jinja"),
        assistant_start='<|open|>message role="assistant"<|sep|>',
        stop_tokens=STOPS,
        thinking_kwarg="thinking",
        effort_kwarg="thinking_effort",
        effort_levels=EFFORTS,
        effort_default="max",
        thinking_in_prefix=True,
        comparator_special=("<|end_of_msg|>",),
        turn_openers=('<|open|>message role="',),
        assistant_openers=('<|open|>message role="assistant"',),
    )
    return KimiK3Renderer(tokenizer, spec, XtmlParser(tokenizer, stop_texts=STOPS))

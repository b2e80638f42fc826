"""The renderer protocol and the default template-diff renderer (DESIGN 4.1-4.3).

A renderer turns messages into token ids. It does three things:

- ``render_prompt``: the first turn, a full chat-template render with the generation prompt;
- ``bridge``: on later turns, the ids to append to the stored snapshot for the appended
  messages only (never a re-render of the history), plus how many trailing stored ids a
  family's junction rule drops;
- ``render_completion``: the ids a model emits for an assistant message (used by the mock
  engine and the verifier).

The default algorithm works for any Hugging Face chat template: render a fixed synthetic
base (a dummy system message + a dummy assistant that carries the stored turn's tool calls)
without the generation prompt, render base + appended messages with it, require the first
text to be a prefix of the second, and tokenize the difference. The *junction* (what follows
the model's stop token in a canonical render, e.g. Qwen's ``\\n`` after ``<|im_end|>``) is
read off the same render, so the stored ids + bridge reproduce the canonical text.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tito.errors import BadRequest, TokenizationError
from tito.parse.base import ParsedCompletion, Parser
from tito.render.template import render_template
from tito.render.tokenizer import Tokenizer

Message = dict[str, Any]
ALL_ROLES = frozenset({"system", "user", "assistant", "tool"})

DUMMY_SYSTEM: Message = {"role": "system", "content": "dummy system"}
DUMMY_USER: Message = {"role": "user", "content": "dummy user"}


@dataclass(frozen=True, slots=True)
class Bridge:
    """How to extend a stored snapshot: drop ``drop`` trailing ids, then append ``ids``."""

    drop: int
    ids: list[int]


@dataclass(frozen=True)
class FamilySpec:
    """What a model family declares (DESIGN 4.3)."""

    name: str
    template: str | None = None
    """Chat template source; None: the tokenizer's own."""
    pinned_kwargs: dict[str, Any] = field(default_factory=dict)
    """Template kwargs that make rendering append-only; a request may not contradict them."""
    allowed_append_roles: frozenset[str] = ALL_ROLES
    stop_tokens: tuple[str, ...] = ()
    """Stop token texts; the first one closes a turn cut by ``length``. Empty: the EOS token."""
    thinking_kwarg: str | None = None
    """The template kwarg that switches thinking on and off (e.g. ``enable_thinking``)."""
    max_trailing_trim: int = 0
    """Declared trailing trim: stored ids the next turn's junction may drop."""
    assistant_start: str | None = None
    """Text that opens an assistant turn (classifies comparator mismatches)."""


def normalize_messages(messages: Sequence[Message]) -> list[Message]:
    """Messages as chat templates expect them (a copy; the input is never mutated).

    ``content`` None becomes ``""``, a list of text parts is joined, tool-call arguments
    given as JSON strings become objects (as SGLang does), so every template sees one shape.
    """
    out: list[Message] = []
    for message in messages:
        m = dict(message)
        content = m.get("content")
        if content is None:
            m["content"] = ""
        elif isinstance(content, list):
            m["content"] = "".join(
                part.get("text", "") for part in content if isinstance(part, dict)
            )
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                call = copy.deepcopy(call)
                fn = call.get("function") or {}
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        parsed = json.loads(args) if args.strip() else {}
                    except ValueError:
                        parsed = None
                    if isinstance(parsed, dict):
                        fn["arguments"] = parsed
                calls.append(call)
            m["tool_calls"] = calls
        out.append(m)
    return out


class TemplateRenderer:
    """The default renderer: any HF chat template, bridged by template diff."""

    def __init__(self, tokenizer: Tokenizer, spec: FamilySpec, parser: Parser):
        template = spec.template or tokenizer.chat_template
        if not template:
            raise BadRequest(f"tokenizer {tokenizer.name!r} has no chat template; pass one")
        self.tokenizer = tokenizer
        self.spec = spec
        self.template = template
        self.parser = parser
        stop_texts = spec.stop_tokens or ((tokenizer.eos_token,) if tokenizer.eos_token else ())
        if not stop_texts:
            raise BadRequest(f"cannot determine stop tokens of tokenizer {tokenizer.name!r}")
        self.stop_texts: tuple[str, ...] = tuple(stop_texts)
        self.stop_ids: frozenset[int] = frozenset(tokenizer.require_id(t) for t in stop_texts)
        self.primary_stop_id = tokenizer.require_id(stop_texts[0])
        self._special = {
            "bos_token": None,
            "eos_token": tokenizer.eos_token,
        }

    # -- properties ---------------------------------------------------------------------
    @property
    def family(self) -> str:
        return self.spec.name

    @property
    def allowed_append_roles(self) -> frozenset[str]:
        return self.spec.allowed_append_roles

    @property
    def max_trailing_trim(self) -> int:
        return self.spec.max_trailing_trim

    def thinking_variants(self) -> list[dict[str, Any]]:
        """Template kwargs for each thinking mode the family supports (on first)."""
        if self.spec.thinking_kwarg is None:
            return [{}]
        return [{self.spec.thinking_kwarg: True}, {self.spec.thinking_kwarg: False}]

    # -- kwargs ------------------------------------------------------------------------
    def effective_kwargs(self, request_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """Pinned kwargs overlaid by the request's; contradicting a pinned kwarg is a 400."""
        merged = dict(self.spec.pinned_kwargs)
        for key, value in (request_kwargs or {}).items():
            if key in self.spec.pinned_kwargs and self.spec.pinned_kwargs[key] != value:
                raise BadRequest(
                    f"chat_template_kwargs {key}={value!r} conflicts with the value the "
                    f"{self.family!r} family pins for append-only rendering "
                    f"({self.spec.pinned_kwargs[key]!r})",
                    code="template_kwarg_conflict",
                )
            merged[key] = value
        return merged

    # -- rendering ---------------------------------------------------------------------
    def render_text(
        self,
        messages: Sequence[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        return render_template(
            self.template,
            normalize_messages(messages),
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            kwargs=self.effective_kwargs(template_kwargs),
            special_tokens=self._special,
        )

    def render_prompt(
        self,
        messages: Sequence[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """First turn: the whole request with the generation prompt."""
        text = self.render_text(messages, tools=tools, template_kwargs=template_kwargs,
                                add_generation_prompt=True)
        return self.tokenizer.encode(text)

    def _dummy_assistant(self, previous: Message | None) -> Message:
        dummy: Message = {"role": "assistant", "content": "", "reasoning_content": " "}
        if previous and previous.get("tool_calls"):
            dummy["tool_calls"] = previous["tool_calls"]
        return dummy

    def junction_text(self, base_text: str) -> tuple[str | None, str]:
        """(stop text found at the end of the dummy assistant, text after it) or (None, "")."""
        best: tuple[int, str] | None = None
        for stop in self.stop_texts:
            pos = base_text.rfind(stop)
            if pos >= 0 and (best is None or pos > best[0]):
                best = (pos, stop)
        if best is None:
            return None, ""
        tail = base_text[best[0] + len(best[1]) :]
        # Only whitespace may follow the stop text inside the dummy assistant's own render.
        if tail.strip():
            return None, ""
        return best[1], tail

    def bridge(
        self,
        previous: Message | None,
        stored_last_id: int | None,
        appended: Sequence[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> Bridge:
        """Ids that extend a snapshot ending with the assistant ``previous`` by ``appended``.

        ``stored_last_id`` is the last stored id (the model's stop id, or the last token of a
        turn cut by ``length``/``abort``). The appended run is rendered as one suffix and the
        generation prompt is appended exactly once.
        """
        roles = [m.get("role") for m in appended]
        bad = sorted({r for r in roles if r not in self.allowed_append_roles}, key=str)
        if bad:
            raise BadRequest(
                f"family {self.family!r} cannot append messages with role {bad[0]!r} after an "
                f"assistant turn (allowed: {sorted(self.allowed_append_roles)})",
                code="role_not_allowed",
            )
        base = [DUMMY_SYSTEM, self._dummy_assistant(previous)]
        base_text = self.render_text(base, tools=tools, template_kwargs=template_kwargs)
        full_text = self.render_text([*base, *appended], tools=tools,
                                     template_kwargs=template_kwargs, add_generation_prompt=True)
        if not full_text.startswith(base_text):
            raise TokenizationError(
                f"rendered suffix diff failed for {roles}: the {self.family!r} template does not "
                "render append-only for these messages",
                code="template_not_append_only",
            )
        diff = full_text[len(base_text) :]
        stop_text, junction = self.junction_text(base_text)
        drop = 0
        if stop_text is None:
            # The stop token doubles as the next message's opener (GLM): drop the stored one.
            if stored_last_id is not None and stored_last_id in self.stop_ids and \
                    self.spec.max_trailing_trim >= 1:
                drop = 1
        elif stored_last_id is not None and stored_last_id not in self.stop_ids:
            junction = self.stop_texts[0] + junction  # close a turn cut by length/abort
        return Bridge(drop=drop, ids=self.tokenizer.encode(junction + diff))

    def render_completion(
        self,
        message: Message,
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Ids a model emits for ``message`` after the generation prompt, ending with a stop id."""
        head = [DUMMY_USER]
        prompt = self.render_text(head, tools=tools, template_kwargs=template_kwargs,
                                  add_generation_prompt=True)
        full = self.render_text([*head, message], tools=tools, template_kwargs=template_kwargs)
        if not full.startswith(prompt):
            raise TokenizationError(
                f"the {self.family!r} template renders this assistant message differently from "
                "its generation prompt (e.g. reasoning with thinking disabled)"
            )
        text = full[len(prompt) :]
        stop_text, _ = self.junction_text(text)
        if stop_text is not None:
            text = text[: text.rfind(stop_text) + len(stop_text)]
            return self.tokenizer.encode(text)
        return [*self.tokenizer.encode(text), self.primary_stop_id]

    def parse(self, output_ids: Sequence[int], engine_finish: str) -> ParsedCompletion:
        return self.parser.parse(output_ids, engine_finish)

    def capability_report(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "allowed_append_roles": sorted(self.allowed_append_roles),
            "stop_tokens": list(self.stop_texts),
            "pinned_kwargs": dict(self.spec.pinned_kwargs),
            "max_trailing_trim": self.max_trailing_trim,
            "thinking_kwarg": self.spec.thinking_kwarg,
        }

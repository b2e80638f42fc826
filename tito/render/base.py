"""The renderer protocol and the default template-diff renderer (design §4.1-4.3).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tito.parse.base import api_finish_reason
from tito.render.divergence import hints_for, text_divergence
from tito.render.memo import BridgeMemo, MemoKey, bridge_skeleton
from tito.render.skeleton import Shape, Skeleton, build_skeleton, shape_of
from tito.render.standin import StandIns, slot_of, standin_previous, standin_tools
from tito.render.template import render_template
from tito.types.errors import BadRequest, TokenizationError
from tito.types.messages import Message, ParsedCompletion, Parser
from tito.types.tokenizer import Tokenizer

ALL_ROLES = frozenset({"system", "user", "assistant", "tool"})
THINKING_OFF = ("none", "minimal")
"""OpenAI reasoning efforts that switch a family's thinking off (``effort_kwargs``)."""

DUMMY_SYSTEM: Message = {"role": "system", "content": "dummy system"}
DUMMY_USER: Message = {"role": "user", "content": "dummy user"}


@dataclass(frozen=True, slots=True)
class Bridge:
    """How to extend a stored snapshot: drop ``drop`` trailing ids, then append ``ids``."""

    drop: int
    ids: list[int]


@dataclass(frozen=True)
class FamilySpec:
    """What a model family declares (design §4.3)."""

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
    thinking_default: bool = True
    """Whether thinking is on when the request does not set ``thinking_kwarg``."""
    effort_kwarg: str | None = None
    """The template kwarg that takes a reasoning effort level (gpt-oss: ``reasoning_effort``)."""
    effort_levels: dict[str, str] = field(default_factory=dict)
    """OpenAI's ``reasoning.effort`` / ``reasoning_effort`` values -> the level
    ``effort_kwarg`` gets (a value not listed sets nothing: list every effort that turns
    thinking on, so that a session can tell an explicit effort from none)."""
    effort_default: str | None = None
    """The level the template uses when ``effort_kwarg`` is not set (a session compares an
    explicit level with it: :meth:`TemplateRenderer.render_options`)."""
    thinking_in_prefix: bool = False
    """Whether the thinking switch changes the text before the generation prompt (e.g. a
    system instruction): then it is one of a session's render options, compared and kept
    like the others (:meth:`TemplateRenderer.render_options`); else a per-turn option."""
    max_trailing_trim: int = 0
    """Declared trailing trim: stored ids the next turn's junction may drop."""
    assistant_start: str | None = None
    """Text that opens an assistant turn (classifies comparator mismatches)."""
    turn_openers: tuple[str, ...] = ()
    """Texts that open a message of any role; the comparator classifies a text segment as
    assistant text when the last opener before it starts an assistant turn. Empty: the
    segment right before decides (single-token openers such as ``<|im_start|>``)."""
    assistant_openers: tuple[str, ...] = ()
    """Openers (among ``turn_openers``) after which the text is the model's; default:
    ``assistant_start``."""
    history_closers: tuple[str, ...] = ()
    """Texts that close an assistant turn in a history render in place of the model's stop
    token (gpt-oss: the model stops at ``<|return|>``, history shows ``<|end|>``). A stored
    stop id is then dropped (needs ``max_trailing_trim >= 1``) and the closer rendered."""
    bos_token: str | None = None
    """``bos_token`` as the template sees it (templates that print it themselves)."""
    eos_token: str | None = None
    """``eos_token`` for the template; None: the tokenizer's."""
    reasoning: bool = True
    """Whether the format carries reasoning (``reasoning_content``) at all."""
    comparator_special: tuple[str, ...] | None = None
    """Special tokens that segment the mismatch comparator; None: every special token."""
    trailing_tokens: tuple[str, ...] = ()
    """Tokens the comparator strips from the end of both sequences before comparing."""
    bridge_base_user: bool = False
    """Put a dummy user message in the bridge's synthetic base (templates that require one)."""
    renderer_source: str = "tito"
    """Who implements rendering and parsing (``tito`` or an evaluated third party)."""
    tokenizer_note: str = ""
    """Where the tokenizer comes from (documentation for the matrix)."""


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
            "bos_token": spec.bos_token,
            "eos_token": spec.eos_token or tokenizer.eos_token,
        }
        self.closer_texts: tuple[str, ...] = (*self.stop_texts, *spec.history_closers)
        # a template that reads the clock (strftime_now) renders differently over time
        self._base_cache: dict[bytes, str] | None = (
            None if "strftime_now" in template else {})
        self.skeletons: dict[tuple[bytes, Shape], Skeleton | None] | None = (
            None if self._base_cache is None else {})
        """Bridge skeletons by (base key, shape) (:mod:`tito.render.skeleton`); None: off."""
        self._seen_once: set[int] = set()
        """Hashes of the (base key, shape) slots seen once and not built: a skeleton costs
        two renders to build, and a base key that names the previous turn's tool calls
        (every turn of an agent that calls tools) may never come back."""
        self.standins: StandIns | None = StandIns()
        """Which bridge slots take the stand-in tools and calls
        (:mod:`tito.render.standin`); None: off (every bridge renders the real ones)."""
        self.memo = BridgeMemo()
        """Trusted slots' bridge texts as skeletons (:mod:`tito.render.memo`)."""
        custom = type(self).prepare_messages is not TemplateRenderer.prepare_messages
        self._keyed_fields = frozenset(f for f in ("name", "tool_call_id")
                                       if custom or f in template)
        """Fields whose values the render may read: part of a skeleton's key."""

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

    def thinking_enabled(self, template_kwargs: dict[str, Any] | None) -> bool:
        """Whether a request with these kwargs generates reasoning."""
        if not self.spec.reasoning:
            return False
        kwarg = self.spec.thinking_kwarg
        if kwarg is None:
            return True
        value = self.effective_kwargs(template_kwargs).get(kwarg)
        return value is not False if self.spec.thinking_default else value is True

    def effort_kwargs(self, effort: str) -> dict[str, Any]:
        """The template kwargs of OpenAI's reasoning effort (design §4.3): the thinking
        switch off for :data:`THINKING_OFF` and on for any other effort, where the family
        has one; the family's level where its template takes one. A kwarg the family pins
        is left as pinned."""
        out: dict[str, Any] = {}
        if self.spec.thinking_kwarg is not None and self.spec.reasoning:
            out[self.spec.thinking_kwarg] = effort not in THINKING_OFF
        level = self.spec.effort_levels.get(effort)
        if self.spec.effort_kwarg is not None and level is not None:
            out[self.spec.effort_kwarg] = level
        return {k: v for k, v in out.items() if k not in self.spec.pinned_kwargs}

    def render_options(self, kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """The options among chat-template ``kwargs`` that shape a session's history (what
        a later turn may not change, :mod:`tito.session.options`): all of them but the
        thinking switch, unless :meth:`thinking_in_prefix`; the effort level with the
        template's default filled in, so that an explicit default is no change."""
        kwarg = self.spec.thinking_kwarg
        out = {k: v for k, v in (kwargs or {}).items() if k != kwarg}
        if self.spec.effort_kwarg is not None and self.spec.effort_default is not None:
            out.setdefault(self.spec.effort_kwarg, self.spec.effort_default)
        if kwarg is not None and self.thinking_in_prefix(out):
            out[kwarg] = self.thinking_option(kwargs)
        return out

    def thinking_in_prefix(self, options: dict[str, Any]) -> bool:
        """Whether, under ``options`` (render options without the switch), the thinking
        switch changes the text before the generation prompt (a family hook)."""
        return self.spec.thinking_in_prefix

    def thinking_option(self, kwargs: dict[str, Any] | None) -> Any:
        """The thinking switch's value under ``kwargs`` (its default when unset)."""
        assert self.spec.thinking_kwarg is not None
        value = self.effective_kwargs(kwargs).get(self.spec.thinking_kwarg)
        return self.spec.thinking_default if value is None else value

    def thinking_switch_kwargs(self, on: bool) -> dict[str, Any]:
        """The template kwargs of a plain thinking switch (Anthropic ``thinking``): the
        family's ``thinking_kwarg``; nothing for a family without one (a family hook)."""
        kwarg = self.spec.thinking_kwarg
        return {} if kwarg is None else {kwarg: on}

    def reasoning_tokens(self, output_ids: Sequence[int], parsed: ParsedCompletion) -> int:
        """How many of the generated ids are the reasoning of ``parsed`` (its parse): the
        family's parser counts them from the ids (``reasoning_tokens``; 0 for a parser
        that cannot)."""
        count = getattr(self.parser, "reasoning_tokens", None)
        return 0 if count is None or parsed.reasoning_content is None else \
            int(count(output_ids, parsed))

    def completion_stop_text(self, message: Message) -> str:
        """The stop token a model emits at the end of ``message`` (hook for families)."""
        return self.stop_texts[0]

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
            self.prepare_messages(normalize_messages(messages)),
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            kwargs=self.effective_kwargs(template_kwargs),
            special_tokens=self._special,
        )

    def prepare_messages(self, messages: list[Message]) -> list[Message]:
        """Family hook: adapt normalized messages before rendering (e.g. Mistral call ids)."""
        return messages

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

    def renders_call_ids(self) -> bool:
        """Whether the template puts tool-call ids in the text (then a replayed message
        with other ids is another message): two renders of one call under two ids are
        compared. A template that fails on the probe counts as rendering them."""
        texts = set()
        for call_id in ("abcdefghi", "jklmnopqr"):  # nine alphanumerics: Mistral's form
            call = {"id": call_id, "type": "function",
                    "function": {"name": "probe", "arguments": "{}"}}
            messages: list[Message] = [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call_id, "content": "y"}]
            try:
                texts.add(self.render_text(messages, tools=None, template_kwargs=None,
                                           add_generation_prompt=True))
            except Exception:
                return True
        return len(texts) > 1

    def _dummy_assistant(self, previous: Message | None) -> Message:
        dummy: Message = {"role": "assistant", "content": "", "reasoning_content": " "}
        if previous and previous.get("tool_calls"):
            dummy["tool_calls"] = previous["tool_calls"]
        return dummy

    def junction_text(self, base_text: str) -> tuple[str | None, str]:
        """(stop text found at the end of the dummy assistant, text after it) or (None, "")."""
        best: tuple[int, str] | None = None
        for stop in self.closer_texts:
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
        generation prompt is appended exactly once. Once the slot's checks agreed, the render
        is the stand-ins' (:mod:`tito.render.standin`): the tool list cut to names and the
        previous calls fixed, so its base is cached and its skeleton reused.
        """
        roles = [m.get("role") for m in appended]
        bad = sorted({r for r in roles if r not in self.allowed_append_roles}, key=str)
        if bad:
            raise BadRequest(
                f"family {self.family!r} cannot append messages with role {bad[0]!r} after an "
                f"assistant turn (allowed: {sorted(self.allowed_append_roles)})",
                code="role_not_allowed",
            )
        standins, slot = self.standins, None
        if standins is not None and self._base_cache is not None:
            slot = slot_of(previous, appended, tools, template_kwargs)
        if slot is not None and standins is not None and standins.trusted(slot):
            fast = self._trusted_text(slot, previous, stored_last_id, appended, tools,
                                      template_kwargs)
            if fast is not None:
                return Bridge(drop=fast[0], ids=self.tokenizer.encode(fast[1]))
        drop, text = self._bridge_text(previous, stored_last_id, appended, tools,
                                       template_kwargs)
        if slot is not None and standins is not None and not standins.trusted(slot):
            standins.record(slot, self._standin_text(
                previous, stored_last_id, appended, tools, template_kwargs) == (drop, text))
        return Bridge(drop=drop, ids=self.tokenizer.encode(text))

    def _trusted_text(self, slot: bytes, previous: Message | None, stored_last_id: int | None,
                      appended: Sequence[Message], tools: list[dict[str, Any]] | None,
                      template_kwargs: dict[str, Any] | None) -> tuple[int, str] | None:
        """:meth:`_standin_text` of a trusted slot: one skeleton fill once the slot's
        bridge is remembered (:mod:`tito.render.memo`)."""
        shape = shape_of(appended, self._keyed_fields)
        if shape is None:
            return self._standin_text(previous, stored_last_id, appended, tools,
                                      template_kwargs)
        key = (slot, shape, stored_last_id is None, stored_last_id in self.stop_ids)
        contents = [str(m["content"]) for m in appended]
        entry = self.memo.get(key)
        if entry is not None:
            return entry[0], entry[1].fill(contents)
        fast = self._standin_text(previous, stored_last_id, appended, tools, template_kwargs)
        if fast is not None and key not in self.memo:
            self._remember(key, standin_previous(previous), stored_last_id,
                           standin_tools(tools), template_kwargs, contents, fast)
        return fast

    def _remember(self, key: MemoKey, previous: Message | None, stored_last_id: int | None,
                  tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any] | None,
                  contents: list[str], fast: tuple[int, str]) -> None:
        """Remember the bridge ``fast`` of the stand-ins ``previous`` and ``tools`` (once
        its skeleton is built; None: this key has no memo)."""
        base_key = self._base_key(previous, tools, template_kwargs)
        if base_key is None or self._base_cache is None or self.skeletons is None:
            self.memo.put(key, None)
            return
        base_text = self._base_cache.get(base_key)
        if base_text is None or (base_key, key[1]) not in self.skeletons:
            return  # not built yet: a later turn remembers it
        skeleton = self.skeletons[(base_key, key[1])]
        entry = None
        if skeleton is not None:
            drop, junction = self.junction(base_text, stored_last_id)
            memo = bridge_skeleton(base_text, skeleton, drop, junction, contents, fast)
            entry = None if memo is None else (drop, memo)
        self.memo.put(key, entry)

    def _standin_text(self, previous: Message | None, stored_last_id: int | None,
                      appended: Sequence[Message], tools: list[dict[str, Any]] | None,
                      template_kwargs: dict[str, Any] | None) -> tuple[int, str] | None:
        """:meth:`_bridge_text` of the stand-ins (:mod:`tito.render.standin`); None: it
        failed (the template's own render decides)."""
        try:
            return self._bridge_text(standin_previous(previous), stored_last_id, appended,
                                     standin_tools(tools), template_kwargs)
        except Exception:
            return None

    def _bridge_text(self, previous: Message | None, stored_last_id: int | None,
                     appended: Sequence[Message], tools: list[dict[str, Any]] | None,
                     template_kwargs: dict[str, Any] | None) -> tuple[int, str]:
        """(stored ids to drop, the bridge's text): the render of the synthetic base and
        ``appended`` past the base's, after the junction."""
        base_text, full_text = self.bridge_texts(previous, appended, tools=tools,
                                                 template_kwargs=template_kwargs)
        if not full_text.startswith(base_text):
            raise TokenizationError(
                f"rendered suffix diff failed for {[m.get('role') for m in appended]}: the "
                f"{self.family!r} template does not render append-only for these messages "
                f"({self._why(base_text, full_text, appended)})",
                code="template_not_append_only",
            )
        drop, junction = self.junction(base_text, stored_last_id)
        return drop, junction + full_text[len(base_text):]

    def _why(self, base_text: str, full_text: str, appended: Sequence[Message]) -> str:
        """The typed reason and first divergence of a bridge whose base is not a prefix."""
        hints = hints_for(self, list(appended), appended_start=len(base_text),
                          appended_assistant=any(m.get("role") == "assistant"
                                                 for m in appended))
        div = text_divergence(full_text[: len(base_text)], base_text, hints)
        if div is None:
            return "reason: text_differs"
        return (f"reason: {div.reason}; first divergence at char {div.char_index}: expected "
                f"{div.expected_text!r} got {div.actual_text!r}")

    def bridge_texts(self, previous: Message | None, appended: Sequence[Message], *,
                     tools: list[dict[str, Any]] | None = None,
                     template_kwargs: dict[str, Any] | None = None) -> tuple[str, str]:
        """(the synthetic base's render, base + ``appended`` with the generation prompt):
        the bridge is the second less the first, when the first is its prefix."""
        base = [DUMMY_SYSTEM, *([DUMMY_USER] if self.spec.bridge_base_user else []),
                self._dummy_assistant(previous)]
        key = self._base_key(previous, tools, template_kwargs)
        return (self._base_text(base, key, tools, template_kwargs),
                self._full_text(base, key, appended, tools, template_kwargs))

    def _base_key(self, previous: Message | None, tools: list[dict[str, Any]] | None,
                  template_kwargs: dict[str, Any] | None) -> bytes | None:
        """What the synthetic base's render depends on (the tools, the template kwargs and
        the previous turn's tool calls); None: do not cache (a clock-reading template, or
        values that are not JSON)."""
        if self._base_cache is None:
            return None
        calls = previous.get("tool_calls") if previous else None
        try:
            return orjson.dumps([tools, template_kwargs, calls or None])
        except TypeError:
            return None

    def _base_text(self, base: list[Message], key: bytes | None,
                   tools: list[dict[str, Any]] | None,
                   template_kwargs: dict[str, Any] | None) -> str:
        """The render of the bridge's synthetic base, cached by its key."""
        if key is None or self._base_cache is None:
            return self.render_text(base, tools=tools, template_kwargs=template_kwargs)
        text = self._base_cache.get(key)
        if text is None:
            text = self.render_text(base, tools=tools, template_kwargs=template_kwargs)
            if len(self._base_cache) >= 1024:
                self._base_cache.clear()
            self._base_cache[key] = text
        return text

    def _full_text(self, base: list[Message], key: bytes | None, appended: Sequence[Message],
                   tools: list[dict[str, Any]] | None,
                   template_kwargs: dict[str, Any] | None) -> str:
        """Base + appended with the generation prompt: a filled skeleton when the contents
        allow one (:mod:`tito.render.skeleton`), else a template render."""
        def render(messages: Sequence[Message]) -> str:
            return self.render_text([*base, *messages], tools=tools,
                                    template_kwargs=template_kwargs,
                                    add_generation_prompt=True)

        if key is None or self.skeletons is None:
            return render(appended)
        shape = shape_of(appended, self._keyed_fields)
        if shape is None:
            return render(appended)
        slot = (key, shape)
        if slot in self.skeletons:
            skeleton = self.skeletons[slot]
        elif hash(slot) not in self._seen_once:  # built on its second use
            if len(self._seen_once) >= 4096:
                self._seen_once.clear()
            self._seen_once.add(hash(slot))
            return render(appended)
        else:
            skeleton = build_skeleton(render, appended)
            if len(self.skeletons) >= 1024:
                self.skeletons.clear()
            self.skeletons[slot] = skeleton
        if skeleton is None:
            return render(appended)
        return skeleton.fill([str(m["content"]) for m in appended])

    def junction(self, base_text: str, stored_last_id: int | None) -> tuple[int, str]:
        """(stored ids to drop, text to add before the bridge) where snapshot meets bridge."""
        closer, junction = self.junction_text(base_text)
        stored_stop = stored_last_id is not None and stored_last_id in self.stop_ids
        can_drop = stored_stop and self.spec.max_trailing_trim >= 1
        if closer is None:
            # The stop token doubles as the next message's opener (GLM): drop the stored one.
            return (1 if can_drop else 0), ""
        if stored_last_id is None:
            return 0, junction
        if not stored_stop:
            return 0, closer + junction  # close a turn cut by length/abort
        if closer in self.spec.history_closers and can_drop:
            return 1, closer + junction  # the history shows another closer (gpt-oss)
        return 0, junction

    def render_completion(
        self,
        message: Message,
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Ids a model emits for ``message`` after the generation prompt, ending with a stop id."""
        return self.completion_in_context([DUMMY_USER], message, tools=tools,
                                          template_kwargs=template_kwargs)

    def completion_in_context(
        self,
        head: Sequence[Message],
        message: Message,
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Ids a model emits for ``message`` after ``head`` and the generation prompt."""
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
            text = text[: text.rfind(stop_text)]
            if stop_text in self.stop_texts:
                return [*self.tokenizer.encode(text), self.tokenizer.require_id(stop_text)]
        stop = self.completion_stop_text(message)
        return [*self.tokenizer.encode(text), self.tokenizer.require_id(stop)]

    def parse(self, output_ids: Sequence[int], engine_finish: str) -> ParsedCompletion:
        return self.parser.parse(output_ids, engine_finish)

    def parse_turn(self, output_ids: Sequence[int], engine_finish: str,
                   template_kwargs: dict[str, Any] | None) -> ParsedCompletion:
        """:meth:`parse` for a turn rendered with ``template_kwargs``: with the family's
        thinking switch off, the prompt closed the reasoning block itself, so an output cut
        short (``length``/``abort``, or a streamed output so far) is the answer, never
        reasoning (parsers read a cut output of a prompt that opens the block as reasoning)."""
        if engine_finish == "stop" or self.spec.thinking_kwarg is None or \
                self.thinking_enabled(template_kwargs):
            return self.parse(output_ids, engine_finish)
        parsed = self.parse(output_ids, "stop")
        parsed.finish_reason = api_finish_reason(engine_finish, bool(parsed.tool_calls))
        return parsed

    def stream_parse(self, template_kwargs: dict[str, Any] | None
                     ) -> Callable[[Sequence[int], str], ParsedCompletion]:
        """The parse of a streamed turn's output so far (:meth:`parse_turn`)."""
        return lambda ids, finish: self.parse_turn(ids, finish, template_kwargs)

    def capability_report(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "allowed_append_roles": sorted(self.allowed_append_roles),
            "stop_tokens": list(self.stop_texts),
            "pinned_kwargs": dict(self.spec.pinned_kwargs),
            "max_trailing_trim": self.max_trailing_trim,
            "thinking_kwarg": self.spec.thinking_kwarg,
            "reasoning": self.spec.reasoning,
            "renderer_source": self.spec.renderer_source,
        }

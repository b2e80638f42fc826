"""The scripted "model" of the mock engine (pure: no I/O, no asyncio).

The mock decodes the prompt, reads the text of the last user or tool message and looks
for *directives*, one per line, each starting with a keyword:

- ``CALL <name> <json-args>``: reply with that tool call (several lines: parallel calls,
  in order). Arguments that are not valid JSON are rendered verbatim, which gives a
  malformed call for parser tests; missing arguments mean ``{}``.
- ``SAY <text>``: reply with that text (several lines are joined with ``\\n``).
- ``LONG <n>``: the model does not stop: ``n`` output tokens (the opening of whatever the
  other directives produce, without its stop id, then filler), finish reason ``length``.
- ``THINK <text>``: a reasoning block placed before whatever the other directives produce
  (dropped when the prompt ends with a thinking-off generation prompt).
- ``FAULT <mode> [<arg>]``: a failure injected into this request's reply (several lines
  combine; modes and arguments in :mod:`tito.engines.mock.faults`; an unknown mode or a
  bad argument makes the line ignored).

Other lines are ignored. Without SAY or CALL the reply is a short deterministic text
derived from a hash of the prompt. The reply is an OpenAI assistant message rendered to
ids with the family renderer (:meth:`TemplateRenderer.render_completion`), so it ends
with the family's stop id. Logprobs are deterministic per (prompt ids, position),
negative, and exactly representable as float32 (they survive the samples codec).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tito.engines.mock.faults import Fault, parse_fault
from tito.render.base import TemplateRenderer

KEYWORDS = ("CALL", "SAY", "LONG", "THINK", "FAULT")
FILLER_TEXT = (
    " the quick brown fox jumps over the lazy dog and keeps running through the long green"
    " field while the sun goes down over the quiet hills"
)
_TOOL_RESPONSE_RE = re.compile(
    r"<(tool_response|tool_result|result|response)>\n?(.*?)\n?</\1>", re.DOTALL)
_GEMMA_RESPONSE_RE = re.compile(r'^response:[^{]*\{value:<\|"\|>(.*?)<\|"\|>\}$', re.DOTALL)
"""Gemma 4's tool result (``response:NAME{value:<|"|>TEXT<|"|>}``)."""
_F32 = struct.Struct("<f")


# -- directives ------------------------------------------------------------------------
@dataclass
class Script:
    """What the directives of one message ask for."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    """(name, arguments text) per CALL line, in order."""
    say: list[str] = field(default_factory=list)
    think: list[str] = field(default_factory=list)
    long: int | None = None
    faults: list[Fault] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.calls or self.say or self.think or self.long is not None
                    or self.faults)


def _call_directive(rest: str) -> tuple[str, str] | None:
    """(name, arguments text) of a ``CALL`` line; None without a name."""
    name, _, args = rest.partition(" ")
    if not name:
        return None
    args = args.strip() or "{}"
    try:
        args = json.dumps(json.loads(args), ensure_ascii=False)
    except ValueError:
        pass  # rendered verbatim: a malformed call on purpose
    return name, args


def _long_directive(rest: str) -> int | None:
    """The token count of a ``LONG`` line; None when it is not a count >= 0."""
    try:
        n = int(rest)
    except ValueError:
        return None
    return n if n >= 0 else None


def _apply_directive(script: Script, keyword: str, rest: str) -> None:
    if keyword == "CALL":
        call = _call_directive(rest)
        if call is not None:
            script.calls.append(call)
    elif keyword == "SAY":
        script.say.append(rest)
    elif keyword == "THINK":
        script.think.append(rest)
    elif keyword == "LONG":
        n = _long_directive(rest)
        if n is not None:
            script.long = n
    elif keyword == "FAULT":
        try:
            script.faults.append(parse_fault(rest))
        except ValueError:
            pass  # not a fault: ignored, as other lines that are not directives


def parse_directives(text: str) -> Script:
    """The directives in ``text`` (one per line; unknown lines are ignored)."""
    script = Script()
    for raw in text.splitlines():
        keyword, _, rest = raw.strip().partition(" ")
        if keyword in KEYWORDS:
            _apply_directive(script, keyword, rest.strip())
    return script


def call_id(prompt_digest: bytes, index: int) -> str:
    return "call_" + hashlib.blake2b(prompt_digest + index.to_bytes(4, "little"),
                                     digest_size=12).hexdigest()


def build_message(script: Script, prompt_digest: bytes, *, thinking: bool) -> dict[str, Any]:
    """The OpenAI-shape assistant message the directives describe."""
    message: dict[str, Any] = {"role": "assistant"}
    if script.say:
        message["content"] = "\n".join(script.say)
    elif script.calls:
        message["content"] = ""
    else:
        message["content"] = default_reply(prompt_digest)
    if thinking and script.think:
        message["reasoning_content"] = "\n".join(script.think)
    if script.calls:
        message["tool_calls"] = [
            {"id": call_id(prompt_digest, i), "type": "function",
             "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(script.calls)
        ]
    return message


def default_reply(prompt_digest: bytes) -> str:
    return f"Mock reply {prompt_digest.hex()[:8]}."


# -- prompt reading --------------------------------------------------------------------
def prompt_digest(ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).digest()


def _message_body(text: str) -> str:
    blocks = _TOOL_RESPONSE_RE.findall(text)
    body = blocks[-1][1] if blocks else text
    gemma = _GEMMA_RESPONSE_RE.match(body.strip())
    if gemma:
        return gemma.group(1)
    stripped = body.strip()
    if stripped[:1] in '"{':  # JSON-quoted tool results (harmony, Mistral)
        try:
            value = json.loads(stripped)
        except ValueError:
            return body
        if isinstance(value, dict) and isinstance(value.get("content"), str):
            return value["content"]
        if isinstance(value, str):
            return value
    return body


# -- logprobs --------------------------------------------------------------------------
def _unit(digest: bytes, salt: bytes, position: int) -> float:
    h = hashlib.blake2b(digest + salt + position.to_bytes(8, "little"), digest_size=8).digest()
    return (int.from_bytes(h, "little") + 1) / 18446744073709551617.0  # in (0, 1)


def _f32(x: float) -> float:
    return _F32.unpack(_F32.pack(x))[0]


def token_logprob(digest: bytes, position: int, *, salt: bytes = b"out") -> float:
    """Deterministic logprob of output position ``position`` for a prompt: in (-3, -0.001)."""
    return _f32(-0.001 - 2.998 * _unit(digest, salt, position))


# -- the model -------------------------------------------------------------------------
@dataclass
class Plan:
    """A generation decided in full at arrival; the server emits it token by token."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: dict[str, Any]
    variant: dict[str, Any]
    message: dict[str, Any] | None
    faults: tuple[Fault, ...] = ()
    """``FAULT`` directives of the prompt: applied to the reply by the server."""


class MockModel:
    """Turns prompt ids into the scripted completion ids of a family."""

    def __init__(self, renderer: TemplateRenderer):
        self.renderer = renderer
        self.tokenizer = renderer.tokenizer
        self.stop_ids = frozenset(renderer.stop_ids)
        self.im_start_id = self.tokenizer.token_to_id("<|im_start|>")
        self.filler_ids = [t for t in self.tokenizer.encode(FILLER_TEXT) if t not in self.stop_ids]
        self.variants = renderer.thinking_variants()
        self.gen_prompts = [self._gen_prompt_ids(v) for v in self.variants]
        """Per variant: its generation prompts after a user message and after a tool result
        (Gemma 4 continues the model turn after tool results with another prompt)."""
        self._render_cache: dict[tuple[str, int], list[int]] = {}

    # prompt analysis -----------------------------------------------------------------
    def _gen_prompt_ids(self, variant: dict[str, Any]) -> list[list[int]]:
        call = {"id": "call_probe", "type": "function",
                "function": {"name": "probe", "arguments": "{}"}}
        probes: list[list[dict[str, Any]]] = [
            [{"role": "user", "content": "x"}],
            [{"role": "user", "content": "x"},
             {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_probe", "content": "y"}]]
        out = []
        for probe in probes:
            try:
                base = self.renderer.render_text(probe, template_kwargs=variant)
                full = self.renderer.render_text(probe, template_kwargs=variant,
                                                 add_generation_prompt=True)
            except Exception:  # a template that refuses the probe
                continue
            if full.startswith(base):
                out.append(self.tokenizer.encode(full[len(base):]))
        return out or [[]]

    def choose_variant(self, ids: Sequence[int]) -> int:
        """Index of the variant whose generation prompt ``ids`` end with (longest wins)."""
        best, best_len = 0, -1
        for i, gens in enumerate(self.gen_prompts):
            for gen in gens:
                n = len(gen)
                if n > best_len and n <= len(ids) and list(ids[len(ids) - n:]) == gen:
                    best, best_len = i, n
        return best

    def thinking_on(self, variant: dict[str, Any]) -> bool:
        kwarg = self.renderer.spec.thinking_kwarg
        return not (kwarg is not None and variant.get(kwarg) is False)

    def last_message_text(self, ids: Sequence[int]) -> str:
        """Text of the last user/tool message (the last ``<tool_response>`` if it has some)."""
        start_id = self.im_start_id
        if start_id is None:  # not a ChatML-like family: find it by the family's openers
            return self._last_message_by_openers(ids)
        end = len(ids)
        for i in range(len(ids) - 1, -1, -1):
            if ids[i] != start_id:
                continue
            segment = list(ids[i + 1 : end])
            end = i
            for j, tok in enumerate(segment):
                if tok in self.stop_ids:
                    segment = segment[:j]
                    break
            role, _, body = self.tokenizer.decode(segment).partition("\n")
            if role.strip() in ("user", "tool"):
                return _message_body(body)
        return ""

    def _last_message_by_openers(self, ids: Sequence[int]) -> str:
        """The last non-assistant message, located with the family's turn openers."""
        spec = self.renderer.spec
        text = self.tokenizer.decode(ids)
        openers = spec.turn_openers
        if not openers:
            return _message_body(self.tokenizer.decode(ids, skip_special_tokens=True))
        assistant = spec.assistant_openers or ((spec.assistant_start,) if spec.assistant_start
                                               else ())
        marks = sorted({(m.start(), o) for o in openers
                        for m in re.finditer(re.escape(o), text)})
        for k in range(len(marks) - 1, -1, -1):
            pos, opener = marks[k]
            if any(text.startswith(a, pos) for a in assistant):
                continue
            end = marks[k + 1][0] if k + 1 < len(marks) else len(text)
            body = text[pos + len(opener) : end]
            for header_end in ("<|message|>", "<|end_header_id|>", "<|im_middle|>",
                               "<|sep|>",  # (Kimi K3: role="user"<|sep|>)
                               "<|content_text|>"):
                if header_end in body:
                    body = body.split(header_end, 1)[1]
            for stop in (*self.renderer.closer_texts, "<|end|>", "<|eot_id|>",
                         "<|close|>message<|sep|>", "<|end_message|>"):
                body = body.replace(stop, "")
            return _message_body(body)
        return ""

    # completion ----------------------------------------------------------------------
    def render(self, message: dict[str, Any], variant_index: int) -> list[int]:
        key = (json.dumps(message, sort_keys=True), variant_index)
        ids = self._render_cache.get(key)
        if ids is None:
            ids = self.renderer.render_completion(
                message, template_kwargs=self.variants[variant_index])
            if len(self._render_cache) >= 4096:
                self._render_cache.clear()
            self._render_cache[key] = ids
        return list(ids)

    def script(self, ids: Sequence[int]) -> Script:
        """The directives of the prompt's last user/tool message."""
        return parse_directives(self.last_message_text(ids))

    def scripted(self, ids: Sequence[int], digest: bytes | None = None,
                 script: Script | None = None
                 ) -> tuple[list[int], int | None, int, dict[str, Any] | None]:
        """(ids the model wants to emit, LONG limit or None, variant index, message)."""
        digest = digest if digest is not None else prompt_digest(ids)
        script = script if script is not None else self.script(ids)
        vi = self.choose_variant(ids)
        thinking = self.thinking_on(self.variants[vi])
        if script.long is not None:
            prefix: list[int] = []
            message = None
            if script.say or script.calls or (thinking and script.think):
                message = build_message(script, digest, thinking=thinking)
                prefix = self.render(message, vi)
                if prefix and prefix[-1] in self.stop_ids:
                    prefix.pop()
            n = script.long
            out = prefix[:n]
            out.extend(self.filler(k) for k in range(n - len(out)))
            return out, n, vi, message
        message = build_message(script, digest, thinking=thinking)
        return self.render(message, vi), None, vi, message

    def filler(self, k: int) -> int:
        return self.filler_ids[k % len(self.filler_ids)]

    def plan(
        self,
        ids: Sequence[int],
        *,
        max_new_tokens: int = 128,
        min_new_tokens: int = 0,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        stop: Sequence[str] = (),
        stop_regex: Sequence[str] = (),
        digest: bytes | None = None,
    ) -> Plan:
        """The whole completion for ``ids`` under these sampling settings."""
        digest = digest if digest is not None else prompt_digest(ids)
        script = self.script(ids)
        wanted, long_limit, vi, message = self.scripted(ids, digest, script)
        stops = set(stop_token_ids)
        if not ignore_eos:
            stops |= self.stop_ids
        limit = max_new_tokens if long_limit is None else min(long_limit, max_new_tokens)
        out, finish = self._emit(
            wanted, limit, stops, min_new_tokens, stop, [re.compile(r) for r in stop_regex])
        if finish is None:
            finish = {"type": "length", "length": limit}
        logprobs = [token_logprob(digest, i) for i in range(len(out))]
        return Plan(out, logprobs, finish, self.variants[vi], message, tuple(script.faults))

    def _source(self, wanted: list[int]) -> Iterator[int]:
        """The ids the model wants, then filler forever (ignore_eos, or a masked stop)."""
        yield from wanted
        k = 0
        while True:
            yield self.filler(k)
            k += 1

    def _emit(
        self,
        wanted: list[int],
        limit: int,
        stops: set[int],
        min_new_tokens: int,
        stop: Sequence[str],
        regexes: list[re.Pattern[str]],
    ) -> tuple[list[int], dict[str, Any] | None]:
        """Output ids up to ``limit`` and the stop finish reason (None: not stopped)."""
        src = self._source(wanted)
        extra = 0
        out: list[int] = []
        pending: int | None = None
        while len(out) < limit:
            if pending is not None:
                tok, pending = pending, None
            else:
                tok = next(src)
            if tok in stops and len(out) < min_new_tokens:
                pending = tok  # min_new_tokens masks stop ids: say something else first
                tok = self.filler(extra)
                extra += 1
            out.append(tok)
            if tok in stops:
                return out, {"type": "stop", "matched": tok}
            matched = self._stop_text(out, stop, regexes)
            if matched is not None:
                return out, {"type": "stop", "matched": matched}
        return out, None

    def _stop_text(self, out: list[int], stop: Sequence[str],
                   regexes: list[re.Pattern[str]]) -> str | None:
        """The stop string or regex match the decoded output contains, if any."""
        if not (stop or regexes):
            return None
        text = self.tokenizer.decode(out)
        matched: str | None = next((s for s in stop if s and s in text), None)
        if matched is not None:
            return matched
        for rx in regexes:
            m = rx.search(text)
            if m:
                return m.group(0)
        return None

"""Append-only verification of a renderer (design §4.4), pure and CPU-only.

For each trajectory of a pool, each thinking mode and every split point (after each
generated assistant turn) three checks run:

- ``text_prefix``: rendering the first n messages (no generation prompt) is a prefix of
  rendering all of them (with it);
- ``token_prefix``: the ids the gateway would hold — the first turn's prompt, the model's
  completion ids (ending at its stop id), then a bridge per later turn — decode to the
  canonical render of the same messages (first divergence shown with context; ids that
  differ only inside model completions, where the model's own tokenization stands, pass);
- ``parse_round_trip``: parsing the completion ids of an assistant message gives back its
  content, reasoning and tool calls (arguments equal as JSON).

A bridge that declines (raises) is a failure for that role. Trajectories are adapted to the
family: appended roles it does not allow are left out (reported as coverage), reasoning is
removed when thinking is off or the format has none. The gateway runs this at startup and
reports it in ``/health``; ``tito verify-template`` prints it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tito.render.audit import audit_pool
from tito.render.base import TemplateRenderer
from tito.render.divergence import Divergence, hints_for, id_divergence, text_divergence
from tito.types.errors import TitoError

Message = dict[str, Any]
Trajectory = tuple[str, list[Message], list[dict[str, Any]] | None]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALC_TOOL = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search documents.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer"},
        "filters": {"type": "object"}}, "required": ["query"]}}}


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def trajectory_pool() -> list[Trajectory]:
    """(name, messages, tools) trajectories covering the append cases TITO must handle.

    Assistant messages whose content starts with ``(injected)`` are client-supplied history
    (few-shot, compaction), not generations."""
    return [*_single_round_trajectories(), *_multi_round_trajectories()]


def _single_round_trajectories() -> list[Trajectory]:
    return [
        ("tool_then_user", [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
             "tool_calls": [_call("call_1", "get_weather", {"city": "Paris"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
            {"role": "assistant", "content": "It is 21°C in Paris.",
             "reasoning_content": "The tool says 21."},
            {"role": "user", "content": "And in Tokyo?"},
            {"role": "assistant", "content": "Let me check.", "reasoning_content": "Again.",
             "tool_calls": [_call("call_2", "get_weather", {"city": "Tokyo"})]},
        ], [WEATHER_TOOL]),
        ("parallel_calls_and_system_reminder", [
            {"role": "user", "content": "Compute 2+2 and 3*7."},
            {"role": "assistant", "content": "", "reasoning_content": "Two calls.",
             "tool_calls": [_call("call_a", "calculator", {"expression": "2+2"}),
                            _call("call_b", "calculator", {"expression": "3*7"})]},
            {"role": "tool", "tool_call_id": "call_a", "content": "4"},
            {"role": "tool", "tool_call_id": "call_b", "content": "21"},
            {"role": "assistant", "content": "4 and 21.", "reasoning_content": "Done."},
            {"role": "system", "content": "Reminder: answer briefly."},
            {"role": "user", "content": "Now 10/4?"},
            {"role": "assistant", "content": "2.5", "reasoning_content": "Easy."},
        ], [CALC_TOOL]),
        ("failed_call_user_followup_unicode", [
            {"role": "system", "content": "Réponds en français. 🚀"},
            {"role": "user", "content": "Météo à Zürich ?"},
            {"role": "assistant", "content": "Je vérifie.", "reasoning_content": "",
             "tool_calls": [_call("call_z", "get_weather", {"city": "Zürich"})]},
            {"role": "tool", "tool_call_id": "call_z", "content": "error: timeout"},
            {"role": "user", "content": "Réessaie."},
            {"role": "assistant", "content": "Il fait 12°C.", "reasoning_content": "ok"},
        ], [WEATHER_TOOL]),
    ]


def _multi_round_trajectories() -> list[Trajectory]:
    return [
        ("plain_chat_injected_assistant", [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": ""},
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the chicken cross the road?",
             "reasoning_content": "A classic."},
            {"role": "user", "content": ""},
            {"role": "assistant", "content": "(injected) Shall I go on?"},
            {"role": "user", "content": "Yes."},
            {"role": "assistant", "content": "To get to the other side.",
             "reasoning_content": ""},
        ], None),
        ("multi_round_tools_nested_args", [
            {"role": "user", "content": "Find two reports about 東京 and summarise."},
            {"role": "assistant", "content": "", "reasoning_content": "Search first.",
             "tool_calls": [_call("call_s1", "search", {
                 "query": "東京 report", "limit": 2, "filters": {"year": 2024, "tags": ["a"]}})]},
            {"role": "tool", "tool_call_id": "call_s1", "content": "[\"r1\", \"r2\"]"},
            {"role": "assistant", "content": "", "reasoning_content": "Now the second page.",
             "tool_calls": [_call("call_s2", "search", {"query": "東京 report page 2"})]},
            {"role": "tool", "tool_call_id": "call_s2", "content": ""},
            {"role": "assistant", "content": "Two reports: r1 and r2.",
             "reasoning_content": "Enough."},
            {"role": "system", "content": "Keep answers under 20 words."},
            {"role": "assistant", "content": "(injected) Noted."},
            {"role": "user", "content": "Thanks — anything else?\nMulti-line ✓"},
            {"role": "assistant", "content": "No.", "reasoning_content": "Short."},
        ], [SEARCH_TOOL, CALC_TOOL]),
    ]


@dataclass
class CaseResult:
    trajectory: str
    variant: str
    split: int
    check: str
    passed: bool
    detail: str = ""
    reason: str | None = None
    """Why it failed (:data:`tito.types.mismatch.REASONS`); also set on a passing
    ``token_prefix`` case whose ids differ from a fresh tokenization of the same text."""
    divergence: dict[str, Any] | None = None
    """The first divergence (:class:`tito.render.divergence.Divergence`, as a dict)."""


@dataclass
class VerifyReport:
    family: str
    cases: list[CaseResult] = field(default_factory=list)
    roles_exercised: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)
    variants: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    def checks(self) -> dict[str, tuple[int, int]]:
        """check -> (passed, total)."""
        out: dict[str, tuple[int, int]] = {}
        for c in self.cases:
            ok, total = out.get(c.check, (0, 0))
            out[c.check] = (ok + int(c.passed), total + 1)
        return out

    def reasons(self) -> dict[str, int]:
        """reason -> failed cases."""
        out: dict[str, int] = {}
        for c in self.cases:
            if not c.passed and c.reason is not None:
                out[c.reason] = out.get(c.reason, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        failed = [c for c in self.cases if not c.passed]
        first = failed[0] if failed else None
        return {
            "ran": True,
            "passed": self.passed,
            "cases": len(self.cases),
            "failed": len(failed),
            "roles_exercised": sorted(self.roles_exercised),
            "skipped": sorted(set(self.skipped)),
            "first_failure": None if first is None else
            f"{first.trajectory}/{first.variant} split {first.split} "
            f"({first.check}): {first.detail}",
            "first_failure_reason": None if first is None else first.reason,
            "first_failure_divergence": None if first is None else first.divergence,
            "reasons": self.reasons(),
        }


def first_divergence(expected: str, actual: str, context: int = 40) -> str:
    n = next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
             min(len(expected), len(actual)))
    return (f"first divergence at char {n}: expected {expected[max(0, n - context):n + context]!r}"
            f" got {actual[max(0, n - context):n + context]!r}")


def _generated_positions(messages: list[Message]) -> list[int]:
    """Assistant turns the model generated (the pool marks injected ones with '(injected)')."""
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"
            and not str(m.get("content", "")).startswith("(injected)")]


def adapt(messages: list[Message], renderer: TemplateRenderer, thinking: bool
          ) -> list[Message] | None:
    """The trajectory as this family and thinking mode can carry it (None: not applicable).

    Reasoning is removed when thinking is off or the format has none; appended messages
    with a role the family does not allow are left out."""
    allowed = renderer.allowed_append_roles
    gen = _generated_positions(messages)
    if not gen:
        return None
    out: list[Message] = []
    for i, m in enumerate(messages):
        if i > gen[0] and m["role"] not in allowed:
            continue
        if m["role"] == "assistant" and (not thinking or not renderer.spec.reasoning):
            m = {k: v for k, v in m.items() if k != "reasoning_content"}
        out.append(m)
    return out


def _args(call: dict[str, Any]) -> Any:
    try:
        return json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        return call["function"]["arguments"]


def parse_problem(renderer: TemplateRenderer, message: Message, ids: list[int]) -> str | None:
    """Why parsing ``ids`` does not give ``message`` back (None: it does)."""
    parsed = renderer.parse(ids, "stop")
    if (parsed.content or "").strip() != (message.get("content") or "").strip():
        return f"content {parsed.content!r} != {message.get('content')!r}"
    want_reasoning = (message.get("reasoning_content") or "").strip()
    text = renderer.tokenizer.decode(ids)
    content = (message.get("content") or "").strip()
    outside = text.replace(content, "", 1) if content else text
    if want_reasoning and want_reasoning in outside and \
            (parsed.reasoning_content or "").strip() != want_reasoning:
        return f"reasoning {parsed.reasoning_content!r} != {want_reasoning!r}"
    want = [(c["function"]["name"], _args(c)) for c in message.get("tool_calls") or []]
    got = [(c["function"]["name"], _args(c)) for c in parsed.tool_calls]
    if want != got:
        return f"tool calls {got} != {want}"
    return None


def _variants(renderer: TemplateRenderer, thinking: str, extra: dict[str, Any] | None
              ) -> list[dict[str, Any]]:
    kwarg = renderer.spec.thinking_kwarg
    if kwarg is not None and extra and kwarg in extra:
        return [dict(extra)]  # the kwargs choose the mode
    variants = renderer.thinking_variants()
    if kwarg is not None and thinking != "both":
        variants = [v for v in variants if v[kwarg] is (thinking == "on")]
    return [{**v, **(extra or {})} for v in variants]


def verify_renderer(renderer: TemplateRenderer, *, thinking: str = "both",
                    kwargs: dict[str, Any] | None = None,
                    pool: list[Trajectory] | None = None, audit: bool = False
                    ) -> VerifyReport:
    """Run the three checks over the pool; ``thinking``: ``on``, ``off`` or ``both``;
    ``audit``: over the audit corpus too (:mod:`tito.render.audit`; conversations that
    append a role the family does not allow are skipped)."""
    report = VerifyReport(renderer.family)
    tok = renderer.tokenizer
    pool = list(pool if pool is not None else trajectory_pool())
    if audit:
        extra, skipped = audit_pool(renderer.allowed_append_roles)
        pool += extra
        report.skipped += skipped
    for variant in _variants(renderer, thinking, kwargs):
        vname = ",".join(f"{k}={v}" for k, v in variant.items()) or "default"
        report.variants.append(vname)
        try:
            on = renderer.thinking_enabled(variant)
        except TitoError as exc:
            report.cases.append(CaseResult("-", vname, -1, "render", False, exc.message))
            continue
        for name, raw, tools in pool:
            messages = adapt(raw, renderer, on)
            if messages is None:
                report.skipped.append(name)
                continue
            _verify_one(renderer, report, name, vname, messages, tools, variant, tok)
    return report


def _verify_one(renderer: TemplateRenderer, report: VerifyReport, name: str, vname: str,
                messages: list[Message], tools: list[dict[str, Any]] | None,
                variant: dict[str, Any], tok: Any) -> None:
    gen = _generated_positions(messages)
    pos = gen[0]
    try:
        ids = renderer.render_prompt(messages[:pos], tools=tools, template_kwargs=variant)
        for n, pos in enumerate(gen):
            completion = renderer.completion_in_context(messages[:pos], messages[pos],
                                                        tools=tools, template_kwargs=variant)
            problem = parse_problem(renderer, messages[pos], completion)
            report.cases.append(CaseResult(name, vname, pos, "parse_round_trip",
                                           problem is None, problem or "",
                                           None if problem is None else "parse_mismatch"))
            ids = ids + completion
            if n + 1 == len(gen):
                break
            nxt = gen[n + 1]
            report.roles_exercised.update(m["role"] for m in messages[pos + 1 : nxt])
            step = _Step(renderer, name, vname, messages, tools, variant, pos, nxt)
            report.cases.append(step.text_prefix())
            case, ids = step.token_prefix(ids)
            report.cases.append(case)
    except TitoError as exc:
        report.cases.append(CaseResult(name, vname, pos, "render", False, exc.message,
                                       "render_error"))


@dataclass
class _Step:
    """The checks at one split: the messages up to the generated turn ``pos`` are held,
    those up to the next generated turn ``nxt`` are appended."""

    renderer: TemplateRenderer
    name: str
    vname: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    variant: dict[str, Any]
    pos: int
    nxt: int

    @property
    def appended(self) -> list[Message]:
        return self.messages[self.pos + 1 : self.nxt]

    def full(self) -> str:
        return self.renderer.render_text(self.messages[: self.nxt], tools=self.tools,
                                         template_kwargs=self.variant,
                                         add_generation_prompt=True)

    def case(self, check: str, div: Divergence | None, detail: str = "",
             passed: bool | None = None) -> CaseResult:
        ok = div is None if passed is None else passed
        return CaseResult(self.name, self.vname, self.nxt, check, ok, detail,
                          None if div is None else div.reason,
                          None if div is None else div.to_dict())

    def text_prefix(self) -> CaseResult:
        head = self.renderer.render_text(self.messages[: self.pos + 1], tools=self.tools,
                                         template_kwargs=self.variant)
        full = self.full()
        div = None if full.startswith(head) else \
            text_divergence(full, head, hints_for(self.renderer, self.messages[: self.nxt]))
        return self.case("text_prefix", div, "" if div is None else first_divergence(full, head))

    def declined(self, exc: TitoError) -> CaseResult:
        """A bridge that raised: the divergence of its synthetic base and base + appended."""
        roles = [m["role"] for m in self.appended]
        div = None
        try:
            base, full = self.renderer.bridge_texts(self.messages[self.pos], self.appended,
                                                    tools=self.tools,
                                                    template_kwargs=self.variant)
            hints = hints_for(self.renderer, self.messages[: self.nxt],
                              appended_start=len(base),
                              appended_assistant="assistant" in roles)
            div = text_divergence(full[: len(base)], base, hints)
        except TitoError:
            pass
        div = div or Divergence("render_error", 0, "", "")
        return self.case("token_prefix", div, f"bridge declined for {roles}: {exc.message}")

    def token_prefix(self, ids: list[int]) -> tuple[CaseResult, list[int]]:
        """The ids after bridging ``ids`` to the next turn, against the canonical render."""
        renderer, tok = self.renderer, self.renderer.tokenizer
        try:
            bridge = renderer.bridge(self.messages[self.pos], ids[-1], self.appended,
                                     tools=self.tools, template_kwargs=self.variant)
        except TitoError as exc:
            return self.declined(exc), renderer.render_prompt(
                self.messages[: self.nxt], tools=self.tools, template_kwargs=self.variant)
        held = ids[: len(ids) - bridge.drop]
        ids = held + bridge.ids
        canonical = tok.encode(self.full())
        hints = hints_for(renderer, self.messages[: self.nxt], junctions=(len(held),),
                          appended_start=len(tok.decode(held)),
                          appended_assistant=any(m["role"] == "assistant"
                                                 for m in self.appended))
        div = id_divergence(tok, canonical, ids, hints)
        exp_text, got_text = tok.decode(canonical), tok.decode(ids)
        ok = exp_text == got_text
        detail = "" if ok else first_divergence(exp_text, got_text)
        if ok and div is not None:
            # The model's own ids at a completion boundary (e.g. "\n" + "\n" where a
            # fresh tokenization merges "\n\n"): same text; an assistant-text matter.
            detail = "same text; model ids differ from a fresh tokenization"
        return self.case("token_prefix", div, detail, passed=ok), ids

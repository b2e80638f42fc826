"""Append-only verification of a renderer (DESIGN 4.4), pure and CPU-only.

For each trajectory of a pool and every pair of consecutive assistant turns, the ids the
gateway would build — the first turn's rendered prompt, the model's completion ids, then
a bridge per later turn — must equal the canonical full render of the same messages.
Also checks the parse round trip of every assistant message. The gateway runs this at
startup and reports it in ``/health``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tito.errors import TitoError
from tito.render.base import TemplateRenderer

Message = dict[str, Any]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALC_TOOL = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def trajectory_pool() -> list[tuple[str, list[Message], list[dict[str, Any]] | None]]:
    """(name, messages, tools) trajectories covering the append cases TITO must handle."""
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
    ]


@dataclass
class CaseResult:
    trajectory: str
    variant: str
    split: int
    check: str
    passed: bool
    detail: str = ""


@dataclass
class VerifyReport:
    family: str
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    def summary(self) -> dict[str, Any]:
        failed = [c for c in self.cases if not c.passed]
        return {
            "ran": True,
            "passed": self.passed,
            "cases": len(self.cases),
            "failed": len(failed),
            "first_failure": None if not failed else
            f"{failed[0].trajectory}/{failed[0].variant} split {failed[0].split} "
            f"({failed[0].check}): {failed[0].detail}",
        }


def first_divergence(expected: str, actual: str, context: int = 40) -> str:
    n = next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
             min(len(expected), len(actual)))
    return (f"first divergence at char {n}: expected {expected[max(0, n - context):n + context]!r}"
            f" got {actual[max(0, n - context):n + context]!r}")


def _variant_messages(messages: list[Message], thinking: bool) -> list[Message]:
    if thinking:
        return messages
    return [{**m, "reasoning_content": ""} if m["role"] == "assistant" else m
            for m in messages]


def _generated_positions(messages: list[Message]) -> list[int]:
    """Assistant turns the model generated (the pool marks injected ones with '(injected)')."""
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"
            and not str(m.get("content", "")).startswith("(injected)")]


def _parse_matches(renderer: TemplateRenderer, message: Message, ids: list[int]) -> str | None:
    parsed = renderer.parse(ids, "stop")
    if (parsed.content or "") != (message.get("content") or ""):
        return f"content {parsed.content!r} != {message.get('content')!r}"
    want_reasoning = message.get("reasoning_content") or ""
    if want_reasoning and (parsed.reasoning_content or "") != want_reasoning:
        return f"reasoning {parsed.reasoning_content!r} != {want_reasoning!r}"
    want = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls") or []]
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
           for c in parsed.tool_calls]
    if want != got:
        return f"tool calls {got} != {want}"
    return None


def verify_renderer(renderer: TemplateRenderer) -> VerifyReport:
    report = VerifyReport(renderer.family)
    tok = renderer.tokenizer
    for variant in renderer.thinking_variants():
        thinking = all(v is not False for v in variant.values())
        vname = ",".join(f"{k}={v}" for k, v in variant.items()) or "default"
        for name, raw, tools in trajectory_pool():
            messages = _variant_messages(raw, thinking)
            gen = _generated_positions(messages)
            try:
                ids = renderer.render_prompt(messages[: gen[0]], tools=tools,
                                             template_kwargs=variant)
                for n, pos in enumerate(gen):
                    completion = renderer.render_completion(messages[pos], tools=tools,
                                                            template_kwargs=variant)
                    problem = _parse_matches(renderer, messages[pos], completion)
                    report.cases.append(CaseResult(name, vname, pos, "parse_round_trip",
                                                   problem is None, problem or ""))
                    ids = ids + completion
                    if n + 1 == len(gen):
                        break
                    nxt = gen[n + 1]
                    bridge = renderer.bridge(messages[pos], ids[-1], messages[pos + 1 : nxt],
                                             tools=tools, template_kwargs=variant)
                    ids = ids[: len(ids) - bridge.drop] + bridge.ids
                    canonical = renderer.render_prompt(messages[:nxt], tools=tools,
                                                       template_kwargs=variant)
                    ok = ids == canonical
                    detail = "" if ok else first_divergence(tok.decode(canonical),
                                                            tok.decode(ids))
                    if ok is False and tok.decode(canonical) == tok.decode(ids):
                        detail = "same text, different token ids"
                    report.cases.append(CaseResult(name, vname, nxt, "token_prefix", ok, detail))
            except TitoError as exc:
                report.cases.append(CaseResult(name, vname, -1, "render", False, exc.message))
    return report

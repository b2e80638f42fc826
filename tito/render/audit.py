"""The audit corpus: conversations that exercise every junction of append-only rendering
(design §4.4), run by ``tito verify-template`` for every family and by the family matrix
in CI. Pure data.

Each conversation declares the roles it appends after its first generated turn
(``appends``); a family whose ``allowed_append_roles`` lacks one skips the conversation
by that declared capability (reported as skipped, not failed). Assistant messages whose
content starts with ``(injected)`` are client-supplied history, as in the verifier's pool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look a key up.",
    "parameters": {"type": "object", "properties": {
        "key": {"type": "string"}, "exact": {"type": "boolean"}, "limit": {"type": "integer"},
        "ratio": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["key"]}}}
READ = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}
TOOLS = [LOOKUP, READ]

LONG_OUTPUT = "\n".join(f"line {i:04d}: " + "lorem ipsum dolor sit amet " * 3
                        for i in range(120))
"""A long tool output (about 10k characters, many lines)."""
UNICODE = "Ünïcödé ✓ — 東京 नमस्ते مرحبا 👩‍💻 ½"
"""Accents, CJK, Devanagari, right-to-left, an emoji ZWJ sequence (NFC: tokenizers that
normalize, as Qwen's do, cannot give a decomposed form back, a tokenizer matter)."""


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


@dataclass(frozen=True)
class AuditConversation:
    name: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    appends: frozenset[str]
    """Roles appended after the first generated turn (the capability it needs)."""


def _conv(name: str, messages: list[Message], tools: list[dict[str, Any]] | None = TOOLS
          ) -> AuditConversation:
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return AuditConversation(name, messages, tools,
                             frozenset(m["role"] for m in messages[first + 1 :]))


def _tool_rounds() -> list[AuditConversation]:
    return [
        _conv("tool_result_after_reasoning", [
            {"role": "user", "content": "Look up alpha."},
            {"role": "assistant", "content": "", "reasoning_content": "I need the tool.\nOK.",
             "tool_calls": [_call("a1", "lookup", {"key": "alpha"})]},
            {"role": "tool", "tool_call_id": "a1", "content": "{\"alpha\": 1}"},
            {"role": "assistant", "content": "Alpha is 1.", "reasoning_content": "Read it."},
        ]),
        _conv("parallel_calls_three", [
            {"role": "user", "content": "Look up a, b and c."},
            {"role": "assistant", "content": "", "reasoning_content": "Three at once.",
             "tool_calls": [_call("p1", "lookup", {"key": "a"}),
                            _call("p2", "lookup", {"key": "b", "exact": True}),
                            _call("p3", "read_file", {"path": "/tmp/c.txt"})]},
            {"role": "tool", "tool_call_id": "p1", "content": "1"},
            {"role": "tool", "tool_call_id": "p2", "content": "2"},
            {"role": "tool", "tool_call_id": "p3", "content": "three"},
            {"role": "assistant", "content": "1, 2 and three.", "reasoning_content": "All in."},
        ]),
        _conv("typed_arguments", [
            {"role": "user", "content": "Search with options."},
            {"role": "assistant", "content": "", "reasoning_content": "Typed arguments.",
             "tool_calls": [_call("t1", "lookup", {
                 "key": "q", "exact": False, "limit": 10, "ratio": 0.5,
                 "tags": ["x", "y"]})]},
            {"role": "tool", "tool_call_id": "t1", "content": "[]"},
            {"role": "assistant", "content": "Nothing found.", "reasoning_content": "Empty."},
        ]),
        _conv("long_tool_output", [
            {"role": "user", "content": "Read the log."},
            {"role": "assistant", "content": "", "reasoning_content": "Read it.",
             "tool_calls": [_call("l1", "read_file", {"path": "/var/log/app.log"})]},
            {"role": "tool", "tool_call_id": "l1", "content": LONG_OUTPUT},
            {"role": "assistant", "content": "120 lines.", "reasoning_content": "Counted."},
        ]),
    ]


def _edge_cases() -> list[AuditConversation]:
    return [
        _conv("empty_contents", [
            {"role": "user", "content": "Check the empty file."},
            {"role": "assistant", "content": "", "reasoning_content": "",
             "tool_calls": [_call("e1", "read_file", {"path": "/tmp/empty"})]},
            {"role": "tool", "tool_call_id": "e1", "content": ""},
            {"role": "assistant", "content": "It is empty.", "reasoning_content": ""},
            {"role": "user", "content": ""},
            {"role": "assistant", "content": "Anything else?", "reasoning_content": "Blank."},
        ]),
        _conv("unicode_everywhere", [
            {"role": "system", "content": f"Système : {UNICODE}"},
            {"role": "user", "content": f"Cherche {UNICODE}"},
            {"role": "assistant", "content": "", "reasoning_content": f"Pensée {UNICODE}",
             "tool_calls": [_call("u1", "lookup", {"key": UNICODE})]},
            {"role": "tool", "tool_call_id": "u1", "content": f"résultat {UNICODE}"},
            {"role": "assistant", "content": f"Voilà {UNICODE}", "reasoning_content": "✓"},
        ]),
        _conv("system_mid_conversation", [
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."},
            {"role": "system", "content": "From now on, answer in one word."},
            {"role": "user", "content": "How are you?"},
            {"role": "assistant", "content": "Fine.", "reasoning_content": "One word."},
        ], None),
    ]


def _role_switches() -> list[AuditConversation]:
    return [
        _conv("tool_then_user", [
            {"role": "user", "content": "Look up beta."},
            {"role": "assistant", "content": "", "reasoning_content": "Tool.",
             "tool_calls": [_call("b1", "lookup", {"key": "beta"})]},
            {"role": "tool", "tool_call_id": "b1", "content": "error: not found"},
            {"role": "user", "content": "Never mind, say hi."},
            {"role": "assistant", "content": "Hi!", "reasoning_content": "Fine."},
        ]),
        _conv("tool_then_system", [
            {"role": "user", "content": "Look up gamma."},
            {"role": "assistant", "content": "", "reasoning_content": "Tool.",
             "tool_calls": [_call("g1", "lookup", {"key": "gamma"})]},
            {"role": "tool", "tool_call_id": "g1", "content": "3"},
            {"role": "system", "content": "The tool budget is spent."},
            {"role": "assistant", "content": "Gamma is 3.", "reasoning_content": "Answer."},
        ]),
        _conv("consecutive_users", [
            {"role": "user", "content": "One."},
            {"role": "assistant", "content": "Yes?", "reasoning_content": "Wait."},
            {"role": "user", "content": "Two."},
            {"role": "user", "content": "Three."},
            {"role": "assistant", "content": "Got three.", "reasoning_content": "Count."},
        ], None),
        _conv("injected_assistant_after_tool", [
            {"role": "user", "content": "Look up delta."},
            {"role": "assistant", "content": "", "reasoning_content": "Tool.",
             "tool_calls": [_call("d1", "lookup", {"key": "delta"})]},
            {"role": "tool", "tool_call_id": "d1", "content": "4"},
            {"role": "assistant", "content": "(injected) Delta is 4."},
            {"role": "user", "content": "And then?"},
            {"role": "assistant", "content": "Done.", "reasoning_content": "End."},
        ]),
    ]


def audit_corpus() -> list[AuditConversation]:
    """Every conversation of the audit corpus."""
    return [*_tool_rounds(), *_edge_cases(), *_role_switches()]


def audit_pool(allowed_roles: frozenset[str]
               ) -> tuple[list[tuple[str, list[Message], list[dict[str, Any]] | None]],
                          list[str]]:
    """(the corpus as verifier trajectories named ``audit/<name>``, the names skipped
    because they append a role outside ``allowed_roles``)."""
    pool, skipped = [], []
    for conv in audit_corpus():
        if conv.appends <= allowed_roles:
            pool.append((f"audit/{conv.name}", conv.messages, conv.tools))
        else:
            skipped.append(f"audit/{conv.name}")
    return pool, skipped


FORMAT_LIMITS: dict[str, dict[str, str]] = {}
"""family -> audit conversation -> why its ``parse_round_trip`` cannot be exact (a format
limit, documented in docs/families.md); every other audit failure fails the family."""

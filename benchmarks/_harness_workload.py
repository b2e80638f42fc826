"""Harness-shaped conversations (issue 30): the bodies Claude Code and Codex send, built
from the captured requests in ``tests/harnesses/fixtures``, turn by turn.

Each door plays an agent loop: every turn resends the whole history with the system
prompt and the tool list (Claude Code: a ~20k-token system prompt, 13 tools, the
``cache_control`` marker on the newest message only; Codex: developer messages, 7
function tools, typed ``input`` items echoed back; Chat: the same system prompt and tools
as OpenAI functions). The last message of a turn is a tool result that scripts the mock
engine: ``THINK`` with n one-token words (n drawn per turn in a range: the reasoning the
model streams) and one ``CALL`` (the tool call the agent answers next turn).
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from typing import Any

from _paths import REPO

FIXTURES = REPO / "tests" / "harnesses" / "fixtures"
WORDS = ("the quick brown fox jumps over the lazy dog and keeps running through the long "
         "green field while the sun goes down over the quiet hills").split()
DOORS = {"messages": "v1/messages", "responses": "v1/responses",
         "chat": "v1/chat/completions", "chat-nostream": "v1/chat/completions"}


def _fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    body = data["body"]
    if isinstance(body.get("tools"), str):  # "@tools-<n>-<hash>.json": stored once
        body["tools"] = json.loads((FIXTURES / name).with_name(body["tools"][1:]).read_text())
    return body


def padded(text: str, tokens: int) -> str:
    """``text`` followed by filler words up to about ``tokens`` tokens (4 chars a token)."""
    words = []
    size = len(text)
    while size < 4 * tokens:
        word = " " + WORDS[len(words) % len(WORDS)]
        words.append(word)
        size += len(word)
    return text + "".join(words)


def directive(n: int, tool: str, k: int) -> str:
    think = " ".join(WORDS[i % len(WORDS)] for i in range(n))
    return f"THINK {think}\nCALL {tool} {json.dumps({'command': f'ls {k}'})}"


@dataclass
class Conversation:
    """One session's history in one door's format."""

    door: str
    system_tokens: int
    think: list[int]
    """The THINK words of each turn's directive."""
    base: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        getattr(self, "_start_" + self.door.split("-")[0])()

    # -- first body ----------------------------------------------------------------------
    def _start_messages(self) -> None:
        body = _fixture("claude_code/bash_1.json")
        system = body["system"]
        system[-1] = {**system[-1], "text": padded(system[-1]["text"], self.system_tokens)}
        self.base = {k: v for k, v in body.items() if k != "messages"}
        self.history = [{"role": "user", "content": [
            {"type": "text", "text": directive(self.think[0], "Bash", 0)}]}]

    def _start_responses(self) -> None:
        body = _fixture("codex/exec_command_0.json")
        items = body.pop("input")[:-1]
        first = items[0]["content"][0]
        first["text"] = padded(first["text"], self.system_tokens)
        self.base = body
        self.history = [*items, {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": directive(self.think[0], "exec_command", 0)}]}]

    def _start_chat(self) -> None:
        body = _fixture("claude_code/bash_1.json")
        system = padded("\n".join(b["text"] for b in body["system"]), self.system_tokens)
        tools = [{"type": "function", "function": {
            "name": t["name"], "description": t.get("description", ""),
            "parameters": t.get("input_schema", {"type": "object"})}} for t in body["tools"]]
        self.base = {"model": "m", "tools": tools, "max_tokens": 32768,
                     "stream": self.door == "chat"}
        if self.door == "chat":
            self.base["stream_options"] = {"include_usage": True}
        self.history = [{"role": "system", "content": system},
                        {"role": "user", "content": directive(self.think[0], "Bash", 0)}]

    # -- every turn ----------------------------------------------------------------------
    def body(self) -> bytes:
        if self.door == "messages":  # the marker on the newest message's last block only
            last = copy.deepcopy(self.history[-1])
            last["content"][-1]["cache_control"] = {"type": "ephemeral"}
            data = {"model": self.base["model"], "messages": [*self.history[:-1], last],
                    **{k: v for k, v in self.base.items() if k != "model"}}
        elif self.door == "responses":
            data = {"model": self.base["model"], "stream": True, "input": self.history,
                    **{k: v for k, v in self.base.items() if k not in ("model", "stream")}}
        else:
            data = {"messages": self.history, **self.base}
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()

    def answer(self, reply: Any, k: int) -> None:
        """Append turn ``k``'s reply (what the client read) and the tool's result, which
        scripts turn ``k + 1``."""
        n = self.think[min(k + 1, len(self.think) - 1)]
        if self.door == "messages":
            uses = [b for b in reply if b["type"] == "tool_use"]
            self.history += [{"role": "assistant", "content": reply}, {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": u["id"], "content":
                 directive(n, "Bash", k + 1), "is_error": False} for u in uses]}]
        elif self.door == "responses":
            calls = [i for i in reply if i["type"] == "function_call"]
            self.history += [*reply, *({"type": "function_call_output", "call_id": c["call_id"],
                                        "output": directive(n, "exec_command", k + 1)}
                                       for c in calls)]
        else:
            self.history += [reply, *({"role": "tool", "tool_call_id": c["id"],
                                       "content": directive(n, "Bash", k + 1)}
                                      for c in reply.get("tool_calls") or ())]


def conversations(door: str, sessions: int, turns: int, tokens: tuple[int, int],
                  system_tokens: int, seed: int = 0) -> list[Conversation]:
    rng = random.Random(seed)
    return [Conversation(door, system_tokens, [rng.randint(*tokens) for _ in range(turns)])
            for _ in range(sessions)]

"""Replays of what the real agent CLIs sent (tests/harnesses/fixtures/, captured by
``python -m helpers.cli_fixtures``) against ``tito serve`` over the mock engine: fast, no
npm. One fixture is posted as the first call of a new session; a sequence is posted in
order on one session, each body echoing the ids this gateway gave (``cli_fixtures.replay``).
Every call must be answered 200 without an error event and committed. The shapes the
gateway refuses today are xfail(strict) with the exact refusal, so each flips when fixed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.cli_fixtures import failure, load, replay, sequence
from helpers.support import Proc, start_gateway, start_mock

pytestmark = pytest.mark.slow  # real processes per case (fast tier: under a minute)


def case(name: str, xfail: str | None = None) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(name, marks=marks, id=name)


SINGLE = [
    case("claude_code/bash_0"),  # 12 tools, DeferredToolPlaceholder defer_loading, system role
    case("claude_code/bash_1"),  # tool_result
    case("claude_code/thinking_echo"),  # thinking block with the gateway's signature
    case("claude_code/structured_output"),  # --json-schema: a StructuredOutput tool
    case("claude_code/subagent_1"),  # a sub-agent's first call (x-claude-code-agent-id)
    case("claude_code/tool_reference"),  # a tool_reference in a tool_result
    case("claude_code/web_search_side_request"),  # only the server tool web_search_20250305
    case("claude_code/image_tool_result"),  # an image block in a tool_result
    case("codex/default_tools"),  # a namespace tool (multi_agent_v1) and web_search
    case("codex/web_search_tool"),  # the hosted web_search tool
    case("codex/exec_command_1"),  # reasoning, function_call, function_call_output echoed
    case("codex/empty_reasoning_echo"),  # function_call THEN an empty reasoning item
    case("codex/input_image_output"),  # a view_image function_call_output with an image
    case("codex/compaction_1"),  # the compaction side request: no tools, summary prompt
    case("codex/subagent_1"),  # a Codex sub-agent's first call: web_search left out
    case("codex/subagent_3"),  # the parent echoes a function_call with its "namespace"
]

SEQUENCES = [
    case("claude_code/bash"),
    case("codex/exec_command"),
    case("claude_code/subagent:v2"),  # main, sub, sub, main on one session
    case("claude_code/subagent:v1"),  # the sub-agent is an agent context of its own
    case("codex/compaction:v2"),  # turn, compaction request, the new window
    case("codex/compaction:v1"),  # each window a context (x-codex-window-id)
    case("codex/subagent:v2"),  # namespace tools flattened, calls routed back
]


@pytest.fixture(scope="module")
def gateways(qwen3_dir: Path) -> Iterator[dict[str, str]]:
    """A v1 and a v2 gateway over one mock engine (``{"v1": url, "v2": url}``), both with
    ``--images placeholder``: the setting under which an image must not be refused."""
    engine = start_mock(qwen3_dir, "qwen3")
    procs: list[Proc] = []
    try:
        for version in ("v1", "v2"):
            procs.append(start_gateway(engine.url, qwen3_dir, "qwen3", "--session-version",
                                       version, "--images", "placeholder"))
        yield {"v1": procs[0].url, "v2": procs[1].url}
    finally:
        for proc in procs:
            proc.stop()
        engine.stop()


def committed(url: str, sid: str) -> int:
    """Turns the session holds, in every agent context: v1 records, or every node of a v2
    tree."""
    meta = httpx.get(f"{url}/sessions/{sid}").json()["metadata"]
    contexts = meta.get("contexts") or [meta]
    return sum(len(c["tree"]["nodes"]) if c.get("tree") else int(c.get("num_turns",
                                                                       c.get("turns", 0)))
               for c in contexts)


PARENT_HEADERS = frozenset({"x-codex-parent-thread-id", "x-claude-code-parent-agent-id"})
"""Left out of a sub-agent's call replayed alone: its parent sent nothing on that session
(a parent the session does not know is 400 ``unknown_parent_agent``, tests/server)."""


def check(url: str, calls: list[dict[str, Any]], drop: frozenset[str] = frozenset()) -> None:
    sid, replies = replay(url, calls, drop)
    problems = [f"call {i} ({calls[i]['scenario']}#{calls[i]['call']}): {failure(r)}"
                for i, r in enumerate(replies) if failure(r)]
    assert not problems, f"the gateway refused: {problems}"
    assert committed(url, sid) == len(calls)


@pytest.mark.parametrize("name", SINGLE)
def test_replay_one_call(name: str, gateways: dict[str, str]) -> None:
    check(gateways["v1"], [load(name)], PARENT_HEADERS)


@pytest.mark.parametrize("name", SEQUENCES)
def test_replay_sequence(name: str, gateways: dict[str, str]) -> None:
    base, _, version = name.partition(":")
    check(gateways[version or "v1"], sequence(base))

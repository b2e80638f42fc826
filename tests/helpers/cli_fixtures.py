"""Raw requests of the real agent CLIs, saved as JSON under tests/harnesses/fixtures/, and
their replay against a gateway (tests/harnesses/test_replay.py).

Capture them again (after a CLI version bump in scripts/harness_clis.sh) with::

    PYTHONPATH=$PWD:$PWD/tests python3 -m helpers.cli_fixtures

which runs the scenarios of :mod:`helpers.cli_scenarios` (and :data:`SHIM_SCENARIOS`) in
network namespaces and rewrites the folder. A fixture is one model call::

    {"cli": "claude", "cli_version": "2.1.332", "scenario": "bash", "call": 0,
     "method": "POST", "path": "/sessions/{session}/v1/messages?beta=true",
     "headers": {...}, "body": {...}, "status": 200, "reply_ids": ["msg_...", "call_..."]}

``body.tools`` may be ``"@<file>"``: the tools list, identical across many calls, lives once
in that file of the same folder (:func:`load`). ``reply_ids`` are the ids the gateway gave
in its reply, in order: a replay maps them to the ids of its own replies, so the next call
of a sequence echoes the history the replaying gateway gave (:func:`replay`).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from helpers.cli_harness import REPO, is_model_call, run_in_netns
from helpers.cli_scenarios import (
    CLAUDE,
    CODEX,
    Scenario,
    call,
    cli_binary,
    pinned_versions,
)
from helpers.logging_proxy import read_log
from helpers.support import tokenizer_dir

FIXTURES = REPO / "tests" / "harnesses" / "fixtures"
MAX_BYTES = 50_000
"""A fixture file stays under this (tools lists are shared to keep it so)."""
DROP_HEADERS = frozenset({"host", "content-length", "connection", "accept-encoding"})
ID_RE = re.compile(r"\b(?:call|msg|resp|rs|fc|toolu)_[0-9a-f]{16,}\b|\btito-[0-9a-f]{16,}\b")
"""Ids the gateway makes: response, message, reasoning, call ids and thinking signatures."""

SHIM_SCENARIOS = [
    Scenario("subagent_shim", "codex", "Delegate.\n" + call(
        "spawn_agent", {"message": "Sub task.\n" + call("exec_command", {"cmd": "echo sub"})})
        + "\n" + call("exec_command", {"cmd": "sleep 3; printf 'SAY done\\n'"}),
        gateway_args=("--session-version", "v2")),
]
"""Captured with ``proxy_rewrite: flatten_namespaces`` (the gateway refuses the namespace
tool today): the bodies saved are what Codex SENT, before the proxy flattened them."""

SELECTION: dict[str, tuple[str, str, list[int]]] = {
    # name: (cli, scenario, model-call indexes); several indexes: a sequence NAME_<i>
    "claude_code/bash": ("claude", "bash", [0, 1]),
    "claude_code/thinking_echo": ("claude", "thinking_chain", [1]),
    "claude_code/structured_output": ("claude", "structured_output", [0]),
    "claude_code/subagent": ("claude", "subagent_v2", [0, 1, 2, 3]),
    "claude_code/tool_reference": ("claude", "tool_search", [1]),
    "claude_code/web_search_side_request": ("claude", "web_search", [1]),
    "claude_code/image_tool_result": ("claude", "image_read", [2]),
    "codex/default_tools": ("codex", "default_tools", [0]),
    "codex/web_search_tool": ("codex", "web_search_tool", [0]),
    "codex/exec_command": ("codex", "exec_command", [0, 1]),
    "codex/empty_reasoning_echo": ("codex", "view_image", [1]),
    "codex/input_image_output": ("codex", "view_image", [2]),
    "codex/compaction": ("codex", "compaction_v2", [0, 1, 2]),
    "codex/subagent": ("codex", "subagent_shim", [0, 1, 2, 3]),
}


# -- reading -----------------------------------------------------------------------------
def load(name: str) -> dict[str, Any]:
    """One fixture, its ``@file`` tools resolved."""
    path = FIXTURES / f"{name}.json"
    fixture = dict(json.loads(path.read_text()))
    tools = fixture["body"].get("tools")
    if isinstance(tools, str) and tools.startswith("@"):
        fixture["body"]["tools"] = json.loads((path.parent / tools[1:]).read_text())
    return fixture


def sequence(name: str) -> list[dict[str, Any]]:
    """The calls ``name_0``, ``name_1``, ... of a captured sequence."""
    count = len(SELECTION[name][2])
    return [load(f"{name}_{i}") for i in range(count)]


# -- replaying -----------------------------------------------------------------------------
def reply_ids(text: str) -> list[str]:
    """The gateway-made ids of a reply (JSON or event stream), first appearance order."""
    return list(dict.fromkeys(ID_RE.findall(text)))


def stream_error(text: str) -> str | None:
    """The error event of a 200 event stream (None: none)."""
    for line in text.splitlines():
        if line.startswith("data:") and '"error"' in line and \
                ('"type":"error"' in line or line.startswith('data: {"error"')):
            return line
    return None


def replay(url: str, calls: list[dict[str, Any]], drop: frozenset[str] = frozenset(),
           ) -> tuple[str, list[httpx.Response]]:
    """Post ``calls`` in order on a new session of the gateway at ``url``, each body with
    the captured reply ids replaced by the replaying gateway's (and without the ``drop``
    headers); stops at the first failure. Returns the session id and the replies."""
    sid = httpx.post(url + "/sessions").json()["session_id"]
    ids: dict[str, str] = {}
    replies: list[httpx.Response] = []
    for fixture in calls:
        body = json.dumps(fixture["body"])
        for old, new in ids.items():
            body = body.replace(old, new)
        headers = {k: v for k, v in fixture["headers"].items()
                   if k.lower() not in DROP_HEADERS and k.lower() not in drop}
        resp = httpx.post(url + fixture["path"].replace("{session}", sid), content=body,
                          headers=headers, timeout=120)
        replies.append(resp)
        if resp.status_code != 200 or stream_error(resp.text):
            break
        new_ids = reply_ids(resp.text)
        if not fixture["reply_ids"] and fixture is calls[-1]:
            break  # captured when the gateway refused it: nothing later refers to its ids
        assert len(new_ids) == len(fixture["reply_ids"]), \
            f"the reply has ids {new_ids}, the captured one had {fixture['reply_ids']}"
        ids.update(zip(fixture["reply_ids"], new_ids, strict=True))
    return sid, replies


def failure(resp: httpx.Response) -> str | None:
    """``status: body`` of a failed reply (None: a 200 without an error event)."""
    if resp.status_code != 200:
        return f"{resp.status_code}: {resp.text[:500]}"
    return stream_error(resp.text)


# -- capturing -----------------------------------------------------------------------------
def _tools_ref(folder: Path, tools: list[Any]) -> str:
    """Save ``tools`` once in ``folder`` (named by count and content); its ``@file``."""
    text = json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    name = f"tools-{len(tools)}-{digest}.json"
    (folder / name).write_text(text + "\n")
    return "@" + name


def fixture_of(entry: dict[str, Any], cli: str, scenario: str, index: int,
               folder: Path) -> dict[str, Any]:
    body = dict(entry["body"])
    if isinstance(body.get("tools"), list) and len(json.dumps(body["tools"])) > 2000:
        body["tools"] = _tools_ref(folder, body["tools"])
    sid = entry["path"].split("/")[2]
    return {"cli": cli, "cli_version": pinned_versions()[cli], "scenario": scenario,
            "call": index, "method": entry["method"],
            "path": entry["path"].replace(sid, "{session}"),
            "headers": {k: v for k, v in entry["headers"].items()
                        if k.lower() not in DROP_HEADERS},
            "body": body, "status": entry.get("status"),
            "reply_ids": reply_ids(json.dumps(entry.get("reply")))}


def _write(path: Path, fixture: dict[str, Any]) -> None:
    text = json.dumps(fixture, separators=(",", ":"), ensure_ascii=False) + "\n"
    if len(text.encode()) > MAX_BYTES:
        print(f"warning: {path.name} is {len(text.encode())} bytes (> {MAX_BYTES})",
              file=sys.stderr)
    path.write_text(text)


def capture_run(scenario: Scenario, work: Path) -> list[dict[str, Any]]:
    """Run ``scenario`` once; the proxy's log of its model calls."""
    spec = scenario.spec(cli_binary(scenario.cli), tokenizer_dir("qwen3"))
    if scenario in SHIM_SCENARIOS:
        spec["proxy_rewrite"] = "flatten_namespaces"
    out = work / f"{scenario.cli}-{scenario.name}"
    proc = run_in_netns(spec, out, timeout=scenario.timeout + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"{scenario.name}: {proc.stderr[-2000:]}")
    return [e for e in read_log(out / "requests") if is_model_call(e)]


def capture(folder: Path = FIXTURES) -> None:
    """Run every selected scenario and rewrite the fixtures in ``folder``."""
    scenarios = {(s.cli, s.name): s for s in [*CLAUDE, *CODEX, *SHIM_SCENARIOS]}
    wanted = {(cli, name) for cli, name, _ in SELECTION.values()}
    with tempfile.TemporaryDirectory() as tmp:
        logs = {key: capture_run(scenarios[key], Path(tmp)) for key in sorted(wanted)}
    for sub in ("claude_code", "codex"):
        for old in (folder / sub).glob("*.json"):
            old.unlink()
        (folder / sub).mkdir(parents=True, exist_ok=True)
    for name, (cli, scenario, indexes) in SELECTION.items():
        log = logs[(cli, scenario)]
        for i, index in enumerate(indexes):
            path = folder / (f"{name}_{i}.json" if len(indexes) > 1 else f"{name}.json")
            _write(path, fixture_of(log[index], cli, scenario, index, path.parent))


if __name__ == "__main__":
    capture(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES)

"""Scripted tasks for the real agent CLIs (tests/harnesses/): what each one runs, what the
gateway must do with it, and — where it fails today — the exact cause.

The mock engine's directives (``CALL``, ``SAY``, ``THINK``) in the prompt make the "model"
call the CLI's own tools; a tool's OUTPUT can carry the next directive (the mock reads the
last user or tool message), which chains steps: ``CALL Bash {"command": "printf 'SAY
done'"}`` makes the model say "done" after the command ran.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers.cli_harness import REPO, run_in_netns
from helpers.support import tokenizer_dir

HARNESS_SCRIPT = REPO / "scripts" / "harness_clis.sh"
PNG_1X1 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAE"
           "lFTkSuQmCC")
"""A 1x1 PNG, base64: a tool writes it so that the CLI reads it back as an image."""

CODEX_FUNCTION_TOOLS = 'web_search = "disabled"\n[agents]\nenabled = false\n'
"""Codex config: no multi-agent ``namespace`` tool, no hosted ``web_search`` tool."""
CODEX_NO_AGENTS = "[agents]\nenabled = false\n"
CODEX_QUIET = "[analytics]\nenabled = false\n"


def call(tool: str, args: dict[str, Any]) -> str:
    """The mock directive that makes the model call ``tool`` with ``args``."""
    return f"CALL {tool} {json.dumps(args)}"


def printf(*lines: str) -> str:
    """A shell command that prints ``lines`` (each may be a directive for the next step)."""
    return "printf '" + "\\n".join(lines) + "\\n'"


@dataclass(frozen=True)
class Scenario:
    """One scripted CLI run (``spec`` of :mod:`helpers.cli_harness`) and what it must show."""

    name: str
    cli: str
    prompt: str
    expect: tuple[str, ...] = ()
    """Texts some sample's response must contain (the tool ran, the model answered)."""
    gateway_args: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    codex_config: str = ""
    roles: tuple[str, ...] = ()
    """The samples' agent roles, sorted (empty: not checked); each sub-agent's parent is
    the agent of another sample."""
    xfail: str | None = None
    """Why the gateway fails this run today (the exact refusal): marks it xfail(strict)."""
    timeout: float = 150.0

    def spec(self, binary: str, tokenizer: Path) -> dict[str, Any]:
        return {"cli": self.cli, "bin": binary, "prompt": self.prompt,
                "tokenizer": str(tokenizer), "family": "qwen3",
                "gateway_args": list(self.gateway_args), "args": list(self.args),
                "env": dict(self.env), "codex_config": self.codex_config + CODEX_QUIET,
                "timeout": self.timeout}


V2 = ("--session-version", "v2")
IMAGES = ("--images", "placeholder")
"""Under this setting an image must become a marker, not a refusal."""
AGENT_TASK = "Sub task.\n" + call("Bash", {"command": "echo sub", "description": "echo"})

CLAUDE = [
    Scenario("bash", "claude", "Run a command.\n" + call(
        "Bash", {"command": "echo hi", "description": "Say hi"}),
        expect=("<tool_response>\nhi\n</tool_response>", "Mock reply")),
    Scenario("thinking_chain", "claude", "Think, then run.\nTHINK I should run printf.\n" + call(
        "Bash", {"command": printf("THINK Done thinking.", "SAY finished"),
                 "description": "print"}),
        expect=("I should run printf.", "Done thinking.", "finished<|im_end|>")),
    Scenario("structured_output", "claude", "Answer in the schema.\n" + call(
        "StructuredOutput", {"answer": "hi"}),
        args=("--json-schema", json.dumps({"type": "object", "properties": {
            "answer": {"type": "string"}}, "required": ["answer"]})),
        expect=('"name": "StructuredOutput"',)),
    Scenario("subagent_v2", "claude", "Delegate.\n" + call("Agent", {
        "description": "Echo task", "prompt": AGENT_TASK, "subagent_type": "general-purpose",
        "run_in_background": False}), gateway_args=V2,
        expect=("<tool_response>\nsub\n</tool_response>", "Subagent hand-back"),
        roles=("main", "subagent")),
    Scenario("subagent_v1", "claude", "Delegate.\n" + call("Agent", {
        "description": "Echo task", "prompt": AGENT_TASK, "subagent_type": "general-purpose",
        "run_in_background": False}), roles=("main", "subagent")),
    Scenario("tool_search", "claude", "Load a tool.\n" + call(
        "ToolSearch", {"query": "select:WebFetch"})),
    Scenario("web_search", "claude", "Search.\n" + call("WebSearch", {"query": "tito"}),
             env={"ENABLE_TOOL_SEARCH": "false"}, gateway_args=V2),
    Scenario("image_read", "claude", "Look at the picture.\n" + call("Bash", {
        "command": f"echo {PNG_1X1} | base64 -d > dot.png && "
                   "echo \"CALL Read {\\\"file_path\\\": \\\"$PWD/dot.png\\\"}\"",
        "description": "make a png"}), gateway_args=IMAGES),
]

CODEX = [
    Scenario("exec_command", "codex", "Run it.\nTHINK Plan: run printf.\n" + call(
        "exec_command", {"cmd": printf("THINK ok", "SAY done")}),
        codex_config=CODEX_FUNCTION_TOOLS,
        expect=("Plan: run printf.", "Output:\nTHINK ok\nSAY done", "done<|im_end|>")),
    Scenario("default_tools", "codex", "Run it.\n" + call("exec_command", {"cmd": "echo hi"})),
    Scenario("web_search_tool", "codex", "Run it.\n" + call("exec_command", {"cmd": "echo hi"}),
             codex_config=CODEX_NO_AGENTS),
    Scenario("subagent_v2", "codex", "Delegate.\n" + call(  # the flat name the model sees
        "multi_agent_v1__spawn_agent", {"message": "Sub task.\n" + call(
            "exec_command", {"cmd": "echo sub"})})
        + "\n" + call("exec_command", {"cmd": "sleep 3; " + printf("SAY done")}),
        gateway_args=V2, expect=("Output:\nsub\n",), roles=("main", "subagent")),
    Scenario("view_image", "codex", "Look.\n" + call("exec_command", {
        "cmd": f"echo {PNG_1X1} | base64 -d > dot.png && "
               "echo \"CALL view_image {\\\"path\\\": \\\"$PWD/dot.png\\\"}\""}),
        codex_config=CODEX_FUNCTION_TOOLS, gateway_args=IMAGES),
    Scenario("compaction_v2", "codex", "Run it.\n" + call("exec_command", {
        "cmd": printf("SAY done")}),
        codex_config='model_auto_compact_token_limit = 3000\n' + CODEX_FUNCTION_TOOLS,
        gateway_args=V2, expect=("CONTEXT CHECKPOINT COMPACTION",)),
    Scenario("compaction_v1", "codex", "Run it.\n" + call("exec_command", {
        "cmd": printf("SAY done")}),
        codex_config='model_auto_compact_token_limit = 3000\n' + CODEX_FUNCTION_TOOLS,
        expect=("CONTEXT CHECKPOINT COMPACTION",), roles=("main", "main")),
]


# -- finding the CLIs ----------------------------------------------------------------------
def pinned_versions() -> dict[str, str]:
    """The versions scripts/harness_clis.sh installs: ``{"claude": ..., "codex": ...}``."""
    text = HARNESS_SCRIPT.read_text()
    found = dict(re.findall(r"^(CLAUDE_CODE|CODEX)_VERSION=(\S+)$", text, re.MULTILINE))
    return {"claude": found["CLAUDE_CODE"], "codex": found["CODEX"]}


PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}


def npm_prefix() -> Path:
    return Path(os.environ.get("TITO_HARNESS_NPM", Path.home() / ".cache" / "tito" / "npm"))


def netns_problem() -> str | None:
    """Why a loopback-only network namespace cannot be made here (None: it can)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2) for a network namespace"
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a network namespace (unshare -n: {probe.stderr.strip()})"
    return None


def cli_binary(cli: str) -> str:
    """The installed CLI at its pinned version, or skip the test with the reason."""
    version = pinned_versions()[cli]
    install = f"run bash scripts/harness_clis.sh (needs npm) to install {PACKAGES[cli]}@{version}"
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip(f"needs node and npm for {PACKAGES[cli]}; then {install}")
    manifest = npm_prefix() / "node_modules" / PACKAGES[cli] / "package.json"
    binary = npm_prefix() / "node_modules" / ".bin" / cli
    if not manifest.is_file() or not binary.exists():
        pytest.skip(f"{PACKAGES[cli]} is not installed in {npm_prefix()}: {install}")
    installed = json.loads(manifest.read_text()).get("version")
    if installed != version:
        pytest.skip(f"{PACKAGES[cli]} {installed} installed, {version} pinned: {install}")
    problem = netns_problem()
    if problem is not None:
        pytest.skip(problem)
    return str(binary)


# -- running one and checking what it did --------------------------------------------------
def run_scenario(scenario: Scenario, out: Path) -> dict[str, Any]:
    """Run ``scenario`` in its own network namespace; the runner's ``result.json``."""
    spec = scenario.spec(cli_binary(scenario.cli), tokenizer_dir("qwen3"))
    proc = run_in_netns(spec, out, timeout=scenario.timeout + 120)
    result_file = out / "result.json"
    assert proc.returncode == 0 and result_file.is_file(), \
        f"the harness runner failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n" \
        f"{proc.stderr[-3000:]}"
    return dict(json.loads(result_file.read_text()))


def check_run(scenario: Scenario, result: dict[str, Any]) -> None:
    """The CLI finished its task through the gateway: no refused model call, exit 0, every
    model call committed and in the samples, no TITO violation, the expected texts."""
    calls = result["model_calls"]
    assert calls >= 1, f"the CLI made no model call: {result['stderr'][-2000:]}"
    assert not result["errors"], f"the gateway refused model calls: {result['errors']}"
    assert result["exit_code"] == 0 and not result["timed_out"], \
        f"{scenario.cli} exited {result['exit_code']} (timed out: {result['timed_out']}):\n" \
        f"{result['stdout'][-2000:]}\n{result['stderr'][-2000:]}"
    samples = result["samples"]
    assert samples["status"] == 200, f"samples: {samples.get('error')}"
    assert result["turns_total"] == calls, \
        f"tito_turns_total {result['turns_total']} for {calls} model calls"
    assert samples["covered"] + samples["side"] == calls, \
        f"the samples hold {samples['covered']} of the {calls} model calls " \
        f"({samples['side']} in side-request contexts)"
    violations = [v for s in samples["samples"] for v in s["violations"]]
    assert not violations, f"TITO violations: {violations}"
    responses = "\n".join(s["response"] for s in samples["samples"])
    missing = [text for text in scenario.expect if text not in responses]
    assert not missing, f"not in any sample's response: {missing}"
    if scenario.roles:
        lineage = [s["lineage"] for s in samples["samples"]]
        assert sorted(str(x["role"]) for x in lineage) == list(scenario.roles), lineage
        agents = {x["agent_id"] for x in lineage}
        assert all(x["parent_agent_id"] in agents for x in lineage
                   if x["role"] == "subagent"), lineage


def scenario_params(scenarios: list[Scenario]) -> list[Any]:
    """``pytest.param`` per scenario, xfail(strict) with the cause where it fails today."""
    return [pytest.param(s, id=s.name, marks=[pytest.mark.xfail(strict=True, reason=s.xfail)]
                         if s.xfail else []) for s in scenarios]

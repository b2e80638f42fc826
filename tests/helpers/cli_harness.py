"""Run one agent CLI (Claude Code or Codex) against ``tito serve`` over the mock engine,
with a logging proxy between them, and write what happened to a folder.

Run it ONLY inside a network namespace of its own with loopback alone; it refuses to run
elsewhere (:func:`loopback_only`)::

    unshare -n bash -c 'ip link set lo up; exec python -m helpers.cli_harness SPEC OUT'

(:func:`run_in_netns` does exactly this from a test). ``SPEC`` is a JSON file:

- ``cli``: ``"claude"`` or ``"codex"``; ``bin``: the CLI's path (scripts/harness_clis.sh);
- ``prompt``: the task (the mock engine's directives: ``CALL``, ``SAY``, ``THINK``);
- ``args``: extra CLI arguments; ``env``: extra environment; ``max_turns`` (Claude Code);
- ``codex_config``: config.toml text (root keys, then tables) before the gateway provider;
- ``gateway_args``: extra ``tito serve`` arguments; ``tokenizer``, ``family``;
- ``timeout``: seconds the CLI may run;
- ``proxy_rewrite``: EXPLORATION ONLY, a key of :data:`REWRITES` (the proxy changes what
  the gateway sees, to look past a refusal; never in a test).

``OUT`` receives ``requests/NNNN.json`` (the proxy's log: :mod:`helpers.logging_proxy`),
``gateway.log`` and ``result.json``: the CLI's exit code and output, the session id, the
samples (status, turns, TITO violations, response text), how many model calls they cover,
``tito_turns_total``, the model calls the proxy saw and the gateway's refusals of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from helpers.logging_proxy import LoggingProxy, read_log
from tito import launch
from tito.client.checks import sample_violations
from tito.samples import decode_samples

REPO = Path(__file__).resolve().parents[2]
QUIET_ENV = {
    # Claude Code: no auto-update, telemetry, error reports, surveys, connectivity probe
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "DISABLE_COST_WARNINGS": "1", "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    # Codex: its update check and analytics are off in config.toml (CODEX_CONFIG, CODEX_QUIET)
    "NO_COLOR": "1",
}
DUMMY_KEY = "sk-dummy-tito-harness"


def work_root() -> Path:
    """Where each run gets its HOME and project folders: not under /tmp, where Codex
    refuses to create its helper binaries (``apply_patch``)."""
    default = Path.home() / ".cache" / "tito" / "harness-runs"
    root = Path(os.environ.get("TITO_HARNESS_WORK", default))
    root.mkdir(parents=True, exist_ok=True)
    return root


def loopback_only() -> bool:
    """True when this process's network namespace has no interface but ``lo``."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def run_in_netns(spec: dict[str, Any], out: Path,
                 timeout: float) -> subprocess.CompletedProcess[str]:
    """Run :func:`main` on ``spec`` in a new network namespace (``unshare -n``, loopback up)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    inner = (f"ip link set lo up && exec {shlex.quote(sys.executable)} -m helpers.cli_harness "
             f"{shlex.quote(str(out / 'spec.json'))} {shlex.quote(str(out))}")
    return subprocess.run(["unshare", "-n", "bash", "-c", inner], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


# -- the CLIs' configuration --------------------------------------------------------------
def claude_command(spec: dict[str, Any], base: str,
                   home: Path) -> tuple[list[str], dict[str, str]]:
    """``claude -p PROMPT --output-format json`` against ``base`` (the session URL)."""
    (home / ".claude").mkdir(parents=True, exist_ok=True)
    (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
    env = {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": DUMMY_KEY, "IS_SANDBOX": "1"}
    cmd = [spec["bin"], "-p", spec["prompt"], "--output-format", "json",
           "--dangerously-skip-permissions", "--max-turns", str(spec.get("max_turns", 8)),
           *spec.get("args", [])]
    return cmd, env


CODEX_CONFIG = """\
model = "gpt-5-codex"
model_provider = "tito"
check_for_update_on_startup = false
{extra}
[model_providers.tito]
name = "TITO gateway"
base_url = "{base}/v1"
env_key = "TITO_HARNESS_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""


def codex_command(spec: dict[str, Any], base: str,
                  home: Path) -> tuple[list[str], dict[str, str]]:
    """``codex exec PROMPT`` with a custom provider whose base URL is the session's."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    # spec["codex_config"]: root keys, then tables; our provider table comes last
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(
        base=base, extra=spec.get("codex_config", "")))
    env = {"CODEX_HOME": str(codex_home), "TITO_HARNESS_KEY": DUMMY_KEY}
    cmd = [spec["bin"], "exec", "--skip-git-repo-check",
           "--dangerously-bypass-approvals-and-sandbox", *spec.get("args", []), spec["prompt"]]
    return cmd, env


# -- one run ---------------------------------------------------------------------------------
async def run_cli(spec: dict[str, Any], base: str, work: Path) -> dict[str, Any]:
    """Run the CLI of ``spec`` in ``work`` (its HOME and working folder)."""
    home = work / "home"
    cwd = work / "project"
    cwd.mkdir(parents=True, exist_ok=True)
    build = claude_command if spec["cli"] == "claude" else codex_command
    cmd, env = build(spec, base, home)
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                "TERM": "dumb", "LANG": "C.UTF-8", **QUIET_ENV, **env, **spec.get("env", {})}
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=cwd, env=full_env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True)  # its own process group: the CLI and what it started
    timed_out = False
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), spec.get("timeout", 180))
    except TimeoutError:
        timed_out = True
        kill_group(proc.pid)
        stdout, stderr = await proc.communicate()
    kill_group(proc.pid)  # helpers it left behind (shells, sub-agents)
    return {"exit_code": proc.returncode, "timed_out": timed_out, "cmd": cmd,
            "stdout": stdout.decode("utf-8", "replace")[-100_000:],
            "stderr": stderr.decode("utf-8", "replace")[-100_000:]}


def kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid`` (the CLI's, started by us), if any is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sample_summary(gateway: str, sid: str) -> dict[str, Any]:
    """The session's samples (status, turns, violations, whole response text), how many
    committed turns they cover (the turns of v1 samples, the distinct nodes on the v2
    leaves' paths, per agent context) and how many turns side requests took (listed in the
    session metadata, not training samples under ``--side-requests drop``)."""
    resp = httpx.post(f"{gateway}/sessions/{sid}/samples", json={}, timeout=60)
    if resp.status_code != 200:
        return {"status": resp.status_code, "error": resp.text, "samples": [], "covered": 0,
                "side": 0}
    decoded = decode_samples(resp.content)
    samples = []
    nodes: set[tuple[Any, int]] = set()
    turns = 0
    for sample in decoded.samples:
        meta = sample.metadata
        leaf = meta.get("leaf")
        if isinstance(leaf, dict):
            nodes.update((meta.get("context_id"), n) for n in leaf.get("path_node_ids") or [])
        turns += len(meta.get("lifecycle") or [])
        samples.append({
            "status": sample.status, "tokens": len(sample.tokens),
            "response_length": sample.response_length,
            "turns": len(meta.get("lifecycle") or []), "leaf": leaf,
            "violations": sample_violations(sample),
            "mismatches": meta.get("tito_session_mismatch") or [],
            "lineage": {k: meta.get(k) for k in ("role", "agent_id", "parent_agent_id")},
            "response": sample.response or ""})
    side = sum(len(c["tree"]["nodes"]) if c.get("tree") else int(c.get("num_turns") or 0)
               for c in decoded.session_metadata.get("contexts") or []
               if c.get("role") == "side")
    return {"status": 200, "samples": samples, "covered": len(nodes) if nodes else turns,
            "side": side}


MODEL_ROUTES = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


def is_model_call(entry: dict[str, Any]) -> bool:
    """A request the proxy logged that asks the model for a turn (not a probe such as
    Claude Code's ``HEAD /api/hello``, nor ``count_tokens``)."""
    path = entry["path"].split("?", 1)[0]
    return entry["method"] == "POST" and path.endswith(MODEL_ROUTES)


def error_of(entry: dict[str, Any]) -> str:
    """``status code: message`` of a failed request, from the API's error envelope."""
    reply = entry.get("reply")
    error = reply.get("error") if isinstance(reply, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        return f"{entry.get('status')} {code}: {error.get('message')}"
    return f"{entry.get('status')}: {str(reply)[:300]}"


def calls_summary(folder: Path) -> dict[str, Any]:
    """The model calls the proxy saw and the gateway's refusals of them (an error event
    inside a 200 stream counts as a refusal too)."""
    log = [e for e in read_log(folder) if is_model_call(e)]
    errors = [f"#{e['seq']} {error_of(e)}" for e in log if e.get("status") != 200]
    errors += [f"#{e['seq']} stream error: {str(e.get('reply'))[-300:]}" for e in log
               if e.get("status") == 200 and isinstance(e.get("reply"), str)
               and ("event: error" in e["reply"] or '"type":"error"' in e["reply"])]
    return {"requests": len(read_log(folder)), "model_calls": len(log), "errors": errors}


def turns_total(gateway: str) -> float:
    """``tito_turns_total`` of the gateway's ``/metrics``."""
    for line in httpx.get(gateway + "/metrics").text.splitlines():
        if line.startswith("tito_turns_total "):
            return float(line.split()[1])
    return -1.0


def flatten_namespaces(body: dict[str, Any]) -> dict[str, Any] | None:
    """EXPLORATION ONLY: a Responses body with its ``namespace`` tools flattened into
    function tools and its hosted tools dropped (None: nothing to change)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or all(t.get("type") == "function" for t in tools):
        return None
    flat: list[Any] = []
    for tool in tools:
        if tool.get("type") == "namespace":
            flat.extend(tool.get("tools") or [])
        elif tool.get("type") == "function":
            flat.append(tool)
    return {**body, "tools": flat}


def namespace_calls(chunk: bytes) -> bytes:
    """EXPLORATION ONLY: multi-agent function calls in a reply stream get their namespace."""
    for name in (b"spawn_agent", b"wait_agent", b"send_input", b"close_agent", b"resume_agent"):
        chunk = chunk.replace(b'"name":"' + name + b'"',
                              b'"name":"' + name + b'","namespace":"multi_agent_v1"')
    return chunk


REWRITES = {"flatten_namespaces": (flatten_namespaces, namespace_calls)}


async def serve_proxy(upstream: str, folder: Path, rewrite: str | None = None
                      ) -> tuple[web.AppRunner, str]:
    request_rw, reply_rw = REWRITES[rewrite] if rewrite else (None, None)
    proxy = LoggingProxy(upstream, folder, request_rw, reply_rw)
    runner = web.AppRunner(proxy.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def run(spec: dict[str, Any], out: Path) -> dict[str, Any]:
    tokenizer, family = spec["tokenizer"], spec.get("family", "qwen3")
    engine = launch.start_mock_engine(tokenizer, family, cwd=REPO, timeout=60.0)
    gateway = None
    try:
        gateway = launch.start_gateway(engine.url, tokenizer, family, "--access-log",
                                       *spec.get("gateway_args", []), cwd=REPO, timeout=60.0)
        runner, proxy = await serve_proxy(gateway.url, out / "requests",
                                            spec.get("proxy_rewrite"))
        try:
            sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
            with tempfile.TemporaryDirectory(prefix="run-", dir=work_root()) as work:
                result = await run_cli(spec, f"{proxy}/sessions/{sid}", Path(work))
        finally:
            await runner.cleanup()
        result.update(session_id=sid, samples=sample_summary(gateway.url, sid),
                      turns_total=turns_total(gateway.url))
        return result
    finally:
        if gateway is not None:
            gateway.stop()
            (out / "gateway.log").write_text("\n".join(gateway.lines))
        engine.stop()


def main(argv: list[str]) -> int:
    if not loopback_only():
        print("cli_harness: refusing to run outside a loopback-only network namespace "
              "(run it with unshare -n)", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    if shutil.which(spec["bin"]) is None and not Path(spec["bin"]).exists():
        print(f"cli_harness: {spec['bin']} not found", file=sys.stderr)
        return 2
    result = asyncio.run(run(spec, out))
    result.update(calls_summary(out / "requests"))
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

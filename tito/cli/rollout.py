"""``tito rollout``: run an agent over a dataset through the gateway and write training data.

With no arguments it loads the embedded CPU engine (SmolLM2-135M-Instruct), serves the
gateway in-process (uvicorn on ``127.0.0.1``, a free port, this event loop), runs the demo
calculator agent (:mod:`tito.examples.calculator_agent`) over the bundled
``arithmetic.jsonl`` and writes ``samples.parquet`` + ``summary.json`` to ``./rollout_out``
(:mod:`tito.client.writers`). ``--engine mock`` spawns ``tito mock-engine`` as a child
process, ``--engine sglang`` uses a running server at ``--engine-url``; the gateway is
in-process either way, started by the stack builder (:mod:`tito.stack`).

Exit codes: 0 every trajectory finished with no TITO violation and no strict mismatch;
1 the run finished but something failed (an agent error, a violation, a mismatch) or the
engine/gateway could not start; 2 bad input (``--agent``, ``--data``, flags), nothing
written; 130 interrupted (Ctrl-C / SIGTERM), what finished is written.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from tito.cli.serve import add_session_arguments, session_config
from tito.client.agent import AbortFn, AgentFn, resolve_agent
from tito.client.errors import RolloutInputError
from tito.client.prompts import PromptItem, load_prompts
from tito.client.results import RolloutResult, TrajectoryResult
from tito.client.rollout import RolloutDriver
from tito.client.settings import RolloutSettings
from tito.client.summary import RolloutSummary, summarize
from tito.config import ENGINES, ServerConfig
from tito.examples import ARITHMETIC_DATA, DEMO_AGENT
from tito.stack import EMBEDDED_FAMILY, default_family, start_stack
from tito.types.errors import ConfigError

if TYPE_CHECKING:
    from tito.cluster import RayRolloutDriver

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``tito rollout`` flags."""
    from tito.render import FAMILIES

    p.add_argument("--agent", default=DEMO_AGENT, metavar="MODULE:FUNCTION",
                   help="async run_agent(base_url, prompt, request_kwargs, metadata, **kw); "
                        "MODULE may also be a path/to/file.py; the default is the demo "
                        "calculator agent")
    p.add_argument("--data", default=str(ARITHMETIC_DATA), metavar="FILE.jsonl",
                   help='one {"messages": [...], "metadata": {...}} per line; the default '
                        "is the bundled arithmetic questions")
    p.add_argument("--engine", choices=ENGINES, default="embedded",
                   help="embedded: SmolLM2-135M on this CPU; sglang: a running server at "
                        "--engine-url; mock: a `tito mock-engine` child process")
    p.add_argument("--engine-url", default=None, metavar="URL",
                   help="engine URL (with --engine sglang or vllm)")
    p.add_argument("--gateway", action="append", default=None, metavar="URL",
                   help="use running tito gateway(s) instead of starting one; give it once "
                        "per worker of `tito serve --workers N`, in order (sessions are "
                        "placed by a stable hash of the trajectory index)")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run the trajectories as Ray tasks on a cluster: auto, HOST:PORT, "
                        "ray://HOST:PORT, or local (a one-node cluster in this process); "
                        "one gateway per node (the engine flags apply on each node) unless "
                        "--gateway is given; needs pip install 'tito-gateway[ray]'")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="tokenizer folder (sglang, mock); embedded uses the model's own")
    p.add_argument("--family", default=None, choices=sorted(FAMILIES),
                   help=f"model family; unset: {EMBEDDED_FAMILY} with --engine embedded, "
                        "else default")
    p.add_argument("--out", default="rollout_out", metavar="DIR",
                   help="output folder for samples.parquet and summary.json")
    p.add_argument("--concurrency", type=_positive_int, default=8, metavar="N",
                   help="trajectories running at once (the embedded engine decodes them as "
                        "one batch; on 2 cores the default run took 37 s at 8, 58 s at 4, "
                        "41 s at 16)")
    p.add_argument("--n-per-prompt", type=_positive_int, default=1, metavar="K",
                   help="trajectories per prompt")
    p.add_argument("--max-turns", type=_positive_int, default=3, metavar="N",
                   help="turns per trajectory at most (passed to the agent)")
    p.add_argument("--max-seq-len", type=_positive_int, default=None, metavar="N",
                   help="truncate samples (and cap each turn) at this many tokens")
    p.add_argument("--max-new-tokens", type=_positive_int, default=64, metavar="N",
                   help="tokens per turn at most (max_tokens of each request)")
    p.add_argument("--temperature", type=float, default=0.7, metavar="T",
                   help="sampling temperature")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="trajectory t samples with seed S + t; unset: unseeded")
    p.add_argument("--limit", type=_positive_int, default=None, metavar="N",
                   help="use only the first N prompts")
    p.add_argument("--collect-timeout", type=_positive_float, default=120.0, metavar="SECONDS",
                   help="HTTP timeout of the tracer (create, collect, delete); a collect "
                        "that times out gives an ABORTED sample")
    add_session_arguments(p)


# -- the engine + gateway stack ------------------------------------------------------------
def _check_args(args: argparse.Namespace) -> ServerConfig:
    """Flag combinations, checked before anything starts (ConfigError: exit 2)."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {args.out!r} exists and is not a folder")
    if args.gateway:
        engine_flags = [flag for flag, value in (("--engine", args.engine != "embedded"),
                                                 ("--engine-url", args.engine_url),
                                                 ("--tokenizer", args.tokenizer),
                                                 ("--family", args.family)) if value]
        if engine_flags:
            raise ConfigError(f"--gateway uses running gateways (with their own engines and "
                              f"settings): drop {', '.join(engine_flags)}")
    if args.engine != "embedded" and args.tokenizer is None:
        raise ConfigError(f"--engine {args.engine} needs --tokenizer DIR")
    if args.tokenizer is not None and not Path(args.tokenizer).is_dir():
        raise ConfigError(f"--tokenizer {args.tokenizer!r}: no such folder")
    config = ServerConfig(tokenizer=args.tokenizer or "",
                          family=args.family or default_family(args.engine),
                          engine=args.engine, engine_url=args.engine_url, host="127.0.0.1",
                          port=0, max_seq_len=args.max_seq_len, log_level="warning",
                          **session_config(args))
    config.validate()
    return config


async def _running_gateways(urls: list[str]) -> RunningGateways:
    """Running gateways as the run's target: each must answer ``/health`` (ok)."""
    async with httpx.AsyncClient(timeout=10) as http:
        for url in urls:
            try:
                reply = await http.get(url.rstrip("/") + "/health")
            except httpx.HTTPError as exc:
                raise ConfigError(f"--gateway {url}: no answer ({exc})") from exc
            if reply.status_code != 200:
                raise ConfigError(f"--gateway {url}: /health answered {reply.status_code}")
    return RunningGateways(tuple(u.rstrip("/") for u in urls))


class Target(Protocol):
    """What a run goes to: the stack it started, or running gateways."""

    @property
    def url(self) -> str: ...
    @property
    def description(self) -> str: ...
    async def close(self) -> None: ...


@dataclass(frozen=True)
class RunningGateways:
    """Gateways this run did not start (``--gateway``): nothing to stop."""

    urls: tuple[str, ...]

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def description(self) -> str:
        return "gateway" + ("s " if len(self.urls) > 1 else " ") + ", ".join(self.urls)

    async def close(self) -> None:
        return None


# -- the run ---------------------------------------------------------------------------------
def settings_from_args(args: argparse.Namespace) -> RolloutSettings:
    return RolloutSettings(
        concurrency=args.concurrency, n_per_prompt=args.n_per_prompt,
        max_turns=args.max_turns, max_seq_len=args.max_seq_len,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
        collect_timeout=args.collect_timeout,
    )


def summary_table(summary: RolloutSummary, out_dir: Path | None, startup: float) -> Table:
    """The rich table printed at the end."""
    def count(n: int, bad: bool) -> str:
        return f"[bold red]{n}[/]" if bad and n else f"[green]{n}[/]" if bad else str(n)

    s = summary
    table = Table(title="tito rollout", show_header=False, title_style="bold")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("trajectories", f"{s.finished} finished / {s.trajectories}"
                  + (f", [red]{s.failed} failed[/]" if s.failed else "")
                  + (f", [yellow]{s.cancelled} cancelled[/]" if s.cancelled else ""))
    table.add_row("samples", str(s.samples))
    if s.leaves:
        table.add_row("tree leaves", f"{s.leaves} ({s.samples} kept samples, "
                                     f"{s.dropped_leaves} dropped: superseded retries or "
                                     "truncated away)")
    table.add_row("turns", f"{s.turns_run} run, "
                  + (f"{s.turns} in samples" if s.turns == s.turns_run
                     else f"[yellow]{s.turns} in samples[/]"))
    table.add_row("multi-turn samples", f"{s.multi_turn_samples} of {s.samples}")
    if s.length_cut_turns:
        table.add_row("length-cut turns", f"{s.length_cut_turns} (cut by max_tokens; in "
                                          "the samples with the turns after them)")
    table.add_row("prompt tokens", str(s.prompt_tokens))
    table.add_row("generated tokens", str(s.generated_tokens))
    table.add_row("bridge tokens", str(s.bridge_tokens))
    table.add_row("statuses", ", ".join(f"{k} {v}" for k, v in s.statuses.items()))
    table.add_row("collect failures (aborted)", count(s.collect_failures, True))
    table.add_row("TITO invariant violations", count(s.tito_violations, True))
    table.add_row("strict mismatches", count(s.strict_mismatches, True))
    if s.discarded_turns:
        table.add_row("discarded turns", f"[yellow]{s.discarded_turns}[/] (retries or "
                                         "rollbacks: see tito_discarded_turns)")
    if any(s.tolerated.values()):
        table.add_row("tolerated replay differences",
                      ", ".join(f"{k} {v}" for k, v in sorted(s.tolerated.items()) if v))
    if s.mixed_version_samples:
        table.add_row("mixed weight versions", f"{s.mixed_version_samples} samples "
                                               f"({s.mixed_version_share:.1%})")
    table.add_row("mean reward", "n/a" if s.mean_reward is None else
                  f"{s.mean_reward:.3f} ({s.positive_reward_samples} of "
                  f"{s.rewarded_samples} samples above 0)")
    table.add_row("wall time", f"{s.wall_time_s:.1f} s (+ {startup:.1f} s startup)")
    table.add_row("generated tokens/s", f"{s.generated_tokens_per_s:.1f}")
    if s.requeued_trajectories:
        table.add_row("run again (node lost)", f"{s.requeued_trajectories} trajectories, "
                                               f"{s.duplicates_dropped} duplicates dropped")
    if s.interrupted:
        table.add_row("interrupted", "[yellow]yes[/] (partial results)")
    table.add_row("output", str(out_dir) if out_dir else "[red]not written[/]")
    return table


def _config_record(args: argparse.Namespace, description: str | None,
                   settings: RolloutSettings) -> dict[str, Any]:
    return {"agent": args.agent, "data": str(args.data), "engine": args.engine,
            "engine_url": args.engine_url, "tokenizer": args.tokenizer,
            "gateway": args.gateway, "ray": args.ray,
            "session_version": args.session_version,
            "family": args.family, "stack": description,
            "limit": args.limit, **{k: getattr(settings, k) for k in (
                "concurrency", "n_per_prompt", "max_turns", "max_seq_len", "max_new_tokens",
                "temperature", "seed", "collect_timeout")}}


@dataclass
class _Interrupts:
    """Ctrl-C / SIGTERM: the first one stops the run gracefully, later ones are noted."""

    console: Console
    main: asyncio.Task[Any]
    driver: RolloutDriver | RayRolloutDriver | None = None
    count: int = 0

    def __call__(self) -> None:
        self.count += 1
        if self.count > 1:
            self.console.print("[yellow]already stopping; cleaning up sessions...[/]")
            return
        self.console.print("[yellow]interrupted: stopping the agents, keeping what "
                           "finished...[/]")
        if self.driver is not None:
            self.driver.interrupt()
        else:
            self.main.cancel()


async def _run_async(args: argparse.Namespace, config: ServerConfig, agent: AgentFn,
                     abort: AbortFn | None, prompts: list[PromptItem],
                     settings: RolloutSettings) -> int:
    err = Console(stderr=True)
    out = Console()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    interrupts = _Interrupts(err, main)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupts)
    if args.ray:
        try:
            return await _run_ray(args, config, prompts, settings, err, out, interrupts)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    stack: Target | None = None
    started = time.monotonic()
    try:
        try:
            if args.gateway:
                stack = await _running_gateways(args.gateway)
            else:
                with err.status(f"starting the {config.engine} engine and the gateway..."):
                    stack = await start_stack(config)
        except asyncio.CancelledError:
            err.print("tito rollout: interrupted before the run started; nothing written")
            return EXIT_INTERRUPTED
        except Exception as exc:
            what = "reach the gateway" if args.gateway else \
                f"start the {args.engine} engine and gateway"
            err.print(f"tito rollout: cannot {what}: {type(exc).__name__}: {exc}",
                      markup=False, highlight=False, soft_wrap=True)
            return EXIT_FAILED
        startup = time.monotonic() - started
        result = await _drive(args, agent, abort, prompts, settings, stack, err, interrupts)
    finally:
        if stack is not None:
            await stack.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return _finish(args, settings, stack.description if stack else None, result, startup,
                   out, err)


async def _run_ray(args: argparse.Namespace, config: ServerConfig, prompts: list[PromptItem],
                   settings: RolloutSettings, err: Console, out: Console,
                   interrupts: _Interrupts) -> int:
    """``--ray``: a gateway and a runner per node of the cluster, trajectories as Ray tasks."""
    from tito.cluster import RayRolloutDriver, RayUnavailable

    started = time.monotonic()
    progress, on_result = _progress_view(err, len(prompts) * settings.n_per_prompt)
    driver = RayRolloutDriver(args.ray, args.agent, prompts, settings,
                              config=None if args.gateway else config,
                              gateways=[u.rstrip("/") for u in args.gateway]
                              if args.gateway else None, on_result=on_result)
    try:
        with err.status(f"joining the Ray cluster {args.ray} and starting a gateway and a "
                        "runner per node..."):
            await driver.connect()
    except (RayUnavailable, asyncio.CancelledError) as exc:
        await driver.shutdown()
        reason = "interrupted" if isinstance(exc, asyncio.CancelledError) else str(exc)
        err.print(f"tito rollout: {reason}; nothing written", markup=False,
                  highlight=False, soft_wrap=True)
        return EXIT_INTERRUPTED if isinstance(exc, asyncio.CancelledError) else EXIT_FAILED
    interrupts.driver = driver
    startup = time.monotonic() - started
    description = driver.description
    err.print(f"tito rollout: {driver.total} trajectories, {description}", markup=False,
              highlight=False, soft_wrap=True)
    with progress:
        result = await driver.run()
    if result.requeued:
        err.print(f"tito rollout: {driver.lost_nodes} node(s) lost; {result.requeued} "
                  "trajectories ran again elsewhere", markup=False, highlight=False)
    return _finish(args, settings, description, result, startup, out, err)


def _progress_view(err: Console, total: int
                   ) -> tuple[Progress, Callable[[TrajectoryResult], None]]:
    """The progress bar and the callback each finished trajectory advances it with."""
    progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                        TimeElapsedColumn(), console=err, transient=False)
    task = progress.add_task("rollout", total=total, status="")
    failed = 0
    generated = 0

    def on_result(result: TrajectoryResult) -> None:
        nonlocal failed, generated
        if result.error is not None:
            failed += 1
            progress.console.print(f"tito rollout: {result.label} failed: {result.error}",
                                   markup=False, highlight=False, soft_wrap=True)
        for sample in result.samples:
            if sample.loss_mask is not None:
                generated += int(sample.loss_mask.sum())
        progress.update(task, advance=1,
                        status=f"{generated} tok" + (f", {failed} failed" if failed else ""))

    return progress, on_result


async def _drive(args: argparse.Namespace, agent: AgentFn, abort: AbortFn | None,
                 prompts: list[PromptItem], settings: RolloutSettings, stack: Target,
                 err: Console, interrupts: _Interrupts) -> RolloutResult:
    urls = [u.rstrip("/") for u in args.gateway] if args.gateway else [stack.url]
    progress, on_result = _progress_view(err, len(prompts) * settings.n_per_prompt)
    driver = RolloutDriver(urls, agent, prompts, settings, abort_hook=abort,
                           on_result=on_result)
    interrupts.driver = driver
    err.print(f"tito rollout: {driver.total} trajectories, {stack.description}, "
              f"gateway {stack.url}", markup=False, highlight=False, soft_wrap=True)
    with progress:
        return await driver.run()


def _finish(args: argparse.Namespace, settings: RolloutSettings, description: str | None,
            result: RolloutResult, startup: float, out: Console, err: Console) -> int:
    from tito.client.writers import write_rollout

    summary = summarize(result)
    out_dir = Path(args.out)
    if result.interrupted:
        code = EXIT_INTERRUPTED
    else:
        code = EXIT_OK if summary.ok else EXIT_FAILED
    record = {"config": _config_record(args, description, settings), **summary.to_dict(),
              "startup_s": round(startup, 3), "exit_code": code,
              "files": {"samples": "samples.parquet", "summary": "summary.json"}}
    rows = [(t.prompt_index, t.sample_index, s) for t, s in result.samples()]
    try:
        write_rollout(out_dir, rows, record)
    except Exception as exc:
        err.print(f"tito rollout: cannot write {out_dir}: {type(exc).__name__}: {exc}",
                  markup=False, highlight=False, soft_wrap=True)
        out.print(summary_table(summary, None, startup))
        return EXIT_FAILED
    out.print(summary_table(summary, out_dir, startup))
    for line in summary.violations:
        err.print(f"tito rollout: TITO violation: {line}", markup=False, highlight=False,
                  soft_wrap=True)
    return code


def run(args: argparse.Namespace) -> int:
    """``tito rollout``: validate the inputs (exit 2 on a problem), then run."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = _check_args(args)
        settings = settings_from_args(args)
        agent, abort = resolve_agent(args.agent)
        prompts = load_prompts(args.data, limit=args.limit)
    except (ConfigError, RolloutInputError, ValueError) as exc:
        print(f"tito rollout: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tito rollout: interrupted; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        return asyncio.run(_run_async(args, config, agent, abort, prompts, settings))
    except KeyboardInterrupt:  # before the handlers were installed, or after removal
        print("tito rollout: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


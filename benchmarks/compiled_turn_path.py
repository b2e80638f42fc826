"""Would compiling the turn path close the plain workload's gap? This measures it.

Copies this tree (its tracked files, as they are now) to a scratch folder, compiles the
modules a plain chat turn runs through with mypyc there (they type-check under mypy
strict; the package stays importable with or without the compiled modules), and then
alternates the two trees:

- in process: ``gateway_inprocess.py`` of each tree (tito's CPU per turn without sockets);
- through the servers: ``gateway_overhead.py --modes passthrough,gateway`` with
  ``TITO_BENCH_ROOT`` pointing at each tree (gateway CPU per turn over the pass-through
  proxy's, the issue's ratio).

Needs mypy (a dev dependency: it ships mypyc) and a C compiler. Nothing is installed: the
compiled tree lives under ``--workdir`` and is only put on ``PYTHONPATH`` of its own runs.

    python benchmarks/compiled_turn_path.py                   # 18 modules, 2 rounds
    python benchmarks/compiled_turn_path.py --modules tito/session/turns.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _paths import QWEN3_DIR, REPO
from _tables import fmt, median, print_table
from _workload import add_workload_args

TURN_PATH = (
    "tito/types/fast_bpe.py",
    "tito/session/idbuffer.py", "tito/session/turns.py", "tito/session/linear.py",
    "tito/session/contexts.py", "tito/session/base.py",
    "tito/parse/hermes.py", "tito/parse/base.py",
    "tito/render/base.py", "tito/render/memo.py",
    "tito/engines/sglang_reply.py", "tito/engines/prompt_json.py",
    "tito/server/growing_body.py", "tito/server/entry.py", "tito/server/http.py",
    "tito/server/openai/decode.py", "tito/server/openai/serving.py",
    "tito/server/openai/convert.py",
)
"""What one plain Chat turn runs through, less the modules mypyc cannot compile (async
generators: ``server/gateway.py``, ``server/adapter.py``, ``server/serving.py``,
``engines/sglang.py``)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_workload_args(p)
    p.add_argument("--modules", nargs="+", default=list(TURN_PATH),
                   help="module files (relative to the repository) to compile")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds of (interpreted, compiled) runs of each benchmark")
    p.add_argument("--repeat", type=int, default=3, help="--repeat of each benchmark run")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the compiled copy goes (default: a new temporary folder, "
                        "removed at the end)")
    p.add_argument("--skip-servers", action="store_true",
                   help="only the in-process benchmark")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def bench_args(args: argparse.Namespace) -> list[str]:
    """The flags both benchmarks take: the workload, --repeat, the tokenizer."""
    return ["--sessions", str(args.sessions), "--turns", str(args.turns),
            "--input-tokens", str(args.input_tokens), "--output-tokens", str(args.output_tokens),
            "--repeat", str(args.repeat), "--tokenizer", str(args.tokenizer)]


def copy_tree(dest: Path) -> None:
    """This repository's tracked files (working-tree contents) into ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def compile_modules(tree: Path, modules: list[str]) -> float:
    """mypyc the modules in place (extension modules beside their .py); seconds taken."""
    mypyc = shutil.which("mypyc")
    if mypyc is None:
        raise SystemExit("needs mypyc on PATH (it comes with mypy: pip install mypy)")
    started = time.perf_counter()
    done = subprocess.run([mypyc, *modules], cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mypyc failed:\n{(done.stdout + done.stderr)[-3000:]}")
    check = subprocess.run(
        [sys.executable, "-c", "import importlib, sys; m = importlib.import_module(sys.argv[1]);"
         " print(m.__file__)", modules[0].removesuffix(".py").replace("/", ".")],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if not check.stdout.strip().endswith(".so"):
        raise SystemExit(f"the compiled module is not the one imported: {check.stdout!r} "
                         f"{check.stderr[-1000:]}")
    return time.perf_counter() - started


def run_json(cmd: list[str], tree: Path, env: dict[str, str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        done = subprocess.run([*cmd, "--json", out.name], cwd=tree, capture_output=True,
                              text=True, env={**os.environ, **env})
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
        return json.loads(Path(out.name).read_text())


def in_process(tree: Path, args: argparse.Namespace) -> float:
    """tito's own µs per turn (tito minus the floor, medians) of ``tree``."""
    res = run_json([sys.executable, str(tree / "benchmarks" / "gateway_inprocess.py"),
                    *bench_args(args)], tree, {"PYTHONPATH": str(tree)})
    return median(res["tito_us_per_turn"]) - median(res["floor_us_per_turn"])


def through_servers(tree: Path, args: argparse.Namespace) -> tuple[float, float]:
    """(gateway CPU ms per turn, its paired ratio over the pass-through proxy)."""
    res = run_json([sys.executable, str(REPO / "benchmarks" / "gateway_overhead.py"),
                    "--modes", "passthrough,gateway", *bench_args(args)], REPO,
                   {"TITO_BENCH_ROOT": str(tree)})
    return res["results"]["gateway"]["server_cpu_ms_per_turn"], median(res["cpu_ratio_paired"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scratch = args.workdir or Path(tempfile.mkdtemp(prefix="tito-compiled-"))
    tree = scratch / "tree"
    try:
        tree.mkdir(parents=True, exist_ok=False)
        copy_tree(tree)
        took = compile_modules(tree, args.modules)
        print(f"compiled {len(args.modules)} modules with mypyc in {took:.0f} s ({tree})")
        trees = {"interpreted": REPO, "compiled": tree}
        own: dict[str, list[float]] = {k: [] for k in trees}
        cpu: dict[str, list[float]] = {k: [] for k in trees}
        ratio: dict[str, list[float]] = {k: [] for k in trees}
        for _ in range(args.rounds):
            for name, root in trees.items():
                own[name].append(in_process(root, args))
                if not args.skip_servers:
                    ms, r = through_servers(root, args)
                    cpu[name].append(ms)
                    ratio[name].append(r)
    finally:
        if args.workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    report(args, own, cpu, ratio)
    if args.json:
        args.json.write_text(json.dumps({
            "modules": args.modules, "own_us_per_turn_in_process": own,
            "gateway_cpu_ms_per_turn": cpu, "gateway_over_passthrough": ratio}, indent=2))
    return 0


def report(args: argparse.Namespace, own: dict[str, list[float]],
           cpu: dict[str, list[float]], ratio: dict[str, list[float]]) -> None:
    def cells(runs: dict[str, list[float]], digits: int) -> list[str]:
        i, c = runs["interpreted"], runs["compiled"]
        return [" ".join(fmt(v, digits) for v in i), " ".join(fmt(v, digits) for v in c),
                f"{median(c) / median(i):.2f}x"]

    rows = [["tito's own work per turn in process (µs)", *cells(own, 1)]]
    if not args.skip_servers:
        rows += [["gateway CPU per turn through the servers (ms)", *cells(cpu, 3)],
                 ["gateway / pass-through proxy (paired median)", *cells(ratio, 2)]]
    print_table(f"compiled turn path: {len(args.modules)} modules, {args.rounds} round(s) "
                "alternated", ["", "interpreted", "compiled (mypyc)", "compiled / interpreted"],
                rows, "each cell: one benchmark run per round (gateway_inprocess.py, "
                      f"gateway_overhead.py --modes passthrough,gateway, --repeat {args.repeat})")


if __name__ == "__main__":
    sys.exit(main())

"""The package's layers (design §3): every import between subpackages points down.

Read with ``ast`` from the source (imports inside functions and under TYPE_CHECKING
count too). ``ALLOWED[x]`` is every ``tito`` subpackage or top-level module that ``x`` may
import; anything else is an upward or sideways edge and fails, and so does any cycle.
Bottom to top::

    types                       value types, errors, the engine contract, the tokenizer
    parse -> render             completion parsers; renderers (a family wires its parser)
    samples                     assembly + codec
    session                     v1 sessions, matchers, store
    config, net, launch, heap   gateway settings; sockets/uvicorn; child processes; GC settings
    engines                     SGLang client, embedded engine, mock engine
    server                      gateway service, API modules (never a concrete engine)
    client                      tracer, agent contract, rollout driver (only samples, types)
    integrations                RL-framework adapters over the client (miles / slime)
    stack                       the one stack builder: engines + server + net
    cluster                     rollouts on a Ray cluster (a stack + runner per node)
    examples                    demo agents and the mock demo
    cli                         the ``tito`` command (top)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tito"

ALLOWED: dict[str, set[str]] = {
    "types": set(),
    "parse": {"types"},
    "render": {"parse", "types"},
    "samples": {"types"},
    "session": {"render", "parse", "samples", "types"},
    "config": {"types"},
    "net": set(),
    "launch": set(),
    "heap": set(),
    "engines": {"render", "parse", "types", "net"},
    "server": {"session", "samples", "render", "parse", "types", "config"},
    "client": {"samples", "types"},
    "integrations": {"client", "samples", "types"},
    "stack": {"engines", "server", "session", "render", "types", "config", "net", "launch"},
    "cluster": {"client", "stack", "samples", "types", "config"},
    "examples": {"client", "stack", "samples", "render", "types", "config"},
    "cli": {"cluster", "stack", "examples", "client", "engines", "server", "session", "samples",
            "render", "parse", "types", "config", "net", "launch", "heap"},
    "__init__": {"client", "samples"},
}


def unit_of(path: Path) -> str:
    """``tito/server/app.py`` -> ``server``; ``tito/stack.py`` -> ``stack``."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_units(path: Path) -> set[str]:
    units = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "tito" and len(parts) > 1:
                units.add(parts[1])
            elif parts == ["tito"]:
                units.add("__init__")
    return units


def edges() -> dict[str, dict[str, list[str]]]:
    """unit -> imported unit -> the files with that import."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = unit_of(path)
        for target in imported_units(path) - {unit}:
            graph[unit][target].append(str(path.relative_to(PACKAGE.parent)))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_every_unit_is_placed() -> None:
    units = {unit_of(p) for p in PACKAGE.rglob("*.py")}
    assert units <= set(ALLOWED), f"place these in ALLOWED: {sorted(units - set(ALLOWED))}"


def test_no_upward_or_sideways_import() -> None:
    bad = [f"{unit} -> {target} ({', '.join(files)})"
           for unit, targets in edges().items() for target, files in targets.items()
           if target not in ALLOWED.get(unit, set())]
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_cycle_between_units() -> None:
    assert find_cycle(ALLOWED) is None  # the allowed graph itself is a DAG
    actual = {unit: set(targets) for unit, targets in edges().items()}
    assert find_cycle(actual) is None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_client_library_imports_without_server_engines_or_torch() -> None:
    code = ("import sys, tito, tito.client.agent, tito.client.tracer, tito.client.rollout, "
            "tito.client.writers; tito.SessionTracer; tito.decode_samples; "
            "print(sorted(m for m in ('tito.server', 'tito.engines', 'tito.stack', "
            "'torch', 'starlette', 'uvicorn', 'aiohttp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# -- inside the server -------------------------------------------------------------------
API_PACKAGES = ("openai", "anthropic", "responses")
"""One package per API under tito/server/: request models, decode, convert, events and the
adapter of the shared turn route (tito/server/adapter.py)."""
WIRES_APIS = {"app.py", "api_state.py"}
"""The server modules that may name an API package: the app (it wires their routes) and
the typed per-session API state (each API's last body, named for type checking only)."""


def server_imports() -> dict[Path, set[str]]:
    """tito/server file -> the ``tito.server.<x>`` names it imports."""
    out: dict[Path, set[str]] = {}
    for path in sorted((PACKAGE / "server").rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            names |= {m.split(".")[2] for m in modules
                      if m.startswith("tito.server.") and len(m.split(".")) > 2}
        out[path] = names
    return out


def test_api_packages_import_none_of_each_other() -> None:
    bad = []
    for path, names in server_imports().items():
        rel = path.relative_to(PACKAGE / "server")
        own = rel.parts[0] if len(rel.parts) > 1 else None
        others = names & set(API_PACKAGES) - {own}
        if others and (own in API_PACKAGES or rel.name not in WIRES_APIS or own is not None):
            bad.append(f"{path.relative_to(PACKAGE.parent)} -> {sorted(others)}")
    assert not bad, "an API package or a core server module names an API package:\n" + \
        "\n".join(bad)


def test_no_module_outside_the_session_package_asks_a_sessions_version() -> None:
    """The server uses the Session protocol (tito/session/base.py); only tito/session/
    knows the classes of its versions."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if unit_of(path) == "session":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id == "isinstance" and len(node.args) == 2 and \
                    "Session" in ast.unparse(node.args[1]):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not bad, "isinstance on a session class:\n" + "\n".join(bad)


MAX_FUNCTION_LINES = 60


def test_no_function_is_over_sixty_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                    node.end_lineno is not None and \
                    node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)

"""Prometheus text metrics: counters, gauges and histograms (design §7, ``GET /metrics``).

Hand-rolled rather than ``prometheus_client``, whose bucket updates take a lock each
(costly at seven observations a turn). A turn makes seven observations: :meth:`Metrics.turn` appends
them as one row, and every :data:`FOLD_EVERY` turns (and before a render) the rows are
binned at once with numpy, so a turn costs one list append. The output is the text
exposition format 0.0.4, checked in the tests with ``prometheus_client``'s own parser.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tito.session.agents import ROLES as AGENT_ROLES
from tito.session.matchers import TOLERATED_KINDS
from tito.types.mismatch import MISMATCH_TYPES

SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
           10.0, 30.0, 60.0, 120.0)
OVERHEAD_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 1.0)
TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)
RATIO = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
FOLD_EVERY = 256
"""Turns whose observations wait to be binned at most (a render bins them first)."""


@dataclass(slots=True)
class Histogram:
    """Cumulative buckets on output (``le``); ``+Inf`` is the count."""

    name: str
    help: str
    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe_many(self, values: np.ndarray) -> None:
        """Count ``values`` (a value equal to a bound goes to that bound's bucket)."""
        bins = np.bincount(np.searchsorted(self.bounds, values, side="left"),
                           minlength=len(self.counts))
        self.counts = [c + int(n) for c, n in zip(self.counts, bins, strict=True)]
        self.total += float(values.sum())
        self.count += len(values)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            lines.append(f'{self.name}_bucket{{le="{_number(bound)}"}} {running}')
        lines += [f'{self.name}_bucket{{le="+Inf"}} {self.count}',
                  f"{self.name}_sum {_number(self.total)}", f"{self.name}_count {self.count}"]
        return lines


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else f"{value:.1f}"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.errors: Counter[tuple[int, str, str]] = Counter()
        self.mismatches: Counter[str] = Counter(dict.fromkeys(MISMATCH_TYPES, 0))
        self.tolerated: Counter[str] = Counter(dict.fromkeys(TOLERATED_KINDS, 0))
        """Every class from the start (at 0), so a dashboard's rate() has a series."""
        self.agent_turns: Counter[str] = Counter(dict.fromkeys(AGENT_ROLES, 0))
        """Committed turns by their agent context's role (design §5.5)."""
        self.turn_latency = Histogram(
            "tito_turn_latency_seconds", "Turn time in the gateway: from the parsed request "
            "to the committed turn (engine time included).", SECONDS)
        self.engine_time = Histogram(
            "tito_engine_seconds", "Engine time per turn, as the gateway waited for it.",
            SECONDS)
        self.overhead = Histogram(
            "tito_gateway_overhead_seconds", "Gateway time per turn outside the engine "
            "(planning, rendering, checks, parsing, commit; held time excluded).",
            OVERHEAD_SECONDS)
        self.prompt_tokens = Histogram(
            "tito_turn_prompt_tokens", "Prompt tokens per turn.", TOKENS)
        self.bridge_tokens = Histogram(
            "tito_turn_bridge_tokens", "Tokens the gateway appended per turn (the bridge).",
            TOKENS)
        self.generated_tokens = Histogram(
            "tito_turn_generated_tokens", "Tokens generated per turn.", TOKENS)
        self.cache_hit = Histogram(
            "tito_prefix_cache_hit_ratio", "Share of each turn's prompt the engine had "
            "cached (cached_tokens / prompt tokens).", RATIO)
        self.histograms = (self.turn_latency, self.engine_time, self.overhead,
                           self.prompt_tokens, self.bridge_tokens, self.generated_tokens,
                           self.cache_hit)
        self._rows: list[tuple[float, ...]] = []
        """Turns not yet binned: one value per histogram (NaN: no observation)."""

    def inc(self, name: str, value: int = 1) -> None:
        self.counters[name] += value

    def error(self, status: int, code: str, route: str = "") -> None:
        """``route``: the route's path template (``door`` for a refusal by the access rules)."""
        self.errors[(status, code, route)] += 1

    def turn(self, *, latency: float, engine: float, overhead: float, prompt: int,
             bridge: int, generated: int, cached: int) -> None:
        """One committed turn."""
        self._rows.append((latency, engine, overhead, prompt, bridge, generated,
                           min(cached / prompt, 1.0) if prompt else math.nan))
        if len(self._rows) >= FOLD_EVERY:
            self._fold()
        self.counters["prompt_tokens_total"] += prompt
        self.counters["cached_prompt_tokens_total"] += cached

    def _fold(self) -> None:
        """Bin the pending turns into the histograms."""
        if not self._rows:
            return
        columns = np.array(self._rows, dtype=np.float64).T
        self._rows = []
        for histogram, values in zip(self.histograms, columns, strict=True):
            histogram.observe_many(values[~np.isnan(values)])

    def tolerate(self, kinds: dict[str, int]) -> None:
        """Differences the ``harness`` matcher tolerated in a turn's echoed messages."""
        self.tolerated.update(kinds)

    def mismatch(self, kinds: Sequence[str]) -> None:
        """Entries of an assembled sample's ``tito_session_mismatch`` report, by type."""
        self.mismatches.update(kinds)

    def render(self, gauges: dict[str, float],
               engines: dict[str, dict[str, float]] | None = None) -> str:
        """``engines``: per engine URL, its figures (``tito_engine_<name>{engine="URL"}``;
        the ``_total`` ones are counters)."""
        lines: list[str] = []
        for name, value in sorted(self.counters.items()):
            lines += [f"# TYPE tito_{name} counter", f"tito_{name} {value}"]
        lines.append("# TYPE tito_errors_total counter")
        for (status, code, route), value in sorted(self.errors.items()):
            lines.append(f'tito_errors_total{{status="{status}",code="{_label(code)}",'
                         f'route="{_label(route)}"}} {value}')
        lines.append("# TYPE tito_tolerated_total counter")
        for kind, value in sorted(self.tolerated.items()):
            lines.append(f'tito_tolerated_total{{kind="{_label(kind)}"}} {value}')
        lines.append("# TYPE tito_agent_turns_total counter")
        for role, value in sorted(self.agent_turns.items()):
            lines.append(f'tito_agent_turns_total{{role="{_label(role)}"}} {value}')
        lines.append("# TYPE tito_mismatches_total counter")
        for kind, value in sorted(self.mismatches.items()):
            lines.append(f'tito_mismatches_total{{type="{_label(kind)}"}} {value}')
        self._fold()
        for histogram in self.histograms:
            lines += histogram.render()
        for gauge, level in sorted(gauges.items()):
            lines += [f"# TYPE tito_{gauge} gauge", f"tito_{gauge} {level}"]
        names = sorted({name for figures in (engines or {}).values() for name in figures})
        for name in names:
            kind = "counter" if name.endswith("_total") else "gauge"
            lines.append(f"# TYPE tito_engine_{name} {kind}")
            for url, figures in sorted((engines or {}).items()):
                lines.append(f'tito_engine_{name}{{engine="{_label(url)}"}} {figures[name]}')
        return "\n".join(lines) + "\n"

"""Prometheus text metrics (counters and gauges; no client library needed)."""

from __future__ import annotations

from collections import Counter


class Metrics:
    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.errors: Counter[tuple[int, str]] = Counter()

    def inc(self, name: str, value: int = 1) -> None:
        self.counters[name] += value

    def error(self, status: int, code: str) -> None:
        self.errors[(status, code)] += 1

    def render(self, gauges: dict[str, float],
               engines: dict[str, dict[str, float]] | None = None) -> str:
        """``engines``: per engine URL, its figures (``tito_engine_<name>{engine="URL"}``;
        the ``_total`` ones are counters)."""
        lines: list[str] = []
        for name, value in sorted(self.counters.items()):
            lines += [f"# TYPE tito_{name} counter", f"tito_{name} {value}"]
        lines.append("# TYPE tito_errors_total counter")
        for (status, code), value in sorted(self.errors.items()):
            lines.append(f'tito_errors_total{{status="{status}",code="{code}"}} {value}')
        for gauge, level in sorted(gauges.items()):
            lines += [f"# TYPE tito_{gauge} gauge", f"tito_{gauge} {level}"]
        names = sorted({name for figures in (engines or {}).values() for name in figures})
        for name in names:
            kind = "counter" if name.endswith("_total") else "gauge"
            lines.append(f"# TYPE tito_engine_{name} {kind}")
            for url, figures in sorted((engines or {}).items()):
                lines.append(f'tito_engine_{name}{{engine="{url}"}} {figures[name]}')
        return "\n".join(lines) + "\n"

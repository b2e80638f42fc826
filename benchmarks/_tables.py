"""What a benchmark prints: statistics of its measurements, formatted numbers and tables."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


# -- statistics ----------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]) of ``values``."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- output ------------------------------------------------------------------------------------
def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                caption: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption=caption, caption_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(str(c) for c in row))
    Console(width=max(100, sum(len(c) + 6 for c in columns) + 30)).print(table)


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value:,.{digits}f}"

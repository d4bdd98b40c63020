"""Shared helpers for the benchmark scripts: timing medians and a plain side-by-side table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(
    fn: Callable[[], object], repeats: int = 5, warmup: int = 1, clock: str = "wall"
) -> tuple[float, list[float]]:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup``.

    ``clock="cpu"`` uses this process's CPU time (all threads): on a shared, oversubscribed machine
    it measures the work done rather than the waiting, which is what a ratio between two
    single-threaded implementations should compare. ``"wall"`` is the elapsed time.
    """
    tick = time.process_time if clock == "cpu" else time.perf_counter
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = tick()
        fn()
        times.append(tick() - t0)
    return statistics.median(times), times


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    cells = [[str(h) for h in headers]] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for j, row in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if j == 0:
            print("  ".join("-" * w for w in widths))

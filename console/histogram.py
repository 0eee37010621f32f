"""Fixed-bucket latency histograms shared by the worker (which counts) and the collectors
(which turn two snapshots into quantiles). Same bounds everywhere, so snapshots subtract."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

# Upper bounds in milliseconds; the last bucket is everything above 60 s.
BOUNDS_MS: tuple[float, ...] = (
    0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 25, 50, 100, 250, 500,
    1_000, 2_500, 5_000, 10_000, 30_000, 60_000, math.inf,
)


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * len(BOUNDS_MS)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BOUNDS_MS, seconds * 1000.0)] += 1

    def observe_many(self, seconds: Sequence[float]) -> None:
        """observe() for each value: the worker's per-batch path (one call per claim, not per job)."""
        counts, bounds, find = self.counts, BOUNDS_MS, bisect.bisect_left
        for value in seconds:
            counts[find(bounds, value * 1000.0)] += 1

    def snapshot(self) -> list[int]:
        return list(self.counts)


def delta(newer: Sequence[int], older: Sequence[int] | None) -> list[int]:
    """newer - older element-wise; a restarted worker (counts went down) counts from zero."""
    newer = list(newer) + [0] * (len(BOUNDS_MS) - len(newer))
    if not older:
        return newer
    older = list(older) + [0] * (len(BOUNDS_MS) - len(older))
    diff = [n - o for n, o in zip(newer, older, strict=True)]
    return newer if any(d < 0 for d in diff) else diff


def quantile(counts: Sequence[int], q: float) -> float | None:
    """The q-quantile in seconds, interpolated inside its bucket; None with no observations."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            lower = BOUNDS_MS[index - 1] if index else 0.0
            upper = BOUNDS_MS[index]
            if math.isinf(upper):
                return lower / 1000.0
            fraction = (rank - seen) / count
            return (lower + (upper - lower) * fraction) / 1000.0
        seen += count
    return None

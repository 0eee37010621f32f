"""A rows-per-second throttle between batches, interruptible by a stop event."""

from __future__ import annotations

import threading
import time


class Throttle:
    """After a batch of `rows` that took `seconds`, wait so the average stays at `rate` rows/s.

    `rate=None` means no throttle (but `min_pause` still applies, so a loop always yields).
    """

    def __init__(self, rate: float | None, *, min_pause: float = 0.0, stop: threading.Event | None = None):
        self.rate = rate
        self.min_pause = min_pause
        self.stop = stop or threading.Event()

    def wait(self, rows: int, seconds: float) -> bool:
        """Sleep as needed; returns False when the stop event was set (stop now)."""
        pause = self.min_pause
        if self.rate:
            pause = max(pause, rows / self.rate - seconds)
        if pause > 0:
            return not self.stop.wait(pause)
        return not self.stop.is_set()


def elapsed_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0

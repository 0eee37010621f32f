"""A rows-per-second throttle between batches, interruptible by a stop event."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Throttle:
    """After a batch of `rows` that took `seconds`, wait so the average stays at `rate` rows/s.

    `rate=None` means no throttle (but `min_pause` still applies, so a loop always yields).
    """

    def __init__(self, rate: float | None, *, min_pause: float = 0.0, stop: threading.Event | None = None):
        self.rate = rate
        self.min_pause = min_pause
        self.stop = stop or threading.Event()

    def pause_for(self, rows: int, seconds: float) -> float:
        """Seconds to wait after a batch of `rows` that took `seconds`."""
        pause = self.min_pause
        if self.rate:
            pause = max(pause, rows / self.rate - seconds)
        return max(pause, 0.0)

    def wait(self, rows: int, seconds: float, *, interrupted: Callable[[], bool] | None = None,
             check_every: float = 1.0) -> bool:
        """Sleep as needed; returns False when the stop event was set (stop now).

        `interrupted()` is polled every `check_every` seconds of a long pause (a cancel request
        read from the database); when it returns True the pause ends early (returns True: the
        caller's next batch sees the request)."""
        remaining = self.pause_for(rows, seconds)
        while remaining > 0:
            step = min(remaining, check_every) if interrupted is not None else remaining
            if self.stop.wait(step):
                return False
            remaining -= step
            if remaining > 0 and interrupted is not None and interrupted():
                break
        return not self.stop.is_set()


def elapsed_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0

"""Requests one user may have in flight at once in this web process: the caps that guard the
process's own threads rather than rows of the database.

An export streams for as long as the client reads (tens of seconds for 100,000 rows) and a
webhook test waits for a receiver for up to `alerts.delivery_timeout`; neither holds a database
connection while it waits, but each holds one of gunicorn's threads. Ten tabs opening exports,
or a script calling "send test" in a loop, would take every thread of the process:

    slot = state().in_flight.take("export", g.user.name, caps.exports_per_user, "caps.exports_per_user")
    response.call_on_close(slot.release)    # a stream gives its slot back when it ends

A request past the cap gets CapReached (HTTP 429 naming the setting). The count is per process
(each gunicorn worker keeps its own), which is what the thread budget is; the database-wide
caps are in console/caps.py.
"""

from __future__ import annotations

import threading
from collections import Counter

from console.caps import CapReached

WHAT = {"export": "exports", "test": "webhook test sends"}


class Slot:
    def __init__(self, owner: InFlight, key: tuple[str, str]):
        self._owner, self._key, self._released = owner, key, False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._owner._release(self._key)

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class InFlight:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Counter[tuple[str, str]] = Counter()

    def take(self, kind: str, user: str, limit: int, setting: str) -> Slot:
        key = (kind, user)
        with self._lock:
            held = self._held[key]
            if held >= limit:
                raise CapReached(f"{WHAT.get(kind, kind)} of {user!r} running at once in this web process: "
                                 f"{held:,} already, the cap is {limit:,} ({setting}); wait for one to finish",
                                 setting=setting, limit=limit, count=held)
            self._held[key] += 1
        return Slot(self, key)

    def held(self, kind: str, user: str) -> int:
        with self._lock:
            return self._held[(kind, user)]

    def _release(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]


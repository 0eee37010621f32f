"""What every viewer sees of the newest collection cycle, computed once per cycle and database.

Sixty on-call engineers polling the overview every five seconds all look at the same thing:
the samples of the newest collection cycle, the alerts as the last evaluation left them and the
state operators last changed. Built per request, that model cost seconds of a core at 5,000
queues (45,000 samples read, decoded and judged by the alert rules), so an incident's crowd
queued behind itself. Built once per generation in each web process, it still cost each
gunicorn process seconds every cycle, during which the process's other threads waited for the
GIL (p95 7.6 s with sixty people). So:

- The overview's model of the default window is built once per cycle by the scheduler's
  leader, after the cycle's alert evaluation, and stored in the database it describes
  (console/web/cycle_store.py, skiplock.cycle_models). `cycle_store.stored` finds it with one primary-key
  probe per request and reads its body once per process: a web process then builds nothing.
  When none fits (another window, an operator's change since the cycle, other settings, no
  scheduler, or a stored model older than `BUCKET_SECONDS`), the process builds its own, as
  below (`cached`).
- The generation (sql/cycle.sql `generation`, one statement of index probes; `marks`) is the
  newest collection cycle, the newest alert evaluation, the newest audited operator action
  (every change an operator can make is audited: a pause, an acknowledgement, a silence, a
  rule; sign-ins and other `ACCOUNT_ACTIONS` are not counted, as no model shows them), the
  newest silence and the current `BUCKET_SECONDS` bucket of the clock, so that what a model
  says about time ("the newest measurement is 6 min old") is never more than one bucket behind.
  A stored model's generation is its row's id instead: it is younger than a bucket anyway, and
  polls are answered 304 until the leader stores the next one.
- While the generation holds, requests reuse the model. When it moves, the first request builds
  (or reads) the new one; the requests arriving meanwhile are shown the previous model (built
  less than `STALE_SECONDS` ago) rather than queue behind the build, and a request with no
  previous model waits for the build, at most `wait` seconds, after which it builds its own.
- A model with a failed panel (a statement timeout, say) is not kept: the next request tries
  again instead of showing the failure for the rest of the cycle (nor stored by the leader).
- The generation of the model a response shows is its ETag (`etag`, `respond`): a poll of an
  unchanged view is answered 304 with no body, and static/skiplock.js keeps what it shows.

Each process keeps its own models and stored models read (`CycleCache.built` and `.loaded`
count them); a process keeps at most `SIZE` of them, the least recently used going first.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flask import Response, current_app, g, make_response, request, session

from console.sqlfiles import query
from console.web.database import current_database, get_conn, read_from, release

T = TypeVar("T")

BUCKET_SECONDS = 30
STALE_SECONDS = 60.0
SIZE = 64


@dataclass(frozen=True)
class Generation:
    """Where a model was read (a database, its primary or replica) and what it was read after
    (the newest cycle, evaluation and audited action, the clock's bucket)."""

    database: str
    replica: bool
    marks: tuple


@dataclass
class _Slot:
    """One model (a name and its arguments): the newest built, and the build under way."""

    generation: Generation | None = None
    value: Any = None
    built_at: float = 0.0
    building: Generation | None = None
    done: threading.Event = field(default_factory=threading.Event)


class CycleCache:
    """Models by name and generation: built once (single flight), the previous one shown while
    the next builds."""

    def __init__(self, size: int = SIZE, stale_seconds: float = STALE_SECONDS, *,
                 clock: Callable[[], float] = time.monotonic, age_from_start: bool = False):
        """`age_from_start`: a model's age (what `stale_seconds` bounds) counts from when its
        build began, not when it ended: the fleet's rows (console/web/fleet.py) are as old as
        their read, however long the read took. `clock`: the seconds that age is measured in."""
        self._size = size
        self._stale = stale_seconds
        self._clock = clock
        self._age_from_start = age_from_start
        self._lock = threading.Lock()
        self._slots: OrderedDict[tuple, _Slot] = OrderedDict()
        self.built = 0  # how many models this process built (tests and the bench read it)
        self.loaded = 0  # how many stored models it read (console/web/cycle_store.py)

    def get(self, name: tuple, generation: Generation, build: Callable[[], T], *,
            keep: Callable[[T], bool] = lambda _: True, wait: float = 30.0,
            before_wait: Callable[[], None] | None = None, tally: str = "built") -> tuple[T, Generation]:
        """(the model, the generation it was built from) for `name` at `generation`. A model
        of one database (or of its replica) is never shown for another. `tally` names the
        counter a call of `build` adds one to ("loaded": it read a stored model)."""
        key = (*name, generation.database, generation.replica)
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot()
                while len(self._slots) > self._size:
                    self._slots.popitem(last=False)
            self._slots.move_to_end(key)
            if slot.generation == generation:
                return slot.value, generation
            fresh_enough = slot.generation is not None and self._clock() - slot.built_at < self._stale
            if slot.building == generation:
                if fresh_enough:
                    return slot.value, slot.generation
                owner, done = False, slot.done
            else:
                owner, done = True, threading.Event()
                slot.building, slot.done = generation, done
        if not owner:
            if before_wait is not None:
                before_wait()  # a request waiting for another's build gives its connection back
            done.wait(wait)
            with self._lock:
                if slot.generation == generation:
                    return slot.value, generation
            return build(), generation  # the build failed, kept nothing, or is slower than we wait
        started = self._clock()
        try:
            value = build()
        except BaseException:
            self._settle(slot, generation, done)
            raise
        with self._lock:
            setattr(self, tally, getattr(self, tally) + 1)
            if keep(value):
                slot.generation, slot.value = generation, value
                slot.built_at = started if self._age_from_start else self._clock()
        self._settle(slot, generation, done)
        return value, generation

    def _settle(self, slot: _Slot, generation: Generation, done: threading.Event) -> None:
        with self._lock:
            if slot.building == generation:
                slot.building = None
        done.set()


def cache() -> CycleCache:
    extra = current_app.extensions["skiplock"].extra
    found = extra.get("cycle_cache")
    if found is None:
        found = extra.setdefault("cycle_cache", CycleCache())
    return found


# Audited actions about accounts and sessions: no model shows them, so they make no generation.
ACCOUNT_ACTIONS = ["login", "logout", "token_create", "token_revoke", "sessions_revoke", "user_add", "user_update",
                   "user_disable"]


def marks(conn) -> tuple:
    """sql/cycle.sql `generation` on `conn`: the newest sample, evaluation, audited action (but
    `ACCOUNT_ACTIONS`) and silence, and the clock's bucket."""
    return tuple(conn.execute(query("cycle", "generation"),
                              {"bucket": BUCKET_SECONDS, "accounts": ACCOUNT_ACTIONS}).fetchone())


def generation() -> Generation:
    """The generation of the request's database, read on the connection its pages read."""
    return Generation(current_database(), read_from().replica, marks(get_conn()))


def cached(name: str, build: Callable[[], T], *parts: Any,
           keep: Callable[[T], bool] = lambda _: True) -> tuple[T, Generation]:
    """(the model `name` with its arguments `parts`, the generation it shows) for the request."""
    # While it waits for another request's build, a request holds no pooled connection: a crowd
    # of waiters holding them would leave the pool empty and answer 503 (seen at load 12).
    return cache().get((name, *parts), request_generation(), build, keep=keep, before_wait=release)


def request_generation() -> Generation:
    """The generation, read once per request."""
    found = g.get("_skiplock_generation")
    if found is None:
        found = g._skiplock_generation = generation()
    return found


def renders() -> CycleCache:
    """The fragments rendered once per generation (`respond(shared=True)`). Never stale: a
    rendered body is shown only with the ETag of the generation it was rendered from, so a
    request arriving while another renders waits for that render (a few milliseconds)."""
    extra = current_app.extensions["skiplock"].extra
    found = extra.get("render_cache")
    if found is None:
        found = extra.setdefault("render_cache", CycleCache(stale_seconds=0.0))
    return found


def etag(shown: Generation) -> str:
    """This request's view of the generation `shown`: the generation, the URL with its query,
    and who asks (a fragment carries the viewer's role and CSRF token)."""
    who = f"{session.get('sid', '')}|{request.headers.get('Authorization', '')}"
    text = repr((shown, request.full_path, who, request.headers.get("HX-Request")))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def respond(shown: Generation, render: Callable[[], Any], *, shared: bool = False) -> Response:
    """304 when the client already has this view of `shown` (static/skiplock.js sends the ETag
    of a polled fragment's last answer), else `render()`'s response with its ETag. Nothing is
    stored by the browser: pages stay Cache-Control: no-store (docs/security.md).

    `shared`: `render()` returns text that depends on the model, the URL and the viewer's role
    only (no CSRF token, no user name): it is rendered once per generation, URL and role in
    this process and sent to every viewer. When a new stored model arrived, each of sixty
    viewers' first poll rendered the same fragments again (issue 31's crowd)."""
    tag = etag(shown)
    if tag in request.if_none_match:
        response = Response(status=304)
    elif shared:
        user = g.get("user")
        key = ("rendered", request.full_path, request.headers.get("HX-Request"), user.role if user else None)
        body, _ = renders().get(key, shown, render)
        response = make_response(body)
    else:
        response = make_response(render())
    response.set_etag(tag)
    return response

"""The exit plan for one queue (issue 32, docs/exit-plan.md): from the advisor's verdict to the
queue served by NATS JetStream, and back.

- `plan(conn, queue, nats_url=...)`: the advisor's signals that bear on outgrowing PostgreSQL
  (the verdict's own, all database-wide, and the queue's own claim latency, both measured by
  console.advisor.verdict, never recomputed here), the queue's backend, its dual-run state and
  the numbered steps with their commands, each marked done, to do, or to check by hand;
- `dual_run(conn, queue)`: what each side still holds: the queue's jobs in skiplock.jobs by
  state (the Queues page's bounded figures, console.browse.queue_figures) and its unsent outbox
  rows (the first OUTBOX_CAP), and whether the side the queue left is drained;
- `move(conn, queue, to, ...)`: switch the backend (broker.set_backend with `move`, audited as
  'move queue' with what was left behind); moving to the backend the queue already has changes
  nothing and writes no audit row.

What it cannot see: the broker. Jobs already published to JetStream and the nats-server are
outside PostgreSQL (broker workers are seen once they register in skiplock.workers, which they
do when they have a database), so the steps that depend on them say "check". One exception,
`with_stream`: `skiplock queues move --status` asks the broker how many jobs a queue served by
PostgreSQL still has in its stream (after a move back), through console.brokerwhy, with no
transaction open. It never scans the jobs table, and takes its
configuration as arguments (the faces read it; only the declared default of `[broker] nats_url`
is read from console.config's table of settings).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from console import browse
from console.advisor import verdict as advisor_verdict
from console.config import SETTINGS
from console.maintenance.actions import check_known_queue
from console.natscall import BrokerUnavailable
from console.queue import broker
from console.sqlfiles import query

OUTBOX_CAP = browse.PENDING_CAP  # unsent outbox rows counted per queue (exact below it)
# [broker] nats_url's declared default (the step says "check" while it is in force)
DEFAULT_NATS_URL: str = next(s.default for s in SETTINGS if (s.section, s.key) == ("broker", "nats_url"))
DONE, TODO, CHECK, IF_NEEDED = "done", "to do", "check", "if needed"
PLACEHOLDER_REASON = "INC-...: why (the advisor's verdict, the incident)"


def known_queue(conn: psycopg.Connection, queue: str, *, create: bool = False) -> None:
    """UnknownQueue (a ValueError naming the queue and the nearest known names) unless known."""
    if not isinstance(queue, str) or not queue.strip():
        raise ValueError("a queue name is needed (a non-empty string)")
    if not create:
        check_known_queue(conn, queue, then="Check the name (skiplock queues list).")


def _broker_name(queue: str) -> bool:
    try:
        broker.check_queue(queue)
    except broker.InvalidBrokerQueue:
        return False
    return True


# --- the dual-run window ------------------------------------------------------------------------


def _count(value: int, capped: bool) -> str:
    return f"{value:,}{'+' if capped else ''}"


def dual_run(conn: psycopg.Connection, queue: str) -> dict[str, Any]:
    """Both sides of `queue`, and which of them is the old one (the backend it does not have):

    keys: backend; jobs {pending (due), scheduled (run_at later), running, stuck, failed,
    capped, failed_capped}: skiplock.jobs, lower bounds when capped (the Queues page's
    windows of the claim, lease and dead-letter indexes); outbox {unsent, waiting (for their
    run_at), capped}; old_side ('postgres' or 'nats'), left (jobs the old side still has to
    run), drained (True/False; None when a bound hides the answer), text (one paragraph)."""
    backend = broker.backend_of(conn, queue)
    row = next((r for r in browse.queue_figures(conn) if r["queue"] == queue), None) or {}
    pending_capped = bool(row.get("pending_capped", False))
    jobs = {"pending": row.get("eligible", 0), "scheduled": row.get("scheduled", 0), "running": row.get("running", 0),
            "stuck": row.get("stuck", 0), "failed": row.get("failed", 0), "capped": pending_capped,
            "failed_capped": bool(row.get("failed_capped", False))}
    with conn.cursor(row_factory=dict_row) as cur:
        ob = cur.execute(query("broker", "outbox_unsent_of_queue"), {"queue": queue, "cap": OUTBOX_CAP}).fetchone() or {
            "unsent": 0, "waiting": 0, "oldest": None}  # an aggregate: always one row
    outbox = {"unsent": ob["unsent"], "waiting": ob["waiting"], "capped": ob["unsent"] >= OUTBOX_CAP,
              "oldest": ob["oldest"].isoformat() if ob["oldest"] else None}
    on_pg = jobs["pending"] + jobs["scheduled"] + jobs["running"]
    one = jobs["failed"] == 1 and not jobs["failed_capped"]
    dead = (f" {_count(jobs['failed'], jobs['failed_capped'])} dead letter{'' if one else 's'} stay{'s' if one else ''} in "
            "skiplock.jobs, replayable from the console (a replayed job runs on the PostgreSQL workers)."
            if jobs["failed"] else "")
    if backend == "nats":
        old, left = "postgres", on_pg
        drained: bool | None = None if on_pg == 0 and pending_capped else on_pg == 0
        if on_pg:
            text = (f"Left on PostgreSQL (skiplock.jobs): {_count(jobs['pending'], pending_capped)} pending, "
                    f"{_count(jobs['scheduled'], pending_capped)} scheduled, {jobs['running']:,} running: keep the "
                    "PostgreSQL workers of this queue running until they have finished them.")
        elif pending_capped:
            text = (f"None of the queue's jobs among the first {browse.PENDING_CAP:,} entries of the claim index and no "
                    "running one; the claim index holds more, so the drain cannot be confirmed yet.")
        else:
            text = "Drained: no pending, scheduled or running job of this queue is left in skiplock.jobs."
        text += dead
        if outbox["unsent"]:
            text += f" The relay has {_count(outbox['unsent'], outbox['capped'])} of its jobs still to publish."
    else:
        old, left = "nats", outbox["unsent"]
        drained = outbox["unsent"] == 0
        if outbox["unsent"]:
            waiting = f" ({outbox['waiting']:,} of them wait for their run_at)" if outbox["waiting"] else ""
            text = (f"Left for the broker: {_count(outbox['unsent'], outbox['capped'])} unsent outbox rows{waiting}, "
                    "which `skiplock relay` still publishes to JetStream: keep the relay and "
                    "`skiplock worker --backend nats` running until they are sent and run.")
        else:
            text = "Nothing left in the outbox."
            if _broker_name(queue):
                text += (f" If the queue was ever on nats, the jobs already published are in the stream "
                         f"{broker.stream(queue)}, which PostgreSQL cannot see: keep `skiplock worker --backend nats` "
                         f"running until `skiplock queues move {queue} --status` (which asks the broker) says the "
                         "stream is empty.")
        text += dead
    return {"queue": queue, "backend": backend, "jobs": jobs, "outbox": outbox, "old_side": old, "left": left,
            "drained": drained, "text": text}


def status_lines(state: dict[str, Any]) -> list[str]:
    """`skiplock queues move QUEUE --status` (and exit-plan's dual-run paragraph) in lines."""
    jobs, outbox = state["jobs"], state["outbox"]
    where = "the outbox, published by `skiplock relay`" if state["backend"] == "nats" else "skiplock.jobs"
    return [
        f"queue {state['queue']!r}: backend {state['backend']} (new jobs go to {where})",
        f"  skiplock.jobs: {_count(jobs['pending'], jobs['capped'])} pending, {_count(jobs['scheduled'], jobs['capped'])} "
        f"scheduled, {jobs['running']:,} running ({jobs['stuck']:,} stuck); "
        f"dead letters: {_count(jobs['failed'], jobs['failed_capped'])}",
        f"  outbox: {_count(outbox['unsent'], outbox['capped'])} unsent"
        + (f" ({outbox['waiting']:,} waiting for their run_at)" if outbox["waiting"] else ""),
        "  drain: " + state["text"],
    ] + _stream_lines(state)


def _stream_lines(state: dict[str, Any]) -> list[str]:
    """The broker's own count of the queue's stream, when `skiplock queues move --status` read it
    (`with_stream`): what PostgreSQL cannot see of a queue moved back."""
    found = state.get("stream")
    if found is None:
        return []
    name = broker.stream(state["queue"])
    if found.get("error"):
        return [f"  stream {name}: not read ({found['error']})"]
    if not found["exists"]:
        return [f"  stream {name}: none (nothing of this queue is in the broker)"]
    held = found["pending"] + found["ack_pending"]
    return [f"  stream {name}: {found['pending']:,} waiting, {found['ack_pending']:,} delivered and not acknowledged"
            + (" (empty: the broker side is drained)" if not held else
               ": keep `skiplock worker --backend nats` running until it is empty")]


def broker_facts(nats_url: str, queue: str, timeout: float) -> dict[str, Any]:
    """The stream's and its consumer's figures (console.collectors.broker's read); raises
    BrokerUnavailable when the broker does not answer within `timeout` seconds."""
    from console.collectors.broker import read_broker

    return read_broker(nats_url, [broker.check_queue(queue)], timeout)[queue]


def with_stream(state: dict[str, Any], nats_url: str, timeout: float) -> dict[str, Any]:
    """`state` (dual_run's) with `stream`: the broker's count of the queue's job stream, read
    now within `timeout` seconds, for a queue served by PostgreSQL whose name a broker can
    carry (it may have left jobs there). Call it with no transaction open: it waits on NATS."""
    if state["backend"] != "postgres" or not _broker_name(state["queue"]):
        return state
    try:
        found = broker_facts(nats_url, state["queue"], timeout)
    except BrokerUnavailable as exc:
        return {**state, "stream": {"error": str(exc)}}
    return {**state, "stream": {k: found[k] for k in ("exists", "pending", "ack_pending")}}


# --- the move -----------------------------------------------------------------------------------


def move(conn: psycopg.Connection, queue: str, to: str, *, actor: str, reason: str, create: bool = False) -> dict[str, Any]:
    """Route `queue`'s new jobs to `to`, audited as 'move queue' with the reason and what the
    side it leaves still holds. Returns {queue, before, after, changed, dual_run}; `changed` is
    False (and nothing is written or audited) when the queue already has that backend. An
    unknown queue (no jobs, samples, limits or row) is refused unless `create`."""
    broker.check_backend(queue, to)
    known_queue(conn, queue, create=create)
    before = dual_run(conn, queue)
    left = {"jobs": {k: before["jobs"][k] for k in ("pending", "scheduled", "running", "failed", "capped")},
            "outbox_unsent": before["outbox"]["unsent"]}
    result = broker.set_backend(conn, queue, to, actor=actor, reason=reason, move=True, left=left)
    result["dual_run"] = dual_run(conn, queue) if result["changed"] else before
    return result


# --- the plan -----------------------------------------------------------------------------------


@dataclass
class Step:
    title: str
    commands: list[str]
    state: str  # done / to do / check / if needed
    note: str = ""


@dataclass
class Plan:
    queue: str
    backend: str
    verdict: dict[str, Any]
    signals: list[dict[str, Any]]
    dual_run: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    advice: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for n, step in enumerate(out["steps"], 1):
            step["number"] = n
        return out


def _signal(sig: advisor_verdict.Signal, scope: str) -> dict[str, Any]:
    return {"id": sig.id, "name": sig.name, "level": sig.level, "text": sig.text, "scope": scope,
            "history_seconds": sig.history_seconds, "instants": sig.instants,
            "cause": (sig.cause or {}).get("sentence")}


def relay_leaders(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The sessions holding the relay's leader lock (at most one; pg_locks, no table read)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("broker", "relay_leader")).fetchall()


BROKER_WORKER_WITHIN = 60.0  # seconds: a registered broker worker heard from within this is running


def broker_workers(conn: psycopg.Connection, queue: str) -> list[dict[str, Any]]:
    """The broker workers of `queue` in the worker registry (migration 031), heard from lately."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("broker", "live_broker_workers"),
                           {"queue": queue, "within": BROKER_WORKER_WITHIN}).fetchall()


def _masked(url: str) -> str:
    return re.sub(r"//[^@/,]*@", "//****@", url)


def plan(conn: psycopg.Connection, queue: str, *, nats_url: str = DEFAULT_NATS_URL,
         window: timedelta = advisor_verdict.DEFAULT_WINDOW, timeout_ms: int = 2000,
         client_installed: bool | None = None, server_path: str | None | bool = False) -> Plan:
    """The exit plan for `queue` (UnknownQueue when no queue has that name). `nats_url` is the
    `[broker] nats_url` in force; `client_installed` / `server_path` default to what this
    machine has (nats-py importable, nats-server on PATH): the tests pass them."""
    known_queue(conn, queue)
    verdict = advisor_verdict.evaluate_verdict(conn, window=window, timeout_ms=timeout_ms)
    own = advisor_verdict.queue_claim_latency(conn, queue, window=window, timeout_ms=timeout_ms)
    signals = [_signal(s, "database") for s in verdict.signals] + [_signal(own, "queue")]
    state = dual_run(conn, queue)
    backend = state["backend"]
    if client_installed is None:
        client_installed = importlib.util.find_spec("nats") is not None  # finds it without importing it
    if server_path is False:
        server_path = shutil.which("nats-server")
    leaders = relay_leaders(conn)
    workers = broker_workers(conn, queue)
    nats_name = _broker_name(queue)
    on_nats = backend == "nats"

    steps = [
        Step("Install the NATS client where the relay and the broker workers run",
             ["pip install 'skiplock[nats]'"], DONE if client_installed else TODO,
             "nats-py is installed here" if client_installed else "nats-py is not installed here"),
        Step("Install nats-server and run it with JetStream",
             ["apt-get install nats-server", "nats-server -js -sd /var/lib/nats"],
             DONE if server_path else CHECK,
             f"found {server_path} on this machine; is it running, with -js? (Debian's nats-server.service "
             "runs without JetStream: add a jetstream block to /etc/nats-server.conf, or stop it and run the "
             "command above)" if server_path else
             "not on this machine's PATH; check the host that runs it"),
        Step("Point Skiplock at it: [broker] nats_url in the config file (or SKIPLOCK_BROKER_NATS_URL)",
             ["[broker]", 'nats_url = "nats://HOST:4222"'],
             CHECK if nats_url == DEFAULT_NATS_URL else DONE,
             f"in force: {_masked(nats_url)}" + (", the default" if nats_url == DEFAULT_NATS_URL else "")),
        Step("Start the relay (one leader per database; a second one waits as a standby)", ["skiplock relay"],
             DONE if leaders else TODO,
             ("running: " + ", ".join(f"pid {r['pid']} ({r['application_name'] or '?'})" for r in leaders)) if leaders
             else "no session holds the relay's leader lock"),
        Step("Start broker workers for the queue, with the same tasks modules",
             [f"skiplock worker --backend nats --queues {queue} --tasks YOUR.TASKS"], DONE if workers else CHECK,
             ("registered: " + ", ".join(f"{w['id']} ({w['host']}, pid {w['pid']})" for w in workers)) if workers
             else f"no broker worker of queue {queue} reported in the last {BROKER_WORKER_WITHIN:g} s (a broker worker "
                  "without a database does not register): check their processes"),
        Step("Move the queue: new jobs go to the outbox and the relay, PostgreSQL workers drain the rest",
             [f'skiplock queues move {queue} --to nats --reason "{PLACEHOLDER_REASON}"'],
             DONE if on_nats else TODO,
             "new jobs go to nats" if on_nats else
             ("" if nats_name else "refused: the queue's name must be letters, digits, '_' or '-' for a broker")),
        Step("Watch the drain; keep the PostgreSQL workers of the queue running until it is complete",
             [f"skiplock queues move {queue} --status", f"skiplock exit-plan {queue}"],
             DONE if on_nats and state["drained"] else TODO,
             state["text"] if on_nats else "after the move"),
        Step("Roll back: new jobs return to skiplock.jobs; keep the relay and the broker workers "
             "until the outbox and the stream are empty",
             [f'skiplock queues move {queue} --to postgres --reason "{PLACEHOLDER_REASON}"'], IF_NEEDED,
             "" if on_nats or not state["outbox"]["unsent"] else state["text"]),
    ]
    if verdict.label == advisor_verdict.OUTGROWING:
        advice = "The advisor says this workload is outgrowing PostgreSQL: plan the move."
    else:
        advice = (f"The advisor's verdict is \"{verdict.label}\", not \"outgrowing PostgreSQL\": fix what "
                  "`skiplock check` and the advisor page point at first; move when a signal stays.")
    verdict_out = {"label": verdict.label, "level": verdict.level, "headline": verdict.headline,
                   "history_seconds": verdict.history_seconds, "enough_history": verdict.enough_history}
    return Plan(queue, backend, verdict_out, signals, state, steps, advice)

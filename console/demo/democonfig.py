"""What the demo writes into its config file and its cluster: short intervals, demo alert
thresholds with a local webhook receiver, and quick autovacuum. Only settings this installation
declares (`console.config.SETTINGS`) are written.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from console.config import SETTINGS

# The demo's configuration at pace 1: short leases and intervals so that a few minutes show the
# whole life of a job. Only settings this installation knows are written (an unknown key would
# be refused by the config loader); the others are listed as not applied. `demo_settings(pace)`
# divides every interval by the pace (`skiplock demo --pace 6`: the same schedule six times
# faster, which is how tests/test_demo_promises.py sees every promise within minutes).
DEMO_SETTINGS: dict[str, Any] = {
    "database.pool_size": 4,
    "worker.concurrency": 4,
    "worker.lease": 15.0,
    "worker.poll_interval": 1.0,
    "worker.shutdown_grace": 5.0,
    "worker.flush_interval": 5.0,
    "queue.backoff_base": 2.0,
    "queue.backoff_cap": 60.0,
    "scheduler.collect_interval": 10.0,
    # 75 s, more than twice the default: a killed worker's jobs (killed within a sixth of it
    # after a reaper run, see Demo._chaos) stay stuck long enough for the stuck_leases alert.
    "scheduler.reap_interval": 75.0,
    "scheduler.archive_interval": 60.0,
    "scheduler.election_interval": 5.0,
    "scheduler.rate_window": "15m",
    "web.stale_worker_after": 30.0,
    "maintenance.archive_after": "2m",  # completed jobs leave the hot table after two minutes
    "maintenance.archive_retention": "1d",
    # The demo's webhook receiver listens on loopback, which the address policy refuses by default.
    "alerts.allow_private_destinations": True,
    # The demo's console is `skiplock serve` (development mode); should it ever run in production
    # mode, a local Prometheus may still scrape the demo's /metrics without a token.
    "web.metrics_public": True,
}

# Seconds-valued settings that the pace divides, and the least each may become.
_PACED: dict[str, float] = {
    # The lease never below 9 s: the demo's reports take up to 8 s, and a lease shorter than
    # its jobs is what the advisor's lease-vs-runtime check fails on (rightly).
    "worker.lease": 9.0, "worker.poll_interval": 0.2, "worker.flush_interval": 0.5, "worker.shutdown_grace": 1.0,
    # The reaper never below 30 s, because the lease stops at 9 s: a killed worker's leases
    # expire up to 9 s after the kill and must stay expired for the stuck_leases alert's `for`
    # and three collections (one for a late cycle) before the next run, which may come a sixth
    # of the interval after the kill (Demo._ripe). At 75 s / 6 = 12.5 s that window was
    # 1.4-6.5 s, and a CI run's first kill went unalerted (tests/test_demo_config.py).
    "scheduler.collect_interval": 1.0, "scheduler.reap_interval": 30.0, "scheduler.archive_interval": 5.0,
    "scheduler.election_interval": 1.0, "web.stale_worker_after": 3.0,
}


def demo_settings(pace: float = 1.0) -> dict[str, Any]:
    """DEMO_SETTINGS with every interval divided by `pace`."""
    out = dict(DEMO_SETTINGS)
    for key, least in _PACED.items():
        out[key] = max(float(out[key]) / pace, least)
    out["scheduler.rate_window"] = f"{rate_window_s(pace):g}s"
    out["maintenance.archive_after"] = f"{max(120.0 / pace, 20.0):g}s"
    return out


# The PostgreSQL settings of the demo cluster: the defaults plus a quick autovacuum so dead
# tuples are visibly removed (and visibly not, while a session holds the horizon).
CLUSTER_SETTINGS = {
    "synchronous_commit": "off",  # demo data: a lost last transaction after a crash is fine
    "autovacuum_naptime": "10s",
    "log_min_messages": "warning",
}


@dataclass(frozen=True)
class Promise:
    """A condition the demo provokes on purpose and the alert that detects it: first provoked
    `first_after` seconds after the start (then every `every`), at pace 1. `within(pace, rate)`
    is how long after being provoked the alert fires at most: the rule's threshold, `for` and
    two collection intervals, all divided by the pace; for a dead-letter rate, also the time
    the windowed rate takes to pass 50 per hour at `per_hour` (its rate at --rate 5, scaled by
    --rate), plus `unpaced` seconds of retries' backoff. docs/operators-guide.md ("The demo")
    is this table, and tests/test_demo_promises.py holds the demo to it."""

    key: str
    condition: str
    rule: str
    labels: dict[str, str]
    first_after: float
    every: float
    paced: float  # seconds at pace 1 (threshold + for + two collections)
    why: str
    per_hour: float | None = None  # dead letters per hour at --rate 5
    unpaced: float = 0.0
    lease: bool = False  # add the workers' lease (paced, never under 9 s: see _PACED)

    def within(self, pace: float = 1.0, rate: float = 5.0) -> float:
        seconds = self.paced / pace + self.unpaced
        if self.lease:
            seconds += demo_settings(pace)["worker.lease"]
        if self.per_hour:
            # Dead letters arrive at random (a Poisson stream): the rate over the window passes
            # the threshold once more than threshold x window arrived, which takes this long or
            # less 99 times in 100 (the mean would be late half the time).
            need = math.floor(DEMO_RULES["dead_letter_growth"]["threshold"] * rate_window_s(pace) / 3600.0) + 1
            seconds += poisson_wait(need, self.per_hour * rate / 5.0 / 3600.0)
        return seconds


def poisson_wait(arrivals: int, per_second: float, certainty: float = 0.99) -> float:
    """Seconds within which a Poisson stream of `per_second` has brought `arrivals` with the
    given certainty: the smallest t with P(N(t) >= arrivals) >= certainty."""
    def below(t: float) -> float:  # P(N(t) < arrivals)
        mean = per_second * t
        term = total = math.exp(-mean)
        for k in range(1, arrivals):
            term *= mean / k
            total += term
        return total

    t = 0.0
    while below(t) > 1.0 - certainty:
        t += 1.0
    return t


# The demo's alert rules (they replace the defaults of the same name): a threshold, a `for`
# and, where the default has one, a clear value, all in seconds at pace 1.
DEMO_RULES: dict[str, dict[str, Any]] = {
    "queue_age": {"metric": "queue_age_seconds", "op": ">", "threshold": 30, "clear": 10, "for": 20,
                  "severity": "critical", "summary": "Oldest eligible job in queue {queue} has waited {value}s (over {threshold}s)"},
    "stuck_leases": {"metric": "stuck_leases", "op": ">", "threshold": 0, "for": 10, "severity": "warning",
                     "summary": "{value} job(s) in queue {queue} hold an expired lease (a worker died)"},
    "vacuum_blocked": {"metric": "xmin_horizon_age_seconds", "labels": {"holder": "any"}, "op": ">", "threshold": 30,
                       "clear": 5, "for": 10, "severity": "warning",
                       "summary": "The xmin horizon has been held for {value}s: vacuum cannot remove dead rows"},
    # The shipped threshold (50 per hour) and `for` (5 min): only the pace changes it.
    "dead_letter_growth": {"metric": "dead_letter_growth", "op": ">", "threshold": 50, "for": 300, "severity": "warning",
                           "summary": "Queue {queue} gains {value} dead letters per hour"},
}

COLLECT = DEMO_SETTINGS["scheduler.collect_interval"]


def rate_window_s(pace: float = 1.0) -> float:
    """[scheduler] rate_window of the demo: 15 minutes divided by the pace, never under five (a
    shorter window holds too few dead letters to say a rate without flapping)."""
    return max(900.0 / pace, 300.0)


# Jobs per search burst. The reports worker's two threads drain it in about two minutes beside
# the reports (600 did not drain between two bursts, so queue_age never resolved; 300 drained
# before the rule's `for` had passed, so it never fired).
BURST = 450

PROMISES: tuple[Promise, ...] = (
    Promise("burst", f"a burst of {BURST} search.reindex jobs (priority -10) every 4 minutes, the first after 45 s",
            "queue_age", {"queue": "search"}, 45.0, 240.0,
            DEMO_RULES["queue_age"]["threshold"] + DEMO_RULES["queue_age"]["for"] + 2 * COLLECT,
            "the head of the search queue waits past 30 s while two threads drain the burst beside the reports "
            "(about two minutes)"),
    Promise("kill", "worker-reports killed with SIGKILL every 3 minutes (the first after a minute), while it holds "
            "a job and just after a reaper run", "stuck_leases", {}, 60.0, 180.0,
            DEMO_RULES["stuck_leases"]["for"] + 2 * COLLECT,
            "its jobs' leases expire 15 s later and stay expired until the reaper's next run, 75 s after the last",
            lease=True),
    Promise("idle", "a session idle in transaction (REPEATABLE READ, with an xid) for 6 minutes every 20 minutes, "
            "the first after 90 s", "vacuum_blocked", {"holder": "any"}, 90.0, 1200.0,
            DEMO_RULES["vacuum_blocked"]["threshold"] + DEMO_RULES["vacuum_blocked"]["for"] + 2 * COLLECT,
            "it holds back the xmin horizon: dead rows cannot be removed while it lasts"),
    Promise("partner-c", "partner-c is down: 3 % of partner webhooks fail three times, then go to the dead letters "
            "(about 140 per hour at --rate 5)", "dead_letter_growth", {"queue": "webhooks"}, 0.0, 0.0,
            DEMO_RULES["dead_letter_growth"]["for"] + 2 * COLLECT,
            "the rate over the 15-minute window passes 50 per hour once 13 have arrived (5.6 min on average, 9.8 at the "
            "99th percentile), then holds for 5 min",
            per_hour=140.0, unpaced=15.0),
    Promise("declined", "2 % of cards are declined, straight to the dead letters (about 95 per hour at --rate 5)",
            "dead_letter_growth", {"queue": "billing"}, 0.0, 0.0,
            DEMO_RULES["dead_letter_growth"]["for"] + 2 * COLLECT,
            "the rate over the 15-minute window passes 50 per hour once 13 have arrived (8.2 min on average, 14.4 at the "
            "99th percentile), then holds for 5 min",
            per_hour=95.0),
)


def demo_alerts(*, port: int, secret: str, pace: float = 1.0) -> str:
    """The [[webhooks]] receiver and DEMO_RULES, with every duration divided by `pace`."""
    lines = ["# Demo alert thresholds, lower than the defaults so that alerts fire (and resolve) within minutes.",
             "[[webhooks]]", 'name = "demo-receiver"', 'kind = "json"', f'url = "http://127.0.0.1:{port}/hook"',
             f'secret = "{secret}"', ""]
    for name, rule in DEMO_RULES.items():
        seconds_valued = rule["metric"] in ("queue_age_seconds", "xmin_horizon_age_seconds")
        lines += ["[[alerts.rules]]", f'name = "{name}"', f'metric = "{rule["metric"]}"']
        if "labels" in rule:
            lines.append("labels = { " + ", ".join(f'{k} = "{v}"' for k, v in rule["labels"].items()) + " }")
        threshold = round(rule["threshold"] / pace, 1) if seconds_valued else rule["threshold"]
        lines += [f'op = "{rule["op"]}"', f"threshold = {threshold:g}"]
        if "clear" in rule:
            lines.append(f"clear = {round(rule['clear'] / pace, 1) if seconds_valued else rule['clear']:g}")
        lines += [f'for = "{round(max(rule["for"] / pace, 1), 1):g}s"', f'severity = "{rule["severity"]}"',
                  f"summary = {json.dumps(rule['summary'])}", f'runbook = "docs/alerts.md#{name}"', ""]
    return "\n".join(lines)


# The demo's periodic (cron) jobs, so the Periodic page has schedules at work: a sweep every
# 30 s at pace 1 (divided by the pace, never under 10 s), which a few minutes show running, and
# a cron report every five minutes (cron fields are whole minutes: not paced). The sweep goes to
# the default queue, which worker-1 and worker-2 serve: on the search queue, a chaos kill of
# worker-reports holding it would stall it past two intervals (lease, then the reaper), and the
# periodic_late alert would fire for the demo's own kill, which it promises no alert for.
DEMO_PERIODIC: tuple[dict[str, Any], ...] = (
    {"name": "stale-products-sweep", "kind": "search.reindex", "queue": "default",
     "payload": {"sweep": "stale", "ms": 300}, "every": 30.0},
    {"name": "refunds-report", "kind": "reports.build", "queue": "reports",
     "payload": {"report": "refunds", "customer_id": 1, "ms": 1500}, "cron": "*/5 * * * *"},
)


def demo_periodic(pace: float = 1.0) -> str:
    """DEMO_PERIODIC as [[periodic]] tables, `every` divided by `pace`."""
    lines = ["# Periodic jobs (docs/queue.md, \"Periodic jobs\"): the Periodic page lists them."]
    for entry in DEMO_PERIODIC:
        lines += ["[[periodic]]", f'name = "{entry["name"]}"', f'kind = "{entry["kind"]}"', f'queue = "{entry["queue"]}"',
                  "payload = { " + ", ".join(f"{k} = {toml_value(v)}" for k, v in entry["payload"].items()) + " }"]
        if "every" in entry:
            lines.append(f'every = "{max(round(entry["every"] / pace), 10)}s"')
        else:
            lines.append(f'cron = "{entry["cron"]}"')
        lines.append("")
    return "\n".join(lines)


def traffic_args(pace: float = 1.0) -> list[str]:
    """The traffic generator's schedule (console.demo.traffic) divided by `pace`: the bursts
    (smaller too, so one drains in the same share of its interval) and the idle sessions."""
    return ["--burst-every", f"{240.0 / pace:g}", "--burst-size", str(max(int(BURST / pace), 20)),
            "--first-burst-after", f"{45.0 / pace:g}", "--idle-every", f"{1200.0 / pace:g}",
            "--idle-for", f"{360.0 / pace:g}", "--first-idle-after", f"{90.0 / pace:g}"]


def has_setting(dotted: str) -> bool:
    return any(s.dotted == dotted for s in SETTINGS)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))

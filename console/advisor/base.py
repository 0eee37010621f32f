"""What every advisor check is made of: results, the per-family registry, the `Probe` a check
reads through, and the formatting helpers its sentences use.

A family module (`claim_path`, `locks`, `leases`, `retries`, `hygiene`, `multixact`, `server`)
creates one `Family` and registers its checks with `@FAMILY.check(id, title)`;
`console.advisor.checks` lists the families in the order the advisor page shows them and runs
them. This module runs nothing and imports no family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from console.config import Config
from console.sqlfiles import query

OK, WARN, FAIL, UNKNOWN = "ok", "warn", "fail", "unknown"
STATUSES = (OK, WARN, FAIL, UNKNOWN)
SEVERITY = {OK: 0, UNKNOWN: 1, WARN: 2, FAIL: 3}
DOCS = "docs/advisor.md"
COUNT_CAP = 100_000  # bounded counts stop here and say "100,000+"


# --- results --------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a check function returns."""

    status: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    remedy: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckResult:
    id: str
    title: str
    area: str
    status: str
    summary: str
    evidence: list[str]
    remedy: str
    docs: str
    data: dict[str, Any]
    elapsed_ms: float
    system: str = "skiplock"  # whose queue the check is about (an external source's system)
    external: str | None = None  # the [[external_queues]] entry's name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    results: list[CheckResult]
    database: str = ""
    server_version: int = 0

    @property
    def counts(self) -> dict[str, int]:
        counts = {status: 0 for status in STATUSES}
        for result in self.results:
            counts[result.status] += 1
        return counts

    @property
    def worst(self) -> str:
        return max((r.status for r in self.results), key=SEVERITY.__getitem__, default=OK)

    @property
    def failed(self) -> bool:
        return any(r.status == FAIL for r in self.results)

    def by_id(self, check_id: str) -> CheckResult:
        for result in self.results:
            if result.id == check_id:
                return result
        raise KeyError(check_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "database": self.database,
            "server_version": self.server_version,
            "worst": self.worst,
            "counts": self.counts,
            "checks": [r.to_dict() for r in self.results],
        }


# --- the registry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    area: str
    func: Callable[[Probe], Outcome]
    system: str = "skiplock"
    external: str | None = None

    @property
    def docs(self) -> str:
        return f"{DOCS}#{self.id}"



class Family:
    """One group of checks as the advisor page shows them: its area title and its checks in the
    order they are registered."""

    def __init__(self, area: str):
        self.area = area
        self.checks: list[Check] = []

    def check(self, check_id: str, title: str) -> Callable[[Callable[[Probe], Outcome]], Callable[[Probe], Outcome]]:
        def register(func: Callable[[Probe], Outcome]) -> Callable[[Probe], Outcome]:
            self.checks.append(Check(check_id, title, self.area, func))
            return func

        return register


class UnknownCheck(ValueError):
    pass



# --- what a check reads through -------------------------------------------------------------


class Probe:
    """A check's view of the database: one time-limited cursor, the config, and the advisor's
    memory of earlier readings."""

    def __init__(self, cur: psycopg.Cursor, config: Config):
        self.cur = cur
        self.config = config

    def rows(self, query_name: str, /, **params: Any) -> list[dict[str, Any]]:
        self.cur.execute(query("advisor", query_name), params)
        # extract(epoch ...) is numeric: figures become floats so checks can do arithmetic
        return [{k: float(v) if isinstance(v, Decimal) else v for k, v in row.items()} for row in self.cur.fetchall()]

    def row(self, query_name: str, /, **params: Any) -> dict[str, Any]:
        rows = self.rows(query_name, **params)
        return rows[0] if rows else {}

    def setting(self, dotted: str) -> Any:
        """A setting's value; durations come back as seconds (float)."""
        section, _, key = dotted.partition(".")
        value = self.config.get(section, key)
        return value.total_seconds() if isinstance(value, timedelta) else value

    def recall(self, name: str) -> dict[str, Any] | None:
        return self.row("snapshot_get", name=name) or None

    def remember(self, name: str, data: dict[str, Any]) -> None:
        self.cur.execute(query("advisor", "snapshot_put"), {"name": name, "data": Jsonb(data)})

    def exists(self, relation: str) -> bool:
        return bool(self.row("relation_exists", name=relation).get("exists"))

    @property
    def has_pg_stat_statements(self) -> bool:
        return bool(self.row("capabilities").get("pg_stat_statements"))

    @property
    def can_read_control_data(self) -> bool:
        return bool(self.row("capabilities").get("control_data"))

    @property
    def server_version(self) -> int:
        return self.cur.connection.info.server_version


# --- formatting helpers ---------------------------------------------------------------------


def seconds(value: float | None) -> str:
    """A duration for a human: 45 s, 12 min, 3.5 h, 9 days."""
    if value is None:
        return "unknown"
    value = float(value)
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    if value < 172800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.0f} days"


def count(value: float | None, cap: int | None = None) -> str:
    if value is None:
        return "unknown"
    if cap is not None and value >= cap:
        return f"{cap:,}+"
    return f"{int(round(value)):,}"


def size(value: float | None) -> str:
    if value is None:
        return "unknown"
    value = float(value)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def session(row: dict[str, Any]) -> str:
    """pid, application and query of a session, on one line."""
    app = row.get("application_name") or "(no application_name)"
    query_text = " ".join((row.get("query") or "").split())
    if len(query_text) > 160:
        query_text = query_text[:157] + "..."
    return f"pid {row['pid']} [{app}] {row.get('state') or ''}: {query_text}".strip()


def worst(*statuses: str) -> str:
    return max(statuses, key=SEVERITY.__getitem__, default=OK)



# --- evidence shared by several families ----------------------------------------------------


def scheduler_line(probe: Probe, job: str) -> list[str]:
    """What the scheduler says about one of its jobs, when the scheduler's tables exist."""
    if not probe.exists("skiplock.scheduler_jobs"):
        return []
    row = probe.row("scheduler_job", job=job)
    leader = f"scheduler leader {row['live_leader']} is alive" if row.get("live_leader") else "no live scheduler leader"
    if row.get("last_run_age_s") is None:
        return [f"{leader}; the scheduler has not run its {job} job on this database"]
    line = (f"{leader}; scheduler {job} job every {seconds(row['interval_seconds'])}, last run "
            f"{seconds(row['last_run_age_s'])} ago")
    if row.get("last_error"):
        line += f", failed: {row['last_error'][:160]}"
    return [line]


def maintenance_last_run(probe: Probe, task: str) -> dict[str, Any] | None:
    """The last run of a maintenance task, when the maintenance module records runs."""
    if not probe.exists("skiplock.maintenance_runs"):
        return None
    return probe.row("maintenance_last_run", task=task) or None

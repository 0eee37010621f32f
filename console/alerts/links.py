""""Look here": from an alert to the offending work, computed from the rule's metric and the
alert's labels. The ONE place that maps a metric to console pages.

    look_here("queue_age_seconds", {"queue": "search"}, "https://console.example")
    -> [Link("Eligible jobs in queue search, oldest first",
             "/jobs?state=pending&queue=search&eligible=1", "https://console.example/jobs?..."),
        Link("Why queue search is not moving (the computed answer)", "/queues/search#why", ...)]

The first link is the one to click first: the offending jobs (or the session holding the
horizon, or the blocking tree), then context (the queue, the advisor's check with its
evidence; for a queue that waits, the queue page's computed answer to "why isn't it moving?",
console/why.py). The alert page, the overview's firing-alert row, the JSON API and every webhook
payload show the same list, so changing a mapping here changes all of them.

How a metric is mapped, most specific first: an entry in `_BY_METRIC` (exact name), else the
first entry of `_BY_PREFIX` whose prefix starts the name. Every metric used by a default rule
maps to at least one link (tests/test_alert_links.py fails otherwise).

Metrics named `periodic_*` map through `_periodic`, which links to the entry's row on
`/periodic` (`#entry-<name>`, the `name` label of `periodic_late_ratio`).

A dead-letter alert whose queue has a new error group gets that group's jobs in front
(`with_new_groups`); finding the group needs the database, so `console.alerts.context.look_here`
does it, for the alert page, its API and every webhook payload alike.

A rule's runbook goes the same way (`runbook_path`, `runbook_url`): the default rules' runbooks
are `docs/alerts.md#<rule>`, which the console serves itself at `/docs/alerts.md#<rule>`
(console/web/docs.py), unless `[alerts] runbook_base_url` is set, and then every relative
runbook is joined to it, on the pages and in the messages alike.

This module is pure: no database, no Flask, no configuration. Paths are absolute within the
console ("/jobs?..."); `url` is the same joined to `alerts.console_url` (None when unset).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urljoin

from console.redaction import DEFAULT_KEYS, REDACTED, redact_text

ANY_QUEUE = ("", "all")  # label values that mean "every queue" (e.g. claim latency's queue="all")


@dataclass(frozen=True)
class Link:
    label: str
    path: str  # starts with "/": the console page, query string encoded
    url: str | None = None  # absolute, from alerts.console_url; None when it is not set

    def as_dict(self) -> dict[str, str | None]:
        return {"label": self.label, "path": self.path, "url": self.url}


def absolute(console_url: str, path: str) -> str | None:
    """`path` under the console's public address (keeps a path prefix such as /skiplock)."""
    if not console_url:
        return None
    return console_url.rstrip("/") + path


def _path(base: str, fragment: str = "", **args: str) -> str:
    query = urlencode([(k, v) for k, v in args.items() if v not in (None, "")])
    return base + (f"?{query}" if query else "") + (f"#{fragment}" if fragment else "")


def _queue(labels: Mapping[str, str]) -> str | None:
    value = labels.get("queue")
    return None if value is None or value in ANY_QUEUE else value


def _advisor(check: str, title: str) -> tuple[str, str]:
    return f"Advisor: {title} (with its evidence)", _path("/advisor", f"check-{check}", check=check)


def _queue_page(queue: str | None) -> tuple[str, str]:
    if queue is None:
        return "Queues", "/queues"
    return f"Queue {queue}", f"/queues/{quote(queue, safe='')}"


# --- one function per kind of trouble: (label, path) pairs, the offending work first -------------

Pairs = list[tuple[str, str]]


def _why(queue: str | None) -> tuple[str, str]:
    """The queue page's computed answer (console/why.py), or the queues list without a queue."""
    if queue is None:
        return _queue_page(None)
    return f"Why queue {queue} is not moving (the computed answer)", f"/queues/{quote(queue, safe='')}#why"


def _eligible(labels: Mapping[str, str]) -> Pairs:
    queue = _queue(labels)
    where = f"in queue {queue}" if queue else "in every queue"
    return [(f"Eligible jobs {where}, oldest first", _path("/jobs", state="pending", queue=queue, eligible="1")),
            _why(queue)]


def _queue_depth(labels: Mapping[str, str]) -> Pairs:
    state, queue = labels.get("state"), _queue(labels)
    if state == "running":
        return [(f"Running jobs in queue {queue}" if queue else "Running jobs",
                 _path("/jobs", state="running", queue=queue)), _queue_page(queue)]
    if state == "failed":
        return _dead_letters(labels)
    if state == "scheduled":
        return [(f"Pending jobs in queue {queue}" if queue else "Pending jobs",
                 _path("/jobs", state="pending", queue=queue)), _queue_page(queue)]
    return _eligible(labels)


def _stuck(labels: Mapping[str, str]) -> Pairs:
    queue = _queue(labels)
    where = f" in queue {queue}" if queue else ""
    return [(f"Running jobs{where} whose lease has expired", _path("/jobs", state="running", queue=queue, lease="expired")),
            _advisor("stuck-leases", "stuck leases"), _queue_page(queue)]


def _dead_letters(labels: Mapping[str, str]) -> Pairs:
    queue = _queue(labels)
    where = f" of queue {queue}" if queue else ""
    return [(f"Error groups{where}", _path("/deadletters", "groups", queue=queue)),
            (f"Dead letters{where}, latest first", _path("/deadletters/jobs", queue=queue))]


def _error_group(labels: Mapping[str, str]) -> Pairs:
    """A new or regressed error group (`error_group_new{fingerprint, change}`): its dead letters
    first (the page shows the group's first occurrence, kinds, queues and an example, and the
    ignore button), then every group. The collector hides secret values in the label; a label
    that still shows a secret key's value, or shows one hidden, is left out of the filter."""
    fingerprint = labels.get("fingerprint") or ""
    filterable = bool(fingerprint) and REDACTED not in fingerprint and redact_text(fingerprint, DEFAULT_KEYS) == fingerprint
    shown = " ".join(redact_text(fingerprint, DEFAULT_KEYS).split())[:80]
    what = "returning" if labels.get("change") == "regressed" else "new"
    return [(f"Dead letters of the {what} error group {shown}".rstrip(),
             _path("/deadletters/jobs", fingerprint=fingerprint if filterable else None)),
            ("Error groups: first seen, kinds, queues (ignore one there)", _path("/deadletters", "groups"))]


def _retries(labels: Mapping[str, str]) -> Pairs:
    queue = _queue(labels)
    where = f" in queue {queue}" if queue else ""
    return [(f"Jobs waiting for a retry{where}, with their last error", _path("/jobs", state="pending", queue=queue,
                                                                            retrying="1")),
            _advisor("retry-hot-loops", "retries back off"), ("Error groups (dead letters)", _path("/deadletters", "groups"))]


def _claim(labels: Mapping[str, str]) -> Pairs:
    return [_advisor("claim-plan", "the claim's plan"), _advisor("claim-buffers", "buffers per claim"),
            ("Who holds the xmin horizon (dead index entries)", "/health#panel-holders")]


def _convoy(labels: Mapping[str, str]) -> Pairs:
    return [_advisor("claim-skip-locked", "claims without SKIP LOCKED"),
            ("Lock waits and the blocking tree", "/health#panel-locks")]


def _workers(labels: Mapping[str, str]) -> Pairs:
    return [("Workers", "/workers"), ("Eligible jobs in every queue, oldest first",
                                      _path("/jobs", state="pending", eligible="1"))]


def _in_flight(labels: Mapping[str, str]) -> Pairs:
    return [("Running jobs", _path("/jobs", state="running")), ("Workers", "/workers")]


def _tables(labels: Mapping[str, str]) -> Pairs:
    return [("Database: dead tuples and autovacuum", "/health#panel-tables"),
            _advisor("autovacuum-progress", "autovacuum keeps up"),
            ("Who holds the xmin horizon", "/health#panel-holders")]


def _horizon(labels: Mapping[str, str]) -> Pairs:
    return [("Database: who holds the xmin horizon", "/health#panel-holders"),
            _advisor("xmin-horizon", "the xmin horizon"), _advisor("long-transactions", "long transactions")]


def _locks(labels: Mapping[str, str]) -> Pairs:
    return [("Database: the blocking tree", "/health#panel-locks"), _advisor("row-lock-waits", "row-lock waits")]


def _multixact(labels: Mapping[str, str]) -> Pairs:
    return [("Database: MultiXact and SLRU", "/health#panel-slru"), _advisor("multixact", "MultiXact")]


def _wraparound(labels: Mapping[str, str]) -> Pairs:
    return [("Database: transaction ID wraparound", "/health#panel-wraparound"),
            ("Who holds the xmin horizon", "/health#panel-holders")]


def _wal(labels: Mapping[str, str]) -> Pairs:
    return [("Database: WAL and replication", "/health#panel-wal"), _advisor("wal-replicas", "WAL and replicas")]


def _connections(labels: Mapping[str, str]) -> Pairs:
    return [_advisor("connections", "connections"), ("Database: who holds the xmin horizon", "/health#panel-holders")]


def _notify(labels: Mapping[str, str]) -> Pairs:
    return [_advisor("notify-queue", "the NOTIFY queue")]


def _archive(labels: Mapping[str, str]) -> Pairs:
    return [("Maintenance: archival runs", "/maintenance#runs"), _advisor("completed-rows", "completed rows")]


def _collectors(labels: Mapping[str, str]) -> Pairs:
    return [("Maintenance: the scheduler and its runs", "/maintenance#scheduler"),
            ("Maintenance: the collectors' errors, with their messages", "/maintenance#collectors")]


def _scheduler(labels: Mapping[str, str]) -> Pairs:
    return [("Maintenance: the scheduler's restarts, nodes and job errors", "/maintenance#scheduler")]


def _groups(labels: Mapping[str, str], *, dead: bool = False) -> Pairs:
    """A fair queue's group (tenant) in trouble (`group_*{queue, group}`): the queue page's
    Groups panel, which shows the same figures for the top groups and flags the starving ones,
    then the queue's eligible jobs, or its dead letters for a dead-letter alert. The group's
    own jobs have no filter of their own on /jobs (the group key is not indexed for browsing)."""
    queue, group = _queue(labels), labels.get("group")
    if queue is None:
        return [_queue_page(None)]
    who = {"_other": "the groups folded into _other", "_none": "jobs without a group", None: ""}.get(group, f"group {group}")
    page = (f"Groups of queue {queue}{': ' + who if who else ''} (backlog, wait, dead letters, starving)",
            f"/queues/{quote(queue, safe='')}#queue-groups")
    if labels.get("state") == "running":
        return [page, (f"Running jobs in queue {queue}", _path("/jobs", state="running", queue=queue))]
    if dead:
        return [page, *_dead_letters(labels)]
    return [page, (f"Eligible jobs in queue {queue}, oldest first", _path("/jobs", state="pending", queue=queue,
                                                                        eligible="1"))]


def _group_dead_letters(labels: Mapping[str, str]) -> Pairs:
    return _groups(labels, dead=True)


def _queues(labels: Mapping[str, str]) -> Pairs:
    return [_queue_page(_queue(labels))]


# The part of an external queue's page (console/web/external.py) each kind of trouble opens.
_EXTERNAL_SECTION = {"dead_letters": "external-dead-letters", "dead_letter_growth": "external-dead-letters",
                     "throughput": "external-source"}


def _external_for(metric: str) -> Callable[[Mapping[str, str]], Pairs]:
    """An [[external_queues]] source's series: its own page filtered to the queue in trouble
    (`/external/<name>?queue=<queue>`, at its dead letters for a dead-letter alert), the
    source's other queues, and the collectors' errors of the sources."""

    def pairs(labels: Mapping[str, str]) -> Pairs:
        name, queue, system = labels.get("external"), _queue(labels), labels.get("system")
        if not name:
            return [("External queues", _path("/queues", "external-queues")),
                    ("Maintenance: the sources' errors of the last hour", "/maintenance#collectors")]
        kind = f" ({system})" if system else ""
        fragment = _EXTERNAL_SECTION.get(metric, "external-source")
        if metric == "queue_depth" and labels.get("state") == "failed":
            fragment = "external-dead-letters"
        base = f"/external/{quote(name, safe='')}"
        where = f"queue {queue} of external queue {name}{kind}" if queue else f"external queue {name}{kind}"
        label = f"Dead letters of {where}" if fragment == "external-dead-letters" else where[0].upper() + where[1:]
        out = [(label, _path(base, fragment, queue=queue))]
        if queue:
            out.append((f"External queue {name}{kind}: every queue", base))
        out.append(("Maintenance: the sources' errors of the last hour", "/maintenance#collectors"))
        return out

    return pairs


def _external(labels: Mapping[str, str]) -> Pairs:
    return _external_for("external_source_errors")(labels)


def _broker(labels: Mapping[str, str]) -> Pairs:
    """A queue NATS JetStream serves (backend="nats"): its jobs are in the broker, not in
    skiplock.jobs, so the jobs list would show none of them; its page shows the broker's figures
    (the collector's newest reading), and the collectors' errors say whether the broker answered."""
    queue = _queue(labels)
    page = (f"Queue {queue} on NATS JetStream", _path(f"/queues/{quote(queue, safe='')}", "queue-broker")) \
        if queue else ("Queues", "/queues")
    return [page, ("Maintenance: the collectors' errors of the last hour (broker)", "/maintenance#collectors")]


def _periodic(labels: Mapping[str, str]) -> Pairs:
    """The periodic job named by the alert's `name` label (or `entry`): its row on /periodic."""
    entry = labels.get("entry") or labels.get("name")
    return [(f"Periodic job {entry}" if entry else "Periodic jobs",
             _path("/periodic", f"entry-{entry}" if entry else ""))]


_BY_METRIC: dict[str, Callable[[Mapping[str, str]], Pairs]] = {
    "queue_age_seconds": _eligible,
    "queue_depth": _queue_depth,
    "pickup_delay_seconds": _eligible,
    "claim_latency_seconds": _claim,
    "claim_buffers_per_call": _claim,
    "claim_rows_per_call": _claim,
    "claim_without_skip_locked_calls": _convoy,
    "throughput": _workers,
    "queue_throughput": _queues,
    "retry_rate": _retries,
    "failure_ratio": _dead_letters,
    "stuck_leases": _stuck,
    "stuck_lease_age_seconds": _stuck,
    "dead_letters": _dead_letters,
    "dead_letter_growth": _dead_letters,
    "error_group_new": _error_group,
    "workers_live": _workers,
    "workers_in_flight": _in_flight,
    "queue_depth_estimated": _queues,
    "queue_redeliveries": _broker,
    "external_source_errors": _external,
    "completed_rows_estimate": _archive,
    "vacuum_removed_nothing": _horizon,
    "table_xid_age": _wraparound,
    "table_mxid_age": _wraparound,
    "database_xid_age": _wraparound,
    "database_mxid_age": _wraparound,
    "xid_consumption_per_second": _wraparound,
    "idle_in_transaction_sessions": _horizon,
    "lwlock_waits": _multixact,
    "connections": _connections,
    "max_connections": _connections,
    "notify_queue_usage": _notify,
    "server_timeline": _wal,
    "scheduler_restarts": _scheduler,
    "queue_groups": _groups,
    "group_dead_letters": _group_dead_letters,
}

_BY_PREFIX: tuple[tuple[str, Callable[[Mapping[str, str]], Pairs]], ...] = (
    ("periodic_", _periodic),
    ("group_", _groups),  # group_depth, group_age_seconds, group_starving, group_series_folded
    ("xmin_horizon_", _horizon),
    ("lock_wait", _locks),
    ("multixact_", _multixact),
    ("slru_", _multixact),
    ("table_", _tables),
    ("vacuum_", _tables),
    ("wal_", _wal),
    ("replica_", _wal),
    ("collect", _collectors),  # collector_*, collection_*
)


# The metrics whose alert asks "why isn't this queue moving?": the alert page shows the answer.
WHY_METRICS = ("queue_age_seconds", "pickup_delay_seconds", "queue_depth", "stuck_leases", "stuck_lease_age_seconds")


def why_queue(metric: str | None, labels: Mapping[str, str] | None) -> str | None:
    """The queue whose "why isn't it moving?" answer belongs on the alert's page, or None (the
    metric is about something else, the alert names no one queue, or counts dead letters)."""
    labels = labels or {}
    if metric not in WHY_METRICS or "external" in labels or labels.get("state") == "failed":
        return None
    if labels.get("backend") == "nats":  # the answer reads skiplock.jobs and its workers, not the broker
        return None
    return _queue(labels)


def mapper(metric: str) -> Callable[[Mapping[str, str]], Pairs] | None:
    """The function that maps `metric`, or None when nothing does."""
    if metric in _BY_METRIC:
        return _BY_METRIC[metric]
    return next((fn for prefix, fn in _BY_PREFIX if metric.startswith(prefix)), None)


def look_here(metric: str | None, labels: Mapping[str, str] | None, console_url: str = "") -> list[Link]:
    """Where to look first for an alert of `metric` with `labels`, most useful first (empty
    when the metric maps to nothing, e.g. a rule that was removed)."""
    fn = mapper(metric or "")
    if fn is None:
        return []
    labels = {str(k): str(v) for k, v in (labels or {}).items()}
    if "external" in labels:  # a queue Skiplock did not create: its own page, filtered to the queue
        fn = _external_for(metric or "")
    elif labels.get("backend") == "nats" and "queue" in labels:  # a broker queue's series
        fn = _broker
    return [Link(label, path, absolute(console_url, path)) for label, path in fn(labels)]


def new_error_group(queue: str, fingerprint: str, example: str | None, console_url: str = "",
                    secret_keys: frozenset[str] = DEFAULT_KEYS) -> Link:
    """A dead-letter alert's extra first link when an error group is new (first seen around
    the time it fired): that group's jobs. The caller finds the group; this names the page.

    The link goes to webhook receivers and to every viewer of the alert, so its text and its
    filter are derived from the error with the values of `secret_keys` hidden
    (console.redaction): a fingerprint that still shows such a value (one stored before
    fingerprints hid them) is left out of the path, which then lists the queue's dead letters."""
    shown = redact_text(fingerprint, secret_keys)
    path = _path("/deadletters/jobs", queue=queue, fingerprint=fingerprint if shown == fingerprint else None)
    text = " ".join(redact_text(str(example or shown), secret_keys).split())[:80]
    return Link(f"New error group in {queue}: {text}", path, absolute(console_url, path))


DEAD_LETTER_METRICS = ("dead_letters", "dead_letter_growth")  # the alerts that look for a new error group
NEW_GROUPS_SHOWN = 3


def with_new_groups(links: list[Link], queue: str, groups: list[Mapping[str, Any]],
                    console_url: str = "", secret_keys: frozenset[str] = DEFAULT_KEYS) -> list[Link]:
    """`links` with one link per new error group of `queue` in front (at most NEW_GROUPS_SHOWN,
    in the order given). `groups` are rows of the error-groups query: fingerprint, example."""
    fresh = [new_error_group(queue, g["fingerprint"], g.get("example"), console_url, secret_keys)
             for g in groups[:NEW_GROUPS_SHOWN]]
    return fresh + links


def as_dicts(links: list[Link]) -> list[dict[str, str | None]]:
    return [link.as_dict() for link in links]


# --- runbooks ------------------------------------------------------------------------------------

DOCS_PATH = "docs/"  # a runbook under it is one of the pages the console serves at /docs/


def _is_url(runbook: str) -> bool:
    return runbook.startswith(("http://", "https://"))


def runbook_path(runbook: str | None, runbook_base_url: str = "") -> str | None:
    """The console path that serves `runbook` ("docs/alerts.md#queue_age" ->
    "/docs/alerts.md#queue_age"), or None when the console does not serve it: an http(s) URL, a
    path of another site ("/wiki/queue-age"), or any relative runbook once `runbook_base_url`
    is set (it is joined to that instead)."""
    if not runbook or _is_url(runbook) or runbook_base_url or not runbook.startswith(DOCS_PATH):
        return None
    return "/" + runbook


def runbook_url(runbook: str | None, *, runbook_base_url: str = "", console_url: str = "") -> str | None:
    """Where `runbook` opens for a reader outside the console (a webhook message): an http(s)
    URL as it is; any other runbook joined to `runbook_base_url` when that is set; a docs page
    the console serves under `console_url` when that is set; otherwise the runbook as written
    (a site path; a bare "docs/..." cannot be made absolute without one of the two settings)."""
    if not runbook or _is_url(runbook):
        return runbook or None
    if runbook_base_url:
        return urljoin(runbook_base_url, runbook)
    path = runbook_path(runbook)
    return (absolute(console_url, path) if path else None) or runbook


__all__ = ["DEAD_LETTER_METRICS", "NEW_GROUPS_SHOWN", "WHY_METRICS", "Link", "absolute", "as_dicts", "look_here",
           "mapper", "new_error_group", "runbook_path", "runbook_url", "why_queue", "with_new_groups"]

"""Evaluation: rules over the newest samples, the alert state machine, silences and acks.

    ok ──condition true──▶ pending ──held for `for`──▶ firing ──past the clear value──▶ ok (resolved)
         ◀─condition false──┘

- A pending alert that stops matching goes back to ok silently: nothing was sent, so a value
  that keeps crossing the threshold for less than `for` produces no notification at all.
- A firing alert resolves only when the value crosses back over the rule's clear value
  (hysteresis: by default the threshold moved by `[alerts] hysteresis` of its size), so a value
  hovering at the threshold does not flap between firing and resolved.
- Rules read the newest collection cycle's samples: a series missing from it (a drained queue)
  resolves its alert; a sample whose value is NULL ("not available") holds the state. When the collectors are stale no sample-based rule moves
  at all (the data cannot be trusted); the `collection_age_seconds` rule, computed from the
  clock, says so instead.
- Notifications: the first time a firing alert is neither silenced nor already notified, one
  "firing" notification per destination; then a "repeat" every `[alerts] repeat_interval`
  unless someone acknowledged it; a "resolved" when it resolves, if a firing notification went
  out. Each goes into the outbox in the same transaction as the transition that caused it.

One evaluation is one transaction under an advisory lock, so two evaluators never interleave.
This module sends nothing over the network (`outbox.Sender` does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from console import audit, caps
from console.actions import clean_reason
from console.alerts import context, outbox
from console.alerts.links import (
    DEAD_LETTER_METRICS,
    Link,
    absolute,
    as_dicts,
    look_here,
    runbook_url,
)
from console.alerts.rules import DERIVED_METRICS, Rule, RuleError, RuleSet, metric_labels
from console.alerts.transports import PAYLOAD_VERSION
from console.caps import Caps
from console.db import time_limited
from console.redaction import DEFAULT_KEYS, key_set
from console.sqlfiles import query

log = logging.getLogger(__name__)

EVALUATION_LOCK_KEY = 0x5C1B_A1E7
MAX_SILENCE = timedelta(days=30)


@dataclass(frozen=True)
class AlertSettings:
    repeat_interval: float = 4 * 3600.0
    hysteresis: float = 0.1
    series_window: float = 300.0
    delivery_timeout: float = 10.0
    allow_private_destinations: bool = False  # the address policy (console.alerts.addresses)
    delivery_interval: float = 10.0
    retry_base: float = 10.0
    retry_cap: float = 600.0
    give_up_after: float = 24 * 3600.0
    delivery_batch: int = 100
    console_url: str = ""
    runbook_base_url: str = ""
    keep_days: float = 30.0
    events_retention: timedelta = timedelta(days=30)
    statement_timeout_ms: int = 5000  # every evaluation and outbox statement runs under it
    # The [[databases]] name this evaluator runs in (the scheduler member's): every notification's
    # labels carry it. `link_prefix` ("/db/<name>" for a database other than the first) goes in
    # front of the notification's console paths so its links open that database's pages.
    database: str = "default"
    link_prefix: str = ""
    # Keys whose values a notification hides (a new error group's example and fingerprint in
    # look_here): the defaults and web.redact_keys. A webhook reaches people who are not
    # operators of this console.
    secret_keys: frozenset[str] = DEFAULT_KEYS

    @classmethod
    def from_config(cls, config) -> AlertSettings:
        if config is None or not hasattr(config, "alerts"):
            return cls()
        section = config.alerts
        values = {name: getattr(section, name) for name in cls.__dataclass_fields__ if hasattr(section, name)}
        database = getattr(config, "database", None)
        if database is not None and hasattr(database, "statement_timeout_ms"):
            values["statement_timeout_ms"] = database.statement_timeout_ms
        web = getattr(config, "web", None)
        if web is not None and hasattr(web, "redact_keys"):
            values["secret_keys"] = DEFAULT_KEYS | key_set(web.redact_keys)
        return cls(**values)

    def for_database(self, name: str, *, home: bool = True) -> AlertSettings:
        """These settings for the evaluator of database `name` (`home`: the first, unprefixed one)."""
        return replace(self, database=name, link_prefix="" if home else f"/db/{name}")


@dataclass
class Transition:
    alert_id: int
    rule: str
    labels: dict[str, str]
    kind: str  # pending, firing, repeat, resolved, ok (pending abandoned)
    value: float | None
    notifications: int = 0


@dataclass
class EvaluationReport:
    at: datetime
    rules: int = 0
    series: int = 0
    held_rules: list[str] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)

    @property
    def notifications(self) -> int:
        return sum(t.notifications for t in self.transitions)


def _key(rule: str, labels: Mapping[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
    return rule, tuple(sorted(labels.items()))


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def build_notification(*, kind: str, alert: Mapping[str, Any], rule: Rule | None, event_id: int,
                       value: float | None, at: datetime, settings: AlertSettings,
                       links: list[Link] | None = None, error_group: dict[str, Any] | None = None) -> dict[str, Any]:
    """The versioned notification document (payload version 1; see docs/alerts.md).

    The JSON webhook posts it as is; Slack and PagerDuty transports format it. It is written to
    the outbox once, so every retry sends the same body and the same idempotency key. `links`
    is the alert's look-here list (`context.look_here`, which the evaluator reads with the
    database); without it, the rule's metric alone decides (`links.look_here`). `error_group`
    (`context.error_group`, a new_error_group alert's group with its secrets hidden) goes in
    `alert.error_group` when given."""
    labels = dict(alert["labels"])
    # A docs runbook opens the console's copy (console/web/docs.py) or runbook_base_url's.
    runbook = runbook_url(rule.runbook if rule else None, runbook_base_url=settings.runbook_base_url,
                          console_url=settings.console_url)
    prefix = settings.link_prefix
    console_url = settings.console_url.rstrip("/") + f"{prefix}/alerts/{alert['id']}" if settings.console_url else None
    found = (links if links is not None else look_here(rule.metric, labels, settings.console_url)) if rule else []
    if prefix:  # the alert's database is not the first: its pages live under /db/<name>/
        found = [Link(k.label, prefix + k.path, absolute(settings.console_url, prefix + k.path)) for k in found]
    # A resolved notification says so, with the last value over the threshold (not the cleared one).
    summary = rule.summary_for(labels, "ok" if kind == "resolved" else "firing", value,
                               alert.get("last_over_value")) if rule else f"{alert['rule']} (rule removed)"
    # Which database the alert is about: added here, not stored (samples live in their database).
    labels = {**labels, "database": settings.database}
    document = {
        "version": PAYLOAD_VERSION,
        "event": kind,
        # Alert ids are per database: a database other than the first has its name in the key
        # (the first keeps the one-database form, so an upgrade does not change its keys).
        "idempotency_key": f"skiplock:{'db:' + settings.database + ':' if prefix else ''}alert:{alert['id']}:event:{event_id}",
        "occurred_at": _iso(at),
        "alert": {
            "id": alert["id"],
            "rule": alert["rule"],
            "labels": labels,
            "state": "ok" if kind == "resolved" else "firing",
            "severity": rule.severity if rule else "warning",
            "metric": rule.metric if rule else None,
            "op": rule.op if rule else None,
            "threshold": rule.threshold if rule else None,
            "value": value,
            "summary": summary,
            "runbook": runbook,
            # Where to look first (console/alerts/links.py): [{label, path, url}], url absolute
            # when alerts.console_url is set. Added in payload version 1 (receivers ignore it).
            "look_here": as_dicts(found),
            "started_at": _iso(alert.get("fired_at")),
            "resolved_at": _iso(at) if kind == "resolved" else None,
            "acknowledged_by": alert.get("acknowledged_by"),
        },
        "console_url": console_url,
    }
    if error_group is not None:  # added in payload version 1 (receivers ignore it)
        document["alert"]["error_group"] = error_group
    return document


class _Evaluation:
    """The state of one evaluation transaction (kept out of the public API)."""

    def __init__(self, conn: psycopg.Connection, ruleset: RuleSet, settings: AlertSettings, now: datetime):
        self.conn = conn
        self.cur = conn.cursor(row_factory=dict_row)
        self.ruleset = ruleset
        self.settings = settings
        self.now = now
        self.report = EvaluationReport(at=now)
        self.silences = self.cur.execute(query("alerts", "active_silences"), {"now": now}).fetchall()

    def silenced_by(self, rule: str, labels: Mapping[str, str]) -> int | None:
        for silence in self.silences:
            if silence["rule"] not in (None, rule):
                continue
            if all(labels.get(k) == v for k, v in silence["labels"].items()):
                return silence["id"]
        return None

    def event(self, alert_id: int, kind: str, value: float | None, detail: Any = None, actor: str | None = None) -> int:
        row = self.cur.execute(query("alerts", "insert_event"), {
            "alert_id": alert_id, "at": self.now, "kind": kind, "value": value, "actor": actor,
            "detail": None if detail is None else Jsonb(detail),
        }).fetchone()
        return row["id"]

    def set_state(self, rule: str, labels: Mapping[str, str], state: str, value: float | None,
                  over: bool = False) -> dict[str, Any]:
        """`over`: `value` meets the rule's condition (kept as the alert's last_over_value, which
        a resolved alert's summary shows)."""
        return self.cur.execute(query("alerts", "set_state"), {
            "rule": rule, "labels": Jsonb(dict(labels)), "state": state, "value": value, "now": self.now,
            "over": over,
        }).fetchone()

    def touch(self, alert_id: int, value: float | None, over: bool) -> None:
        self.cur.execute(query("alerts", "touch_alert"), {"id": alert_id, "value": value, "now": self.now,
                                                          "over": over})

    def notify(self, alert: Mapping[str, Any], rule: Rule | None, kind: str, value: float | None,
               detail: Any = None) -> Transition:
        event_id = self.event(alert["id"], kind, value, detail)
        targets = self.ruleset.targets(rule) if rule else list(self.ruleset.destinations.values())
        # A dead-letter alert's new error group goes first, as on the alert page (one savepoint).
        links = context.look_here(self.conn, rule.metric, alert["labels"], alert.get("fired_at") or self.now,
                                  console_url=self.settings.console_url,
                                  timeout_ms=self.settings.statement_timeout_ms,
                                  secret_keys=self.settings.secret_keys) if rule else []
        group = context.error_group(self.conn, rule.metric, alert["labels"],
                                    timeout_ms=self.settings.statement_timeout_ms,
                                    secret_keys=self.settings.secret_keys) if rule else None
        document = build_notification(kind=kind, alert=alert, rule=rule, event_id=event_id, value=value,
                                      at=self.now, settings=self.settings, links=links, error_group=group)
        sent = outbox.enqueue(self.conn, alert_id=alert["id"], event_id=event_id,
                              destinations=[d.name for d in targets], notification=document)
        if kind != "resolved":
            self.cur.execute(query("alerts", "mark_notified"), {"id": alert["id"], "now": self.now})
        transition = Transition(alert["id"], alert["rule"], dict(alert["labels"]), kind, value, sent)
        self.report.transitions.append(transition)
        return transition

    def fire(self, rule: Rule, labels: Mapping[str, str], value: float) -> None:
        alert = self.set_state(rule.name, labels, "firing", value, over=True)
        silence = self.silenced_by(rule.name, labels)
        if silence is None:
            self.notify(alert, rule, "firing", value)
        else:
            self.event(alert["id"], "firing", value, {"silenced_by": silence})
            self.report.transitions.append(Transition(alert["id"], rule.name, dict(labels), "firing", value))

    def resolve(self, current: Mapping[str, Any], rule: Rule | None, value: float | None, why: str) -> None:
        alert = self.set_state(current["rule"], current["labels"], "ok", value)
        if current["notified"]:
            # Good news goes out even under a silence: it closes the incident the firing opened.
            self.notify({**alert, "fired_at": current["fired_at"], "acknowledged_by": current["acknowledged_by"]},
                        rule, "resolved", value, {"why": why})
        else:
            self.event(alert["id"], "resolved", value, {"why": why, "notified": False})
            self.report.transitions.append(Transition(alert["id"], current["rule"], dict(current["labels"]),
                                                      "resolved", value))

    def keep_firing(self, current: Mapping[str, Any], rule: Rule, value: float | None) -> None:
        # Between the clear value and the threshold (hysteresis) it still fires, but is not over.
        self.touch(current["id"], value, over=value is not None and rule.condition(value))
        labels = current["labels"]
        silence = self.silenced_by(rule.name, labels)
        if silence is not None:
            return
        alert = {**current, "value": value}
        if not current["notified"]:
            self.notify(alert, rule, "firing", value, {"after_silence": True})
        elif current["acknowledged_by"] is None and current["last_notified_at"] is not None and \
                (self.now - current["last_notified_at"]).total_seconds() >= self.settings.repeat_interval:
            self.notify(alert, rule, "repeat", value)


def _series_for(rule: Rule, samples: Mapping[str, list[dict[str, Any]]]) -> list[tuple[dict[str, str], float | None]]:
    return [(row["labels"], row["value"]) for row in samples.get(rule.metric, []) if rule.matches(row["labels"])]


def _guard_state(rule: Rule, samples: Mapping[str, list[dict[str, Any]]]) -> bool | None:
    """True/False when the guard holds / does not; None when its series are there but "not
    available" (a collector failed: hold the alert as it is). No series at all is an answer:
    nothing is eligible when no queue reports eligible jobs (the queues drained and left the
    samples), so the guard does not hold. It was None, and workers_zero stayed firing for ever
    after the workers came back and finished the work."""
    if rule.guard is None:
        return True
    guard = rule.guard
    rows = [row for row in samples.get(guard.metric, []) if all(row["labels"].get(k) == v for k, v in guard.labels.items())]
    values = [row["value"] for row in rows if row["value"] is not None]
    if not rows:
        return False
    if not values:
        return None
    from console.alerts.rules import compare

    return any(compare(guard.op, v, guard.threshold) for v in values)


def evaluate(conn: psycopg.Connection, ruleset: RuleSet, settings: AlertSettings | None = None, *,
             now: datetime | None = None, only_derived: bool = False) -> EvaluationReport:
    """Evaluate every enabled rule once (one transaction) and return what changed.

    `now` defaults to the database's clock; tests pass it to step through time. `only_derived`
    evaluates just the rules over derived metrics (the dead man's switch), which the delivery
    job runs between collections so a stuck collector is noticed even though it writes nothing.
    """
    settings = settings or AlertSettings()
    with time_limited(conn, settings.statement_timeout_ms):
        conn.execute(query("alerts", "evaluation_lock"), {"key": EVALUATION_LOCK_KEY})
        if now is None:
            now = conn.execute("SELECT now()").fetchone()[0]
        ev = _Evaluation(conn, ruleset, settings, now)
        rules = [r for r in ruleset.enabled() if not only_derived or r.metric in DERIVED_METRICS]
        wanted = sorted({r.metric for r in rules if r.metric not in DERIVED_METRICS}
                        | {r.guard.metric for r in rules if r.guard})
        samples: dict[str, list[dict[str, Any]]] = {}
        if wanted:
            for row in ev.cur.execute(query("alerts", "latest_samples"),
                                      {"metrics": wanted, "now": now, "window": settings.series_window}):
                samples.setdefault(row["metric"], []).append(row)
        newest = ev.cur.execute(query("alerts", "newest_collection")).fetchone()["finished_at"]
        collection_age = None if newest is None else max(0.0, (now - newest).total_seconds())
        samples["collection_age_seconds"] = [{"labels": {}, "value": collection_age}]
        data_stale = collection_age is not None and collection_age > settings.series_window

        active = {_key(a["rule"], a["labels"]): a for a in ev.cur.execute(query("alerts", "active_alerts"))}
        ev.report.rules = len(rules)
        evaluated: set[str] = set()
        for rule in rules:
            derived = rule.metric in DERIVED_METRICS
            if data_stale and not derived:
                ev.report.held_rules.append(rule.name)
                continue
            guard = _guard_state(rule, samples)
            series = _series_for(rule, samples)
            evaluated.add(rule.name)
            seen = set()
            for labels, value in series:
                key = _key(rule.name, labels)
                seen.add(key)
                ev.report.series += 1
                current = active.get(key)
                state = current["state"] if current else "ok"
                if value is None or guard is None:
                    if current:
                        ev.touch(current["id"], value, over=value is not None and rule.condition(value))
                    continue
                if state == "ok":
                    if rule.condition(value) and guard:
                        if rule.for_seconds <= 0:
                            ev.fire(rule, labels, value)
                        else:
                            alert = ev.set_state(rule.name, labels, "pending", value, over=True)
                            ev.report.transitions.append(Transition(alert["id"], rule.name, labels, "pending", value))
                elif state == "pending":
                    if not (rule.condition(value) and guard):
                        alert = ev.set_state(rule.name, labels, "ok", value)
                        ev.report.transitions.append(Transition(alert["id"], rule.name, labels, "ok", value))
                    elif (now - current["state_since"]).total_seconds() >= rule.for_seconds:
                        ev.fire(rule, labels, value)
                    else:
                        ev.touch(current["id"], value, over=True)
                else:  # firing
                    if rule.still_firing(value, settings.hysteresis) and guard:
                        ev.keep_firing(current, rule, value)
                    else:
                        ev.resolve(current, rule, value, "value cleared" if guard else "guard condition no longer holds")
            # Series that vanished from the samples: their alerts end.
            for key, current in active.items():
                if key[0] != rule.name or key in seen:
                    continue
                if current["state"] == "pending":
                    alert = ev.set_state(current["rule"], current["labels"], "ok", None)
                    ev.report.transitions.append(Transition(alert["id"], rule.name, dict(current["labels"]), "ok", None))
                else:
                    ev.resolve(current, rule, None, "series no longer reported")
        # Alerts of rules that were removed or disabled end too (unless we only ran derived rules).
        if not only_derived:
            live = {r.name for r in rules}
            for current in active.values():
                if current["rule"] in live:
                    continue
                if current["state"] == "pending":
                    ev.set_state(current["rule"], current["labels"], "ok", None)
                else:
                    ev.resolve(current, ruleset.rules.get(current["rule"]), None, "rule removed or disabled")
        ev.cur.close()
    for t in ev.report.transitions:
        if t.kind in ("firing", "resolved", "repeat"):
            log.info("alert %s %s %s value=%s notifications=%d", t.rule, t.labels, t.kind, t.value, t.notifications)
    return ev.report


# --- operator actions: acknowledge and silence (audited) ----------------------------------------


class AlertActionError(ValueError):
    """An acknowledge or silence that cannot be done as asked (the message says why)."""


class AlertNotFound(AlertActionError):
    pass


class AlertNotFiring(AlertActionError):
    pass


def get_alert(conn: psycopg.Connection, alert_id: int) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("alerts", "get_alert"), {"id": alert_id}).fetchone()


def acknowledge(conn: psycopg.Connection, alert_id: int, *, actor: str, note: str | None = None) -> dict[str, Any]:
    """Mark a firing alert as being handled by `actor`: repeats stop until it resolves. The
    note is the audit row's reason: optional, and by console.actions' rule when given."""
    if not actor:
        raise AlertActionError("acknowledge needs the name of who is on it")
    try:
        note = clean_reason(note)
    except ValueError as exc:
        raise AlertActionError(str(exc).replace("reason:", "note:", 1)) from None
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("alerts", "acknowledge"), {"id": alert_id, "actor": actor, "note": note or None}).fetchone()
        if row is None:
            if get_alert(conn, alert_id) is None:
                raise AlertNotFound(f"alert {alert_id} does not exist")
            raise AlertNotFiring(f"alert {alert_id} is not firing; only a firing alert can be acknowledged")
        cur.execute(query("alerts", "insert_event"), {"alert_id": alert_id, "at": cur.execute("SELECT now() AS now").fetchone()["now"],
                                                      "kind": "acknowledged", "value": None, "actor": actor,
                                                      "detail": Jsonb({"note": note}) if note else None})
        audit.record(conn, actor=actor, action="alert_acknowledge", target=f"alert:{alert_id}",
                     selection={"rule": row["rule"], "labels": row["labels"]}, reason=note or None, rows=1)
    return row


def silence(conn: psycopg.Connection, *, rule: str | None, labels: Mapping[str, str] | None, duration: timedelta,
            reason: str, actor: str, ruleset: RuleSet | None = None,
            cap: int = Caps().silences) -> dict[str, Any]:
    """Stop notifications for alerts of `rule` (None: any rule) whose labels include `labels`,
    for `duration`. Alerts keep their state and still show; only notifications are held.
    CapReached when `cap` silences are in force already (caps.silences)."""
    try:
        reason = clean_reason(reason)
    except ValueError as exc:
        raise AlertActionError(str(exc)) from None
    if not reason:
        raise AlertActionError("a silence needs a reason (what is being done about it)")
    if not actor:
        raise AlertActionError("a silence needs the name of who set it")
    if not isinstance(duration, timedelta) or duration <= timedelta(0):
        raise AlertActionError("a silence needs a positive duration")
    if duration > MAX_SILENCE:
        raise AlertActionError("a silence may last at most 30 days")
    labels = dict(labels or {})
    if rule is not None and ruleset is not None:
        if rule not in ruleset.rules:
            raise AlertActionError(f"no alert rule named {rule!r}")
        try:
            allowed = metric_labels(ruleset.rules[rule].metric)
        except ValueError as exc:
            raise AlertActionError(str(exc)) from None
        unknown = sorted(set(labels) - set(allowed))
        if unknown:
            raise AlertActionError(f"rule {rule!r} has no label {', '.join(repr(u) for u in unknown)} (its labels: {', '.join(allowed) or 'none'})")
    if rule is None and not labels:
        raise AlertActionError("silencing every alert needs at least one label (or pick a rule)")
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        caps.serialise(conn, "silences")
        held = cur.execute(query("alerts", "caps_silences")).fetchone()["held"]
        caps.within(held, cap, what="silences in force in this database", setting="caps.silences",
                    advice="expire one, or silence by a broader label")
        starts = cur.execute("SELECT now() AS now").fetchone()["now"]
        row = cur.execute(query("alerts", "insert_silence"), {
            "rule": rule, "labels": Jsonb(labels), "starts_at": starts, "ends_at": starts + duration,
            "reason": reason, "actor": actor,
        }).fetchone()
        audit.record(conn, actor=actor, action="alert_silence", target=f"rule:{rule or '*'}",
                     selection={"rule": rule, "labels": labels, "until": row["ends_at"].isoformat()}, reason=reason,
                     rows=1)
    return row


def expire_silence(conn: psycopg.Connection, silence_id: int, *, actor: str) -> dict[str, Any]:
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("alerts", "expire_silence"), {"id": silence_id, "actor": actor}).fetchone()
        if row is None:
            raise AlertNotFound(f"silence {silence_id} does not exist or has already ended")
        audit.record(conn, actor=actor, action="alert_unsilence", target=f"silence:{silence_id}",
                     selection={"rule": row["rule"], "labels": row["labels"]})
    return row


# The new-error-group lookup of a firing dead-letter alert in a list (the overview's row, the
# alerts list and its API): one bounded read of the queue's groups per such alert.
LIST_GROUPS_TIMEOUT_MS = 500


# The alerts list's order: firing first, then by the rule's severity, then the longest in its
# state (an alert whose rule is gone ranks as severity None).
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2, None: 3}


def _listed(row: dict[str, Any], ruleset: RuleSet | None, silences: list[dict[str, Any]]) -> dict[str, Any]:
    """An active alert's row as the lists show it: its rule's severity, summary and runbook, the
    silence that holds it (if any), no look-here links yet, and its rule under `_rule`."""
    rule = ruleset.rules.get(row["rule"]) if ruleset else None
    silenced = next((s for s in silences if s["rule"] in (None, row["rule"])
                     and all(row["labels"].get(k) == v for k, v in s["labels"].items())), None)
    return {**row, "severity": rule.severity if rule else None, "metric": rule.metric if rule else None,
            "for_seconds": rule.for_seconds if rule else None,
            "summary": rule.summary_for(row["labels"], row["state"], row["value"], row["last_over_value"])
            if rule else row["rule"],
            "runbook": rule.runbook if rule else None, "condition": rule.describe() if rule else None,
            "look_here": [], "silence": silenced, "_rule": rule}


def _silences(cur) -> list[dict[str, Any]]:
    return cur.execute(query("alerts", "active_silences"), {"now": datetime.now().astimezone()}).fetchall()


def active_alerts(conn: psycopg.Connection, ruleset: RuleSet | None = None, *,
                  secret_keys: frozenset[str] = DEFAULT_KEYS, links_for: int | range | None = None) -> list[dict[str, Any]]:
    """Pending and firing alerts, each with its rule's severity/summary/runbook and silence, and
    its look-here links: for a firing dead-letter alert the new error groups of its queue first,
    as on the alert page and in its webhook (`context.look_here`, naming them with the values
    of `secret_keys` hidden). Links cost queries of their own: with `links_for` (a count, or a
    range of positions in the order returned), only those alerts get them, the others an empty
    list: a page that shows 20 of 10,000 alerts looks up 20 alerts' links (and the Alerts page
    reads only its page: `alerts_page`)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("alerts", "active_alerts")).fetchall()
        silences = _silences(cur)
    out = [_listed(row, ruleset, silences) for row in rows]
    out.sort(key=lambda a: (a["state"] != "firing", SEVERITY_RANK.get(a["severity"], 3), a["state_since"]))
    wanted = range(links_for) if isinstance(links_for, int) else links_for
    for index, alert in enumerate(out):
        rule = alert.pop("_rule")
        if rule is not None and (wanted is None or index in wanted):
            alert["look_here"] = _list_links(conn, rule, alert, secret_keys)
    return out


def _ranks(ruleset: RuleSet | None) -> dict[str, Any]:
    """The rules' severity ranks as two arrays, for the SQL that sorts as active_alerts does."""
    rules = sorted(ruleset.rules) if ruleset else []
    return {"rules": rules, "ranks": [SEVERITY_RANK.get(ruleset.rules[name].severity, 3) for name in rules]}


@dataclass
class AlertCounts:
    firing: int
    pending: int
    active: int


def alert_counts(conn: psycopg.Connection) -> AlertCounts:
    """How many alerts are firing, pending, and both."""
    row = conn.execute(query("alerts", "active_alerts_counts")).fetchone()
    return AlertCounts(*row)


def alerts_page(conn: psycopg.Connection, ruleset: RuleSet | None, *, offset: int, limit: int,
                secret_keys: frozenset[str] = DEFAULT_KEYS) -> list[dict[str, Any]]:
    """The active alerts at positions [offset, offset + limit) of active_alerts' order, as it
    makes them (with links), reading those rows only: the database sorts and pages, so a list
    of 10,000 alerts costs what its page costs."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("alerts", "active_alerts_page"),
                           {**_ranks(ruleset), "offset": offset, "limit": limit}).fetchall()
        silences = _silences(cur) if rows else []
    return _with_links(conn, [_listed(row, ruleset, silences) for row in rows], secret_keys)


def alert_names(conn: psycopg.Connection, ruleset: RuleSet | None) -> list[dict[str, Any]]:
    """Every active alert's {id, rule, labels}, in active_alerts' order (for a search)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("alerts", "active_alert_names"), _ranks(ruleset)).fetchall()


def alerts_by_id(conn: psycopg.Connection, ruleset: RuleSet | None, ids: list[int], *,
                 secret_keys: frozenset[str] = DEFAULT_KEYS) -> list[dict[str, Any]]:
    """The active alerts of `ids`, in that order, as active_alerts makes them (with links); an
    id no longer active is left out."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = {r["id"]: r for r in cur.execute(query("alerts", "active_alerts_by_id"), {"ids": list(ids)}).fetchall()}
        silences = _silences(cur) if rows else []
    return _with_links(conn, [_listed(rows[i], ruleset, silences) for i in ids if i in rows], secret_keys)


def _with_links(conn: psycopg.Connection, alerts: list[dict[str, Any]], secret_keys: frozenset[str]) -> list[dict[str, Any]]:
    for alert in alerts:
        rule = alert.pop("_rule")
        if rule is not None:
            alert["look_here"] = _list_links(conn, rule, alert, secret_keys)
    return alerts


def look_here_links(conn: psycopg.Connection, rule: Rule | None, row: dict[str, Any],
                    secret_keys: frozenset[str] = DEFAULT_KEYS) -> list[dict[str, str | None]]:
    """One active alert's look-here links (what `active_alerts` adds), for a caller that chose
    which alerts to show after the list was made."""
    return _list_links(conn, rule, row, secret_keys) if rule is not None else []


def _list_links(conn: psycopg.Connection, rule: Rule, row: dict[str, Any],
                secret_keys: frozenset[str] = DEFAULT_KEYS) -> list[dict[str, str | None]]:
    if row["state"] != "firing" or rule.metric not in DEAD_LETTER_METRICS:
        return as_dicts(look_here(rule.metric, row["labels"]))
    fired = row["fired_at"] or row["state_since"]
    return as_dicts(context.look_here(conn, rule.metric, row["labels"], fired, timeout_ms=LIST_GROUPS_TIMEOUT_MS,
                                      secret_keys=secret_keys))


def recent_events(conn: psycopg.Connection, *, limit: int = 50, before_id: int | None = None,
                  alert_id: int | None = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("alerts", "recent_events"),
                           {"limit": limit, "before_id": before_id, "alert_id": alert_id}).fetchall()


def recent_silences(conn: psycopg.Connection, *, limit: int = 50) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("alerts", "recent_silences"), {"limit": limit}).fetchall()


__all__ = ["AlertSettings", "EvaluationReport", "evaluate", "acknowledge", "silence", "expire_silence",
           "active_alerts", "alert_counts", "alerts_page", "alert_names", "alerts_by_id",
           "recent_events", "recent_silences", "build_notification", "RuleError"]

"""Alert commands: list rules and alerts, evaluate, deliver, test a webhook, read the delivery log,
acknowledge and silence. The same domain functions the scheduler and the web console call."""

from __future__ import annotations

import json

import click

from console import alerts, jsonbounds
from console.alerts import evaluate as ev
from console.alerts import outbox
from console.alerts.rules import format_value
from console.cli.common import DURATION, dsn_option, friendly_errors, main_group, who_and_why
from console.db import connect, require_schema


@main_group.group("alerts")
def alerts_group() -> None:
    """Alert rules, webhooks and deliveries (see docs/alerts.md)."""


def _conn(obj):
    conn = connect(obj.dsn, application_name="skiplock-cli")
    require_schema(conn)
    return conn


@alerts_group.command("list")
@dsn_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@friendly_errors
@click.pass_obj
def list_cmd(obj, as_json: bool) -> None:
    """The rules in force (and where each comes from), destinations, and active alerts."""
    with _conn(obj) as conn:
        ruleset = alerts.load(conn, obj.config)
        active = ev.active_alerts(conn, ruleset)
    if as_json:
        click.echo(json.dumps({
            "rules": [r.as_record() for r in ruleset.rules.values()],
            "destinations": [d.public() for d in ruleset.destinations.values()],
            "active": [{"id": a["id"], "rule": a["rule"], "labels": a["labels"], "state": a["state"],
                        "value": a["value"], "since": a["state_since"].isoformat(),
                        "acknowledged_by": a["acknowledged_by"]} for a in active],
        }, indent=2))
        return
    click.echo("RULES")
    for rule in sorted(ruleset.rules.values(), key=lambda r: r.name):
        flag = "" if rule.enabled else " (disabled)"
        shadow = " (UI version shadowed by the config file)" if rule.name in ruleset.shadowed_rules else ""
        click.echo(f"  {rule.name:<22} {rule.severity:<8} {rule.source:<7} {rule.describe()}{flag}{shadow}")
    click.echo("DESTINATIONS")
    if not ruleset.destinations:
        click.echo("  none configured: alerts show in the console but notify nobody")
    for dest in ruleset.destinations.values():
        click.echo(f"  {dest.name:<22} {dest.kind:<9} {dest.source:<7} {dest.display_url()}")
    click.echo("ACTIVE ALERTS")
    if not active:
        click.echo("  none: every rule is ok")
    for a in active:
        labels = ",".join(f"{k}={v}" for k, v in sorted(a["labels"].items()))
        extra = f" ack by {a['acknowledged_by']}" if a["acknowledged_by"] else ""
        extra += " silenced" if a["silence"] else ""
        click.echo(f"  #{a['id']:<5} {a['state']:<8} {a['rule']:<22} {labels:<24} value={format_value(a['value'])}{extra}")


@alerts_group.command("evaluate")
@dsn_option
@friendly_errors
@click.pass_obj
def evaluate_cmd(obj) -> None:
    """Evaluate every rule once now (the scheduler does this after each collection)."""
    with _conn(obj) as conn:
        report = alerts.evaluate_now(conn, obj.config)
    click.echo(f"{report.rules} rules, {report.series} series, {len(report.transitions)} transitions, "
               f"{report.notifications} notifications queued")
    for t in report.transitions:
        click.echo(f"  {t.kind:<9} {t.rule} {t.labels} value={format_value(t.value)}")
    if report.held_rules:
        click.echo(f"  collectors are stale: {len(report.held_rules)} rules held")


@alerts_group.command("deliver")
@dsn_option
@friendly_errors
@click.pass_obj
def deliver_cmd(obj) -> None:
    """Send what is due in the outbox once (the scheduler's delivery job does this)."""
    with _conn(obj) as conn:
        report = alerts.deliver(conn, obj.config)
    click.echo(f"delivered {report.delivered}, retrying {report.retried}, failed {report.failed}, "
               f"gave up {report.gave_up}")


@alerts_group.command("test-webhook")
@dsn_option
@click.argument("name")
@friendly_errors
@click.pass_obj
def test_webhook_cmd(obj, name: str) -> None:
    """Send a test notification to the destination NAME and print the receiver's answer."""
    with _conn(obj) as conn:
        ruleset = alerts.load(conn, obj.config)
        dest = ruleset.destinations.get(name)
        if dest is None:
            raise click.UsageError(f"no webhook named {name!r} (defined: {', '.join(sorted(ruleset.destinations)) or 'none'})")
        settings = alerts.settings(obj.config)
        result = outbox.send_test(conn, dest, timeout=settings.delivery_timeout,
                                  allow_private=settings.allow_private_destinations)
    click.echo(f"{name} ({dest.kind}, {dest.display_url()}): {'OK' if result.ok else 'FAILED'} {result.message}")
    if not result.ok:
        raise SystemExit(1)


@alerts_group.command("deliveries")
@dsn_option
@click.option("--limit", type=click.IntRange(1, 500), default=20, show_default=True)
@click.option("--destination", default=None, help="Only this destination.")
@friendly_errors
@click.pass_obj
def deliveries_cmd(obj, limit: int, destination: str | None) -> None:
    """The newest rows of the delivery log."""
    with _conn(obj) as conn:
        rows = outbox.delivery_log(conn, limit=limit, destination=destination)
    if not rows:
        click.echo("no deliveries yet")
    for r in rows:
        what = f"{r['event'] or 'test'} {r['rule'] or ''}".strip()
        status = r["http_status"] if r["http_status"] is not None else "-"
        click.echo(f"{r['at']:%Y-%m-%d %H:%M:%S} {r['destination']:<16} #{r['attempt']:<3} {r['outcome']:<11} "
                   f"{status!s:<4} {what} {r['error'] or ''}")


@alerts_group.command("ack")
@dsn_option
@click.argument("alert_id", type=int)
@click.option("--note", default=None, help="What you are doing about it (kept in the audit log as the reason).")
@who_and_why("alert_acknowledge")
@friendly_errors
@click.pass_obj
def ack_cmd(obj, alert_id: int, note: str | None, actor: str, reason: str | None) -> None:
    """Acknowledge a firing alert: repeats stop, the console shows who is on it."""
    with _conn(obj) as conn:
        ev.acknowledge(conn, alert_id, actor=actor, note=note or reason)
    click.echo(f"alert {alert_id} acknowledged")


@alerts_group.command("silence")
@dsn_option
@click.option("--rule", default=None, help="Rule name (default: every rule).")
@click.option("--label", "labels", multiple=True, help="key=value the alert's labels must include (repeatable).")
@click.option("--for", "duration", type=DURATION, required=True, help="How long, e.g. 30m, 2h.")
@who_and_why("alert_silence")
@friendly_errors
@click.pass_obj
def silence_cmd(obj, rule: str | None, labels: tuple[str, ...], duration, actor: str, reason: str) -> None:
    """Hold notifications of matching alerts for a while (audited)."""
    selector = {}
    for item in labels:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise click.UsageError(f"--label {item!r} is not key=value")
        selector[key] = value
    with _conn(obj) as conn:
        row = ev.silence(conn, rule=rule, labels=selector, duration=duration, reason=reason, actor=actor,
                         ruleset=alerts.load(conn, obj.config), cap=obj.config.caps.silences)
    click.echo(f"silence {row['id']} until {row['ends_at']:%Y-%m-%d %H:%M:%S %Z}")


@alerts_group.command("receiver")
@click.option("--port", type=click.IntRange(0, 65535), default=8099, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--secret", envvar="SKIPLOCK_RECEIVER_SECRET", default=None,
              help="Verify X-Skiplock-Signature with this secret [env: SKIPLOCK_RECEIVER_SECRET].")
def receiver_cmd(port: int, host: str, secret: str | None) -> None:
    """A local webhook receiver for trying alerts out: prints one line per notification (and
    whether its signature verifies). Point a `[[webhooks]]` entry of kind json at it."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from console.alerts.transports import verify

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                doc = jsonbounds.loads(body, "body")  # TooDeep is a ValueError: "not a notification"
                alert = doc.get("alert") or {}
                labels = ",".join(f"{k}={v}" for k, v in sorted((alert.get("labels") or {}).items()))
                line = f"{doc.get('event', '?'):<9} {alert.get('rule')} {labels} value={alert.get('value')} — {alert.get('summary')}"
            except (ValueError, AttributeError):
                line = f"not a Skiplock notification ({len(body)} bytes)"
            if secret:
                ok = verify(secret, self.headers.get("X-Skiplock-Signature", ""), body)
                line += " [signature ok]" if ok else " [SIGNATURE INVALID]"
            click.echo(line)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    click.echo(f"listening on http://{host}:{server.server_address[1]}/ (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()

"""Transports: one per destination kind, all the same shape.

The contract every transport keeps (tested against real local HTTP receivers):

- `render(notification)` is pure: it turns the versioned notification document (see
  `console.alerts.evaluate.build_notification` and docs/alerts.md) into the request body and
  headers for this kind of receiver. It never does I/O and never raises for a valid document.
- `send(notification)` makes exactly one HTTP POST, with the destination's custom headers, no
  redirects followed and a time limit (`timeout`, seconds) on connecting and on each read.
  It returns a `Delivered` when the receiver answered 2xx, and otherwise raises:
    * `TransientError` — worth retrying later: connection refused or reset, DNS failure, a
      timeout, HTTP 408, 429 and every 5xx. `retry_after` carries the receiver's Retry-After
      (seconds) when it sent one.
    * `PermanentError` — retrying cannot help: any other 4xx (400 bad payload, 401/403 bad
      credentials, 404/410 the webhook was deleted), a 3xx redirect, or a URL that cannot work.
  Nothing else escapes `send`.
- Error messages hold the status and at most 200 characters of the receiver's answer, with the
  destination's secret, URL and header values removed, so they are safe for the delivery log.
  Secrets and request bodies are never logged.

Transports do not retry, sleep or touch the database: `console.alerts.outbox` decides what a
failure means for the notification.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, ClassVar

from console.alerts.rules import Destination

USER_AGENT = "Skiplock-Alerts/1"
PAYLOAD_VERSION = 1
ANSWER_EXCERPT = 200


class DeliveryError(Exception):
    """A send that did not succeed. `status` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None, duration_ms: float | None = None):
        super().__init__(message)
        self.status = status
        self.duration_ms = duration_ms


class TransientError(DeliveryError):
    """Retry later (with backoff); `retry_after` is the receiver's hint in seconds, if any."""

    def __init__(self, message: str, *, status: int | None = None, duration_ms: float | None = None,
                 retry_after: float | None = None):
        super().__init__(message, status=status, duration_ms=duration_ms)
        self.retry_after = retry_after


class PermanentError(DeliveryError):
    """Do not retry: the receiver refused the request in a way a retry cannot change."""


@dataclass(frozen=True)
class Delivered:
    status: int
    answer: str
    duration_ms: float


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-Skiplock-Signature` value: `t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: str, header: str, body: bytes, *, tolerance: float = 300, now: float | None = None) -> bool:
    """What a receiver does (and what the tests do): recompute and compare in constant time,
    refusing signatures older than `tolerance` seconds (replays)."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((now or time.time()) - timestamp) > tolerance:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v1", ""))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102
        return None  # a 3xx reaches send() as an HTTPError: the URL is wrong, say so


_OPENER = urllib.request.build_opener(_NoRedirect())


class Transport:
    """Base class: subclasses set `kind` and implement `render`; `send` is shared."""

    kind: ClassVar[str] = ""

    def __init__(self, destination: Destination, *, timeout: float = 10.0):
        self.destination = destination
        self.timeout = timeout

    def render(self, notification: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        raise NotImplementedError

    def test_notification(self) -> dict[str, Any]:
        """The document "send test" renders: event "test", obviously not a real alert."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {
            "version": PAYLOAD_VERSION,
            "event": "test",
            "idempotency_key": f"skiplock:test:{self.destination.name}:{time.time_ns()}",
            "occurred_at": now,
            "alert": {
                "id": None, "rule": "test", "labels": {}, "state": "test", "severity": "info",
                "metric": None, "op": None, "threshold": None, "value": None,
                "summary": f"Test notification from Skiplock to {self.destination.name}",
                "runbook": None, "look_here": [], "started_at": now, "resolved_at": None, "acknowledged_by": None,
            },
            "console_url": None,
        }

    def send(self, notification: dict[str, Any]) -> Delivered:
        body, headers = self.render(notification)
        headers = {**self.destination.headers, "User-Agent": USER_AGENT, **headers}
        request = urllib.request.Request(self.destination.url, data=body, headers=headers, method="POST")
        started = time.monotonic()

        def elapsed() -> float:
            return round((time.monotonic() - started) * 1000, 1)

        try:
            with _OPENER.open(request, timeout=self.timeout) as response:
                answer = response.read(4096).decode("utf-8", "replace")
                return Delivered(status=response.status, answer=self._clean(answer), duration_ms=elapsed())
        except urllib.error.HTTPError as exc:
            status = exc.code
            try:
                answer = exc.read(4096).decode("utf-8", "replace")
            except Exception:  # noqa: BLE001 - the answer is a courtesy; the status decides
                answer = ""
            message = f"HTTP {status}" + (f": {self._clean(answer)}" if answer.strip() else "")
            if status in (408, 429) or status >= 500:
                raise TransientError(message, status=status, duration_ms=elapsed(),
                                     retry_after=_retry_after(exc.headers.get("Retry-After"))) from None
            if 300 <= status < 400:
                raise PermanentError(f"HTTP {status}: the receiver redirects; configure the final URL",
                                     status=status, duration_ms=elapsed()) from None
            raise PermanentError(message, status=status, duration_ms=elapsed()) from None
        except TimeoutError:
            raise TransientError(f"timed out after {self.timeout:g}s", duration_ms=elapsed()) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                raise TransientError(f"timed out after {self.timeout:g}s", duration_ms=elapsed()) from None
            raise TransientError(f"cannot connect: {self._clean(str(reason))}", duration_ms=elapsed()) from None
        except (ConnectionError, OSError) as exc:
            raise TransientError(f"connection failed: {self._clean(str(exc))}", duration_ms=elapsed()) from None
        except ValueError as exc:  # e.g. a header value urllib refuses
            raise PermanentError(f"request refused before sending: {self._clean(str(exc))}",
                                 duration_ms=elapsed()) from None

    def _clean(self, text: str) -> str:
        text = " ".join(self.destination.redact(text).split())
        return text[:ANSWER_EXCERPT] + ("…" if len(text) > ANSWER_EXCERPT else "")


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: ignore, use our own backoff


class JsonTransport(Transport):
    """The generic webhook: the notification document itself, signed when a secret is set.

    Headers: `Content-Type: application/json`, `X-Skiplock-Event` (firing, repeat, resolved,
    test), `Idempotency-Key` (the same on every retry of one transition to one destination),
    and `X-Skiplock-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
    """

    kind = "json"

    def render(self, notification):
        body = json.dumps(notification, separators=(",", ":"), sort_keys=True).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Skiplock-Event": str(notification.get("event")),
            "Idempotency-Key": str(notification.get("idempotency_key")),
        }
        if self.destination.secret:
            headers["X-Skiplock-Signature"] = sign(self.destination.secret, int(time.time()), body)
        return body, headers


def _look_here(alert: dict[str, Any]) -> list[dict[str, Any]]:
    """The alert's "look here" links that have an absolute URL (alerts.console_url is set)."""
    return [link for link in alert.get("look_here") or [] if isinstance(link, dict) and link.get("url")]


def _slack_text(text: Any) -> str:
    # Slack's link syntax <url|text>: '&', '<', '>' are escaped as entities, '|' would split it.
    text = str(text or "Look here").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "/")


_ICONS = {"firing": ":red_circle:", "repeat": ":red_circle:", "resolved": ":large_green_circle:", "test": ":white_circle:"}


class SlackTransport(Transport):
    """A Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat): `{"text": ...}` in
    Slack's link syntax. The URL itself is the credential, so it is displayed without its path."""

    kind = "slack"

    def render(self, notification):
        alert = notification.get("alert") or {}
        event = notification.get("event", "")
        labels = ", ".join(f"{k}={v}" for k, v in sorted((alert.get("labels") or {}).items()))
        title = f"{_ICONS.get(event, '')} *{event.upper()}* {alert.get('rule')}" + (f" ({labels})" if labels else "")
        lines = [title.strip(), str(alert.get("summary") or "")]
        if alert.get("severity"):
            lines.append(f"severity: {alert['severity']}")
        links = [f"<{link['url']}|{_slack_text(link.get('label'))}>" for link in _look_here(alert)]
        if alert.get("runbook"):
            links.append(f"<{alert['runbook']}|Runbook>")
        if notification.get("console_url"):
            links.append(f"<{notification['console_url']}|Console>")
        if links:
            lines.append(" · ".join(links))
        body = json.dumps({"text": "\n".join(line for line in lines if line)}).encode()
        return body, {"Content-Type": "application/json"}


_PD_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


class PagerDutyTransport(Transport):
    """PagerDuty Events API v2: firing and repeat send `trigger`, resolved sends `resolve`, with
    `dedup_key` = `skiplock:<rule>:<alert id>:<episode start>` so PagerDuty folds repeats into one
    incident, the resolve closes it, and the next episode opens a new one. The routing key is the destination's `secret`. A "send test" sends a
    `resolve` for a key that has no incident: PagerDuty checks the routing key and answers 202
    without paging anyone."""

    kind = "pagerduty"

    def render(self, notification):
        alert = notification.get("alert") or {}
        event = notification.get("event")
        if alert.get("id") is None:
            dedup = f"skiplock:test:{self.destination.name}"
        else:  # one incident per firing episode: the episode's start keeps a later one apart
            dedup = f"skiplock:{alert.get('rule')}:{alert.get('id')}:{alert.get('started_at')}"
        document: dict[str, Any] = {
            "routing_key": self.destination.secret or "",
            "event_action": "resolve" if event in ("resolved", "test") else "trigger",
            "dedup_key": dedup,
        }
        if document["event_action"] == "trigger":
            document["payload"] = {
                "summary": str(alert.get("summary") or alert.get("rule"))[:1024],
                "source": "skiplock",
                "severity": _PD_SEVERITY.get(alert.get("severity"), "warning"),
                "timestamp": notification.get("occurred_at"),
                "component": alert.get("metric"),
                "group": ",".join(f"{k}={v}" for k, v in sorted((alert.get("labels") or {}).items())) or None,
                "custom_details": {k: alert.get(k) for k in ("rule", "labels", "value", "op", "threshold")},
            }
            links = [{"href": link["url"], "text": str(link.get("label") or "Look here")} for link in _look_here(alert)]
            if alert.get("runbook"):
                links.append({"href": alert["runbook"], "text": "Runbook"})
            if links:
                document["links"] = links
        body = json.dumps(document).encode()
        return body, {"Content-Type": "application/json"}


TRANSPORTS: dict[str, type[Transport]] = {t.kind: t for t in (JsonTransport, SlackTransport, PagerDutyTransport)}


def transport_for(destination: Destination, *, timeout: float = 10.0) -> Transport:
    return TRANSPORTS[destination.kind](destination, timeout=timeout)

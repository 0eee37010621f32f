"""Transports: one per destination kind, all the same shape.

The contract every transport keeps (tested against real local HTTP receivers):

- `render(notification)` is pure: it turns the versioned notification document (see
  `console.alerts.evaluate.build_notification` and docs/alerts.md) into the request body and
  headers for this kind of receiver. It never does I/O and never raises for a valid document.
- `send(notification)` makes exactly one HTTP POST, with the destination's custom headers, no
  redirects followed and one deadline (`timeout`, seconds) for the whole exchange: connect,
  TLS handshake, sending and reading the answer together (a receiver that trickles a byte a
  second is cut off at the deadline, not at each read). The host is resolved first and every
  address checked against the address policy (`console.alerts.addresses`; unless
  `allow_private`), then the connection goes to a checked address, never to the name again.
  It returns a `Delivered` when the receiver answered 2xx, and otherwise raises:
    * `TransientError` — worth retrying later: connection refused or reset, DNS failure, a
      timeout, HTTP 408, 429 and every 5xx, an answer that is not HTTP. `retry_after` carries the receiver's Retry-After
      (seconds) when it sent one.
    * `PermanentError` — retrying cannot help: any other 4xx (400 bad payload, 401/403 bad
      credentials, 404/410 the webhook was deleted), a 3xx redirect, a URL that cannot work, or
      an address the policy refuses.
  Nothing else escapes `send`.
- Error messages hold the status and at most 200 characters of the receiver's answer, with the
  destination's secret, URL and header values removed, so they are safe for the delivery log.
  Secrets and request bodies are never logged.

DNS resolution happens before the deadline starts (the system resolver has its own time limits).
Transports do not retry, sleep or touch the database: `console.alerts.outbox` decides what a
failure means for the notification.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import io
import json
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

from console.alerts.addresses import AddressRefused, resolve
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


class _DeadlineSocket:
    """A connected socket whose every blocking call gets only the time left until `deadline`:
    what http.client needs (sendall, makefile, close) and nothing more. Like a real socket, it
    stays open while a reader made by makefile() is open (http.client closes the connection
    before the answer's body is read when the receiver says `Connection: close`)."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock = sock
        self._deadline = deadline
        self._readers = 0
        self._closed = False

    def arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("delivery deadline passed")
        self._sock.settimeout(left)

    def sendall(self, data) -> None:
        self.arm()
        self._sock.sendall(data)  # since Python 3.5 the timeout bounds the whole sendall

    def recv_into(self, buffer) -> int:
        self.arm()
        return self._sock.recv_into(buffer)

    def makefile(self, mode: str = "rb", *args, **kwargs):
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self))

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self._sock.close()

    def close(self) -> None:
        self._closed = True
        if self._readers <= 0:
            self._sock.close()


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket):
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._sock.reader_closed()
        super().close()


def _open(addresses: list[tuple[int, tuple]], deadline: float) -> socket.socket:
    """Connect to the first of the checked addresses that answers before the deadline."""
    error: OSError | None = None
    for family, sockaddr in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("delivery deadline passed")
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(left)
            sock.connect(sockaddr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
            if isinstance(exc, TimeoutError):
                raise
    raise error or OSError("no address to connect to")


class _PinnedHTTP(http.client.HTTPConnection):
    """HTTP to `host` (its Host header) over a connection to an address checked beforehand."""

    def __init__(self, host: str, port: int, *, addresses: list[tuple[int, tuple]], deadline: float,
                 tls: ssl.SSLContext | None = None):
        super().__init__(host, port)
        self._addresses, self._deadline, self._tls = addresses, deadline, tls

    def connect(self) -> None:
        sock = _open(self._addresses, self._deadline)
        if self._tls is not None:
            try:
                sock.settimeout(max(0.001, self._deadline - time.monotonic()))
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)  # verifies the name, not the IP
            except BaseException:
                sock.close()
                raise
        self.sock = _DeadlineSocket(sock, self._deadline)


class Transport:
    """Base class: subclasses set `kind` and implement `render`; `send` is shared."""

    kind: ClassVar[str] = ""

    def __init__(self, destination: Destination, *, timeout: float = 10.0, allow_private: bool = False):
        self.destination = destination
        self.timeout = timeout
        self.allow_private = allow_private

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
        headers = {**self.destination.headers, "User-Agent": USER_AGENT, "Connection": "close", **headers}
        parts = urlsplit(self.destination.url)
        host, https = parts.hostname or "", parts.scheme == "https"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        started = time.monotonic()

        def elapsed() -> float:
            return round((time.monotonic() - started) * 1000, 1)

        connection: _PinnedHTTP | None = None
        response: http.client.HTTPResponse | None = None
        try:
            port = parts.port or (443 if https else 80)
            addresses = resolve(host, port, allow_private=self.allow_private)
            deadline = time.monotonic() + self.timeout
            connection = _PinnedHTTP(host, port, addresses=addresses, deadline=deadline,
                                     tls=ssl.create_default_context() if https else None)
            connection.request("POST", path, body=body, headers=headers)
            response = connection.getresponse()
            status = response.status
            try:
                answer = response.read(4096).decode("utf-8", "replace")
            except (OSError, http.client.HTTPException):  # the answer is a courtesy; the status decides
                answer = ""
            retry_after = response.headers.get("Retry-After")
        except AddressRefused as exc:
            raise PermanentError(f"destination {self.destination.name!r}: {exc}", duration_ms=elapsed()) from None
        except TimeoutError:
            raise TransientError(f"timed out after {self.timeout:g}s (connect, send and answer together)",
                                 duration_ms=elapsed()) from None
        except socket.gaierror as exc:
            raise TransientError(f"cannot connect: cannot resolve {host}: {self._clean(str(exc.strerror or exc))}",
                                 duration_ms=elapsed()) from None
        except (ConnectionError, OSError) as exc:
            raise TransientError(f"cannot connect: {self._clean(str(exc))}", duration_ms=elapsed()) from None
        except http.client.HTTPException as exc:
            raise TransientError(f"the receiver's answer is not HTTP: {self._clean(exc.__class__.__name__)}",
                                 duration_ms=elapsed()) from None
        except ValueError as exc:  # e.g. a header value http.client refuses
            raise PermanentError(f"request refused before sending: {self._clean(str(exc))}",
                                 duration_ms=elapsed()) from None
        finally:
            if response is not None:
                response.close()
            if connection is not None:
                connection.close()
        if 200 <= status < 300:
            return Delivered(status=status, answer=self._clean(answer), duration_ms=elapsed())
        message = f"HTTP {status}" + (f": {self._clean(answer)}" if answer.strip() else "")
        if status in (408, 429) or status >= 500:
            raise TransientError(message, status=status, duration_ms=elapsed(), retry_after=_retry_after(retry_after))
        if 300 <= status < 400:
            raise PermanentError(f"HTTP {status}: the receiver redirects; configure the final URL",
                                 status=status, duration_ms=elapsed())
        raise PermanentError(message, status=status, duration_ms=elapsed())

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


def _slack_text(value: Any) -> str:
    """Slack reads <...> as a link or a mention (<!channel>): a queue name or a summary must not
    become a link to somewhere else. Slack's escaping is exactly these three."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_link(url: str, label: str) -> str:
    return f"<{_slack_text(url).replace('|', '%7C')}|{label}>"


class SlackTransport(Transport):
    """A Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat): `{"text": ...}` in
    Slack's link syntax. The URL itself is the credential, so it is displayed without its path."""

    kind = "slack"

    def render(self, notification):
        alert = notification.get("alert") or {}
        event = notification.get("event", "")
        labels = ", ".join(f"{k}={v}" for k, v in sorted((alert.get("labels") or {}).items()))
        title = f"{_ICONS.get(event, '')} *{event.upper()}* {_slack_text(alert.get('rule'))}" + (
            f" ({_slack_text(labels)})" if labels else "")
        lines = [title.strip(), _slack_text(alert.get("summary") or "")]
        if alert.get("severity"):
            lines.append(f"severity: {_slack_text(alert['severity'])}")
        links = [_slack_link(link["url"], _slack_text(link.get("label"))) for link in _look_here(alert)]
        if alert.get("runbook"):
            links.append(_slack_link(alert["runbook"], "Runbook"))
        if notification.get("console_url"):
            links.append(_slack_link(notification["console_url"], "Console"))
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
            # A database other than the first has its name in the key (ids are per database).
            scope = notification.get("idempotency_key") or ""
            scope = f"db:{(alert.get('labels') or {}).get('database')}:" if scope.startswith("skiplock:db:") else ""
            dedup = f"skiplock:{scope}{alert.get('rule')}:{alert.get('id')}:{alert.get('started_at')}"
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


def transport_for(destination: Destination, *, timeout: float = 10.0, allow_private: bool = False) -> Transport:
    return TRANSPORTS[destination.kind](destination, timeout=timeout, allow_private=allow_private)

"""Webhook destinations: the model (`Destination`, which keeps its secret out of logs and pages)
and its validation (`parse_destination`). Where they are loaded from and saved to is
`console.alerts.rules`; the address policy is `console.alerts.addresses`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from console.alerts.model import NAME, RuleError, check_url

KINDS = ("json", "slack", "pagerduty")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
# Headers the transports set themselves; a destination may not replace them.
RESERVED_HEADERS = {"content-type", "content-length", "host", "x-skiplock-signature", "idempotency-key"}


@dataclass(frozen=True)
class Destination:
    """Where notifications go. `secret` signs (json) or is the routing key (pagerduty); it is
    never rendered back to a browser nor written to a log (see `public()`)."""

    name: str
    kind: str
    url: str
    secret: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    source: str = "file"

    def __repr__(self) -> str:  # keep secrets and webhook paths out of tracebacks and logs
        return f"Destination(name={self.name!r}, kind={self.kind!r}, url={self.display_url()!r})"

    def display_url(self) -> str:
        """The URL with its path hidden for Slack (the path is the credential) and any query or
        userinfo removed."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        path = parts.path if self.kind == "json" else ("/…" if parts.path not in ("", "/") else "")
        return f"{parts.scheme}://{host}{path}"

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "url": self.display_url(), "has_secret": bool(self.secret),
                "headers": sorted(self.headers), "source": self.source}

    def redact(self, text: str) -> str:
        """Remove this destination's secret, URL and header values from a message."""
        for sensitive in [self.secret, self.url, *self.headers.values()]:
            if sensitive and len(sensitive) >= 4:
                text = text.replace(sensitive, "***")
        return text


DESTINATION_FIELDS = {"name", "url", "kind", "secret", "headers"}


def parse_destination(record: Mapping[str, Any], *, source: str = "file", where: str = "") -> Destination:
    name = record.get("name") if isinstance(record, Mapping) else None
    label = f"webhook {name!r}" if isinstance(name, str) and name else "webhook (unnamed)"
    if where:
        label += f" {where}"
    try:
        if not isinstance(record, Mapping):
            raise ValueError("must be a table")
        unknown = sorted(set(record) - DESTINATION_FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(DESTINATION_FIELDS))})")
        if not isinstance(name, str) or not NAME.match(name):
            raise ValueError("name must be lower-case letters, digits, '_', '.', '-' (starting with a letter)")
        kind = record.get("kind", "json") or "json"
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} must be one of {', '.join(KINDS)}")
        url = check_url(record.get("url"))
        secret = record.get("secret") or None
        if secret is not None and not isinstance(secret, str):
            raise ValueError("secret must be a string")
        if kind == "pagerduty" and not secret:
            raise ValueError("a pagerduty destination needs secret = the integration's routing key")
        headers = record.get("headers") or {}
        if not isinstance(headers, Mapping):
            raise ValueError("headers must be a table of name = \"value\"")
        clean: dict[str, str] = {}
        for key, value in headers.items():
            if not isinstance(key, str) or not _HEADER_NAME.match(key):
                raise ValueError(f"header name {key!r} is not a valid HTTP header name")
            if key.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {key!r} is set by Skiplock and cannot be overridden")
            if not isinstance(value, str) or "\r" in value or "\n" in value:
                raise ValueError(f"header {key!r} must be a one-line string")
            clean[key] = value
    except ValueError as exc:
        raise RuleError(f"{label}: {exc}") from None
    return Destination(name=name, kind=kind, url=url, secret=secret, headers=clean, source=source)

"""What the demo writes into its config file and its cluster: short intervals, demo alert
thresholds with a local webhook receiver, and quick autovacuum. Only settings this installation
declares (`console.config.SETTINGS`) are written.
"""

from __future__ import annotations

import json
from typing import Any

from console.config import SETTINGS

# The demo's configuration: short leases and intervals so that a few minutes show the whole
# life of a job. Only settings this installation knows are written (an unknown key would be
# refused by the config loader); the others are listed as not applied.
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
    "scheduler.reap_interval": 30.0,  # the default: stuck leases stay visible for a few samples
    "scheduler.archive_interval": 60.0,
    "scheduler.election_interval": 5.0,
    "maintenance.archive_after": "2m",  # completed jobs leave the hot table after two minutes
    "maintenance.archive_retention": "1d",
    # The demo's webhook receiver listens on loopback, which the address policy refuses by default.
    "alerts.allow_private_destinations": True,
    # The demo's console is `skiplock serve` (development mode); should it ever run in production
    # mode, a local Prometheus may still scrape the demo's /metrics without a token.
    "web.metrics_public": True,
}

# The PostgreSQL settings of the demo cluster: the defaults plus a quick autovacuum so dead
# tuples are visibly removed (and visibly not, while a session holds the horizon).
CLUSTER_SETTINGS = {
    "synchronous_commit": "off",  # demo data: a lost last transaction after a crash is fine
    "autovacuum_naptime": "10s",
    "log_min_messages": "warning",
}


# Alert rules with demo thresholds (they replace the defaults of the same name), so the bursts,
# the killed worker and the idle session fire alerts within minutes, and a local receiver.
DEMO_ALERTS = """\
# Demo alert thresholds, lower than the defaults so that alerts fire (and resolve) within minutes.
[[webhooks]]
name = "demo-receiver"
kind = "json"
url = "http://127.0.0.1:{port}/hook"
secret = "{secret}"

[[alerts.rules]]
name = "queue_age"
metric = "queue_age_seconds"
op = ">"
threshold = 30
clear = 10
for = "20s"
severity = "critical"
summary = "Oldest eligible job in queue {{queue}} has waited {{value}}s (over {{threshold}}s)"
runbook = "docs/alerts.md#queue_age"

[[alerts.rules]]
name = "stuck_leases"
metric = "stuck_leases"
op = ">"
threshold = 0
for = "10s"
severity = "warning"
summary = "{{value}} job(s) in queue {{queue}} hold an expired lease (a worker died)"
runbook = "docs/alerts.md#stuck_leases"

[[alerts.rules]]
name = "vacuum_blocked"
metric = "xmin_horizon_age_seconds"
labels = {{ holder = "any" }}
op = ">"
threshold = 30
clear = 5
for = "10s"
severity = "warning"
summary = "The xmin horizon has been held for {{value}}s: vacuum cannot remove dead rows"
runbook = "docs/alerts.md#vacuum_blocked"
"""


def has_setting(dotted: str) -> bool:
    return any(s.dotted == dotted for s in SETTINGS)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))

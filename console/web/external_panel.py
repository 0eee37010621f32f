"""The watched systems' panel ([[external_queues]]), shown on the overview and the Queues page:
a module of its own so that neither page imports the other."""

from __future__ import annotations

from console.web import state
from console.web.database import run_panel


def external_panel():
    """The [[external_queues]] panel's data: each source's queues worst first (stuck leases,
    the longest wait, dead letters, backlog), at most web.list_limit of them with the count of
    the rest (`queues_more`): another library's queues are as many as its producers make."""
    from console.collectors.external import latest_sources

    found = run_panel(latest_sources)
    if found.ok:
        limit = state().config.web.list_limit
        for src in found.data or []:
            ranked = sorted(src["queues"], key=lambda r: (
                -(r.get("stuck_leases") or 0), -(r.get("queue_age_seconds") or 0) if r.get("eligible") else 0,
                -(r.get("dead_letters") or 0), -(r.get("eligible") or 0), r["queue"]))
            src["queues"], src["queues_more"] = ranked[:limit], max(len(ranked) - limit, 0)
    return found

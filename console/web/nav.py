"""The navigation bar: one list, in one place. Add a line for your page.

An entry whose endpoint is not registered (its blueprint is not in this build) is skipped,
and an entry with a role is shown only to users who have it.
"""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask


@dataclass(frozen=True)
class NavEntry:
    endpoint: str
    label: str
    order: int = 50
    role: str = "viewer"
    several_databases: bool = False  # shown only when [[databases]] lists more than one


NAV: list[NavEntry] = [
    NavEntry("fleet.index", "Databases", 5, several_databases=True),
    NavEntry("overview.index", "Overview", 10),
    NavEntry("queues.index", "Queues", 20),
    NavEntry("jobs.index", "Jobs", 30),
    NavEntry("deadletters.index", "Dead letters", 40),
    NavEntry("workers.index", "Workers", 50),
    NavEntry("periodic.index", "Periodic", 55),
    NavEntry("health.index", "Database", 60),
    NavEntry("alerts.index", "Alerts", 70),
    NavEntry("timeline.index", "Timeline", 75),
    NavEntry("advisor.index", "Advisor", 80),
    NavEntry("maintenance.index", "Maintenance", 90),
    NavEntry("auditlog.index", "Audit", 100),
    NavEntry("admin.users", "Users", 110, role="admin"),
]


def entries_for(app: Flask, user) -> list[NavEntry]:
    if user is None:
        return []
    registry = app.extensions["skiplock"].databases
    several = registry is not None and len(registry) > 1
    return sorted(
        (e for e in NAV if e.endpoint in app.view_functions and user.can(e.role)
         and (several or not e.several_databases)),
        key=lambda e: e.order,
    )

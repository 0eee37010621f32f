"""The `[maintenance]` settings as keyword arguments for the maintenance functions.

    s = MaintenanceSettings.from_config(config)
    archive_completed(conn, **s.archive_kwargs())
    apply_retention(conn, **s.retention_kwargs())
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass(frozen=True)
class MaintenanceSettings:
    archive_after: timedelta = timedelta(hours=1)
    archive_mode: str = "archive"
    archive_retention: timedelta = timedelta(days=30)
    partitions_ahead: int = 7
    batch_size: int = 1000
    rate: float | None = None
    pause_ms: float = 10.0
    bulk_rate: float | None = None
    statement_timeout_ms: int = 10_000
    error_history: int = 20

    @classmethod
    def from_config(cls, config: Any) -> MaintenanceSettings:
        m = config.maintenance
        return cls(
            archive_after=m.archive_after,
            archive_mode=m.archive_mode,
            archive_retention=m.archive_retention,
            partitions_ahead=m.partitions_ahead,
            batch_size=m.batch_size,
            rate=m.rate or None,  # 0 in the config means "no cap"
            pause_ms=m.pause_ms,
            bulk_rate=m.bulk_rate or None,
            statement_timeout_ms=m.statement_timeout_ms,
            error_history=config.queue.error_history,
        )

    def archive_kwargs(self) -> dict[str, Any]:
        return {"older_than": self.archive_after, "mode": self.archive_mode, "batch_size": self.batch_size,
                "rate": self.rate, "pause_ms": self.pause_ms, "days_ahead": self.partitions_ahead,
                "keep": self.archive_retention, "statement_timeout_ms": self.statement_timeout_ms}

    def retention_kwargs(self) -> dict[str, Any]:
        return {"retention": self.archive_retention, "batch_size": self.batch_size, "rate": self.rate,
                "pause_ms": self.pause_ms, "days_ahead": self.partitions_ahead,
                "statement_timeout_ms": self.statement_timeout_ms}

"""The advisor: the production checklist evaluated live, and the "is this outgrowing
PostgreSQL?" verdict over the stored history.

- `run_checks(conn, config)` -> `Report` of `CheckResult`s (ok / warn / fail / unknown, with
  evidence, what to do and a docs link); `CHECKS` lists them.
- `evaluate_verdict(conn)` -> `Verdict` over the stored samples (default 7 days).
- `verdict_line(conn)` -> the one line the overview page shows.

The checks live in one module per family, as the page groups them (`claim_path`, `locks`,
`leases`, `retries`, `hygiene`, `multixact`, `server`, sharing `base`); `checks` runs them.

Faces (the CLI's `skiplock check`, the web page, `/api/v1/advisor`) call these; this package
imports no face.
"""

from console.advisor.checks import (
    CHECKS,
    FAIL,
    OK,
    UNKNOWN,
    WARN,
    CheckResult,
    Report,
    UnknownCheck,
    check_ids,
    run_checks,
)
from console.advisor.verdict import Verdict, evaluate_verdict, verdict_line

__all__ = ["CHECKS", "FAIL", "OK", "UNKNOWN", "WARN", "CheckResult", "Report", "UnknownCheck", "Verdict",
           "check_ids", "evaluate_verdict", "run_checks", "verdict_line"]

"""Locks and transactions: nobody waits on row locks of the jobs tables, and no transaction holds
them open across work.
"""

from __future__ import annotations

import re

from console.advisor.base import FAIL, OK, WARN, Family, Outcome, Probe, seconds, session

FAMILY = Family("Locks and transactions")


_LOCKING_CLAUSE = re.compile(r"\bfor\s+(?:no\s+key\s+update|update|key\s+share|share)\b", re.IGNORECASE)
_SKIPS = re.compile(r"\bskip\s+locked\b|\bnowait\b", re.IGNORECASE)


def waits_for_rows(query_text: str) -> bool:
    """A SELECT ... FOR UPDATE/SHARE without SKIP LOCKED or NOWAIT: it queues behind row locks."""
    return bool(_LOCKING_CLAUSE.search(query_text)) and not _SKIPS.search(query_text)


@FAMILY.check("row-lock-waits", "Claims skip locked rows: nobody waits on jobs-table row locks")
def row_lock_waits(probe: Probe) -> Outcome:
    waiters = probe.rows("lock_waiters")
    if not waiters:
        return Outcome(OK, "no session is waiting on a lock of the jobs tables")
    blocker_pids = sorted({pid for w in waiters for pid in (w["blocked_by"] or [])})
    blockers = {b["pid"]: b for b in probe.rows("sessions", pids=blocker_pids)} if blocker_pids else {}
    evidence = []
    convoy = []
    for w in waiters:
        evidence.append(f"waiting {seconds(w['waiting_s'])} on {w['wait_event']}: {session(w)}")
        for pid in w["blocked_by"] or []:
            b = blockers.get(pid)
            evidence.append(f"  blocked by pid {pid}" + (
                f" [{b['application_name'] or '(no application_name)'}] {b['state']}, transaction open "
                f"{seconds(b['xact_s'])}: {' '.join((b['query'] or '').split())[:160]}" if b else " (a prepared transaction or gone)"))
        if waits_for_rows(w["query"] or ""):
            convoy.append(w)
    longest = max((w["waiting_s"] or 0) for w in waiters)
    data = {"waiters": len(waiters), "longest_wait_s": longest,
            "applications": sorted({w["application_name"] or "" for w in waiters}),
            "plain_for_update": [w["pid"] for w in convoy]}
    remedy = ("Claim with FOR UPDATE SKIP LOCKED (Skiplock's claim does): a plain FOR UPDATE waits behind the "
              "row another worker holds, and the workers form a convoy. Find the application by its "
              "application_name and fix its claim; if a blocker sits idle in a transaction, end it "
              "(SELECT pg_terminate_backend(pid)) and fix the code that holds it open.")
    if convoy:
        apps = ", ".join(sorted({w["application_name"] or "(no application_name)" for w in convoy}))
        return Outcome(FAIL, f"{len(convoy)} session(s) claim jobs with a plain FOR UPDATE and wait in a convoy ({apps})",
                       evidence, remedy, data)
    limit = probe.setting("advisor.lock_wait_fail")
    status = FAIL if longest >= limit or len(waiters) >= 3 else WARN
    return Outcome(status, f"{len(waiters)} session(s) waiting on locks of the jobs tables, longest {seconds(longest)}",
                   evidence, remedy, data)


@FAMILY.check("long-transactions", "Short claim transactions: nothing holds the jobs table open across work")
def long_transactions(probe: Probe) -> Outcome:
    idle_warn = probe.setting("advisor.idle_in_transaction_warn")
    idle_fail = probe.setting("advisor.idle_in_transaction_fail")
    age_warn = probe.setting("advisor.transaction_age_warn")
    age_fail = probe.setting("advisor.transaction_age_fail")
    rows = probe.rows("long_transactions", idle_s=idle_warn, xact_s=age_warn)
    touching = [r for r in rows if r["touches_jobs"]]
    data = {"sessions": [{k: r[k] for k in ("pid", "application_name", "state", "xact_s", "state_s", "touches_jobs")} for r in rows]}
    if not touching:
        note = [f"{len(rows)} long transaction(s) elsewhere in this database (see xmin-horizon)"] if rows else []
        return Outcome(OK, "no transaction holds the jobs tables open", note, "", data)
    status = WARN
    evidence = []
    for r in touching:
        idle = (r["state"] or "").startswith("idle in transaction")
        if (idle and r["state_s"] >= idle_fail) or r["xact_s"] >= age_fail:
            status = FAIL
        what = f"idle in transaction for {seconds(r['state_s'])}" if idle else f"running, transaction open {seconds(r['xact_s'])}"
        who = f"{r['usename']}@{r['client'] or 'local'}"
        evidence.append(f"pid {r['pid']} [{r['application_name'] or '(no application_name)'}] {who}, {what}, "
                        f"transaction open {seconds(r['xact_s'])}; last statement: "
                        f"{' '.join((r['query'] or '').split())[:160]}")
    remedy = ("Claim in one statement and commit at once; do the job's work outside any transaction and "
              "complete it in a second short transaction. A transaction held open across work keeps its row "
              "locks and pins the xmin horizon, so vacuum cannot clean the claim index. End the session "
              "(SELECT pg_terminate_backend(pid)) and set idle_in_transaction_session_timeout for that role.")
    idle_count = sum(1 for r in touching if (r["state"] or "").startswith("idle in transaction"))
    summary = (f"{len(touching)} session(s) hold a transaction open on the jobs tables"
               + (f", {idle_count} of them idle in transaction" if idle_count else ""))
    return Outcome(status, summary, evidence, remedy, data)

"""Retries: a real attempt cap, backoff instead of hot loops, and dead letters someone looks at.
"""

from __future__ import annotations

from console.advisor.base import COUNT_CAP, FAIL, OK, WARN, Family, Outcome, Probe, count, seconds

FAMILY = Family("Retries")


HEAD_SCAN = 5000  # rows of the head of the claim index that retry checks look at


@FAMILY.check("retry-caps", "Every job has a real attempt cap")
def retry_caps(probe: Probe) -> Outcome:
    warn_at = probe.setting("advisor.max_attempts_warn")
    fail_at = probe.setting("advisor.max_attempts_fail")
    default = probe.setting("queue.max_attempts")
    rows = probe.rows("attempt_caps", scan=HEAD_SCAN, threshold=warn_at)
    data = {"default_max_attempts": default, "kinds": rows}
    evidence = [f"{r['jobs']} job(s) of kind {r['kind']} on queue {r['queue']} allow up to {r['max_attempts']:,} "
                f"attempts (e.g. job {r['example_id']})" for r in rows]
    remedy = ("Cap attempts at a number that matches the backoff (with the default 2 s base and 1 h cap, 25 "
              "attempts span about a day). Without a cap a poisoned job retries forever and never reaches the "
              "dead letters where someone would look at it. Set max_attempts on enqueue, or queue.max_attempts.")
    if default > warn_at:
        evidence.insert(0, f"queue.max_attempts (the default for enqueue) is {default:,}")
    top = max([r["max_attempts"] for r in rows] + [default if default > warn_at else 0])
    if not rows and default <= warn_at:
        return Outcome(OK, f"the next {HEAD_SCAN:,} jobs to run and the running ones all allow {warn_at} attempts or fewer",
                       [f"default max_attempts: {default}"], "", data)
    status = FAIL if top > fail_at else WARN
    return Outcome(status, f"jobs allow up to {top:,} attempts: effectively no retry cap", evidence, remedy, data)


@FAMILY.check("retry-hot-loops", "Retries back off instead of hot-looping")
def retry_hot_loops(probe: Probe) -> Outcome:
    gap = probe.setting("advisor.hot_loop_gap")
    rows = probe.rows("hot_loops", scan=500, gap_s=gap, min_quick=2)
    base = probe.setting("queue.backoff_base")
    data = {"jobs": [{k: r[k] for k in ("id", "kind", "queue", "status", "attempts", "quick", "min_gap_s")} for r in rows],
            "backoff_base": base}
    evidence = [f"job {r['id']} ({r['kind']} on {r['queue']}, {r['status']}): {r['quick']} retries less than "
                f"{gap:g} s after the previous attempt (shortest {r['min_gap_s']:.3f} s)" for r in rows]
    if base < 0.5:
        evidence.append(f"queue.backoff_base is {base:g} s")
    remedy = ("Retries must wait: run_at pushed out by exponential backoff with jitter (queue.backoff_base, "
              "queue.backoff_cap). A job retried within milliseconds burns a worker and the database on the same "
              "error, and hides the failure rate. Check the handler or the worker that sets a zero delay.")
    if not rows:
        return Outcome(OK if base >= 0.5 else WARN,
                       "no job among the newest dead letters and next retries retried in a hot loop"
                       if base >= 0.5 else f"backoff base is only {base:g} s", evidence, remedy if base < 0.5 else "", data)
    status = FAIL if len(rows) >= 5 or max(r["quick"] for r in rows) >= 5 else WARN
    return Outcome(status, f"{len(rows)} job(s) retried in a hot loop (attempts less than {gap:g} s apart)",
                   evidence, remedy, data)


@FAMILY.check("dead-letters", "Dead letters are looked at: bounded growth and age")
def dead_letters(probe: Probe) -> Outcome:
    age_warn = probe.setting("advisor.dead_letter_age_warn")
    row = probe.row("dead_letters", cap=COUNT_CAP)
    data = dict(row)
    if not row["total"]:
        return Outcome(OK, "no dead letters", [], "", data)
    evidence = [f"{count(row['total'], COUNT_CAP)} dead letter(s); {count(row['last_day'], COUNT_CAP)} in the last day, "
                f"{count(row['last_hour'], COUNT_CAP)} in the last hour",
                f"oldest dead letter failed {seconds(row['oldest_s'])} ago"]
    remedy = ("Group the dead letters by error (the console's dead-letter page), fix the cause, then replay the "
              "group or purge it (audited). A dead-letter set nobody inspects is a quiet data graveyard, and its "
              "rows stay in the hot table.")
    oldest = row["oldest_s"] or 0
    if oldest >= 4 * age_warn or row["total"] >= COUNT_CAP:
        return Outcome(FAIL, f"{count(row['total'], COUNT_CAP)} dead letters, the oldest {seconds(oldest)} old: nobody is looking",
                       evidence, remedy, data)
    if oldest >= age_warn:
        return Outcome(WARN, f"the oldest dead letter is {seconds(oldest)} old ({count(row['total'], COUNT_CAP)} in all)",
                       evidence, remedy, data)
    if row["last_hour"] >= 100:
        return Outcome(WARN, f"dead letters are growing: {count(row['last_hour'], COUNT_CAP)} in the last hour",
                       evidence, remedy, data)
    return Outcome(OK, f"{count(row['total'], COUNT_CAP)} dead letter(s), the oldest {seconds(oldest)} old", evidence, "", data)

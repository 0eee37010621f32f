"""Hot table hygiene: completed rows leave, autovacuum is tuned for the churn and keeps up, and
nothing holds the xmin horizon.
"""

from __future__ import annotations

from console.advisor.base import (
    COUNT_CAP,
    FAIL,
    OK,
    WARN,
    Family,
    Outcome,
    Probe,
    count,
    maintenance_last_run,
    scheduler_line,
    seconds,
)
from console.advisor.causes import holder_cause, the_holder

FAMILY = Family("Hot table hygiene")


def _archive_age(probe: Probe) -> tuple[float, str]:
    """Age past which a completed job is late: the archival age plus a slack for the archiver's
    schedule (completed rows are fine until archival has had its chance)."""
    slack = probe.setting("advisor.archive_slack")
    value = probe.setting("maintenance.archive_after")
    return value + slack, f"maintenance.archive_after {seconds(value)} + advisor.archive_slack {seconds(slack)}"


def _has_completed_index(probe: Probe) -> bool:
    return any("status = 'completed'" in (i["definition"] or "") and "finished_at" in (i["definition"] or "")
               for i in probe.rows("jobs_indexes"))


@FAMILY.check("completed-rows", "Completed jobs leave the hot table (archival keeps up)")
def completed_rows(probe: Probe) -> Outcome:
    age, source = _archive_age(probe)
    warn_at = probe.setting("advisor.completed_rows_warn")
    stats = probe.row("jobs_table_stats")
    if _has_completed_index(probe):
        # exact up to the cap, through the archiver's own index
        counted = probe.row("completed_counts", age_s=age, cap=COUNT_CAP)
        old, completed, oldest = counted["old_completed"], counted["completed"], counted["oldest_completed_s"]
        live, exact, percent = stats["n_live_tup"] or 0, True, None
        how = "counted through jobs_completed_idx"
    else:
        # no index on completed rows: estimate from a page sample, never a full scan
        pages = max(int(stats["pages"] or 0), 1)
        percent = min(100.0, 100.0 * probe.setting("advisor.sample_pages") / pages)
        sample = probe.row("completed_sample", age_s=age, percent=percent)
        exact = percent >= 100
        live = sample["sampled"] if exact else max(stats["n_live_tup"] or 0, sample["sampled"])
        scale = live / sample["sampled"] if sample["sampled"] else 0
        old, completed, oldest = sample["old_completed"] * scale, sample["completed"] * scale, sample["oldest_completed_s"]
        how = "counted" if exact else f"estimated from a {percent:.1f}% page sample"
    data = {"late_after_s": age, "age_source": source, "old_completed": round(old), "completed": round(completed),
            "live_rows": live, "exact": exact, "sampled_percent": percent}
    approx = "" if exact else "about "
    evidence = [f"{approx}{count(old, COUNT_CAP)} completed row(s) finished more than {seconds(age)} ago "
                f"({source}), of {approx}{count(completed, COUNT_CAP)} completed rows in skiplock.jobs ({how})"]
    if oldest is not None:
        evidence.append(f"oldest completed row{' in the sample' if not exact else ''} finished {seconds(oldest)} ago")
    last = maintenance_last_run(probe, "archive")
    late = old >= warn_at
    if last:
        data["last_archive"] = last
        evidence.append(f"last archival run: {seconds(last['age_s'])} ago by {last['actor']}, {last['outcome']}"
                        + (f" ({last['error']})" if last.get("error") else f", {count(last['rows'])} rows"))
    elif probe.exists("skiplock.maintenance_runs"):
        evidence.append("archival has never run on this database")
    if late:
        evidence += scheduler_line(probe, "archive")
    remedy = ("Completed rows that stay in the hot table make every scan, vacuum and index larger. Let the "
              "archiver move them out in bounded batches (the scheduler runs it every few minutes; "
              "`skiplock archive` runs it now); check that the scheduler runs, that the last archival run "
              "ended ok, and that maintenance.archive_after is what you want.")
    if old >= 10 * warn_at or (late and last and last["outcome"] == "error"):
        return Outcome(FAIL, f"{approx}{count(old, COUNT_CAP)} completed rows older than {seconds(age)} are still in the "
                       "hot table: archival is not keeping up", evidence, remedy, data)
    if late:
        return Outcome(WARN, f"{approx}{count(old, COUNT_CAP)} completed rows older than {seconds(age)} are still in the hot table",
                       evidence, remedy, data)
    # Archival keeps up, but at a high rate the history it is not yet due to move can be most of
    # the table: 30 k jobs/s for an hour is 100 million rows (docs/benchmarks.md, "Completing
    # into the archive": the rate fell to 0.88 in ten minutes as the history grew).
    recent = completed - old
    share = recent / max(live, completed, 1)
    data["recent_share"] = share
    if recent >= 10 * warn_at and share > 0.5:
        evidence.append(f"{approx}{count(recent, COUNT_CAP)} completed rows within the archival age: "
                        f"{share:.0%} of the rows in skiplock.jobs")
        return Outcome(WARN, f"completed history is {share:.0%} of the hot table ({approx}{count(recent, COUNT_CAP)} "
                       f"rows within {seconds(age)}): archival keeps up, but the table is mostly history", evidence,
                       "Every claim, vacuum and index of the hot table pays for the completed rows it keeps until "
                       "maintenance.archive_after. Shorten maintenance.archive_after, or let the workers move each "
                       "job into the archive as it completes (worker.complete_into_archive = true; docs/queue.md, "
                       "\"Completing into the archive\": it frees an idempotency key at completion).", data)
    return Outcome(OK, f"{approx}{count(old, COUNT_CAP)} completed rows past the archival age ({seconds(age)})", evidence, "", data)


@FAMILY.check("autovacuum-settings", "The jobs table's autovacuum settings match its churn")
def autovacuum_settings(probe: Probe) -> Outcome:
    s = probe.row("jobs_table_stats")
    churn = ((s["n_tup_upd"] or 0) + (s["n_tup_del"] or 0)) / max(s["stats_age_s"] or 1, 1)
    trigger = s["vacuum_trigger"]
    interval = trigger / churn if churn > 0 else None
    data = {k: s[k] for k in ("autovacuum_enabled", "vacuum_threshold", "vacuum_scale_factor", "cost_delay_ms",
                              "vacuum_trigger", "reloptions", "reltuples")}
    data.update(churn_per_s=churn, vacuum_every_s=interval)
    evidence = [
        f"reloptions: {', '.join(s['reloptions']) if s['reloptions'] else 'none (server defaults apply)'}",
        f"vacuum starts at {count(trigger)} dead rows (threshold {s['vacuum_threshold']:g} + scale factor "
        f"{s['vacuum_scale_factor']:g} x {count(s['reltuples'])} rows); cost delay {s['cost_delay_ms']:g} ms",
        f"churn (updates + deletes) since statistics reset: {churn:.1f} rows/s"
        + (f", so a vacuum about every {seconds(interval)}" if interval else ""),
    ]
    remedy = ("Give the jobs table its own settings, as migration 001 does: ALTER TABLE skiplock.jobs SET "
              "(autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000, "
              "autovacuum_vacuum_cost_delay = 0). A scale factor lets the dead rows at the head of the claim "
              "index grow with the backlog; cost-based sleeping lets them pile up during the vacuum.")
    if not s["autovacuum_enabled"]:
        return Outcome(FAIL, "autovacuum is disabled for skiplock.jobs", evidence,
                       "Re-enable it: ALTER TABLE skiplock.jobs RESET (autovacuum_enabled). " + remedy, data)
    problems = []
    if s["vacuum_scale_factor"] > 0.05 and (s["reltuples"] or 0) >= 50_000:
        problems.append(f"the scale factor {s['vacuum_scale_factor']:g} makes vacuum wait for {count(trigger)} dead rows")
    elif trigger > 50_000:
        # what bounds the damage is the number of dead rows a claim may walk, not the time
        problems.append(f"vacuum waits for {count(trigger)} dead rows, which every claim may have to walk past")
    if s["cost_delay_ms"] > 2 and churn >= 100:
        problems.append(f"vacuum sleeps {s['cost_delay_ms']:g} ms per cost unit on a table changing {churn:.0f} rows/s")
    if problems:
        return Outcome(WARN, "; ".join(problems), evidence, remedy, data)
    return Outcome(OK, f"vacuum starts at {count(trigger)} dead rows"
                   + (f", about every {seconds(interval)} at the current churn" if interval else ""), evidence, "", data)


@FAMILY.check("autovacuum-progress", "Autovacuum keeps up with the jobs table")
def autovacuum_progress(probe: Probe) -> Outcome:
    s = probe.row("jobs_table_stats")
    dead, trigger = s["n_dead_tup"] or 0, s["vacuum_trigger"]
    data = {"dead": dead, "live": s["n_live_tup"], "trigger": trigger, "vacuum_running": s["vacuum_running"],
            "last_vacuum_age_s": s["last_vacuum_age_s"], "autovacuum_count": s["autovacuum_count"]}
    evidence = [f"{count(dead)} dead rows, {count(s['n_live_tup'])} live; autovacuum starts at {count(trigger)}",
                f"last vacuum: {seconds(s['last_vacuum_age_s']) + ' ago' if s['last_vacuum_age_s'] is not None else 'never'}; "
                f"autovacuum runs: {s['autovacuum_count']}; "
                + ("a vacuum is running now" if s["vacuum_running"] else "no vacuum running")]
    remedy = ("If dead rows stay above the threshold while vacuums run, something holds the xmin horizon (see "
              "xmin-horizon). If no vacuum runs, autovacuum workers are busy elsewhere (raise "
              "autovacuum_max_workers) or disabled; run VACUUM (VERBOSE) skiplock.jobs to see what it can remove.")
    if dead <= trigger:
        return Outcome(OK, f"{count(dead)} dead rows, below the autovacuum trigger ({count(trigger)})", evidence, "", data)
    # Dead rows above the trigger while a holder stands: the holder is why (the same holder,
    # in the same words, as xmin-horizon and claim-buffers name).
    holder = the_holder(probe.rows("xmin_holders"), probe.setting("advisor.xmin_horizon_warn"))
    because = ""
    if holder is not None:
        cause = holder_cause(holder)
        data["cause"] = cause.to_dict()
        because = f": {cause.sentence('vacuum can then remove them')}"
        remedy = f"{cause.fix[0].upper()}{cause.fix[1:]}. " + remedy
    if dead >= 10 * trigger and dead >= 10_000:
        return Outcome(FAIL, f"{count(dead)} dead rows, {dead / max(trigger, 1):.0f}x the autovacuum trigger{because}",
                       evidence, remedy, data)
    if s["vacuum_running"] and not because:
        return Outcome(OK, f"{count(dead)} dead rows above the trigger and a vacuum is running", evidence, "", data)
    return Outcome(WARN, f"{count(dead)} dead rows above the autovacuum trigger ({count(trigger)})"
                   + (because or " and no vacuum running"), evidence, remedy, data)


@FAMILY.check("xmin-horizon", "Vacuum is not blocked by the xmin horizon")
def xmin_horizon(probe: Probe) -> Outcome:
    warn_at = probe.setting("advisor.xmin_horizon_warn")
    fail_at = probe.setting("advisor.xmin_horizon_fail")
    holders = probe.rows("xmin_holders")
    stats = probe.row("jobs_table_stats")
    data = {"holders": holders[:5], "dead": stats["n_dead_tup"]}
    if not holders:
        return Outcome(OK, "nothing holds back the xmin horizon", [], "", data)
    oldest = max((h["age_s"] or 0) for h in holders)
    evidence = [f"{h['kind']} {h['id']} {h['who']}: held {seconds(h['age_s']) if h['age_s'] is not None else '(age unknown)'}, "
                f"{h['xid_age']:,} transactions behind; {' '.join((h['detail'] or '').split())[:160]}" for h in holders[:5]]
    evidence.append(f"skiplock.jobs has {count(stats['n_dead_tup'])} dead rows vacuum cannot remove while the horizon stands")
    remedy = ("Vacuum can only remove row versions older than the oldest snapshot still open. End the session "
              "(pg_terminate_backend), drop or advance the slot, COMMIT/ROLLBACK PREPARED the prepared "
              "transaction, or set idle_in_transaction_session_timeout. Until then every claim walks more dead "
              "index entries.")
    data["oldest_s"] = oldest
    # The holder named is the one claim-buffers and autovacuum-progress name (causes.the_holder:
    # held past the warn level, or a slot's or standby's hold a million transactions back, which
    # carries no time), in the same words.
    holder = the_holder(holders, warn_at)
    if holder is not None:
        cause = holder_cause(holder)
        data["cause"] = cause.to_dict()
        status = FAIL if oldest >= fail_at else WARN
        return Outcome(status, cause.sentence("vacuum can then remove the dead rows"), evidence,
                       f"{cause.fix[0].upper()}{cause.fix[1:]}. " + remedy, data)
    # all of them (up to five), not only the first: the oldest by XID is often a standby's
    # feedback a few transactions behind, and the session that matters comes second
    return Outcome(OK, f"the oldest snapshot is {seconds(oldest)} old", evidence[:-1], "", data)

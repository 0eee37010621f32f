"""Leases: the lease outlasts the jobs, and the reaper rescues the expired ones.
"""

from __future__ import annotations

from console import histogram
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

FAMILY = Family("Leases")


@FAMILY.check("lease-vs-runtime", "The lease is longer than the jobs take (p99 runtime)")
def lease_vs_runtime(probe: Probe) -> Outcome:
    lease = float(probe.setting("worker.lease"))
    workers = probe.rows("worker_runtimes", window_s=86400)
    total = [0] * len(histogram.BOUNDS_MS)
    for w in workers:
        for i, n in enumerate(w["runtime_histogram"] or []):
            if i < len(total):
                total[i] += n
    observed = sum(total)
    p99 = histogram.quantile(total, 0.99)
    p50 = histogram.quantile(total, 0.50)
    data = {"lease_s": lease, "p99_s": p99, "p50_s": p50, "observations": observed, "workers": len(workers)}
    if p99 is None:
        return Outcome(OK, "no job runtimes recorded by workers in the last day", [f"configured lease: {lease:g} s"], "", data)
    evidence = [f"configured lease (worker.lease): {lease:g} s",
                f"job runtime over {observed:,} jobs from {len(workers)} worker(s) in the last day: p50 {p50:.2f} s, p99 {p99:.2f} s"]
    remedy = ("Make the lease longer than ordinary job duration (worker.lease, or --lease), keep heartbeats on "
              "for long jobs, or split long jobs into smaller resumable ones. A job that outlives its lease "
              "without a heartbeat is rescued by the reaper and runs twice.")
    if p99 >= lease:
        return Outcome(FAIL, f"p99 job runtime ({p99:.1f} s) is longer than the lease ({lease:g} s)", evidence, remedy, data)
    if p99 >= lease / 2:
        return Outcome(WARN, f"p99 job runtime ({p99:.1f} s) is more than half the lease ({lease:g} s)", evidence, remedy, data)
    return Outcome(OK, f"p99 job runtime {p99:.2f} s against a {lease:g} s lease", evidence, "", data)


@FAMILY.check("stuck-leases", "No job runs past its lease; the reaper is rescuing expired ones")
def stuck_leases(probe: Probe) -> Outcome:
    grace = probe.setting("advisor.stuck_lease_grace")
    counts = probe.row("running_counts", cap=COUNT_CAP)
    data = {"running": counts["running"], "expired": counts["expired"]}
    last_reap = maintenance_last_run(probe, "reap")
    reap_line = []
    if last_reap:
        data["last_reap"] = last_reap
        reap_line = [f"last reaper run: {seconds(last_reap['age_s'])} ago by {last_reap['actor']}, {last_reap['outcome']}"
                     + (f" ({last_reap['error']})" if last_reap.get("error") else f", {count(last_reap['rows'])} rescued")]
    if counts["expired"]:
        # maintenance_runs holds every reap (scheduler, `skiplock reap`, "reap now");
        # scheduler_jobs says whether the scheduler is running its reap job at all
        reap_line += scheduler_line(probe, "reap")
    if not counts["expired"]:
        return Outcome(OK, f"no stuck leases ({count(counts['running'], COUNT_CAP)} job(s) running)", reap_line, "", data)
    top = probe.rows("stuck_leases", limit=5)
    oldest = top[0]["overdue_s"] if top else 0
    data["oldest_overdue_s"] = oldest
    evidence = [f"job {r['id']} ({r['kind']} on {r['queue']}), attempt {r['attempts']}, held by {r['locked_by']}: "
                f"lease expired {seconds(r['overdue_s'])} ago, running {seconds(r['running_s'])}" for r in top] + reap_line
    remedy = ("Expired leases mean workers died or stopped heartbeating. The reaper (scheduler, every 30 s, or "
              "`skiplock reap`) returns them to pending or to the dead letters. If leases stay expired, the "
              "scheduler is not running or not the leader: start it, or run `skiplock reap` now.")
    if oldest >= grace:
        return Outcome(FAIL, f"{count(counts['expired'], COUNT_CAP)} job(s) past their lease, the oldest by "
                       f"{seconds(oldest)}: the reaper is not rescuing them", evidence, remedy, data)
    return Outcome(WARN, f"{count(counts['expired'], COUNT_CAP)} job(s) past their lease (the reaper should "
                   f"rescue them within {seconds(grace)})", evidence, remedy, data)

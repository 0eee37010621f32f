"""Server: the NOTIFY queue, connection slots, WAL rate and replica lag.
"""

from __future__ import annotations

from console.advisor.base import FAIL, OK, WARN, Family, Outcome, Probe, seconds, size, worst

FAMILY = Family("Server")


@FAMILY.check("notify-queue", "The NOTIFY queue is not filling up")
def notify_queue(probe: Probe) -> Outcome:
    usage = probe.row("notify_usage")["usage"] or 0.0
    data = {"usage": usage}
    evidence = [f"NOTIFY queue {usage:.2%} full"]
    remedy = ("The queue fills when a listening session stops reading (a stuck LISTEN connection, or one inside a "
              "long transaction). When it is full, every NOTIFY (every enqueue) fails. Find the listener that "
              "does not consume (pg_stat_activity, query LISTEN) and restart it.")
    if usage >= 0.5:
        return Outcome(FAIL, f"the NOTIFY queue is {usage:.0%} full", evidence, remedy, data)
    if usage >= 0.1:
        return Outcome(WARN, f"the NOTIFY queue is {usage:.0%} full", evidence, remedy, data)
    return Outcome(OK, f"NOTIFY queue {usage:.1%} used", evidence, "", data)


@FAMILY.check("connections", "Connections stay below max_connections")
def connections(probe: Probe) -> Outcome:
    row = probe.row("connections")
    limit = max(row["max_connections"] - row["reserved"], 1)
    share = row["clients"] / limit
    data = {"clients": row["clients"], "limit": limit, "share": share, "top_applications": row["top_applications"]}
    evidence = [f"{row['clients']} client connections of {limit} available (max_connections {row['max_connections']}, "
                f"{row['reserved']} reserved)",
                "largest: " + ", ".join(f"{a['application']} {a['sessions']}" for a in row["top_applications"])]
    remedy = ("Each worker process holds a few connections (claims, heartbeats, LISTEN). Put a pooler in front "
              "of the application, lower worker concurrency, or raise max_connections with the memory to match.")
    if share >= 0.95:
        return Outcome(FAIL, f"{share:.0%} of the connection slots are in use", evidence, remedy, data)
    if share >= 0.8:
        return Outcome(WARN, f"{share:.0%} of the connection slots are in use", evidence, remedy, data)
    return Outcome(OK, f"{row['clients']} of {limit} connection slots in use", evidence, "", data)


@FAMILY.check("wal-replicas", "WAL rate and replica lag")
def wal_replicas(probe: Probe) -> Outcome:
    position = probe.row("wal_position")
    previous = probe.recall("wal")
    probe.remember("wal", {"wal_bytes": position["wal_bytes"]})
    rate = None
    if previous and previous["age_s"] and previous["data"].get("wal_bytes") is not None:
        delta = position["wal_bytes"] - previous["data"]["wal_bytes"]
        if delta >= 0:
            rate = delta / max(previous["age_s"], 0.001)
    replicas = probe.rows("replication")
    data = {"wal_bytes_per_second": rate, "in_recovery": position["in_recovery"], "replication": replicas}
    evidence = [f"WAL written: {size(rate)}/s since the last check" if rate is not None
                else "WAL rate known from the next check on"]
    if position["in_recovery"]:
        evidence.append(f"this server is a standby; last replayed transaction {seconds(position['replay_delay_s'])} ago")
    status = OK
    problems = []
    for r in replicas:
        if r["kind"] == "standby":
            evidence.append(f"standby {r['name']} ({r['detail']}): replay lag {seconds(r['lag_s']) if r['lag_s'] is not None else '0 s'}, "
                            f"{size(r['lag_bytes'])} behind")
            lag = r["lag_s"] or 0
            if lag >= 300:
                status, _ = worst(status, FAIL), problems.append(f"standby {r['name']} is {seconds(lag)} behind")
            elif lag >= 30:
                status, _ = worst(status, WARN), problems.append(f"standby {r['name']} is {seconds(lag)} behind")
        else:
            evidence.append(f"slot {r['name']} ({r['detail']}): retains {size(r['lag_bytes'])} of WAL")
            retained = r["lag_bytes"] or 0
            if r["detail"] == "active=false" and retained >= 1024**3:
                status = worst(status, WARN)
                problems.append(f"inactive slot {r['name']} retains {size(retained)}")
    remedy = ("Queue churn is WAL: every claim, completion and archival writes it, and standbys must replay "
              "it. Lag that grows with the queue's rate is a migration signal; drop slots nobody uses.")
    if problems:
        return Outcome(status, "; ".join(problems), evidence, remedy, data)
    return Outcome(OK, "no lagging standby" + (f"; WAL {size(rate)}/s" if rate is not None else ""), evidence, "", data)

"""MultiXact risk: foreign keys into the jobs table, savepoints around claims, and MultiXact
consumption and SLRU waits.
"""

from __future__ import annotations

from console.advisor.base import (
    FAIL,
    OK,
    UNKNOWN,
    WARN,
    Family,
    Outcome,
    Probe,
    count,
    seconds,
    session,
)

FAMILY = Family("MultiXact risk")


@FAMILY.check("fk-into-jobs", "No foreign key points into the jobs table")
def fk_into_jobs(probe: Probe) -> Outcome:
    fks = probe.rows("fk_into_jobs")
    data = {"foreign_keys": fks}
    if not fks:
        return Outcome(OK, "no foreign key references the jobs tables", [], "", data)
    lockers = [r for r in probe.rows("row_lockers") if (r["xact_s"] or 0) >= 1]
    data["share_lockers"] = [r["pid"] for r in lockers]
    evidence = [f"{f['constraint_name']} on {f['child_table']}: {f['definition']} ({count(f['child_writes'])} writes to the child table)"
                for f in fks]
    evidence += [f"holding row locks on skiplock.jobs for {seconds(r['xact_s'])}: {session(r)}" for r in lockers]
    remedy = ("Every insert or key update in the child table takes FOR KEY SHARE on the referenced job row; "
              "when a second transaction locks the same row (a claim, a completion, another child insert) "
              "PostgreSQL creates a MultiXact, and the claim scan must resolve it through the MultiXact SLRU. "
              "Reference jobs by id without a constraint (or reference a stable business table instead), "
              "and check integrity in the application or with a periodic query.")
    names = ", ".join(f["constraint_name"] for f in fks)
    if lockers:
        return Outcome(FAIL, f"foreign key(s) into the jobs table ({names}) and {len(lockers)} session(s) holding row "
                       "locks on job rows: MultiXacts are being created on the hot table", evidence, remedy, data)
    return Outcome(WARN, f"{len(fks)} foreign key(s) point into the jobs table: {names}", evidence, remedy, data)


@FAMILY.check("savepoints", "No savepoints around claims (subtransactions)")
def savepoints(probe: Probe) -> Outcome:
    state = probe.row("multixact_state")
    if not probe.has_pg_stat_statements:
        return Outcome(UNKNOWN, "not available: pg_stat_statements is not installed in this database",
                       remedy="Add pg_stat_statements to shared_preload_libraries and CREATE EXTENSION pg_stat_statements.")
    sp = probe.row("savepoint_statements")
    claims = probe.row("claim_statements")
    data = {**sp, "claim_calls": claims["calls"], "subtrans_waiters": state["subtrans_waiters"]}
    evidence = [f"SAVEPOINT statements: {count(sp['savepoints'])}, RELEASE: {count(sp['releases'])}, "
                f"ROLLBACK TO: {count(sp['rollbacks_to'])}; claim calls: {count(claims['calls'])}"]
    if sp["track_utility"] == "off":
        evidence.append("pg_stat_statements.track_utility is off: savepoints are not counted")
    if state["subtrans_waiters"]:
        evidence.append(f"{state['subtrans_waiters']} session(s) waiting on the subtransaction SLRU now")
    remedy = ("A claim (SELECT ... FOR UPDATE) followed by an UPDATE inside a savepoint turns each row lock into "
              "a MultiXact. ORMs add savepoints for nested transaction blocks (Django atomic(), SQLAlchemy "
              "begin_nested(), JDBC autosave), and so do PL/pgSQL EXCEPTION blocks. Claim in a single "
              "statement on an autocommit connection, as Skiplock's worker does.")
    if state["subtrans_waiters"]:
        return Outcome(FAIL, "sessions are waiting on the subtransaction SLRU (subtransaction overflow)", evidence, remedy, data)
    if sp["savepoints"] and claims["calls"] and sp["savepoints"] >= 0.1 * claims["calls"]:
        return Outcome(WARN, f"{count(sp['savepoints'])} savepoints beside {count(claims['calls'])} claims in this database",
                       evidence, remedy, data)
    return Outcome(OK, "no savepoints at the scale of the claims" if sp["savepoints"] else "no savepoints in this database",
                   evidence, "", data)


@FAMILY.check("multixact", "MultiXact consumption, member space and SLRU waits")
def multixact(probe: Probe) -> Outcome:
    state = probe.row("multixact_state")
    table = probe.row("jobs_table_stats")
    slru = {r["name"].lower(): r for r in probe.rows("slru_stats")}
    members = slru.get("multixactmember") or slru.get("multixact_member") or {}
    previous = probe.recall("multixact")
    reading = {"next_mxid": state["next_mxid"], "member_pages_zeroed": members.get("blks_zeroed")}
    probe.remember("multixact", reading)
    rate = None
    consumed = None
    if previous and previous["age_s"] and previous["data"].get("next_mxid") is not None:
        consumed = state["next_mxid"] - previous["data"]["next_mxid"]
        if consumed >= 0:
            rate = consumed / max(previous["age_s"], 0.001)
    offsets = probe.row("multixact_offsets") if probe.can_read_control_data else None
    member_share = None
    if offsets and offsets.get("next_multi_offset") is not None:
        member_share = offsets["next_multi_offset"] / 2**32  # an upper bound: truncation is not exposed
    freeze = state["mxid_freeze_max_age"]
    data = {"next_mxid": state["next_mxid"], "consumed_since_last_check": consumed, "per_second": rate,
            "jobs_mxid_age": table["mxid_age"], "oldest_db_mxid_age": state["oldest_db_mxid_age"],
            "freeze_max_age": freeze, "member_space_upper_bound": member_share,
            "waiters": state["multixact_waiters"], "slru_io_waiters": state["slru_io_waiters"]}
    evidence = [
        f"MultiXacts created so far on this server: {count(state['next_mxid'])}"
        + (f"; {count(consumed)} since the last check ({rate:.2f}/s)" if rate is not None else "; rate known from the next check on"),
        f"MultiXact age: skiplock.jobs {count(table['mxid_age'])}, oldest database {count(state['oldest_db_mxid_age'])} "
        f"(autovacuum_multixact_freeze_max_age {count(freeze)})",
    ]
    if member_share is not None:
        evidence.append(f"member space used: at most {member_share:.1%} (next member offset at the last checkpoint)")
    if members:
        evidence.append(f"MultiXact member SLRU: {count(members.get('blks_read'))} blocks read, {count(members.get('blks_hit'))} hits")
    if state["multixact_waiters"] or state["slru_io_waiters"]:
        evidence.append(f"sessions waiting now: {state['multixact_waiters']} on MultiXact locks, {state['slru_io_waiters']} on SLRU I/O")
    remedy = ("MultiXacts come from several transactions locking one row: foreign keys into jobs, savepoints "
              "around claims, FOR SHARE readers. Remove the cause (see fk-into-jobs and savepoints). Member "
              "space is a separate 4-billion limit that can run out while the MultiXact age looks healthy; "
              "vacuum (freezing) reclaims both.")
    oldest = state["oldest_db_mxid_age"] or 0
    if oldest >= 1_000_000_000 or (member_share is not None and member_share >= 0.5):
        return Outcome(FAIL, "MultiXact wraparound or member-space exhaustion is approaching", evidence, remedy, data)
    if state["multixact_waiters"] >= 3:
        return Outcome(FAIL, f"{state['multixact_waiters']} sessions waiting on MultiXact SLRU locks", evidence, remedy, data)
    if state["multixact_waiters"] or oldest >= 1.5 * freeze or (member_share is not None and member_share >= 0.25):
        return Outcome(WARN, "MultiXact pressure: waits on the SLRU or freezing behind", evidence, remedy, data)
    if rate is not None and rate >= 100:
        return Outcome(WARN, f"{rate:.0f} MultiXacts/s are being created", evidence, remedy, data)
    return Outcome(OK, "no MultiXact pressure"
                   + (f" ({count(consumed)} created since the last check)" if consumed else ""), evidence, "", data)

"""The jobs tables (hot table and archive): tuples, sizes, autovacuum against the table's own
threshold, vacuum in progress, "vacuum ran but removed nothing", and wraparound age.

A partitioned table is read through its leaf partitions: tuples and sizes are summed, ages
and ratios take the worst leaf, and the table is "behind" when any leaf is.

Autovacuum threshold: reloptions first, then the server settings (relation_needs_vacanalyze
in autovacuum.c, PG 13-17). "Behind" means dead rows above that threshold and no vacuum
running on the table. "Removed nothing": VACUUM resets n_dead_tup to the dead rows it could
NOT remove, so when a vacuum ran since the last cycle and dead rows stayed at half or more of
what they were (and at least 1000, or the table's threshold when that is lower), something
is holding the xmin horizon; the flag stays up until a later vacuum removes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from console.collectors.base import Context
from console.samples import Sample

PROGRESS_KEYS = (
    "phase", "heap_blks_total", "heap_blks_scanned", "heap_blks_vacuumed", "index_vacuum_count",
    "max_dead_tuples", "num_dead_tuples", "max_dead_tuple_bytes", "dead_tuple_bytes",
    "num_dead_item_ids", "indexes_total", "indexes_processed",
)


def collect(ctx: Context) -> Iterable[Sample]:
    out, snapshot, vacuuming = measure(ctx, ctx.options.tables, ctx.previous.get("tables", {}))
    ctx.detail("vacuum_progress", vacuuming)
    ctx.remember({"tables": snapshot})
    return out


def measure(
    ctx: Context,
    tables: Iterable[tuple[str, str]],
    previous: dict[str, Any],
    extra_labels: dict[str, str] | None = None,
) -> tuple[list[Sample], dict[str, dict[str, float]], list[dict[str, Any]]]:
    """Samples of the (label, qualified name) tables on ctx's connection, the snapshot for the
    next cycle's deltas, and the vacuums in progress. An external source's queue table comes
    through here too (console.collectors.external), with `extra_labels` {"system": ...}."""
    tables = list(tables)
    labels = [label for label, _ in tables]
    names = [name for _, name in tables]
    leaves = ctx.rows("collectors_tables", "watched_relations", {"labels": labels, "names": names})
    relids = [r["relid"] for r in leaves]
    label_of = {r["relid"]: r["label"] for r in leaves}
    stats = ctx.rows("collectors_tables", "table_stats", {"relids": relids}) if relids else []
    sizes = {r["relid"]: r for r in ctx.rows("collectors_tables", "table_sizes", {"relids": relids})} if relids else {}
    progress = ctx.rows("collectors_tables", "vacuum_progress", {"relids": relids}) if relids else []

    vacuuming: dict[str, list[dict[str, Any]]] = {}
    for p in progress:
        info = {k: p["progress"].get(k) for k in PROGRESS_KEYS if k in p["progress"]}
        info.update(pid=p["progress"].get("pid"), is_auto=p["is_auto"], anti_wraparound=p["anti_wraparound"],
                    running_s=p["running_s"], wait_event_type=p["wait_event_type"], wait_event=p["wait_event"],
                    table=label_of.get(p["relid"]))
        total = info.get("heap_blks_total") or 0
        info["heap_scanned_ratio"] = (info.get("heap_blks_scanned") or 0) / total if total else 0.0
        vacuuming.setdefault(label_of.get(p["relid"], "?"), []).append(info)

    by_table: dict[str, list[dict[str, Any]]] = {}
    for s in stats:
        by_table.setdefault(label_of[s["relid"]], []).append(s)

    snapshot: dict[str, dict[str, float]] = {}
    out: list[Sample] = []
    for table in labels:
        rows = by_table.get(table)
        if not rows:
            continue
        t = {"table": table, **(extra_labels or {})}
        live = sum(r["n_live_tup"] for r in rows)
        dead = sum(r["n_dead_tup"] for r in rows)
        threshold = sum(r["vacuum_threshold"] for r in rows)
        runs = {k: sum(r[k] for r in rows) for k in ("vacuum_count", "autovacuum_count", "analyze_count", "autoanalyze_count")}
        in_progress = vacuuming.get(table, [])
        behind = any(r["n_dead_tup"] > r["vacuum_threshold"] for r in rows) and not in_progress
        vacuum_ages = [r["vacuum_age_s"] for r in rows]
        analyze_ages = [r["analyze_age_s"] for r in rows]

        # Vacuum ran since the last cycle but dead rows did not fall: a horizon blocks it.
        before = previous.get(table)
        removed_nothing = float(before.get("removed_nothing", 0.0)) if before else 0.0
        if before is not None:
            ran = (runs["vacuum_count"] + runs["autovacuum_count"]) > (before["vacuum_count"] + before["autovacuum_count"])
            if ran:
                floor = min(threshold, 1000.0) if threshold else 1000.0
                removed_nothing = 1.0 if before["dead"] > 0 and dead >= 0.5 * before["dead"] and dead >= floor else 0.0
        snapshot[table] = {"dead": dead, "removed_nothing": removed_nothing, **runs}

        out += [
            Sample("table_live_tuples", t, live),
            Sample("table_dead_tuples", t, dead),
            Sample("table_dead_ratio", t, dead / (live + dead) if live + dead else 0.0),
            Sample("table_autovacuum_threshold", t, threshold),
            Sample("table_autovacuum_behind", t, 1.0 if behind else 0.0),
            Sample("table_last_autovacuum_age_seconds", t, None if any(a is None for a in vacuum_ages) else max(vacuum_ages)),
            Sample("table_last_autoanalyze_age_seconds", t, None if any(a is None for a in analyze_ages) else max(analyze_ages)),
            Sample("table_vacuum_count", {**t, "kind": "vacuum"}, runs["vacuum_count"]),
            Sample("table_vacuum_count", {**t, "kind": "autovacuum"}, runs["autovacuum_count"]),
            Sample("table_vacuum_count", {**t, "kind": "analyze"}, runs["analyze_count"]),
            Sample("table_vacuum_count", {**t, "kind": "autoanalyze"}, runs["autoanalyze_count"]),
            Sample("vacuum_in_progress", t, 1.0 if in_progress else 0.0),
            Sample("vacuum_heap_scanned_ratio", t, max((v["heap_scanned_ratio"] for v in in_progress), default=0.0) if in_progress else None),
            Sample("vacuum_index_passes", t, max((v.get("index_vacuum_count") or 0 for v in in_progress), default=0) if in_progress else None),
            Sample("vacuum_removed_nothing", t, removed_nothing),
            Sample("table_xid_age", {**t, "part": "heap"}, max((r["xid_age"] or 0) for r in rows)),
            Sample("table_xid_age", {**t, "part": "toast"}, max((r["toast_xid_age"] or 0) for r in rows)),
            Sample("table_mxid_age", t, max((r["mxid_age"] or 0) for r in rows)),
        ]
        part_sizes = [sizes.get(r["relid"]) for r in rows]
        if all(part_sizes):
            for part in ("heap", "indexes", "toast"):
                out.append(Sample("table_size_bytes", {**t, "part": part}, sum(s[part] for s in part_sizes)))
        else:
            # A leaf is held in AccessExclusiveLock: not waited on, reported as not available.
            for part in ("heap", "indexes", "toast"):
                out.append(Sample("table_size_bytes", {**t, "part": part}, None))
    return out, snapshot, [v for vs in vacuuming.values() for v in vs]

"""Find anything fast: one box in the top bar (and `/` on the keyboard) for a job id, a queue
name or an error text.

GET /search?q=...          jumps to the one thing the text names, else lists the matches by type
GET /api/v1/search?q=...   the same as JSON: `target` (where the page would jump, or null) and
                           `matches` [{type: job|queue|error_group, label, detail, url}]

What it looks at, each under the request's statement timeout (a panel that times out is listed
under `unavailable`; the rest still answers), and what it jumps to, first hit wins:
1. a job id (digits, optionally "#42"): the job, in the hot table or the archive (primary key
   and `jobs_archive_id_idx`) -> /jobs/<id>;
2. a queue name, exactly: the queues the queues page knows (its bounded live figures, paused
   queues, and queues sampled in the last 24 h) -> /queues/<name>; names containing the text are
   matches;
3. an error text: the dead-letter error groups (the dead-letters page's query over
   `jobs_failed_idx`, at most `GROUP_LIMIT` groups) whose fingerprint or example contains the
   text, case-insensitively; a single group -> its jobs. Viewers match against the redacted
   example, as they see it, so a search cannot reveal a redacted value.
4. a payload value: jobs whose payload holds the text (or the number it spells) as a value at
   any depth, among the newest `browse.SEARCH_WINDOW` jobs and the latest as many archived ones
   (console.browse.search_payload); each match links to its job and to the jobs filter that
   finds its like (`payload` containing the path to the value, with `archived=1` for the
   archive). A match is kept only when the value shows in the payload as the user sees it
   (redacted for viewers), so a search cannot reveal a redacted value either.
Otherwise the results page lists what matched, or says nothing did and offers the jobs filter.

This module does not scan the jobs table or the archive, or remember searches.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for

from console import browse, samples
from console import maintenance as m
from console.web import cycle
from console.web.api import INT, STR, Param, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import Panel, run_panel
from console.web.redact import group_for, payload_for

bp = Blueprint("search", __name__)

MAX_QUERY = 200
GROUP_LIMIT = 200
MAX_MATCHES = 20  # per type
BIGINT_MAX = 2**63 - 1

MATCH = obj({"type": {"enum": ["job", "queue", "error_group", "payload"]}, "label": STR, "detail": STR, "url": STR,
             "filter_url": {**STR, "description": "payload matches: the jobs filter that finds jobs with the same value"}},
            optional=("filter_url",))


def query_arg() -> str:
    """The search text, stripped; blank is allowed (nothing to look for, nothing found)."""
    text = (request.args.get("q") or "").strip()
    if len(text) > MAX_QUERY:
        abort(400, f"q: at most {MAX_QUERY} characters (got {len(text)})")
    return text


def _job_id(text: str) -> int | None:
    digits = text[1:] if text.startswith("#") else text
    if digits.isascii() and digits.isdigit() and 0 < int(digits) <= BIGINT_MAX:
        return int(digits)
    return None


def _queue_names() -> Panel:
    """Every queue the Queues page lists: the jobs' and the queues' (names only, not their
    figures), and those the samples know, read once per generation of the cycle's model
    (console/web/cycle.py) as the Queues page reads them."""
    names = run_panel(browse.queue_names)
    activity, _ = cycle.cached("queues.activity", lambda: run_panel(samples.queue_activity), keep=lambda p: p.ok)
    if not names.ok or not activity.ok:
        return Panel(False, error=names.error if not names.ok else activity.error)
    return Panel(True, names.data | set(activity.data))


def search_data(text: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = []
    unavailable: list[dict[str, str]] = []
    target = None
    if not text:
        return {"q": text, "target": target, "matches": matches, "unavailable": unavailable, "window": browse.SEARCH_WINDOW}

    job_id = _job_id(text)
    if job_id is not None:
        job = run_panel(browse.get_job, job_id)
        if not job.ok:
            unavailable.append({"what": "jobs", "error": job.error})
        elif job.data is not None:
            where = "archive" if job.data.get("archived") else job.data.get("status", "")
            url = url_for("jobs.detail", job_id=job_id)
            matches.append({"type": "job", "label": f"job {job_id}",
                            "detail": f"{job.data.get('kind', '')} in queue {job.data.get('queue', '')} ({where})",
                            "url": url})
            target = url

    queues = _queue_names()
    if not queues.ok:
        unavailable.append({"what": "queues", "error": queues.error})
    else:
        needle = text.lower()
        found = sorted(n for n in queues.data if needle in n.lower())
        for name in found[:MAX_MATCHES]:
            matches.append({"type": "queue", "label": name, "detail": "queue",
                            "url": url_for("queues.detail", name=name)})
        if target is None and text in queues.data:
            target = url_for("queues.detail", name=text)

    groups = run_panel(m.groups, limit=GROUP_LIMIT)
    group_matches = []
    if not groups.ok:
        unavailable.append({"what": "error groups", "error": groups.error})
    else:
        needle = text.lower()
        for grp in groups.data:
            # Matched and labelled as the user sees the group (the dead-letters page's rule), so
            # a search for a redacted value finds nothing and shows nothing.
            shown = group_for(grp, g.user)
            example, fingerprint = shown["example"] or "", shown["fingerprint"]
            if needle in fingerprint.lower() or needle in example.lower():
                group_matches.append({
                    "type": "error_group", "label": fingerprint,
                    "detail": f"{grp['count']:,} dead letter{'s' if grp['count'] != 1 else ''} in "
                              f"{', '.join(grp.get('queues') or [])}",
                    "url": url_for("deadletters.jobs", fingerprint=fingerprint if shown["filterable"] else None),
                })
        matches += group_matches[:MAX_MATCHES]
    if target is None and len(matches) == 1 and len(group_matches) == 1:
        target = group_matches[0]["url"]
    if not any(x["type"] == "job" for x in matches):  # digits naming a job are that job, not a value
        found = run_panel(browse.search_payload, text, limit=MAX_MATCHES)
        if not found.ok:
            unavailable.append({"what": "payloads", "error": found.error})
        else:
            matches += _payload_matches(found.data, text)
    return {"q": text, "target": target, "matches": matches, "unavailable": unavailable,
            "window": browse.SEARCH_WINDOW}


def _payload_matches(rows: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """Payload matches as the user may see them: the value must show in the payload after
    redaction (a viewer's search for a redacted value finds nothing)."""
    values = browse.payload_values(text)
    out = []
    for row in rows:
        shape = browse.containing(payload_for(row["payload"], g.user), values)
        if shape is None:
            continue
        args = {"payload": json.dumps(shape, separators=(",", ":"), ensure_ascii=False)}
        if row["archived"]:
            args["archived"] = "1"
        out.append({"type": "payload", "label": f"job {row['id']}",
                    "detail": f"{row['kind']} in queue {row['queue']} ({'archived' if row['archived'] else row['status']}): "
                              f"payload {args['payload'][:120]}",
                    "url": url_for("jobs.detail", job_id=row["id"]), "filter_url": url_for("jobs.index", **args)})
    return out


@bp.get("/search")
@requires("viewer")
def index():
    data = search_data(query_arg())
    if data["target"] and not request.args.get("list"):
        return redirect(data["target"])
    return render_template("search/index.html", search_q=data["q"], **data)


@bp.get("/api/v1/search")
@requires("viewer")
@api_doc("Find a job by id, a queue by name, or an error group by its text",
         params=[Param("q", max_length=MAX_QUERY,
                       description="a job id (42 or #42), a queue name, or part of an error text; "
                                   "blank finds nothing")],
         description="`target` is where the search page jumps: the job (hot table or archive), the queue "
                     "named exactly, or the only error group matching; null when it lists `matches` instead. "
                     "Error groups match their fingerprint or example error text (redacted for viewers), among "
                     f"the {GROUP_LIMIT} largest groups. Payload matches hold the text (or its number) as a value, "
                     f"among the newest {browse.SEARCH_WINDOW:,} jobs and archived jobs (`window`), as the user sees "
                     "the payload. A part whose query timed out is in `unavailable`.",
         responses={"400": "q is longer than 200 characters"},
         response=obj({"q": STR, "target": opt(STR), "matches": arr(MATCH),
                       "unavailable": arr(obj({"what": STR, "error": STR})), "window": INT}, optional=("window",)))
def api_index():
    return jsonify(search_data(query_arg()))

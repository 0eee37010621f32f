"""Fix and replay: an admin edits a dead letter's payload, priority, queue or run-at, sees the
change as a diff, gives a reason, and replays it.

GET  /jobs/<id>/edit-replay                    the form (payload with its secrets shown as [redacted])
POST /jobs/<id>/edit-replay/preview            the diff and the confirm form (htmx: the fragment alone)
POST /jobs/<id>/edit-replay/apply              edit and replay, bound to the preview's version; 303 to the job
POST /api/v1/jobs/<id>/edit-replay/preview     the same, as JSON (changes nothing)
POST /api/v1/jobs/<id>/edit-replay/apply       the same, as JSON

Every route needs the admin role (viewers and operators get 403 whatever they send: the role
is checked before a field is read), and the session's CSRF token or an admin's API token for
the POSTs (console/web/auth.py). The work is console.maintenance.edit_replay's: this module
only translates requests, so the CLI (`skiplock replay --id N --set-...`) behaves the same.

What an admin sees of a secret (console.maintenance.edit_replay): the values of the redacted
keys (the defaults and web.redact_keys) are `[redacted]` in the form, the diff, the audit row
and the API's answers; leaving `[redacted]` in place keeps the stored value. The deployer's
`web.redact_hook` is not applied to the editor: what the form shows is what is written back.

Errors: 400 a field that cannot be used (named; the plain form comes back with the typed
values), 404 no such job, 409 the job is not failed or changed since the preview, 422 no reason.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, abort, jsonify, redirect, render_template, request, url_for

from console.actions import MAX_REASON
from console.maintenance import edit_replay as er
from console.maintenance.actions import known_queues
from console.maintenance.settings import MaintenanceSettings
from console.redaction import DEFAULT_KEYS
from console.web.actor import actor, reason_for
from console.web.api import ANY, INT, OBJ, STR, TIME, api_doc, arr, obj, opt
from console.web.auth import requires
from console.web.database import get_conn, run_limited, run_panel

bp = Blueprint("editreplay", __name__)

ROLE = "admin"


def _state():
    from console.web import state

    return state()


def edit_keys() -> frozenset[str]:
    """The keys whose values an edit never shows: the defaults and web.redact_keys (as the
    webhooks and fingerprints hide them), whoever is looking."""
    return DEFAULT_KEYS | _state().redact_keys


def _job(job_id: int) -> dict[str, Any]:
    """The job as the form shows it; 404 or 409 (not a failed job) as the apply would answer."""
    try:
        job = run_limited(er.read_job, job_id)
        er.check_state(job)
    except er.JobNotFound as exc:
        abort(404, str(exc))
    except er.EditConflict as exc:
        abort(409, str(exc))
    return job


def _form_values(job: dict[str, Any]) -> dict[str, str]:
    """The form's fields as the job has them (the payload's secrets as [redacted]; empty, so
    unchanged, when the stored payload cannot be edited in a form)."""
    payload = "" if er.payload_not_editable(job["payload"]) else er.editable_payload(job["payload"], edit_keys())
    return {"payload": payload, "priority": str(job["priority"]), "queue": job["queue"], "run_at": ""}


def _queues() -> list[str]:
    found = run_panel(known_queues)
    return sorted(found.data)[:200] if found.ok else []


def _page(job_id: int, *, values: dict[str, str] | None = None, preview: dict[str, Any] | None = None,
          error: str | None = None, status: int = 200):
    job = _job(job_id)
    hint = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:00Z")  # a future time, never a fixed past one
    return render_template("editreplay/form.html", job=job, values=values or _form_values(job), preview=preview,
                           error=error, queues=_queues(), now_hint=hint,
                           payload_note=er.payload_not_editable(job["payload"])), status


def _submitted() -> dict[str, str]:
    return {name: request.form.get(name, "") for name in er.EDITABLE}


def _api_fields() -> tuple[dict[str, Any], bool]:
    """(the fields, whether the payload is JSON text): a JSON object body, or a form."""
    if request.is_json:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            abort(400, "body: send a JSON object (Content-Type: application/json)")
        return body, False
    return request.form.to_dict(), True


def _preview(job_id: int, fields: dict[str, Any], *, payload_is_text: bool, strict: bool) -> dict[str, Any]:
    edit = er.parse_edit(fields, payload_is_text=payload_is_text, strict=strict)
    try:
        shown = run_limited(er.preview, job_id, edit, keys=edit_keys())
    except er.JobNotFound as exc:
        abort(404, str(exc))
    except er.EditConflict as exc:
        abort(409, str(exc))
    return shown.as_dict()


def _apply(job_id: int, fields: dict[str, Any], *, payload_is_text: bool, strict: bool,
           body: dict[str, Any] | None = None) -> dict[str, Any]:
    reason = reason_for("edit_replay", body)  # 422 before anything else is looked at
    edit = er.parse_edit(fields, payload_is_text=payload_is_text, strict=strict)
    version = fields.get("version")
    if not isinstance(version, str) or not version.strip():
        abort(400, "version: required: send back the preview's `version` (the apply is bound to what was previewed)")
    history = MaintenanceSettings.from_config(_state().config).error_history
    try:
        return er.apply(get_conn(), job_id, edit, version=version.strip(), actor=actor(), reason=reason,
                        keys=edit_keys(), history=history)
    except er.JobNotFound as exc:
        abort(404, str(exc))
    except er.EditConflict as exc:
        abort(409, str(exc))


# --- the console ------------------------------------------------------------------------------


@bp.get("/jobs/<int:job_id>/edit-replay")
@requires(ROLE)
def form(job_id: int):
    return _page(job_id)


@bp.post("/jobs/<int:job_id>/edit-replay/preview")
@requires(ROLE)
def preview(job_id: int):
    values = _submitted()
    htmx = bool(request.headers.get("HX-Request"))
    try:
        data = _preview(job_id, request.form.to_dict(), payload_is_text=True, strict=False)
    except er.InvalidEdit as exc:
        if htmx:
            raise  # a 400 with the message: the page shows it as a toast, the form keeps what was typed
        return _page(job_id, values=values, error=str(exc), status=400)
    if htmx:
        return render_template("editreplay/_preview.html", preview=data, values=values, job=data["job"])
    return _page(job_id, values=values, preview=data)


@bp.post("/jobs/<int:job_id>/edit-replay/apply")
@requires(ROLE)
def apply(job_id: int):
    _apply(job_id, request.form.to_dict(), payload_is_text=True, strict=False)
    return redirect(url_for("jobs.detail", job_id=job_id), 303)


# --- the API ----------------------------------------------------------------------------------

EDIT_BODY = {
    "payload": {**ANY, "description": "the new payload (any JSON value; at most 256 KiB, 100 levels deep); "
                                      "`[redacted]` at a redacted key keeps the stored value"},
    "priority": {**INT, "minimum": -32768, "maximum": 32767},
    "queue": {**STR, "maxLength": er.MAX_NAME, "description": "a queue that exists (has jobs, samples, limits, or was paused)"},
    "run_at": {**TIME, "description": "ISO 8601; UTC when no offset; default: now"},
}
PREVIEW_BODY = obj(EDIT_BODY, optional=tuple(EDIT_BODY))
PREVIEW_BODY["additionalProperties"] = False
APPLY_BODY = obj({**EDIT_BODY, "version": {**STR, "description": "the preview's `version`"},
                  "reason": {**STR, "minLength": 1, "maxLength": MAX_REASON, "description": "why (kept in the audit log)"}},
                 optional=tuple(EDIT_BODY))
APPLY_BODY["additionalProperties"] = False
CHANGE = obj({"field": {**STR, "enum": list(er.EDITABLE)}, "path": {**opt(STR), "description": "the payload's JSON path ($.a.b[0])"},
              "change": {**STR, "enum": ["added", "removed", "changed"]}, "old": ANY, "new": ANY})
EDIT_NOTE = ("Admins only (viewers and operators: 403 for every field). Give any of payload, priority, queue, run_at; "
             "a form body works too (payload as JSON text). The values of redacted keys are `[redacted]` in every "
             "answer and in the audit log. kind, max_attempts and the other fields cannot be changed (400).")


@bp.post("/api/v1/jobs/<int:job_id>/edit-replay/preview")
@requires(ROLE)
@api_doc("Preview fixing a dead letter before its replay: the change as a diff (changes nothing)", body=PREVIEW_BODY,
         description=EDIT_NOTE + " Send `confirm.version` back to .../edit-replay/apply.",
         response=obj({"id": INT, "version": STR, "changes": arr(CHANGE), "more_changes": INT,
                       "job": OBJ, "confirm": obj({"version": STR})}),
         responses={"400": "a field that cannot be used (named), an unknown queue, or nothing to change",
                    "409": "the job is not failed (running, pending, completed)"})
def api_preview(job_id: int):
    fields, as_text = _api_fields()
    return jsonify(_preview(job_id, fields, payload_is_text=as_text, strict=True))


@bp.post("/api/v1/jobs/<int:job_id>/edit-replay/apply")
@requires(ROLE)
@api_doc("Fix a dead letter and replay it (audited with the old and new values, redacted)", body=APPLY_BODY,
         description=EDIT_NOTE + " The job goes back to pending (due at run_at, else now) with fresh attempts.",
         response=obj({"id": INT, "status": STR, "queue": STR, "priority": INT, "run_at": TIME, "fields": arr(STR),
                       "changes": arr(CHANGE), "audit_id": INT}),
         responses={"400": "a field that cannot be used (named), no version, an unknown queue, or nothing to change",
                    "409": "the job is not failed, or changed since the preview (preview again)",
                    "422": "no reason"})
def api_apply(job_id: int):
    fields, as_text = _api_fields()
    return jsonify(_apply(job_id, fields, payload_is_text=as_text, strict=True,
                          body=fields if not as_text else None))

"""The JSON API's description: `@api_doc(...)` on each /api/v1 view, and the OpenAPI 3.1
document generated from the app's routes at /api/v1/openapi.json.

A route documents itself where it is defined; nothing else needs editing when an API route is
added. Parameters are `Param(name, where="query"|"path"|"form", type=..., minimum=..., enum=...)`;
`response=obj({...})` is the success body's shape (helpers below: STR, INT, TIME, opt, arr, ref);
error statuses get the shared `Error` component. tests/test_api_fuzz.py holds the routes to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, current_app, jsonify

from console.web.auth import requires

bp = Blueprint("api", __name__)

API_PREFIX = "/api/v1"


# --- schema helpers for the decorators: `obj({...})`, `arr(...)`, `opt(...)`, `ref("Error")` ---

STR: dict[str, Any] = {"type": "string"}
INT: dict[str, Any] = {"type": "integer"}
NUM: dict[str, Any] = {"type": "number"}
BOOL: dict[str, Any] = {"type": "boolean"}
TIME: dict[str, Any] = {"type": "string", "format": "date-time"}
OBJ: dict[str, Any] = {"type": "object"}
ANY: dict[str, Any] = {}


def opt(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema, or null."""
    return {"anyOf": [schema, {"type": "null"}]}


def arr(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(props: dict[str, Any], *, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object with these properties, all required but `optional`; other keys allowed."""
    out: dict[str, Any] = {"type": "object", "properties": props}
    required = [k for k in props if k not in optional]
    if required:
        out["required"] = required
    return out


def panel(schema: dict[str, Any]) -> dict[str, Any]:
    """A panel's data, or {available: false, error} when its query failed or timed out."""
    return {"anyOf": [schema, ref("Unavailable")]}


# Shapes several routes share (the document's components/schemas).
COMPONENTS: dict[str, dict[str, Any]] = {
    "Error": {**obj({"error": {**STR, "description": "what is wrong, naming the parameter"},
                     "status": {**INT, "description": "the HTTP status again"}}, optional=("status",)),
              "description": "Every error answer: 400 bad input, 401 no or bad token, 403 role too small, "
                             "404 no such thing, 409 state conflict, 422 invalid content, 503 database "
                             "unreachable or too slow."},
    "Unavailable": obj({"available": {"const": False}, "error": STR}),
    "Operation": obj({
        "id": INT, "action": {"enum": ["replay", "purge"]}, "state": STR, "selection": OBJ,
        "actor": STR, "reason": opt(STR), "total": opt(INT), "done": INT, "percent": opt(NUM),
        "active": BOOL, "rows_per_s": opt(NUM), "eta_s": opt(NUM), "created_at": TIME,
        "started_at": opt(TIME), "finished_at": opt(TIME), "error": opt(STR),
    }, optional=("rows_per_s", "eta_s", "percent")),
    "Job": obj({
        "id": INT, "queue": STR, "kind": STR, "status": {"enum": ["pending", "running", "completed", "failed"]},
        "priority": INT, "run_at": TIME, "attempts": INT, "max_attempts": INT, "last_error": opt(STR),
        "error_fingerprint": opt(STR), "created_at": TIME, "finished_at": opt(TIME), "payload": ANY,
        "fingerprint_hidden": {**BOOL, "description": "the fingerprint is shown redacted (viewers): it cannot be a filter"},
        "attempt_logs": {**arr(ref("AttemptLog")), "description": "one job's page only: the log records of each "
                         "attempt that logged, oldest first (at most [queue] error_history attempts)"},
    }, optional=("payload", "priority", "run_at", "status", "fingerprint_hidden", "attempt_logs")),
    "AttemptLog": {**obj({
        "attempt": INT, "worker": opt(STR), "at": STR, "outcome": {"enum": ["completed", "failed"]},
        "records": arr(obj({"at": STR, "level": STR, "logger": STR, "message": STR, "extra": OBJ, "exc": STR},
                           optional=("extra", "exc"))),
        "dropped": {**INT, "description": "records left out by the worker's bounds, between the first "
                    "`dropped_after` records and the last ones"},
        "dropped_after": INT,
    }, optional=("dropped_after",)),
        "description": "One attempt's log records (the `logging` records its handler emitted), as the worker "
                       "kept them: bounded ([worker] log_records, log_message_chars, log_attempt_chars) and "
                       "redacted; viewers see them redacted again with web.redact_keys."},
    "Alert": obj({
        "id": INT, "rule": STR, "labels": OBJ, "state": STR, "state_since": TIME, "value": opt(NUM),
        "evaluated_at": opt(TIME), "fired_at": opt(TIME), "severity": opt(STR), "summary": opt(STR),
        "runbook": opt(STR), "condition": opt(STR), "acknowledged_by": opt(STR), "acknowledged_at": opt(TIME),
        "ack_note": opt(STR),
        "last_over_value": {**opt(NUM), "description": "the last value that met the rule's condition; a "
                            "resolved alert's summary shows it"},
        "look_here": {**arr(obj({"label": STR, "path": STR, "url": opt(STR)})),
                      "description": "where to look first, most useful first (console/alerts/links.py)"},
    }),
    "AlertEvent": obj({"id": INT, "at": TIME, "kind": STR, "value": opt(NUM), "actor": opt(STR),
                       "alert_id": INT, "rule": STR, "labels": OBJ}, optional=("value", "actor")),
    "Delivery": obj({"id": INT, "at": TIME, "destination": STR, "attempt": INT, "outcome": STR,
                     "http_status": opt(INT), "error": opt(STR), "duration_ms": opt(NUM), "alert_id": opt(INT),
                     "event": STR}),
    "ErrorGroup": obj({
        "fingerprint": STR, "state": {**opt({**STR, "enum": ["new", "regressed", "ignored"]}),
                                      "description": "new or regressed: what the new_error_group alert is about"},
        "first_seen": TIME, "last_seen": TIME, "kinds": arr(STR), "queues": arr(STR), "example": opt(STR),
        "example_job": opt(INT), "change": opt(STR), "change_at": opt(TIME), "previous_seen": opt(TIME),
        "ignored_at": opt(TIME), "ignored_by": opt(STR), "ignore_reason": opt(STR),
    }, optional=("example_job", "change", "change_at", "previous_seen")),
    "Silence": obj({"id": INT, "rule": opt(STR), "labels": OBJ, "starts_at": TIME, "ends_at": TIME,
                    "reason": STR, "created_by": STR, "expired_by": opt(STR)}),
}

# Statuses an API route may answer besides its success, with what they mean by default.
ERRORS = {
    "400": "bad input: the message names the parameter",
    "401": "no, invalid or revoked bearer token",
    "403": "the token's user lacks the role",
    "404": "no such thing (or a path value that is not one)",
    "409": "the thing's state does not allow it",
    "422": "the content is well-formed but invalid",
    "503": "the database is unreachable, the schema is missing, or the query exceeded its time limit",
}

_PATH_SCHEMA = {
    # Flask's int converter matches digits only; ids are PostgreSQL bigints.
    "int": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
    # A string path segment: one or more characters, never a slash.
    None: {"type": "string", "minLength": 1, "pattern": "^[^/]+$"},
    "string": {"type": "string", "minLength": 1, "pattern": "^[^/]+$"},
}


@dataclass(frozen=True)
class Param:
    """One parameter: in the query string, a path segment, or a field of a form body."""

    name: str
    where: str = "query"
    type: str = "string"
    description: str = ""
    required: bool = False
    enum: tuple[str, ...] | None = None
    format: str | None = None
    minimum: int | None = None
    maximum: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    repeat: bool = False  # an array: ?x=1&x=2 or a repeated form field
    # A string that holds JSON (a payload filter, a selection: "text"), or JSON encoded as
    # base64url (a page cursor: "base64url"): the schema says so (`contentMediaType`,
    # `contentEncoding`, and `format` json or json-base64url, which tests/test_api_fuzz.py
    # generates deep and wide JSON for); past jsonbounds' depth it answers 400.
    json: str | None = None

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": self.type}
        if self.json == "text":
            schema.update(format="json", contentMediaType="application/json")
        elif self.json == "base64url":
            schema.update(format="json-base64url", contentEncoding="base64url", contentMediaType="application/json")
        for key, value in (("enum", list(self.enum) if self.enum else None), ("format", self.format),
                           ("minimum", self.minimum), ("maximum", self.maximum),
                           ("maxLength", self.max_length), ("pattern", self.pattern)):
            if value is not None:
                schema[key] = value
        return {"type": "array", "items": schema} if self.repeat else schema


def api_doc(summary: str, *, params: list[Param] | tuple[Param, ...] = (), tag: str | None = None,
            description: str = "", auth: bool = True, responses: dict[str, str | tuple[str, dict]] | None = None,
            response: dict[str, Any] | None = None, status: int = 200, body: dict[str, Any] | None = None,
            media: tuple[str, ...] = ("application/json",)):
    """Attach an OpenAPI description to a view (apply it under the route decorator).

    `response` is the JSON schema of the success body (status `status`, in each of `media`);
    `responses` adds statuses with their meaning ("409": "already ended"), answered with the Error
    body unless given as (meaning, schema); 400 (when there are
    parameters), 401/403 (with auth), 404 (with path parameters) and 503 are added for you.
    `body` is a JSON request body's schema (then form `params` are its form-encoded twin).
    """

    def decorate(view):
        view._openapi = {
            "summary": summary,
            "params": list(params),
            "tag": tag,
            "description": description,
            "auth": auth,
            "responses": responses or {},
            "response": response,
            "status": str(status),
            "body": body,
            "media": media,
        }
        return view

    return decorate


_CONVERTER = re.compile(r"<(?:(\w+):)?(\w+)>")


def _operation(rule, method: str, doc: dict[str, Any], role: str | None) -> dict[str, Any]:
    path_params = {name: conv for conv, name in _CONVERTER.findall(rule.rule)}
    documented = {p.name: p for p in doc["params"] if p.where == "path"}
    parameters = []
    for name, conv in path_params.items():
        p = documented.get(name)
        schema = dict(_PATH_SCHEMA.get(conv, _PATH_SCHEMA[None]))
        if p is not None and p.enum:
            schema = {"type": "string", "enum": list(p.enum)}
        parameters.append({"name": name, "in": "path", "required": True, "schema": schema,
                           **({"description": p.description} if p is not None and p.description else {})})
    form = [p for p in doc["params"] if p.where == "form"]
    for p in doc["params"]:
        if p.where in ("query", "header"):
            entry = {"name": p.name, "in": p.where, "required": p.required, "schema": p.schema()}
            if p.description:
                entry["description"] = p.description
            if p.repeat:
                entry.update(style="form", explode=True)
            parameters.append(entry)

    success: dict[str, Any] = {"description": "OK" if doc["status"] == "200" else doc["responses"].get(doc["status"], "OK")}
    schema = doc["response"] if doc["response"] is not None else OBJ
    success["content"] = {m: {"schema": schema if m == "application/json" else STR} for m in doc["media"]}
    responses: dict[str, Any] = {doc["status"]: success}
    errors: dict[str, Any] = {}
    if form or doc["body"] or any(p.where in ("query", "header") for p in doc["params"]):
        errors["400"] = ERRORS["400"]
    if doc["auth"]:
        errors["401"] = ERRORS["401"]
        errors["403"] = f"needs the {role or ('viewer' if method == 'GET' else 'operator')} role"
    if path_params:
        errors["404"] = ERRORS["404"]
    # A route that takes a reason applies console.actions' rule to it (a required one missing, or
    # one with fewer than 3 visible characters, is a 422), whether its own doc says so or not.
    takes_reason = any(p.name == "reason" for p in doc["params"]) or "reason" in ((doc["body"] or {}).get("properties") or {})
    if takes_reason:
        errors["422"] = "the reason says nothing: missing where this action needs one, or fewer than 3 visible characters"
    errors["503"] = ERRORS["503"]
    errors.update({code: text for code, text in doc["responses"].items() if not code.startswith("2")})
    for code in sorted(errors):
        text, schema = errors[code] if isinstance(errors[code], tuple) else (errors[code], ref("Error"))
        responses[code] = {"description": text, "content": {"application/json": {"schema": schema}}}

    op: dict[str, Any] = {
        "summary": doc["summary"],
        "operationId": f"{rule.endpoint}.{method.lower()}",
        "tags": [doc["tag"] or rule.endpoint.split(".")[0]],
        "parameters": parameters,
        "responses": responses,
    }
    if doc["description"] or role:
        op["description"] = (doc["description"] + (f"\n\nRole: {role}." if role else "")).strip()
    if not doc["auth"]:
        op["security"] = []
    content: dict[str, Any] = {}
    if doc["body"]:
        content["application/json"] = {"schema": doc["body"]}
    if form:
        content["application/x-www-form-urlencoded"] = {"schema": {
            "type": "object",
            "properties": {p.name: {**p.schema(), **({"description": p.description} if p.description else {})}
                           for p in form},
            **({"required": [p.name for p in form if p.required]} if any(p.required for p in form) else {}),
        }}
    if content:
        op["requestBody"] = {"required": any(p.required for p in form) or bool(doc["body"]), "content": content}
    return op


def openapi_document(app) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        view = app.view_functions.get(rule.endpoint)
        doc = getattr(view, "_openapi", None)
        if doc is None or not (rule.rule.startswith(API_PREFIX) or rule.rule == "/healthz"):
            continue
        path = _CONVERTER.sub(r"{\2}", rule.rule)
        role = getattr(view, "_skiplock_role", None)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = _operation(rule, method, doc, role)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Skiplock console API",
            "version": "1",
            "description": "Everything the console's pages show, as JSON, and every action. "
                           "Authenticate with `Authorization: Bearer <token>` (`skiplock users token NAME`). "
                           "Times are ISO 8601 in UTC. Errors are `{\"error\": message, \"status\": code}`.",
        },
        "components": {
            "schemas": COMPONENTS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "An API token from `skiplock users token NAME` "
                                                          "or the admin page; it acts with its user's role."}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }


@bp.get(f"{API_PREFIX}/openapi.json")
@requires("viewer")
@api_doc("This document", tag="meta", response=obj({"openapi": STR, "info": OBJ, "paths": OBJ, "components": OBJ}))
def openapi():
    return jsonify(openapi_document(current_app))

"""The JSON API's description: `@api_doc(...)` on each /api/v1 view, and the OpenAPI 3.1
document generated from the app's routes at /api/v1/openapi.json.

A route documents itself where it is defined; nothing else needs editing when an API route is
added. Parameters are `Param(name, where="query"|"path"|"form", type=..., description=...)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, current_app, jsonify

from console.web.auth import requires

bp = Blueprint("api", __name__)

API_PREFIX = "/api/v1"


@dataclass(frozen=True)
class Param:
    name: str
    where: str = "query"
    type: str = "string"
    description: str = ""
    required: bool = False
    enum: tuple[str, ...] | None = None


def api_doc(summary: str, *, params: list[Param] | tuple[Param, ...] = (), tag: str | None = None,
            description: str = "", auth: bool = True, responses: dict[str, str] | None = None):
    """Attach an OpenAPI description to a view (apply it under the route decorator)."""

    def decorate(view):
        view._openapi = {
            "summary": summary,
            "params": list(params),
            "tag": tag,
            "description": description,
            "auth": auth,
            "responses": responses or {},
        }
        return view

    return decorate


_CONVERTER = re.compile(r"<(?:(\w+):)?(\w+)>")
_TYPES = {"int": "integer", "float": "number", "string": "string", "path": "string", None: "string"}


def openapi_document(app) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        view = app.view_functions.get(rule.endpoint)
        doc = getattr(view, "_openapi", None)
        if doc is None or not (rule.rule.startswith(API_PREFIX) or rule.rule == "/healthz"):
            continue
        path = _CONVERTER.sub(r"{\2}", rule.rule)
        path_params = {name: _TYPES.get(conv, "string") for conv, name in _CONVERTER.findall(rule.rule)}
        role = getattr(view, "_skiplock_role", None)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            op: dict[str, Any] = {
                "summary": doc["summary"],
                "operationId": f"{rule.endpoint}.{method.lower()}",
                "tags": [doc["tag"] or rule.endpoint.split(".")[0]],
                "parameters": [],
                "responses": {
                    "200": {"description": "OK"},
                    **({"400": {"description": "bad parameter (message in `error`)"},
                        "401": {"description": "no or invalid token"},
                        "403": {"description": f"needs role {role or ('viewer' if method == 'GET' else 'operator')}"}}
                       if doc["auth"] else {}),
                    **{code: {"description": text} for code, text in doc["responses"].items()},
                },
            }
            if doc["description"] or role:
                op["description"] = (doc["description"] + (f"\n\nRole: {role}." if role else "")).strip()
            if not doc["auth"]:
                op["security"] = []
            for name, typ in path_params.items():
                op["parameters"].append({"name": name, "in": "path", "required": True, "schema": {"type": typ}})
            form = []
            for p in doc["params"]:
                schema: dict[str, Any] = {"type": p.type}
                if p.enum:
                    schema["enum"] = list(p.enum)
                if p.where == "form":
                    form.append((p, schema))
                elif p.where != "path" or p.name not in path_params:
                    op["parameters"].append({"name": p.name, "in": p.where, "required": p.required,
                                             "description": p.description, "schema": schema})
            if form:
                op["requestBody"] = {"content": {"application/x-www-form-urlencoded": {"schema": {
                    "type": "object",
                    "properties": {p.name: {**schema, "description": p.description} for p, schema in form},
                    "required": [p.name for p, _ in form if p.required],
                }}}}
            paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Skiplock console API",
            "version": "1",
            "description": "Everything the console's pages show, as JSON, and every action. "
                           "Authenticate with `Authorization: Bearer <token>` (`skiplock users token NAME`). "
                           "Times are ISO 8601 in UTC. Errors are `{\"error\": message, \"status\": code}`.",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": paths,
    }


@bp.get(f"{API_PREFIX}/openapi.json")
@requires("viewer")
@api_doc("This document", tag="meta")
def openapi():
    return jsonify(openapi_document(current_app))

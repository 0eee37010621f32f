"""The OpenAPI document at /api/v1/openapi.json: valid OpenAPI 3.1, and complete (every /api/
route of the app is in it, with its methods)."""

from __future__ import annotations

import re

import pytest

from console.web.api import openapi_document

schemathesis = pytest.importorskip("schemathesis")


def test_the_document_is_valid_openapi_3_1(web_app):
    from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

    doc = openapi_document(web_app)
    errors = [f"{'/'.join(map(str, e.instance_path))}: {e.message}" for e in OPENAPI_31_VALIDATOR.iter_errors(doc)]
    assert not errors, "\n".join(errors[:20])
    loaded = schemathesis.openapi.from_dict(doc)  # Schemathesis resolves every operation and $ref
    assert all(result.ok() for result in loaded.get_all_operations())


def test_every_api_route_is_in_the_document(web_app):
    paths = openapi_document(web_app)["paths"]
    missing = []
    for rule in web_app.url_map.iter_rules():
        if not rule.rule.startswith("/api/"):
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            if method.lower() not in paths.get(path, {}):
                missing.append(f"{method} {path}")
    assert not missing, f"undocumented API routes (add @api_doc): {missing}"


def test_errors_use_the_error_component_and_the_token_scheme(web_app, client_as):
    doc = client_as("viewer").get("/api/v1/openapi.json").get_json()
    assert doc["components"]["securitySchemes"]["bearer"] == {**doc["components"]["securitySchemes"]["bearer"],
                                                              "type": "http", "scheme": "bearer"}
    op = doc["paths"]["/api/v1/jobs/{job_id}/{action}"]["post"]
    assert set(op["responses"]) == {"200", "400", "401", "403", "404", "409", "422", "503"}  # 422: a purge without a reason
    assert op["responses"]["409"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    params = {p["name"]: p for p in op["parameters"]}
    assert params["job_id"]["schema"]["type"] == "integer" and params["action"]["schema"]["enum"]

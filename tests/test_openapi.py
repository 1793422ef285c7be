"""/openapi.json is valid OpenAPI 3.1 and lists exactly the registered routes."""

from __future__ import annotations

from flask import Flask
from flask.testing import FlaskClient
from openapi_spec_validator import validate

from accountant.api.openapi import OPERATIONS, flask_path


def test_the_document_is_valid_openapi(client: FlaskClient) -> None:
    document = client.get("/openapi.json").get_json()
    validate(document)
    assert document["openapi"] == "3.1.0"
    assert all(path.startswith("/") for path in document["paths"])


def test_the_document_matches_the_routes(app: Flask) -> None:
    routes = {
        (method, rule.rule)
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static" and not rule.rule.startswith("/dashboard")
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}
    }
    documented = {(method, flask_path(path)) for method, path in OPERATIONS}
    assert routes == documented

"""docs/admin-api.md is kept true with the API: every route in the OpenAPI
schema is documented there, and every route documented there exists."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.admin import build_admin_app
from gateway.admin.errors import CODES
from gateway.config.values import Config
from gateway.observability.metrics import Metrics
from gateway.serving.memory import MemoryBudget

DOC = Path(__file__).resolve().parents[3] / "docs" / "admin-api.md"
# Pages, not in the schema: the schema itself, its browsable form, the status page.
SCHEMA_PAGES = {("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/status")}


class _NotStarted:
    started = False
    tiering = None
    metrics = Metrics()
    memory = MemoryBudget(None)


def _routes() -> set[tuple[str, str]]:
    schema = build_admin_app(Config(admin_token="t"), _NotStarted()).openapi()
    return {(method.upper(), path) for path, ops in schema["paths"].items() for method in ops}


def test_every_route_is_documented() -> None:
    documented = set(re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`?\s]*)", DOC.read_text()))
    routes = _routes()
    assert routes - documented == set(), "routes missing from docs/admin-api.md"
    assert documented - routes - SCHEMA_PAGES == set(), "docs/admin-api.md names routes that do not exist"


def test_every_error_code_is_documented() -> None:
    text = DOC.read_text()
    missing = [code for code in CODES if f"`{code}`" not in text]
    assert not missing, f"error codes missing from docs/admin-api.md: {missing}"

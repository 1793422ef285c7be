"""The documents in docs/ say what the service does: docs/api.md lists exactly the
operations of /openapi.json, with their operation ids and success statuses, and the
README and docs/ name no document the repository does not have."""

from __future__ import annotations

import re
from pathlib import Path

from accountant.api.openapi import document

ROOT = Path(__file__).parent.parent


def test_the_api_document_lists_every_operation() -> None:
    rows = re.findall(
        r"^\| `(GET|POST|PATCH|DELETE) ([^`]+)` \| `([A-Za-z]+)` \| (\d{3}) ",
        (ROOT / "docs" / "api.md").read_text(),
        re.M,
    )
    documented = {(method, path, operation, status) for method, path, operation, status in rows}
    served = {
        (
            method.upper(),
            path,
            op["operationId"],
            next(s for s in op["responses"] if s.startswith("2")),
        )
        for path, ops in document()["paths"].items()
        for method, op in ops.items()
    }
    assert documented == served


def test_documents_named_exist() -> None:
    for text in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in re.findall(r"`(docs/[a-z_]+\.md)`", text.read_text()):
            assert (ROOT / name).exists(), f"{text.name} names {name}"

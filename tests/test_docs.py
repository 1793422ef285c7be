"""The documents in docs/ say what the service does: docs/api.md lists exactly the
operations of /openapi.json, with their operation ids and success statuses,
docs/architecture.md names every file a charge runs, and the README and docs/ name no
document the repository does not have."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from accountant.api.openapi import document
from tests.conftest import Api

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


def test_the_architecture_names_every_file_a_charge_runs(api: Api) -> None:
    """The path of a charge in docs/architecture.md: the files its steps name all run, and
    with the ones it names as run besides, they are every file of the service that a
    grant and a denial run; the count it gives is theirs."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## The path of a charge") : text.index("## Where things go")]
    intro, steps = section[: section.index("\n1. ")], section[section.index("\n1. ") :]
    steps = steps[: steps.index("A preview and a plan")]
    package = ROOT / "accountant"
    files = {path.relative_to(package).as_posix() for path in package.rglob("*.py")}

    def named(part: str) -> list[str]:
        found: list[str] = []
        for token in re.findall(r"`([\w/]+\.py)(?::[^`]*)?`", part):
            if token.startswith("tests/"):
                continue
            matches = [f for f in files if f == token or f.endswith("/" + token)]
            assert len(matches) == 1, f"{token} names {matches}"
            if matches[0] not in found:
                found.append(matches[0])
        return found

    path, besides = named(steps), named(intro)
    stated = re.search(r"passes through these (\d+) files", intro)
    assert stated is not None and int(stated.group(1)) == len(path)

    api.make_dataset(budget={"epsilon": 1})
    assert api.charge().status_code == 201  # the key remembered, every statement compiled
    ran: set[str] = set()

    def note(frame: FrameType, event: str, _arg: Any) -> None:
        name = Path(frame.f_code.co_filename)
        if event == "call" and name.is_relative_to(package):
            ran.add(name.relative_to(package).as_posix())

    sys.setprofile(note)
    try:
        granted = api.charge(headers={"Idempotency-Key": "k"})
        denied = api.charge(epsilon=5)
    finally:
        sys.setprofile(None)
    assert (granted.status_code, denied.status_code) == (201, 409)
    assert set(path) <= ran, set(path) - ran
    assert ran <= set(path) | set(besides), ran - set(path) - set(besides)

"""idempotency keys: a charge's answer kept as its facts, not as an HTTP response

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25

Each row kept the first answer to a keyed charge as an HTTP status, a body
and headers. It now keeps the answer's facts (``services.charge_responses``),
which ``api.charges.answer`` renders first time and on replay alike. The rows
are rewritten here, both ways, so that every replay gives the bytes its first
answer gave: a grant's body is its facts; a denial's problem document gives
its scope, amounts and reason, and its Retry-After the seconds after which a
retry may succeed.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_keys = sa.table(
    "idempotency_keys",
    sa.column("id", sa.Integer),
    sa.column("status", sa.Integer),
    sa.column("body", sa.JSON),
    sa.column("headers", sa.JSON),
    sa.column("facts", sa.JSON),
)

#: A denial's fields in its problem document, in their order there: those of this revision,
#: and those later revisions added (a hold's, a population's, the multiplicity), so that a
#: downgrade keeps every first answer whole.
_DENIAL = (
    "scope",
    "limit",
    "spent",
    "requested",
    "multiplicity",
    "charge_id",
    "hold_id",
    "hold_state",
    "partition",
    "population",
    "resets_at",
)
_PROBLEMS = "https://accountant.invalid/problems/"


def upgrade() -> None:
    op.add_column("idempotency_keys", sa.Column("facts", sa.JSON(), nullable=True))
    connection = op.get_bind()
    rows = connection.execute(sa.select(_keys.c.id, _keys.c.status, _keys.c.body, _keys.c.headers))
    for row in rows.all():
        facts = _facts(row.status, _json(row.body), _json(row.headers))
        connection.execute(_keys.update().where(_keys.c.id == row.id).values(facts=facts))
    with op.batch_alter_table("idempotency_keys") as batch:
        batch.alter_column("facts", existing_type=sa.JSON(), nullable=False)
        for name in ("status", "body", "headers"):
            batch.drop_column(name)


def downgrade() -> None:
    for name, kind in (("status", sa.Integer()), ("body", sa.JSON()), ("headers", sa.JSON())):
        op.add_column("idempotency_keys", sa.Column(name, kind, nullable=True))
    connection = op.get_bind()
    for row in connection.execute(sa.select(_keys.c.id, _keys.c.facts)).all():
        status, body, headers = _response(_json(row.facts))
        connection.execute(
            _keys.update()
            .where(_keys.c.id == row.id)
            .values(status=status, body=body, headers=headers)
        )
    with op.batch_alter_table("idempotency_keys") as batch:
        for name, kind in (("status", sa.Integer()), ("body", sa.JSON()), ("headers", sa.JSON())):
            batch.alter_column(name, existing_type=kind, nullable=False)
        batch.drop_column("facts")


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _facts(status: int, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """The facts of a remembered response: a grant's body as it is, a denial's from its
    problem document."""
    if status == 201:
        return {"kind": "granted", **body}
    facts = {"kind": "denied", **{k: body[k] for k in _DENIAL if k in body}}
    facts["reason"] = body["detail"]
    if "Retry-After" in headers:
        facts["fits_again_in_s"] = int(headers["Retry-After"])
    return facts


def _response(facts: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The status, body and headers the rows kept before this revision."""
    if facts["kind"] == "granted":
        return 201, {k: v for k, v in facts.items() if k != "kind"}, {}
    if "fits_again_in_s" in facts:
        status, slug, title = (
            429,
            "window-exhausted",
            "Window budget exhausted until the window resets",
        )
        headers = {"Retry-After": str(facts["fits_again_in_s"])}
    else:
        status, slug, title, headers = 409, "budget-exhausted", "Privacy budget exhausted", {}
    body = {"type": _PROBLEMS + slug, "title": title, "status": status, "detail": facts["reason"]}
    body.update({k: facts[k] for k in _DENIAL if k in facts})
    return status, body, headers

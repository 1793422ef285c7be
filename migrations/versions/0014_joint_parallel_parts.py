"""tallies: T and s(p) of the joint and of the parallel releases apart, for the top-k rule

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24

Adds T_J, T_P (``tallies.total_joint_*``, ``total_parallel_*``) and s_J(p),
s_P(p) (``tally_spends.joint_*``, ``parallel_*``, each indexed where positive
for the top-k reads), kept on datasets with the top-k rule only (user unit,
bounded k). Their existing rows first count all of their spend as parallel:
the second term of the top-k rule is sound for any division of the charges
into two sets (docs/accounting.md), and with every charge in one set it
equals the first. Then each tally whose T and s(p) equal the replay of its
granted ledger entries gets that replay's exact division; one that differs
(changed outside the service, or its consumer deleted) keeps the
conservative one. The ledger is read once, here, never on the charge path.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from alembic import op

from accountant.accounting.loss import ScopeBooks
from accountant.exact import Amount

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_NAMES = ("epsilon", "delta", "rho")
_PARTS = ("joint", "parallel")

_entries = sa.table(
    "ledger_entries",
    sa.column("dataset_id", sa.Integer),
    sa.column("seq", sa.BigInteger),
    sa.column("kind", sa.String),
    sa.column("status", sa.String),
    sa.column("consumer_id", sa.Integer),
    sa.column("release", sa.String),
    sa.column("partitions", sa.JSON),
    sa.column("cost_epsilon", sa.BigInteger),
    sa.column("cost_delta", sa.BigInteger),
    sa.column("cost_rho", sa.BigInteger),
    sa.column("multiplicity", sa.BigInteger),
    sa.column("created_at", sa.BigInteger),
)


def upgrade() -> None:
    for part in _PARTS:
        for name in _NAMES:
            column = sa.Column(
                f"total_{part}_{name}", sa.BigInteger(), server_default="0", nullable=False
            )
            op.add_column("tallies", column)
    for part in _PARTS:
        for name in _NAMES:
            column = sa.Column(
                f"{part}_{name}", sa.BigInteger(), server_default="0", nullable=False
            )
            op.add_column("tally_spends", column)
            positive = sa.text(f"{part}_{name} > 0")  # only datasets with the top-k rule
            op.create_index(
                f"ix_tally_spends_tally_{part}_{name}",
                "tally_spends",
                ["tally_id", f"{part}_{name}"],
                postgresql_where=positive,
                sqlite_where=positive,
            )
    # the parts are kept only on datasets with the top-k rule (``LossRule.parts``)
    top_k = (
        "SELECT t.id FROM tallies t JOIN datasets d ON d.id = t.dataset_id "
        "WHERE d.privacy_unit = 'user' AND d.max_partitions_per_user IS NOT NULL"
    )
    totals = ", ".join(f"total_parallel_{name} = total_{name}" for name in _NAMES)
    spends = ", ".join(f"parallel_{name} = {name}" for name in _NAMES)
    op.execute(f"UPDATE tallies SET {totals} WHERE id IN ({top_k})")
    op.execute(f"UPDATE tally_spends SET {spends} WHERE tally_id IN ({top_k})")
    connection = op.get_bind()
    datasets = connection.execute(
        sa.text(
            "SELECT id FROM datasets "
            "WHERE privacy_unit = 'user' AND max_partitions_per_user IS NOT NULL"
        )
    )
    for (dataset_id,) in datasets.all():
        _divide(connection, dataset_id)


def _divide(connection: Any, dataset_id: int) -> None:
    """Give each of the dataset's tallies that equals its ledger the ledger's division."""
    tallies = connection.execute(
        sa.text(
            "SELECT id, kind, consumer_id, period_seconds, window_start, total_epsilon, "
            "total_delta, total_rho FROM tallies WHERE dataset_id = :d"
        ),
        {"d": dataset_id},
    ).all()
    keys = dict(
        connection.execute(
            sa.text("SELECT id, key FROM partitions WHERE dataset_id = :d"), {"d": dataset_id}
        ).all()
    )
    books: dict[int, ScopeBooks] = defaultdict(ScopeBooks)
    entries = connection.execute(
        sa.select(_entries)
        .where(
            _entries.c.dataset_id == dataset_id,
            _entries.c.kind == "charge",
            _entries.c.status == "granted",
        )
        .order_by(_entries.c.seq)
    )
    lifetime = [t.id for t in tallies if t.kind == "lifetime"]
    consumers = {t.consumer_id: t.id for t in tallies if t.kind == "consumer"}
    windows = [t for t in tallies if t.kind == "window"]  # the recent ones only: few
    for entry in entries:
        moment = entry.created_at // 1_000_000
        scopes = lifetime + [consumers[entry.consumer_id]] * (entry.consumer_id in consumers)
        scopes += [
            w.id for w in windows if w.window_start <= moment < w.window_start + w.period_seconds
        ]
        cost = Amount(entry.cost_epsilon, entry.cost_delta, entry.cost_rho)
        for tally_id in scopes:
            books[tally_id].add(cost, entry.multiplicity, entry.partitions, entry.release)
    for tally in tallies:
        rebuilt = books[tally.id]
        stored = {
            keys[row.partition_id]: Amount(row.epsilon, row.delta, row.rho)
            for row in connection.execute(
                sa.text(
                    "SELECT partition_id, epsilon, delta, rho FROM tally_spends WHERE tally_id = :t"
                ),
                {"t": tally.id},
            )
        }
        total = Amount(tally.total_epsilon, tally.total_delta, tally.total_rho)
        if total == rebuilt.total and stored == rebuilt.spends:
            _store(connection, tally.id, rebuilt, {key: i for i, key in keys.items()})


def _store(connection: Any, tally_id: int, books: ScopeBooks, ids: dict[str, int]) -> None:
    """Write a tally's exact division: T_J, T_P and s_J(p), s_P(p) of every partition."""
    values = {f"{part}_{name}": books.parts[part].total[name] for part in _PARTS for name in _NAMES}
    connection.execute(
        sa.text(
            f"UPDATE tallies SET {', '.join(f'total_{c} = :{c}' for c in values)} WHERE id = :t"
        ),
        values | {"t": tally_id},
    )
    rows = [
        {
            f"{part}_{name}": books.parts[part].spends.get(key, Amount())[name]
            for part in _PARTS
            for name in _NAMES
        }
        | {"t": tally_id, "p": ids[key]}
        for key in books.spends
    ]
    if rows:
        connection.execute(
            sa.text(
                f"UPDATE tally_spends SET {', '.join(f'{c} = :{c}' for c in values)} "
                "WHERE tally_id = :t AND partition_id = :p"
            ),
            rows,
        )


def downgrade() -> None:
    with op.batch_alter_table("tally_spends") as batch:
        for part in _PARTS:
            for name in _NAMES:
                batch.drop_index(f"ix_tally_spends_tally_{part}_{name}")
                batch.drop_column(f"{part}_{name}")
    with op.batch_alter_table("tallies") as batch:
        for part in _PARTS:
            for name in _NAMES:
                batch.drop_column(f"total_{part}_{name}")

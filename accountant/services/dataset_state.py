"""A dataset as a charge reads it: its row, window budgets and the caller's quota, in one
statement, as plain values.

The charge path locks and reads the dataset on every request, so this is
one driver statement (the row joined to its window budgets, to the
charging consumer's grant and to the caller's API key, which is read
again here so that a key revoked before the lock charges nothing) and no
ORM object. ``lock=True`` takes the row lock on PostgreSQL
(``FOR UPDATE``); on SQLite the write transaction's ``BEGIN IMMEDIATE``
already holds the database's write lock. It is sent, not read
(``Driver.send``), so that the charge's other reads can follow it in the
same round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, bindparam, select

from accountant.accounting.loss import LossRule
from accountant.accounting.modes import Mode, mode_of
from accountant.driver import Driver, Pending, Rows, Statement, statement
from accountant.errors import NotFound
from accountant.exact import Limit
from accountant.models import ApiKey, Dataset, Grant, WindowBudget


@dataclass(frozen=True)
class WindowLimit:
    period_seconds: int
    limit: Limit


@dataclass(frozen=True)
class DatasetState:
    """The columns of a dataset row that pricing, checking and the ledger need."""

    id: int
    name: str
    privacy_unit: str
    accounting: str
    rdp_order: str | None
    composition_delta: int | None  # delta' of an approx dataset with advanced composition
    max_partitions_per_user: int | None
    max_records_per_user: int | None
    limit: Limit
    partition_limit: Limit | None
    windows: tuple[WindowLimit, ...]
    ledger_seq: int
    ledger_head: str
    head_seal: str | None  # ``seals.of_head`` of the two above, as the service wrote it
    terms_sha256: str  # the digest of the terms as the service last set them
    quota: Limit | None  # the charging consumer's quota on this dataset
    granted: bool  # whether the charging consumer holds a grant on it, read under the lock
    key_valid: bool  # whether the caller's API key is unrevoked, read under the lock

    @property
    def limit_delta(self) -> int | None:
        return self.limit.delta

    @property
    def mode(self) -> Mode:
        return mode_of(self.accounting, self.rdp_order, self.composition_delta)

    @property
    def rule(self) -> LossRule:
        return LossRule(self.privacy_unit, self.max_partitions_per_user)


def _select(lock: bool) -> Statement:
    """The dataset by name, one row per window budget, with one consumer's grant and one
    unrevoked API key; ``lock`` takes the dataset row's lock on PostgreSQL (SQLite's write
    lock is the transaction's)."""
    query = (
        select(
            Dataset.id,
            Dataset.name,
            Dataset.privacy_unit,
            Dataset.accounting,
            Dataset.rdp_order,
            Dataset.composition_delta,
            Dataset.max_partitions_per_user,
            Dataset.max_records_per_user,
            Dataset.limit_epsilon,
            Dataset.limit_delta,
            Dataset.limit_rho,
            Dataset.has_partition_limit,
            Dataset.partition_limit_epsilon,
            Dataset.partition_limit_delta,
            Dataset.partition_limit_rho,
            Dataset.ledger_seq,
            Dataset.ledger_head,
            Dataset.head_seal,
            Dataset.terms_sha256,
            WindowBudget.period_seconds,
            WindowBudget.limit_epsilon.label("window_epsilon"),
            WindowBudget.limit_delta.label("window_delta"),
            WindowBudget.limit_rho.label("window_rho"),
            Grant.dataset_id.label("granted"),
            Grant.has_quota,
            Grant.quota_epsilon,
            Grant.quota_delta,
            Grant.quota_rho,
            ApiKey.id.label("key_id"),
        )
        .outerjoin(WindowBudget, WindowBudget.dataset_id == Dataset.id)
        .outerjoin(
            Grant, and_(Grant.dataset_id == Dataset.id, Grant.consumer_id == bindparam("consumer"))
        )
        .outerjoin(ApiKey, and_(ApiKey.id == bindparam("key"), ApiKey.revoked_at.is_(None)))
        .where(Dataset.name == bindparam("name"))
        .order_by(WindowBudget.period_seconds)
    )
    return statement(query.with_for_update(of=Dataset) if lock else query)


_SELECT = {lock: _select(lock) for lock in (False, True)}


def send(
    driver: Driver, name: str, consumer_id: int, key_id: str, *, lock: bool = False
) -> Pending[DatasetState]:
    """The dataset named ``name`` with ``consumer_id``'s quota on it and whether the API key
    ``key_id`` is unrevoked; its result is a 404 if there is none. ``lock`` locks the row on
    PostgreSQL."""
    return driver.send(
        _SELECT[lock],
        {"name": name, "consumer": consumer_id, "key": key_id},
        lambda rows: _state(name, rows),
    )


def _state(name: str, rows: Rows) -> DatasetState:
    if not rows:
        raise NotFound(f"no dataset named {name!r}; list datasets with GET /v1/datasets")
    d = rows[0]
    windows = tuple(
        WindowLimit(w.period_seconds, Limit(w.window_epsilon, w.window_delta, w.window_rho))
        for w in rows
        if w.period_seconds is not None
    )
    return DatasetState(
        id=d.id,
        name=d.name,
        privacy_unit=d.privacy_unit,
        accounting=d.accounting,
        rdp_order=d.rdp_order,
        composition_delta=d.composition_delta,
        max_partitions_per_user=d.max_partitions_per_user,
        max_records_per_user=d.max_records_per_user,
        limit=Limit(d.limit_epsilon, d.limit_delta, d.limit_rho),
        partition_limit=Limit(
            d.partition_limit_epsilon, d.partition_limit_delta, d.partition_limit_rho
        )
        if d.has_partition_limit
        else None,
        windows=windows,
        ledger_seq=d.ledger_seq,
        ledger_head=d.ledger_head,
        head_seal=d.head_seal,
        terms_sha256=d.terms_sha256,
        quota=Limit(d.quota_epsilon, d.quota_delta, d.quota_rho) if d.has_quota else None,
        granted=d.granted is not None,
        key_valid=d.key_id is not None,
    )

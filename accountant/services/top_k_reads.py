"""The top-k rule's reads of a charge: each scope's spends inside the charged set and its
k largest outside it (DESIGN.md, the user unit with a bound k).

Sent after the dataset's reads came back (the rule is the dataset's), every one
before any is read: one round trip more than a charge on another dataset.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from sqlalchemy import bindparam, literal_column, select, union_all

from accountant.accounting.charge_inputs import Column, DatasetState
from accountant.accounting.loss import PARTS, ScopeKey
from accountant.driver import Driver, Pending, Rows
from accountant.models import TallySpend
from accountant.models.tally import PART_PREFIXES
from accountant.statements import Statement, statement

Tops = dict[Column, tuple[int, ...]]
_Pending = tuple[Callable[[], Rows], Pending[dict[str, list[int]]]]


def send(
    driver: Driver, dataset: DatasetState, rows: Rows, wanted: set[ScopeKey], touched: list[int]
) -> dict[ScopeKey, _Pending]:
    """For the top-k rule, each wanted scope's spends inside the charged set (``touched``:
    the ids of the charged partitions that exist; none when there are none, or when every
    partition is charged) and its k largest outside it: every read sent before any is
    read."""
    k = dataset.rule.max_partitions_per_user
    if k is None:
        return {}
    columns = tuple(_columns(dataset))
    sent = {}
    for row in rows:
        key = (row.kind, row.consumer_id, row.period_seconds, row.window_start)
        if key in wanted:
            sent[key] = (
                _send_spends(driver, row.id, columns, touched),
                _send_tops(driver, row.id, columns, k, touched or None),
            )
    return sent


def tops(dataset: DatasetState, sent: _Pending) -> tuple[Tops, Tops]:
    """The values ``send`` sent for one scope, inside and outside the charged set,
    by part and component."""
    columns = _columns(dataset)
    inside, outside = sent[0](), sent[1].result()
    return (
        {column: tuple(getattr(row, name) for row in inside) for name, column in columns.items()},
        {columns[name]: tuple(values) for name, values in outside.items()},
    )


def _columns(dataset: DatasetState) -> dict[str, Column]:
    """The spend columns the top-k rule reads on ``dataset``: s(p), s_J(p) and s_P(p) in each
    component of its mode, by the name of their column."""
    names = dataset.mode.components
    return {f"{PART_PREFIXES[part]}{name}": (part, name) for part in PARTS for name in names}


def _send_spends(
    driver: Driver, tally_id: int, columns: tuple[str, ...], touched: list[int]
) -> Callable[[], Rows]:
    """``columns`` of the charged partitions ``touched`` in a tally, by primary key: one
    row each (none if ``touched`` is empty), sent now, read when called."""
    if not touched:
        return list
    return driver.send(_inside_statement(columns), {"t": tally_id, "p": touched}, list).result


@functools.lru_cache(maxsize=8)
def _inside_statement(columns: tuple[str, ...]) -> Statement:
    """``columns`` of the partitions :p in tally :t (a primary-key lookup each)."""
    return statement(
        select(*(getattr(TallySpend, column) for column in columns)).where(
            TallySpend.tally_id == bindparam("t"),
            TallySpend.partition_id.in_(bindparam("p", expanding=True)),
        )
    )


def _send_tops(
    driver: Driver, tally_id: int, columns: tuple[str, ...], k: int, touched: list[int] | None
) -> Pending[dict[str, list[int]]]:
    """The k largest values of each of ``columns`` (s(p), s_J(p), s_P(p) per component) in
    a tally, outside the charged set (``touched``: their ids) or of every partition
    (``touched`` None): one statement, sent now, read on demand."""

    def lists(rows: Rows) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for row in rows:
            found.setdefault(row.spend, []).append(row.value)
        return {column: sorted(values, reverse=True) for column, values in found.items()}

    params = {"t": tally_id, "k": k} | ({} if touched is None else {"p": touched})
    return driver.send(_tops_statement(columns, touched is not None), params, lists)


@functools.lru_cache(maxsize=16)
def _tops_statement(columns: tuple[str, ...], outside: bool) -> Statement:
    """The :k largest values of each of ``columns`` in tally :t, as rows (spend, value): of
    the partitions other than :p if ``outside``, else of every partition. An index range
    scan each, in one statement."""
    lists = []
    for column in columns:
        spend = getattr(TallySpend, column)
        # positive: zeros add nothing to a top-k sum, and s_J, s_P are indexed where positive
        query = select(spend.label("value")).where(
            TallySpend.tally_id == bindparam("t"), spend > literal_column("0")
        )
        if outside:
            query = query.where(TallySpend.partition_id.not_in(bindparam("p", expanding=True)))
        # the driver's :k as text, and an OFFSET written out, which SQLite's dialect would bind
        limited = (
            query.order_by(spend.desc())
            .limit(literal_column(":k"))
            .offset(literal_column("0"))
            .subquery()
        )
        lists.append(select(literal_column(f"'{column}'").label("spend"), limited.c.value))
    return statement(union_all(*lists))

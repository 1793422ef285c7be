"""The hot path's statements: compiled once per backend, planned in checked blocks, rendered.

Statements are built from the tables' metadata with SQLAlchemy Core and compiled once per
backend (``statement``, ``upsert``) into text in the named style (``:name``), translated
for psycopg into PostgreSQL's own placeholders (``$1``), which it sends without parsing
the text again; a few maintenance statements are plain text in that style. A list value
expands in place to ``(:name_0, :name_1, ...)``, for ``IN`` lists. ``render`` gives the
text and the values a DBAPI cursor takes (``accountant.driver`` sends them).

Compiling also finds the tables a statement writes and reads. A unit of work's writes
are a ``WritePlan``: blocks run in order, each checked when it is built to hold only
writes that do not depend on each other's (``Block``), for a block runs as one statement
on PostgreSQL (``Block.one_statement``).
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement, visitors
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import UpdateBase

_NAMED = re.compile(r"(?<![:\w]):(\w+)")
Params = Mapping[str, Any]


@dataclass(frozen=True)
class Statement:
    """A SQLAlchemy Core statement built from the tables' metadata, compiled once for each
    backend into SQL text in the named style the driver sends, with the tables it writes
    and the other tables it reads (``statement`` finds them in the clause)."""

    sqlite: str
    postgresql: str
    writes: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()
    #: Tables it reads that another statement of its ``Block`` may write, each with the
    #: reason why that write cannot change what it reads (``Block``'s allow-list).
    unaffected: tuple[tuple[str, str], ...] = ()


#: What the driver runs: text in the named style, or a statement built from the metadata.
SQL = str | Statement


def statement(clause: ClauseElement, *, unaffected: Mapping[str, str] | None = None) -> Statement:
    """Compile ``clause`` for both backends (once, at import or in a cached builder). An
    expanding ``bindparam(name, expanding=True)`` becomes ``:name``, which the driver
    expands to a list in place. ``unaffected``: see ``Statement.unaffected``."""
    return Statement(
        _compiled(clause, _SQLITE),
        _compiled(clause, _POSTGRESQL),
        *_tables(clause),
        tuple(sorted((unaffected or {}).items())),
    )


def upsert(
    build: Callable[[Callable[..., Any]], ClauseElement],
    *,
    unaffected: Mapping[str, str] | None = None,
) -> Statement:
    """``statement`` for an ``INSERT ... ON CONFLICT``, which each dialect builds with its
    own ``insert``: ``build`` is called with SQLite's, then PostgreSQL's."""
    clause = build(sqlite.insert)
    return Statement(
        _compiled(clause, _SQLITE),
        _compiled(build(postgresql.insert), _POSTGRESQL),
        *_tables(clause),
        tuple(sorted((unaffected or {}).items())),
    )


def _tables(clause: ClauseElement) -> tuple[frozenset[str], frozenset[str]]:
    """(the table ``clause`` writes, if it is an INSERT, UPDATE or DELETE; every other table
    it names, which it reads)."""
    named = {element.name for element in visitors.iterate(clause) if isinstance(element, Table)}
    target = getattr(clause, "table", None) if isinstance(clause, UpdateBase) else None
    written = frozenset() if target is None else frozenset({target.name})
    return written, frozenset(named - written)


@dataclass(frozen=True)
class Write:
    """One statement that writes, with its parameters."""

    statement: Statement
    params: Params


class DependentWrites(ValueError):
    """A ``Block`` whose statements would depend on each other's writes."""


@dataclass(frozen=True)
class Block:
    """Writes that run together (``Driver.together``), none depending on another's writes:
    checked when the block is built. Each statement writes a table (a block holds no
    read), no two write the same table, and none reads a table another writes, unless it
    declares that table ``unaffected``, with the reason."""

    writes: tuple[Write, ...]

    def __post_init__(self) -> None:
        writer: dict[str, int] = {}
        for index, write in enumerate(self.writes):
            tables = write.statement.writes
            if not tables:
                raise DependentWrites(
                    "a block only writes; read before it. Statement: "
                    + write.statement.sqlite[:200]
                )
            for table in tables:
                if table in writer:
                    raise DependentWrites(
                        f"two statements of one block write {table}; put them in blocks of "
                        "their own, in the order they must run"
                    )
                writer[table] = index
        for index, write in enumerate(self.writes):
            allowed = dict(write.statement.unaffected)
            for table in sorted(write.statement.reads):
                if writer.get(table, index) != index and table not in allowed:
                    raise DependentWrites(
                        f"a statement of the block reads {table}, which another of its "
                        "statements writes: on PostgreSQL it would not see that write. Put "
                        "the write in an earlier block, or declare the table unaffected with "
                        "the reason"
                    )

    def one_statement(self) -> tuple[str, dict[str, Any]]:
        """The block as one PostgreSQL statement, in the named style, and its parameters:
        all its writes but the last as data-modifying ``WITH`` clauses of the last, the
        i-th one's parameters renamed ``t{i}_name`` (see ``Driver.together``)."""
        texts = tuple(write.statement.postgresql for write in self.writes)
        params = {
            f"t{i}_{k}": v for i, write in enumerate(self.writes) for k, v in write.params.items()
        }
        return _together(texts), params


@dataclass(frozen=True)
class WritePlan:
    """The writes of a unit of work, in blocks run in order (``Driver.apply``): a block may
    depend on what the blocks before it wrote, never on its own."""

    blocks: tuple[Block, ...]


def _compiled(clause: ClauseElement, dialect: Dialect) -> str:
    compiled = cast(SQLCompiler, clause.compile(dialect=dialect))
    bound = sorted(name for name, param in compiled.binds.items() if param.value is not None)
    if bound:  # the text would need values the driver is never given
        raise ValueError(f"write constants as literal_column, not as parameters: {bound}")
    return _POSTCOMPILE.sub(r":\1", str(compiled))


_SQLITE = sqlite.dialect(paramstyle="named")
# the base dialect, without a driver's bind casts
_POSTGRESQL = PGDialect(paramstyle="named")  # type: ignore[no-untyped-call]  # unannotated
_POSTCOMPILE = re.compile(r"\(__\[POSTCOMPILE_(\w+)\]\)")


def render(sql: SQL, params: Params, postgres: bool) -> tuple[str, Any]:
    """The text of ``sql`` for one backend, with its list parameters expanded in place, and
    the values to send with it: on PostgreSQL, in the order of its ``$1``, ``$2``, ...
    placeholders; on SQLite, by name."""
    lists = tuple((name, len(v)) for name, v in params.items() if type(v) in _LISTS)
    text, order = _render(_text(sql, postgres), postgres, lists)
    if order is not None:  # PostgreSQL: each placeholder's value, a list's item by index
        return text, [params[name] if i is None else params[name][i] for name, i in order]
    return text, _expand(params) if lists else params


def _text(sql: SQL, postgres: bool) -> str:
    if isinstance(sql, Statement):
        return sql.postgresql if postgres else sql.sqlite
    return sql


@lru_cache(maxsize=256)
def _together(texts: tuple[str, ...]) -> str:
    """One PostgreSQL statement that runs ``texts`` (see ``Driver.together``): the i-th
    one's parameters are renamed ``t{i}_name``."""
    renamed = [_NAMED.sub(rf":t{i}_\1", text) for i, text in enumerate(texts)]
    if any(text.lstrip()[:4].upper() == "WITH" for text in renamed):
        raise ValueError("a statement with a WITH clause of its own cannot be run together")
    clauses = ", ".join(f"t{i} AS ({text})" for i, text in enumerate(renamed[:-1]))
    return f"WITH {clauses} {renamed[-1]}"


@lru_cache(maxsize=256)
def record(columns: tuple[str, ...]) -> Any:
    """The named-tuple type of a result with these columns (aliases make every name
    unique and an identifier)."""
    return namedtuple("Record", columns)


#: The types of a list parameter, expanded in place for ``IN``.
_LISTS = (list, tuple)


def _expand(params: Params) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in params.items():
        if type(value) in _LISTS:
            flat.update((f"{name}_{i}", item) for i, item in enumerate(value))
        else:
            flat[name] = value
    return flat


@lru_cache(maxsize=1024)
def _render(
    sql: str, postgres: bool, lists: tuple[tuple[str, int], ...]
) -> tuple[str, tuple[tuple[str, int | None], ...] | None]:
    """``sql`` with list parameters expanded in place (``:keys`` to ``(:keys_0, ...)``).
    For PostgreSQL, in its own placeholders (``$1``, ``$2``, ...), which psycopg sends as
    they are, and what each number stands for: a parameter's name, with an index into it
    for a list's item. For sqlite3, in the named style, and None."""
    items: dict[str, tuple[str, int | None]] = {}
    for name, length in lists:
        if length == 0:
            raise ValueError(f"empty list for :{name}; an IN list needs one value at least")
        items.update((f"{name}_{i}", (name, i)) for i in range(length))
        expanded = ", ".join(f":{name}_{i}" for i in range(length))
        sql = re.sub(rf"(?<![:\w]):{name}\b", f"({expanded})", sql)
    if not postgres:
        return sql, None
    numbers: dict[str, int] = {}
    text = _NAMED.sub(lambda m: f"${numbers.setdefault(m.group(1), len(numbers) + 1)}", sql)
    return text, tuple(items.get(name, (name, None)) for name in numbers)

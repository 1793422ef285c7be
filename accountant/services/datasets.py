"""Datasets: creation, limit changes (ledgered), partitions, and the budget report."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, object_session

from accountant import seals
from accountant.accounting import advanced
from accountant.accounting.admits import AdmitsNothing, admitting_limit
from accountant.accounting.checks import at_limit, remaining
from accountant.accounting.loss import PARTS, LossRule, Part, ScopeBooks, ScopeState, Top, loss_now
from accountant.accounting.modes import Mode, limit_of, mode_of, mu_of, rdp_order
from accountant.accounting.windows import PERIOD_NAMES, PERIODS, Window, isoformat
from accountant.driver import Driver
from accountant.errors import Conflict, NotFound, field_error
from accountant.exact import COMPONENTS, DELTA, Amount, ComponentName, Limit
from accountant.key_hashing import KeyHasher
from accountant.models import (
    Consumer,
    Dataset,
    Hold,
    LedgerEntry,
    Partition,
    Population,
    Tally,
    TallySpend,
    WindowBudget,
)
from accountant.models.tally import PART_PREFIXES
from accountant.services import ledger, limit_notes, terms
from accountant.services.held_split import loss_without_open_holds


def all_datasets(session: Session) -> list[Dataset]:
    """Every dataset, by name."""
    return list(session.execute(select(Dataset).order_by(Dataset.name)).scalars())


def find(session: Session, name: str, *, lock: bool = False) -> Dataset:
    """The dataset named ``name`` (locked ``FOR UPDATE`` if asked), or a 404."""
    statement = select(Dataset).where(Dataset.name == name)
    if lock:
        statement = statement.with_for_update()
    dataset = session.execute(statement).scalar_one_or_none()
    if dataset is None:
        raise NotFound(f"no dataset named {name!r}; list datasets with GET /v1/datasets")
    return dataset


def rule_of(dataset: Dataset) -> LossRule:
    return LossRule(dataset.privacy_unit, dataset.max_partitions_per_user)


def dataset_delta(dataset: Dataset) -> Decimal | None:
    return None if dataset.limit_delta is None else DELTA.to_decimal(dataset.limit_delta)


def _limit(mode: Mode, stated: dict[str, Any], at_delta: Decimal | None, where: str) -> Limit:
    """The enforced limit of the budget stated at ``where``. A budget whose limit would be 0
    is refused (``accounting.admits``), except a lifetime ``budget`` that a mode converts
    (zcdp, rdp, gdp, advanced composition): it is the dataset's own terms, shown as its
    limit on every read, and may convert to 0. A lifetime epsilon or delta stated below the
    least its limit can hold is refused, as a sub-budget's is."""
    if mode.name == "pure" and stated.get("delta", 0) != 0:
        raise field_error(f"{where}.delta", "a pure dataset has delta 0; use accounting approx")
    try:
        if where == "budget" and (mode.converts or mode.advanced):
            return limit_of(mode, stated, at_delta)
        return admitting_limit(mode, stated, at_delta)
    except AdmitsNothing as error:
        raise field_error(f"{where}.{error.component}", str(error)) from None
    except ValueError as error:
        raise field_error(where, str(error)) from None


def name_taken(session: Session, name: str) -> bool:
    """Whether a dataset or a population has ``name``: they share one namespace, so that a
    chain of the ledger is known by its owner's name alone."""
    return any(
        session.execute(select(table.id).where(table.name == name)).first()
        for table in (Dataset, Population)
    )


def create(session: Session, body: dict[str, Any], now: int, hasher: KeyHasher) -> Dataset:
    accounting = body.get("accounting", "approx")
    unit = body["privacy_unit"]
    for bound in ("max_partitions_per_user", "max_records_per_user"):
        if unit != "user" and body.get(bound) is not None:
            raise field_error(bound, "contribution bounds apply only to privacy_unit user")
    budget = body["budget"]
    if accounting != "rdp" and "rdp_order" in body:
        raise field_error("rdp_order", "rdp_order applies only to accounting rdp")
    if name_taken(session, body["name"]):
        raise Conflict(
            f"a dataset or population named {body['name']!r} exists (they share one "
            "namespace); choose another name"
        )
    order = rdp_order_of(body) if accounting == "rdp" else None
    share = _composition_delta(body, accounting)
    mode = mode_of(accounting, order, share)
    lifetime = lifetime_limit(mode, budget)
    dataset = Dataset(
        name=body["name"],
        privacy_unit=unit,
        accounting=mode.name,
        rdp_order=order,
        composition="advanced" if mode.advanced else "basic",
        composition_delta=share,
        max_partitions_per_user=body.get("max_partitions_per_user"),
        max_records_per_user=body.get("max_records_per_user"),
        description=body.get("description"),
        limit_epsilon=lifetime.epsilon,
        limit_delta=lifetime.delta,
        limit_rho=lifetime.rho,
        created_at=now,
    )
    if body.get("population") is not None:
        _join(session, dataset, body["population"])
    _set_partition_limit(dataset, mode, body.get("partition_budget"))
    _set_windows(dataset, mode, body.get("windows", []))
    seal_terms(dataset, hasher)
    if seals.heads_begun(session):  # its chain is sealed from its (empty) start
        dataset.head_seal = seals.of_head(hasher, dataset.name, 0, ledger.GENESIS)
    session.add(dataset)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"a dataset named {body['name']!r} exists") from None
    session.add(Tally(dataset_id=dataset.id, kind="lifetime"))
    return dataset


def _join(session: Session, dataset: Dataset, name: str) -> None:
    """Make the new ``dataset`` a member of population ``name``, for life: a 400 unless its
    unit is ``user`` and its mode (and rdp order) the population's, with losses that add."""
    population = session.execute(
        select(Population).where(Population.name == name)
    ).scalar_one_or_none()
    if population is None:
        raise field_error(
            "population", f"no population named {name!r}; create it with POST /v1/populations"
        )
    if dataset.privacy_unit != "user":
        raise field_error(
            "population",
            f"population {name!r} counts people: only a dataset of privacy unit user may "
            f"join it, not {dataset.privacy_unit!r}",
        )
    if dataset.accounting != population.accounting:
        raise field_error(
            "population",
            f"population {name!r} adds losses in accounting {population.accounting!r}; "
            f"create the dataset with accounting {population.accounting!r}",
        )
    if dataset.composition == "advanced":
        raise field_error(
            "population",
            "a dataset with advanced composition cannot join a population: its loss is not "
            "a sum of its releases' costs, so it cannot be added to other datasets' losses",
        )
    if dataset.rdp_order != population.rdp_order:
        raise field_error(
            "rdp_order",
            f"population {name!r} adds Renyi divergences at order {population.rdp_order}; "
            f"create the dataset with rdp_order {population.rdp_order}",
        )
    dataset.population_id = population.id


def lifetime_limit(mode: Mode, budget: dict[str, Any]) -> Limit:
    """The enforced lifetime limit of ``budget`` as a dataset or a population of ``mode``
    states it: a 400 for a converted mode's budget without a usable delta."""
    if mode.converts and not budget.get("delta"):
        raise field_error(
            "budget.delta", f"a {mode.name} budget is stated as epsilon and 0 < delta < 1"
        )
    lifetime = _limit(mode, budget, budget.get("delta"), "budget")
    _check_delta(mode, lifetime)
    if mode.name == "approx" and lifetime.delta is None:
        lifetime = Limit(lifetime.epsilon, 0, None)
    return lifetime


def rdp_order_of(body: dict[str, Any]) -> str:
    """The order an rdp dataset keeps for life: the one given, or the best for its budget."""
    given = body.get("rdp_order")
    if given is not None:
        return str(Decimal(given).normalize())
    budget = body["budget"]
    try:
        return str(rdp_order(budget["epsilon"], budget["delta"]))
    except KeyError:
        raise field_error(
            "budget.delta", "an rdp budget needs a delta; add budget.delta (0 < delta < 1)"
        ) from None
    except ValueError as error:
        raise field_error("budget", f"an rdp budget needs epsilon and delta: {error}") from None


def _composition_delta(body: dict[str, Any], accounting: str) -> int | None:
    """delta' of a dataset created with ``"composition": "advanced"`` (in delta units), None
    for basic composition: ``composition_delta`` if given, else half the budget's delta."""
    composition = body.get("composition")
    if accounting != "approx" and composition is not None:
        raise field_error(
            "composition",
            f"composition applies only to accounting approx, not {accounting}; omit it "
            "(zcdp, rdp and gdp datasets already compose their measure by adding it)",
        )
    if composition != "advanced":
        if "composition_delta" in body:
            raise field_error(
                "composition_delta", 'composition_delta applies only to "composition": "advanced"'
            )
        return None
    delta = body["budget"].get("delta")
    if not delta:
        raise field_error(
            "budget.delta",
            "an approx dataset with advanced composition needs 0 < delta < 1: its filter "
            "spends a share delta' of it (composition_delta); state budget.delta",
        )
    units = DELTA.limit_units(delta)
    stated = body.get("composition_delta")
    share = advanced.default_share(units) if stated is None else DELTA.limit_units(stated)
    if not 0 < share <= units:
        raise field_error(
            "composition_delta",
            f"composition_delta must be above 0 (at least 1e-18) and at most budget.delta "
            f"{delta}; got {stated if stated is not None else 'half of budget.delta'}",
        )
    return share


def _check_delta(mode: Mode, limit: Limit) -> None:
    """A converted budget's delta must be representable: at least 1e-18, the delta unit."""
    if mode.converts and not limit.delta:
        raise field_error("budget.delta", f"a {mode.name} budget needs delta of at least 1e-18")


def _set_partition_limit(dataset: Dataset, mode: Mode, stated: dict[str, Any] | None) -> None:
    if stated is None:
        dataset.has_partition_limit = False
        dataset.partition_limit_epsilon = dataset.partition_limit_delta = None
        dataset.partition_limit_rho = None
        return
    limit = _limit(mode, stated, dataset_delta(dataset), "partition_budget")
    dataset.has_partition_limit = True
    dataset.partition_limit_epsilon = limit.epsilon
    dataset.partition_limit_delta = limit.delta
    dataset.partition_limit_rho = limit.rho


def _set_windows(dataset: Dataset, mode: Mode, windows: list[dict[str, Any]]) -> None:
    periods = [w["period"] for w in windows]
    if len(set(periods)) != len(periods):
        raise field_error("windows", "each period may appear once")
    dataset.windows.clear()
    session = object_session(dataset)
    if session is not None:
        session.flush()  # delete the old rows before inserting a window of the same period
    for index, stated in enumerate(windows):
        amounts = {k: v for k, v in stated.items() if k != "period"}
        limit = _limit(mode, amounts, dataset_delta(dataset), f"windows.{index}")
        dataset.windows.append(
            WindowBudget(
                period_seconds=PERIODS[stated["period"]],
                limit_epsilon=limit.epsilon,
                limit_delta=limit.delta,
                limit_rho=limit.rho,
            )
        )


def describe_limit(limit: Limit, mode: Mode | None = None) -> dict[str, Decimal]:
    """A limit as stated: the components it limits, as exact decimals, the enforced one
    under the mode's measure (rho; rdp, the divergence at the order; mu, rounded down)."""
    names: tuple[ComponentName, ...] = ("epsilon", "delta", "rho")
    described: dict[str, Decimal] = {
        name: COMPONENTS[name].to_decimal(v) for name in names if (v := limit[name]) is not None
    }
    if limit.rho is not None and mode is not None and mode.name in ("rdp", "gdp"):
        enforced = described.pop("rho")
        described[mode.lead_name] = enforced if mode.name == "rdp" else mu_of(limit.rho, down=True)
    if mode is not None and mode.composition_delta is not None and limit.delta is not None:
        # stated as delta' + delta'': the enforced delta'' is what the releases may spend
        stated = advanced.stated_delta(limit.delta, mode.composition_delta)
        assert stated is not None
        described["delta"] = DELTA.to_decimal(stated)
    return described


def describe(dataset: Dataset) -> dict[str, Any]:
    """The dataset as created (limits as currently set), plus ``created_at``."""
    partition_limit, mode = dataset.partition_limit, dataset.mode
    view: dict[str, Any] = {
        "name": dataset.name,
        "privacy_unit": dataset.privacy_unit,
        "max_partitions_per_user": dataset.max_partitions_per_user,
        "max_records_per_user": dataset.max_records_per_user,
        "accounting": dataset.accounting,
        "budget": describe_limit(dataset.limit, mode),
        "partition_budget": None
        if partition_limit is None
        else describe_limit(partition_limit, mode),
        "windows": [
            {"period": PERIOD_NAMES[w.period_seconds], **describe_limit(w.limit, mode)}
            for w in dataset.windows
        ],
        "created_at": isoformat(dataset.created_at / 1e6),
    }
    if dataset.description is not None:
        view["description"] = dataset.description
    if mode.order is not None:
        view["rdp_order"] = mode.order
    view.update(composition_of(dataset))
    if dataset.population is not None:
        view["population"] = dataset.population.name
    if dataset.privacy_unit == "partition":
        view["note"] = PARTITION_UNIT_NOTE
    return view


#: What a dataset of privacy unit ``partition`` protects, said wherever it is shown.
PARTITION_UNIT_NOTE = (
    "privacy unit 'partition' protects one whole partition, not a person who appears in "
    "several partitions"
)


def composition_of(dataset: Dataset) -> dict[str, Any]:
    """An approx dataset's composition rule, and with advanced composition its delta'."""
    if dataset.accounting != "approx":
        return {}
    mode = dataset.mode
    if mode.composition_delta is None:
        return {"composition": "basic"}
    return {
        "composition": "advanced",
        "composition_delta": DELTA.to_decimal(mode.composition_delta),
    }


def seal_terms(dataset: Dataset, hasher: KeyHasher | None) -> None:
    """Record the digest of the dataset's terms as the service sets them, and its seal
    (without ``hasher``, on a host without the key-hash secret, the seal stays as it was)."""
    dataset.terms_sha256 = terms.digest(dataset)
    if hasher is not None:
        dataset.terms_seal = seals.of_terms(hasher, dataset.name, dataset.terms_sha256)


def terms_hold(dataset: Dataset, hasher: KeyHasher) -> bool:
    """Whether ``dataset``'s terms are the ones its digest records and its seal vouches for
    (check before changing them: a change recomputes both, and would vouch for an edit)."""
    return terms.digest(dataset) == dataset.terms_sha256 and dataset.terms_seal == (
        seals.of_terms(hasher, dataset.name, dataset.terms_sha256)
    )


def update_limits(
    session: Session,
    dataset: Dataset,
    body: dict[str, Any],
    actor: Any,
    now: int,
    hasher: KeyHasher,
    *,
    approval: dict[str, Any] | None = None,
) -> limit_notes.Outcome:
    """Apply a PATCH (the dataset row is locked); ledger each limit that changed, with the
    reason given or none (and ``approval``: the approver's name and reason, when it was
    approved), never one whose new limit equals the old (``limit_notes``). Refused
    (``Conflict``) when the terms are not the ones the service last set and sealed."""
    if not terms_hold(dataset, hasher):
        raise Conflict(seals.refusal(f"dataset {dataset.name!r}"))
    mode = dataset.mode
    changes: list[tuple[str, Any, Any]] = []
    notes: list[str] = []

    def record(scope: str, what: str, old: Any, new: Any, same: bool) -> None:
        """``same``: the enforced limits are equal, unit for unit (what ``old`` and ``new``
        show may round, as mu does)."""
        if same:
            notes.append(limit_notes.unchanged(what))
        else:
            changes.append((scope, old, new))

    if "budget" in body:
        old_enforced = dataset.limit
        old = describe_limit(old_enforced, mode)
        stated = {k: v for k, v in old.items() if k in ("epsilon", "delta")} | body["budget"]
        if mode.converts and not stated.get("delta"):
            raise field_error("budget.delta", f"a {mode.name} budget needs 0 < delta < 1")
        limit = _limit(mode, stated, stated.get("delta"), "budget")
        _check_delta(mode, limit)
        dataset.limit_epsilon, dataset.limit_delta, dataset.limit_rho = (
            limit.epsilon,
            limit.delta if limit.delta is not None else 0,
            limit.rho,
        )
        record(
            "dataset",
            "the lifetime limit",
            old,
            describe_limit(dataset.limit, mode),
            old_enforced == dataset.limit,
        )
    if "partition_budget" in body:
        old_limit = dataset.partition_limit
        _set_partition_limit(dataset, mode, body["partition_budget"])
        new_limit = dataset.partition_limit
        record(
            "partition",
            "the partition limit",
            None if old_limit is None else describe_limit(old_limit, mode),
            None if new_limit is None else describe_limit(new_limit, mode),
            old_limit == new_limit,
        )
    if "windows" in body:
        old_windows = describe(dataset)["windows"]
        old_enforced_windows = _enforced_windows(dataset)
        old_periods = {w.period_seconds for w in dataset.windows}
        _set_windows(dataset, mode, body["windows"])
        new_windows = describe(dataset)["windows"]
        if old_enforced_windows == _enforced_windows(dataset):
            notes.append(limit_notes.unchanged("the windows"))
        else:
            changes.append(("window", old_windows, new_windows))
        for budget in dataset.windows:
            if budget.period_seconds not in old_periods:
                _rebuild_window(
                    session, dataset, Window.containing(budget.period_seconds, now / 1e6)
                )
        _drop_window_tallies(
            session, dataset, old_periods - {w.period_seconds for w in dataset.windows}
        )
    if not changes:
        return limit_notes.Outcome(False, (limit_notes.nothing_changed(),))
    seal_terms(dataset, hasher)
    ledger_limit_changes(
        session, dataset, actor, changes, body.get("reason"), now, hasher, approval=approval
    )
    notes += _spent_and_lifetime_notes(session, dataset, {scope for scope, _, _ in changes}, now)
    if not limit_notes.given(body.get("reason")):
        notes.append(limit_notes.UNSTATED)
    return limit_notes.Outcome(True, tuple(notes))


def _enforced_windows(dataset: Dataset) -> list[tuple[int, Limit]]:
    """The windows' limits by period: the same windows stated in another order are no
    change, and limits are compared unit for unit."""
    return sorted(((w.period_seconds, w.limit) for w in dataset.windows), key=lambda pair: pair[0])


def _spent_and_lifetime_notes(
    session: Session, dataset: Dataset, scopes: set[str], now: int
) -> list[str]:
    """The notes on the limits of the changed ``scopes``: one now below what its scope has
    spent, and a window or partition limit above the lifetime limit (``limit_notes``)."""
    mode, rule, names = dataset.mode, rule_of(dataset), dataset.mode.components
    notes: list[str | None] = []
    tally = _tally(session, dataset, "lifetime", 0, 0)
    if "dataset" in scopes:
        loss = loss_now(rule, tally_state(session, tally, rule, names), names)
        notes.append(
            limit_notes.below_spent(
                "the lifetime limit",
                limit=dataset.limit,
                spent=loss,
                mode=mode,
                consequence="charges that cost anything there are denied",
            )
        )
    partition_limit = dataset.partition_limit
    if partition_limit is not None and scopes & {"dataset", "partition"}:
        if "partition" in scopes:
            most_spent = tally.max_spend if tally is not None else Amount()
            notes.append(
                limit_notes.below_spent(
                    "the partition limit",
                    limit=partition_limit,
                    spent=most_spent,
                    mode=mode,
                    consequence="charges on the partitions that spent more are denied",
                )
            )
        notes.append(
            limit_notes.above_lifetime(
                "the partition limit", limit=partition_limit, lifetime=dataset.limit, mode=mode
            )
        )
    if scopes & {"dataset", "window"}:
        for budget in dataset.windows:
            window = Window.containing(budget.period_seconds, now / 1e6)
            what = f"the {window.name} window's limit"
            if "window" in scopes:
                state = tally_state(
                    session,
                    _tally(session, dataset, "window", window.period, window.start),
                    rule,
                    names,
                )
                notes.append(
                    limit_notes.below_spent(
                        what,
                        limit=budget.limit,
                        spent=loss_now(rule, state, names),
                        mode=mode,
                        consequence="charges are denied until the window resets at "
                        f"{isoformat(window.end)}",
                    )
                )
            notes.append(
                limit_notes.above_lifetime(
                    what, limit=budget.limit, lifetime=dataset.limit, mode=mode
                )
            )
    return [note for note in notes if note is not None]


def _tally(session: Session, dataset: Dataset, kind: str, period: int, start: int) -> Tally | None:
    return session.execute(
        select(Tally).where(
            Tally.dataset_id == dataset.id,
            Tally.kind == kind,
            Tally.period_seconds == period,
            Tally.window_start == start,
        )
    ).scalar_one_or_none()


def ledger_limit_changes(
    session: Session,
    dataset: Dataset,
    actor: Any,
    changes: list[tuple[str, Any, Any]],
    reason: str | None,
    now: int,
    hasher: KeyHasher | None,
    *,
    approval: dict[str, Any] | None = None,
) -> None:
    """One ``limit_change`` entry per changed scope, (scope, old, new): the old and new terms
    as exact text, the reason (and an approved change's ``approval``), and the terms digest
    the dataset now has. A limit change leaves the loss as it was. ``hasher`` seals the
    chain's new head (``ledger.append``)."""
    loss = lifetime_loss(session, dataset)
    for scope, old, new in changes:
        ledger.append(
            Driver.of(session),
            dataset,
            actor,
            kind="limit_change",
            status="granted",
            created_at=now,
            detail={
                "scope": scope,
                "old": as_text(old),
                "new": as_text(new),
                "reason": reason,
                "terms_sha256": dataset.terms_sha256,
                **(approval or {}),
            },
            loss_after=loss,
            hasher=hasher,
        )


def _drop_window_tallies(session: Session, dataset: Dataset, periods: set[int]) -> None:
    """Forget the running totals of the window budgets of ``periods``, removed: nothing
    keeps them up to date from now on (a charge moves only its budgets' windows), and a
    budget of such a period added again counts its window afresh (``_rebuild_window``)."""
    if periods:
        session.execute(
            delete(Tally)
            .where(
                Tally.dataset_id == dataset.id,
                Tally.kind == "window",
                Tally.period_seconds.in_(sorted(periods)),
            )
            .execution_options(synchronize_session=False)
        )


def _charged_to_window(session: Session, hold_ids: set[str], scope: list[Any]) -> None:
    """The holds ``hold_ids``, not settled, counted by a window added after them: ``scope``
    (the window's) added to the scopes each was charged to, so that its settle gives back
    to the window too what it counted (as ``totals.check`` replays it)."""
    if not hold_ids:
        return
    for hold in session.execute(
        select(Hold).where(Hold.id.in_(sorted(hold_ids)), Hold.state == "open")
    ).scalars():
        if scope not in hold.scopes:
            hold.scopes = [*hold.scopes, scope]


def _rebuild_window(session: Session, dataset: Dataset, window: Window) -> None:
    """Recompute a window's tally from the ledger, for a window budget added mid-window.

    Window tallies are kept only while a window budget of that period exists,
    so a newly added one must first count the charges already granted in the
    current window. This reads the ledger once, at the limit change, never on
    the charge path.
    """
    session.flush()
    session.execute(
        delete(Tally)
        .where(
            Tally.dataset_id == dataset.id,
            Tally.kind == "window",
            Tally.period_seconds == window.period,
            Tally.window_start == window.start,
        )
        .execution_options(synchronize_session=False)
    )
    entries = session.execute(
        select(LedgerEntry)
        .where(
            LedgerEntry.dataset_id == dataset.id,
            ledger.CHANGES_TOTALS,
            LedgerEntry.created_at >= window.start * 1_000_000,
        )
        .order_by(LedgerEntry.seq)
    ).scalars()
    books = ScopeBooks()
    held: set[str] = set()  # the holds charged to this window, which their settles return to
    for entry in entries:
        if entry.kind == "settle":
            if entry.hold_id in held:
                books.remove(entry.cost, entry.multiplicity, entry.partitions, entry.release)
                held.discard(entry.hold_id)
            continue
        if entry.kind == "hold" and entry.hold_id is not None:
            held.add(entry.hold_id)
        books.add(entry.cost, entry.multiplicity, entry.partitions, entry.release)
    _charged_to_window(session, held, ["window", 0, window.period, window.start])
    kept = {part: books.parts[part] for part in rule_of(dataset).parts}
    tally = Tally(
        dataset_id=dataset.id,
        kind="window",
        period_seconds=window.period,
        window_start=window.start,
        **{f"max_{name}": books.max_spend[name] for name in COMPONENTS},
        **{
            f"total_{PART_PREFIXES[part]}{name}": part_books.total[name]
            for part, part_books in kept.items()
            for name in COMPONENTS
        },
    )
    session.add(tally)
    session.flush()
    spends = books.spends
    ids = {
        row.key: row.id
        for row in session.execute(
            select(Partition.key, Partition.id).where(
                Partition.dataset_id == dataset.id, Partition.key.in_(list(spends))
            )
        )
    }
    if spends:
        session.execute(
            insert(TallySpend),
            [
                {"tally_id": tally.id, "partition_id": ids[key]}
                | {
                    f"{PART_PREFIXES[part]}{name}": part_books.spends.get(key, Amount())[name]
                    for part, part_books in kept.items()
                    for name in COMPONENTS
                }
                for key in spends
            ],
        )


def as_text(value: Any) -> Any:
    """Decimals as strings, so ledger details hash and store exactly."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {k: as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_text(v) for v in value]
    return value


def declare_partitions(
    session: Session, dataset: Dataset, keys: list[str], now: int
) -> tuple[list[str], list[str]]:
    """Create the partitions not yet declared (their keys checked,
    ``schemas.check_partition_keys``); return (created, already existing).

    One ``INSERT ... ON CONFLICT DO NOTHING`` names the created ones: no read of the
    existing keys first, whose plan a server may have cached while the table was small
    (a cached sequential scan made a 100,000-key declaration take 80 s on PostgreSQL)."""
    dialect = session.get_bind().dialect.name
    insert_into = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = (
        insert_into(Partition)
        .on_conflict_do_nothing(index_elements=[Partition.dataset_id, Partition.key])
        .returning(Partition.key)
    )
    rows = [{"dataset_id": dataset.id, "key": key, "created_at": now} for key in keys]
    added = set(session.execute(statement, rows).scalars()) if rows else set()
    return [key for key in keys if key in added], [key for key in keys if key not in added]


def tally_state(
    session: Session, tally: Tally | None, rule: LossRule, names: tuple[ComponentName, ...]
) -> ScopeState:
    """A tally's state for ``loss_now``: T, T_J, T_P, the max, and each part's k largest s(p)
    if needed."""
    if tally is None:
        return ScopeState()
    top: dict[tuple[Part, ComponentName], Top] = {}
    if rule.uses_top_k:
        for part in PARTS:
            for name in names:
                spend = getattr(TallySpend, f"{PART_PREFIXES[part]}{name}")
                top[part, name] = Top(
                    tuple(
                        session.execute(
                            select(spend)
                            .where(TallySpend.tally_id == tally.id, spend > 0)
                            .order_by(spend.desc())
                            .limit(rule.max_partitions_per_user)
                        ).scalars()
                    )
                )
    return ScopeState(
        total=tally.total,
        max_all=tally.max_spend,
        joint_total=tally.joint_total,
        parallel_total=tally.parallel_total,
        top=top,
    )


def stated(
    mode: Mode,
    amount: Amount,
    dataset: Dataset,
    only: tuple[ComponentName, ...] | None = None,
    *,
    bound: bool = False,
) -> dict[str, Any]:
    """``amount`` reported in ``dataset``'s mode; ``only``: the components a sub-budget
    limits, the others left out (a window or quota stated without delta limits none);
    ``bound``: a limit or what remains of one (``Mode.report``)."""
    report = mode.report(amount, dataset.limit_delta or 0, bound=bound)
    if only is not None and not mode.converts:
        # with advanced composition, the epsilon of a limited rho is its stated face
        shown = set(only) | ({"epsilon"} if mode.advanced and "rho" in only else set())
        report = {k: v for k, v in report.items() if k in shown}
    return mode.labelled(report, amount)


def lifetime_loss(session: Session, dataset: Dataset) -> Amount:
    """The dataset's lifetime loss now, from its lifetime tally."""
    names = dataset.mode.components
    rule = rule_of(dataset)
    lifetime = session.execute(
        select(Tally).where(Tally.dataset_id == dataset.id, Tally.kind == "lifetime")
    ).scalar()
    return loss_now(rule, tally_state(session, lifetime, rule, names), names)


def _quota_owner(detail: dict[str, Any]) -> dict[str, str]:
    """``{"consumer": name}`` for a change of a consumer's grant or quota (ledgered with
    scope ``consumer`` and the name, or by a conversion as ``consumer:NAME``), else nothing."""
    scope = str(detail.get("scope") or "")
    if scope == "consumer" and isinstance(detail.get("consumer"), str):
        return {"consumer": detail["consumer"]}
    if scope.startswith("consumer:"):
        return {"consumer": scope.removeprefix("consumer:")}
    return {}


def budget_report(
    session: Session, dataset: Dataset, now: float, *, history: bool = True
) -> dict[str, Any]:
    """What GET /v1/datasets/{name}/budget shows, from the scope rows; ``history`` adds the
    limit changes, which are read from the ledger (/metrics leaves them out)."""
    mode = dataset.mode
    rule = rule_of(dataset)
    names = mode.components
    tallies = {
        (t.kind, t.period_seconds, t.window_start): t
        for t in session.execute(
            select(Tally).where(
                Tally.dataset_id == dataset.id, Tally.kind.in_(["lifetime", "window"])
            )
        ).scalars()
    }
    lifetime = tallies.get(("lifetime", 0, 0))
    loss = loss_now(rule, tally_state(session, lifetime, rule, names), names)
    without = loss_without_open_holds(
        session, dataset.id, lifetime, rule, names, int(now * 1_000_000)
    )
    # between 0 and the loss, as it is but for a hold committed while this report reads
    # (PostgreSQL: each statement sees what was committed before it began)
    spent = (
        loss
        if without is None
        else Amount(**{name: min(max(without[name], 0), loss[name]) for name in names})
    )
    windows = []
    for budget in dataset.windows:
        window = Window.containing(budget.period_seconds, now)
        tally = tallies.get(("window", window.period, window.start))
        window_loss = loss_now(rule, tally_state(session, tally, rule, names), names)
        limited = tuple(n for n in names if budget.limit[n] is not None)
        windows.append(
            {
                "period": window.name,
                "start": isoformat(window.start),
                "end": isoformat(window.end),
                "loss": stated(mode, window_loss, dataset),
                "limit": stated(mode, budget.limit.bounds(), dataset, limited, bound=True),
                "remaining": stated(
                    mode, remaining(budget.limit, window_loss, names), dataset, limited, bound=True
                ),
                "at_limit": at_limit(budget.limit, window_loss, names),
            }
        )
    count = session.execute(
        select(func.count()).select_from(Partition).where(Partition.dataset_id == dataset.id)
    ).scalar_one()
    changes = (
        [
            {
                "at": isoformat(entry.created_at / 1e6),
                "scope": entry.detail.get("scope"),
                **_quota_owner(entry.detail),
                "old": as_numbers(entry.detail.get("old")),
                "new": as_numbers(entry.detail.get("new")),
                "reason": limit_notes.reason_of(entry.detail),
                **changed_by(entry, actor),
            }
            for entry, actor in session.execute(
                select(LedgerEntry, Consumer.name)
                .outerjoin(Consumer, Consumer.id == LedgerEntry.consumer_id)
                .where(LedgerEntry.dataset_id == dataset.id, LedgerEntry.kind == "limit_change")
                .order_by(LedgerEntry.id)
            ).all()
        ]
        if history
        else []
    )
    report: dict[str, Any] = {
        "dataset": dataset.name,
        "privacy_unit": dataset.privacy_unit,
        "accounting": dataset.accounting,
        "loss": stated(mode, loss, dataset),
        "limit": stated(mode, dataset.limit.bounds(), dataset, bound=True),
        "remaining": stated(mode, remaining(dataset.limit, loss, names), dataset, bound=True),
        "at_limit": at_limit(dataset.limit, loss, names),
        # what the open holds add to the loss, reserved for jobs not yet settled: where the
        # loss is a max or the k largest, less than their amounts' sum
        "held": stated(mode, Amount(**{name: loss[name] - spent[name] for name in names}), dataset),
        # the loss without the open holds: what releases (and settled or expired holds) spent
        "spent": stated(mode, spent, dataset),
        "windows": windows,
        "partitions": {
            "count": count,
            "max_spent": stated(mode, lifetime.max_spend if lifetime else Amount(), dataset),
        },
        "limit_history": changes,
        "guarantees": (
            "only the lifetime and partition limits bound privacy loss; window "
            "budgets and consumer quotas are allocation limits"
        ),
    }
    report.update(composition_of(dataset))
    if dataset.privacy_unit == "partition":
        report["note"] = PARTITION_UNIT_NOTE
    if dataset.has_partition_limit and dataset.partition_limit is not None:
        limited = tuple(n for n in names if dataset.partition_limit[n] is not None)
        report["partition_limit"] = stated(
            mode, dataset.partition_limit.bounds(), dataset, limited, bound=True
        )
        # what the most spent partition has left: no partition has less
        most_spent = lifetime.max_spend if lifetime else Amount()
        report["partitions"]["remaining"] = stated(
            mode,
            remaining(dataset.partition_limit, most_spent, names),
            dataset,
            limited,
            bound=True,
        )
        report["partitions"]["at_limit"] = at_limit(dataset.partition_limit, most_spent, names)
    return report


def changed_by(entry: LedgerEntry, actor: str | None) -> dict[str, str]:
    """Who made a limit change (``by``: the consumer its ledger entry names; none for one
    made from the command line) and, when another admin approved it, ``approved_by``."""
    who = {} if actor is None else {"by": actor}
    approver = (entry.detail or {}).get("approved_by")
    return who if approver is None else {**who, "approved_by": approver}


def as_numbers(terms: Any) -> Any:
    """Ledgered terms with their amounts (kept as exact text, which the hash covers) as
    decimals, so that the report shows them as JSON numbers like every other amount."""
    if isinstance(terms, list):
        return [as_numbers(item) for item in terms]
    if isinstance(terms, dict):
        return {
            key: Decimal(value)
            if key in _AMOUNT_NAMES and isinstance(value, str)
            else as_numbers(value)
            for key, value in terms.items()
        }
    return terms


_AMOUNT_NAMES = frozenset({"epsilon", "delta", "rho", "rdp", "mu", "order"})


def list_partitions(
    session: Session, dataset: Dataset, *, limit: int, after_id: int
) -> tuple[list[dict[str, Any]], int | None]:
    """A page of ``dataset``'s partitions, each with its lifetime s(p) (and, under a
    partition budget, what it has left and whether it is at its limit), in declaration
    order, and the id to continue after (None: the last page).

    Args:
        session: the caller's session.
        dataset: the dataset.
        limit: the most partitions on the page.
        after_id: the page starts after the partition with this id (0: the first page).
    """
    mode = dataset.mode
    lifetime_id = session.execute(
        select(Tally.id).where(Tally.dataset_id == dataset.id, Tally.kind == "lifetime")
    ).scalar_one()
    rows = session.execute(
        select(Partition.id, Partition.key, TallySpend.epsilon, TallySpend.delta, TallySpend.rho)
        .outerjoin(
            TallySpend,
            (TallySpend.partition_id == Partition.id) & (TallySpend.tally_id == lifetime_id),
        )
        .where(Partition.dataset_id == dataset.id, Partition.id > after_id)
        .order_by(Partition.id)
        .limit(limit + 1)
    ).all()
    names = mode.components
    limit_of_each = dataset.partition_limit if dataset.has_partition_limit else None
    limited = (
        () if limit_of_each is None else tuple(n for n in names if limit_of_each[n] is not None)
    )
    items = []
    for row in rows[:limit]:
        spent = Amount(row.epsilon or 0, row.delta or 0, row.rho or 0)
        item: dict[str, Any] = {"key": row.key, "spent": stated(mode, spent, dataset)}
        if limit_of_each is not None:
            left = remaining(limit_of_each, spent, names)
            item["remaining"] = stated(mode, left, dataset, limited, bound=True)
            item["at_limit"] = at_limit(limit_of_each, spent, names)
        items.append(item)
    next_id = rows[limit - 1].id if len(rows) > limit else None
    return items, next_id

"""Drawing on a hold (DESIGN.md, "Jobs that run elsewhere: holds"): pure rules.

A hold was charged in full to every scope when it was granted, so a charge
that draws on it is checked against the hold's remainder alone: its cost
comes out of what the hold charged, and no scope is charged again. It must
release exactly what the hold reserved for (the same partitions and release
kind), by the consumer that holds it or an admin, while the hold is open.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from accountant.accounting.checks import Denial
from accountant.accounting.loss import LossRule, ScopeBooks, ScopeKey, loss_now
from accountant.accounting.modes import Mode
from accountant.errors import Conflict, Forbidden, NotFound, field_error
from accountant.exact import COMPONENTS, RHO, Amount, ComponentName, Limit, positional


@dataclass(frozen=True, kw_only=True)
class HoldState:
    """A hold's row as a draw reads it under its dataset's lock.

    Args:
        id: the hold's id.
        dataset_id: the dataset it was charged to.
        consumer_id: the consumer that holds it (None: deleted since).
        release: its release kind.
        partitions: its partitions, resolved when it was made.
        amount: its per-release amount.
        drawn: what charges have drawn from it so far (per release).
        state: as stored: ``open`` or ``settled``.
        expires_at: its expiry (microseconds).
        multiplicity: m, how many times its amount counted in the running totals.
        mechanism: the mechanism that priced it (None: a stated amount).
        params: that mechanism's parameters, as stored.
        scopes: the keys of the scopes it charged.
    """

    id: str
    dataset_id: int
    consumer_id: int | None
    release: str
    partitions: tuple[str, ...]
    amount: Amount
    drawn: Amount
    state: str
    expires_at: int
    multiplicity: int = 1
    mechanism: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    scopes: tuple[ScopeKey, ...] = ()

    def state_at(self, now_us: int) -> str:
        """``open``, ``settled``, or ``expired`` from ``expires_at`` inclusive."""
        if self.state == "open" and now_us >= self.expires_at:
            return "expired"
        return self.state


def drawn_partitions(
    hold: HoldState | None,
    *,
    hold_id: str,
    dataset_id: int,
    requested: list[str] | str,
    release: str,
    consumer_id: int,
    role: str | None,
) -> list[str]:
    """The partitions a charge drawing on hold ``hold_id`` releases: the hold's (``"*"``
    stands for them), which the charge must name exactly (in any order), with the hold's
    release kind. A 404 for no such hold, a 403 for another consumer's hold (an admin may
    draw on any), a 400 naming the field otherwise."""
    if hold is None:
        raise NotFound(f"no hold with id {hold_id!r}; list holds with GET /v1/holds")
    if hold.dataset_id != dataset_id:
        raise field_error("hold", f"hold {hold_id!r} is on another dataset; name its dataset")
    if role != "admin" and hold.consumer_id != consumer_id:
        raise Forbidden(f"hold {hold_id!r} is another consumer's; only it or an admin may draw")
    if requested != "*" and sorted(requested) != sorted(hold.partitions):
        raise field_error(
            "partitions",
            f"a charge on hold {hold_id!r} names exactly its partitions "
            f"{list(hold.partitions)} (or '*' for them)",
        )
    if release != hold.release:
        raise field_error(
            "release", f"a charge on hold {hold_id!r} has its release kind {hold.release!r}"
        )
    return list(hold.partitions)


def draw_denial(
    hold: HoldState, cost: Amount, now_us: int, names: tuple[ComponentName, ...]
) -> Denial | None:
    """Why a draw of per-release ``cost`` on ``hold`` at ``now_us`` is refused: the hold is
    settled or expired, or what was drawn plus the cost exceeds its amount in a component.
    None: it fits."""
    state = hold.state_at(now_us)
    after = hold.drawn.plus(cost)
    if state == "open" and not any(after[name] > hold.amount[name] for name in names):
        return None
    return Denial(
        scope="hold",
        limit=Limit(**{name: hold.amount[name] for name in names}),
        spent=hold.drawn,
        requested=cost,
        hold_state=state,
    )


@dataclass(frozen=True, kw_only=True)
class Settlement:
    """A hold settled: what its job used in all (per release, what charges drew included),
    what goes back to every scope it charged (its amount less that, per release; times its
    multiplicity in the running totals), and the dataset's lifetime loss before and after."""

    hold: HoldState
    used: Amount
    returned: Amount
    lifetime_after: Amount
    lifetime_before: Amount


def settle(
    hold: HoldState | None,
    *,
    hold_id: str,
    used: Amount,
    consumer_id: int,
    role: str | None,
    now_us: int,
    mode: Mode,
    rule: LossRule,
    lifetime: ScopeBooks,
    whole_only: bool,
    field_name: str,
) -> Settlement:
    """Settle ``hold`` at ``used``: its holder or an admin, while it is open, at no less
    than what its charges drew and no more than its amount in any component. What it did
    not use goes back; ``lifetime`` (the dataset's lifetime books, every s(p)) gives the
    loss after. ``whole_only``: the hold was priced by composing a fixed plan tightly
    (``subsampled_gaussian`` on approx), valid only for that plan, so it settles at its
    full amount or is released (at what was drawn), never in between. ``field_name`` names
    what stated ``used`` in a 400, in whose message a figure is stated as ``mode`` (the
    dataset's) states amounts. A 404, 403, 409 (settled or expired) or 400 otherwise.
    """
    if hold is None:
        raise NotFound(f"no hold with id {hold_id!r}; list holds with GET /v1/holds")
    if role != "admin" and hold.consumer_id != consumer_id:
        raise Forbidden(f"hold {hold_id!r} is another consumer's; only it or an admin may settle")
    state = hold.state_at(now_us)
    if state != "open":
        raise Conflict(
            f"hold {hold_id!r} is {state}: it can be settled or released only once, "
            "while it is open; an expired hold keeps its amount charged"
        )
    names = mode.components
    for name in names:
        if used[name] < hold.drawn[name]:
            raise field_error(
                field_name,
                "the job used at least what its charges drew "
                f"({_figure(name, hold.drawn[name], mode)}); state the total, draws included",
            )
        if used[name] > hold.amount[name]:
            raise field_error(
                field_name,
                f"more than the hold's amount ({_figure(name, hold.amount[name], mode)}); a "
                "job may not use more than it held: charge the rest",
            )
    if whole_only and used not in (hold.amount, hold.drawn):
        raise field_error(
            field_name,
            f"hold {hold_id!r} was priced by composing its steps as a plan fixed in advance, "
            "which is valid only for the whole plan: settle it at its full amount (the same "
            "steps) or release it if nothing ran outside the accountant",
        )
    returned = hold.amount.minus(used)
    k = rule.max_partitions_per_user if rule.uses_top_k else None
    before = loss_now(rule, lifetime.state(k), names)
    lifetime.remove(
        returned, hold.multiplicity, list(hold.partitions), hold.release, kept=rule.parts
    )
    after = loss_now(rule, lifetime.state(k), names)
    return Settlement(
        hold=hold, used=used, returned=returned, lifetime_after=after, lifetime_before=before
    )


def _figure(name: ComponentName, units: int, mode: Mode) -> str:
    """A component of an amount as a 400 states it, exactly and in decimals: epsilon and
    delta as they are; the rho component as ``mode`` leads its amounts (rho, rdp, or mu on
    gdp), or with advanced composition as the filter's sum of epsilon^2 / 2."""
    if name != "rho":
        return f"{name} {positional(COMPONENTS[name].to_decimal(units))}"
    if mode.advanced:
        return f"the advanced filter's rho {positional(RHO.to_decimal(units))}"
    return f"{mode.lead_name} {positional(mode.lead(Amount(rho=units)))}"

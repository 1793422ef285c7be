"""Drawing on a hold (DESIGN.md, "Jobs that run elsewhere: holds"): pure rules.

A hold was charged in full to every scope when it was granted, so a charge
that draws on it is checked against the hold's remainder alone: its cost
comes out of what the hold charged, and no scope is charged again. It must
release exactly what the hold reserved for (the same partitions and release
kind), by the consumer that holds it or an admin, while the hold is open.
"""

from __future__ import annotations

from dataclasses import dataclass

from accountant.accounting.checks import Denial
from accountant.errors import Forbidden, NotFound, field_error
from accountant.exact import Amount, ComponentName, Limit


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

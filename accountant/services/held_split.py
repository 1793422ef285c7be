"""What a dataset's lifetime loss would be without its open holds: what releases spent.

A hold is charged at once to every scope, like a charge of its amount on its partitions
(``services.charges``). So the loss without the open holds is the loss rule
(``accounting.loss``) applied to the lifetime scope with each open hold's amount taken off
T (times its multiplicity, in its release kind's part too) and off s(p) of each of its
partitions. The loss is not additive over charges (a max, a sum of the k largest, a min),
so this is not the loss less ``held``: on a ``user`` dataset a hold on a partition outside
the k largest adds nothing to the loss, and on a ``record`` dataset holds on partitions
other than the most spent one add nothing either.

Only the partitions of open holds change, so this reads their spend rows and, of the other
partitions, the largest spend (``record``, ``partition``) or the k largest of each part
(``user`` with k). Holds over many partitions (``"*"``) are read without naming their keys
in the statements (a statement takes a bounded number of parameters): their dataset's
partitions and spend rows are read whole, as many rows as the holds cover.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from accountant.accounting.loss import PARTS, LossRule, Part, ScopeState, Top, loss_now
from accountant.exact import Amount, ComponentName
from accountant.models import Hold, Partition, Tally, TallySpend
from accountant.models.tally import PART_PREFIXES

#: Up to this many partition keys of open holds are named in the statements that read them.
_NAMED_AT_MOST = 500


def loss_without_open_holds(
    session: Session,
    dataset_id: int,
    lifetime: Tally | None,
    rule: LossRule,
    names: tuple[ComponentName, ...],
    now_us: int,
) -> Amount | None:
    """The lifetime loss with the open holds taken off, or None when no hold is open (then
    it is the loss itself)."""
    holds = (
        session.execute(
            select(Hold).where(
                Hold.dataset_id == dataset_id, Hold.state == "open", Hold.expires_at > now_us
            )
        )
        .scalars()
        .all()
    )
    if not holds:
        return None
    if lifetime is None:
        return Amount()
    keys = sorted({key for hold in holds for key in hold.partitions})
    named = len(keys) <= _NAMED_AT_MOST  # else read whole, filtered here
    known = dict(
        session.execute(
            select(Partition.key, Partition.id).where(
                Partition.dataset_id == dataset_id, *([Partition.key.in_(keys)] if named else [])
            )
        ).all()
    )
    ids = {key: known[key] for key in keys}
    off: dict[tuple[Part, ComponentName, int], int] = defaultdict(int)
    totals_off: dict[tuple[Part, ComponentName], int] = defaultdict(int)
    for hold in holds:
        part: Part = "joint" if hold.release == "joint" else "parallel"
        parts: tuple[Part, ...] = ("every", part) if rule.uses_top_k else ("every",)
        for name in names:
            amount = getattr(hold, f"amount_{name}")
            for each in parts:
                totals_off[each, name] += amount * hold.multiplicity
                for key in hold.partitions:
                    off[each, name, ids[key]] += amount
    touched = tuple(sorted(set(ids.values())))
    inside = set(touched)
    rows = {
        row.partition_id: row
        for row in session.execute(
            select(TallySpend).where(
                TallySpend.tally_id == lifetime.id,
                *([TallySpend.partition_id.in_(touched)] if named else []),
            )
        ).scalars()
        if row.partition_id in inside
    }

    def after(part: Part, name: ComponentName) -> list[int]:
        """s(p) of the holds' partitions, their amounts taken off."""
        column = f"{PART_PREFIXES[part]}{name}"
        return [
            getattr(rows[pid], column) - off[part, name, pid] if pid in rows else 0
            for pid in touched
        ]

    def others(part: Part, name: ComponentName, limit: int) -> list[int]:
        """The ``limit`` largest s(p) of the other partitions: of the ``limit`` + |touched|
        largest of all, those outside."""
        column = getattr(TallySpend, f"{PART_PREFIXES[part]}{name}")
        largest = session.execute(
            select(column, TallySpend.partition_id)
            .where(TallySpend.tally_id == lifetime.id, column > 0)
            .order_by(column.desc())
            .limit(limit + len(touched))
        ).all()
        return [value for value, pid in largest if pid not in inside][:limit]

    def less(total: Amount, part: Part) -> Amount:
        return Amount(**{name: total[name] - totals_off[part, name] for name in names})

    top: dict[tuple[Part, ComponentName], Top] = {}
    max_all = Amount()
    if rule.uses_top_k:
        k = rule.max_partitions_per_user
        assert k is not None
        for part in PARTS:
            for name in names:
                largest = sorted([*others(part, name, k), *after(part, name)], reverse=True)
                top[part, name] = Top(outside=tuple(v for v in largest[:k] if v > 0))
    elif rule.privacy_unit != "user":
        max_all = Amount(
            **{name: max([0, *others("every", name, 1), *after("every", name)]) for name in names}
        )
    state = ScopeState(
        total=less(lifetime.total, "every"),
        max_all=max_all,
        joint_total=less(lifetime.joint_total, "joint"),
        parallel_total=less(lifetime.parallel_total, "parallel"),
        top=top,
    )
    return loss_now(rule, state, names)

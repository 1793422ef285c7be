"""What a charge is decided from: the request as asked, and the values its transaction read.

Plain frozen values, built by the HTTP layer (``ChargeRequest``) and by
``services.charge_reads`` (``ChargeReads``, with the dataset's row as
``DatasetState``), and read by ``accounting.decide``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from accountant.accounting.holds import HoldState
from accountant.accounting.loss import LossRule, Part, ScopeKey
from accountant.accounting.modes import Mode, mode_of
from accountant.exact import Amount, ComponentName, Limit
from accountant.mechanism import Mechanism


@dataclass(frozen=True)
class WindowLimit:
    period_seconds: int
    limit: Limit


@dataclass(frozen=True, kw_only=True)
class PopulationState:
    """A population's row as read, locked, with its member dataset's.

    Args:
        id: the population's id.
        name: its name.
        limit: its lifetime limit, in its (and its datasets') mode's measure.
        loss: the sum of its datasets' lifetime losses.
    """

    id: int
    name: str
    limit: Limit
    loss: Amount


@dataclass(frozen=True, kw_only=True)
class DatasetState:
    """The columns of a dataset row that pricing, checking and the ledger need, with what
    the same statement read of the caller: its role, its grant and quota, its key.

    Args:
        id: the dataset's id.
        name: its name.
        privacy_unit: its privacy unit (``record``, ``partition`` or ``user``).
        accounting: its mode's name (``modes.MODES``).
        rdp_order: the Renyi order of an rdp dataset, as stored.
        composition_delta: delta' of an approx dataset with advanced composition.
        max_partitions_per_user: k of a user dataset (None: unbounded).
        max_records_per_user: r of a user dataset (None: not stated).
        limit: the lifetime limit.
        partition_limit: the per-partition limit, if any.
        windows: the window budgets.
        ledger_seq: the sequence number of the chain's head.
        ledger_head: the hash of the chain's head.
        head_seal: ``seals.of_head`` of the two above, as the service wrote it.
        terms_sha256: the digest of the terms as the service last set them.
        quota: the charging consumer's quota on this dataset.
        granted: whether the charging consumer holds a grant on it.
        key_valid: whether the caller's API key is unrevoked.
        role: the charging consumer's role (None: the consumer is gone).
        population: the population the dataset belongs to, if any.
    """

    id: int
    name: str
    privacy_unit: str
    accounting: str
    rdp_order: str | None
    composition_delta: int | None
    max_partitions_per_user: int | None
    max_records_per_user: int | None
    limit: Limit
    partition_limit: Limit | None
    windows: tuple[WindowLimit, ...]
    ledger_seq: int
    ledger_head: str
    head_seal: str | None
    terms_sha256: str
    quota: Limit | None
    granted: bool
    key_valid: bool
    role: str | None = None
    population: PopulationState | None = None

    @property
    def limit_delta(self) -> int | None:
        return self.limit.delta

    @property
    def mode(self) -> Mode:
        return mode_of(self.accounting, self.rdp_order, self.composition_delta)

    @property
    def rule(self) -> LossRule:
        return LossRule(self.privacy_unit, self.max_partitions_per_user)


class Caller(Protocol):
    """Who asks for a charge, as authenticated (its role and grants are read again with the
    dataset, ``DatasetState``)."""

    @property
    def consumer_id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def key_id(self) -> str: ...


@dataclass(frozen=True, kw_only=True)
class HoldTerms:
    """What makes a request a hold (DESIGN.md, "Jobs that run elsewhere: holds"): budget
    charged at once for a job that runs elsewhere, nothing run.

    Args:
        hold_id: the new hold's id.
        expires_in_s: how long the hold lasts, in seconds (1 to 7 days, and never past the
            end of the current window of the dataset's shortest window budget).
        purpose: what the job is, as the caller states it.
        amount: the per-release cost stated in the dataset's measure (``epsilon`` and
            ``delta``, ``rho``, ``rdp`` or ``mu``), when no mechanism prices it.
    """

    hold_id: str
    expires_in_s: int
    purpose: str | None = None
    amount: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class PlanShare:
    """A charge's place in a release plan (a batch, DESIGN.md "Release plans: batches").

    Args:
        batch_id: the batch's id.
        group: the number of the group it was priced with (approx datasets, a batch that
            names a delta); None: priced as a single charge.
        cost: its share of its group's cost, rounded up (None: priced by its mechanism).
        group_cost: its group's whole cost, as composed.
        delta: the batch's delta, at which its group was composed.
    """

    batch_id: str
    group: int | None = None
    cost: Amount | None = None
    group_cost: Amount | None = None
    delta: str | None = None


@dataclass(frozen=True, kw_only=True)
class ChargeRequest:
    """A charge as the caller asked for it, validated as far as it can be without the
    database.

    Args:
        dataset: the charged dataset's name.
        partitions: the charged partitions' keys, or ``"*"`` for every one.
        release: ``joint`` or ``parallel``.
        mechanism: the mechanism that runs the release (or prices a hold; None for a hold
            with a stated amount).
        params: its parameters, as sent.
        sensitivity_unit: ``record`` for a record-level sensitivity (None: the dataset's
            unit).
        principal: who asks.
        data: the input the mechanism will run on (None in a preview that sends none).
        noise_secret: the id of the noise secret the output is drawn with (recorded with a
            grant).
        key: the idempotency key, if any.
        fingerprint: the SHA-256 of the body (``idempotency.fingerprint``).
        hold: for a hold, its terms (None: a charge).
        draw: the id of the hold a charge draws on (None: it charges the scopes).
        share: its place in a batch, and the cost its plan fixed (None: a charge alone).
    """

    dataset: str
    partitions: list[str] | str
    release: str
    mechanism: Mechanism | None
    params: Mapping[str, Any]
    sensitivity_unit: str | None
    principal: Caller
    data: Mapping[str, Any] | None = None
    noise_secret: str | None = None
    key: str | None = None
    fingerprint: str = ""
    hold: HoldTerms | None = None
    draw: str | None = None
    share: PlanShare | None = None

    @property
    def mechanism_to_run(self) -> Mechanism:
        """The mechanism a charge runs (a hold runs none, and never asks)."""
        if self.mechanism is None or self.hold is not None:
            raise TypeError("a hold runs no mechanism")
        return self.mechanism


#: One part and component of a scope's spends: s(p), s_J(p) or s_P(p) in epsilon, delta or
#: rho (``loss.PARTS``).
Column = tuple[Part, ComponentName]


@dataclass(frozen=True, kw_only=True)
class ScopeRow:
    """A scope's row as read in the charge's transaction: plain values.

    ``max_touched`` is the largest old s(p) among the charged partitions. For
    the top-k rule, ``inside`` holds each column's values of the charged
    partitions that have spent in this scope, and ``outside`` the k largest
    positive values of the others (of every partition when the read could not
    tell them apart: ``"*"``, or no charged partition exists yet).
    """

    id: int
    total: Amount
    max_spend: Amount
    max_touched: Amount
    joint_total: Amount
    parallel_total: Amount
    inside: Mapping[Column, tuple[int, ...]]
    outside: Mapping[Column, tuple[int, ...]]


@dataclass(frozen=True, kw_only=True)
class ChargeReads:
    """Everything a charge's decision needs, read under its dataset's lock
    (``services.charge_reads``)."""

    dataset: DatasetState
    #: The charge's time, read once its transaction held the lock (microseconds).
    now_us: int
    #: The ids of the charged partitions that exist, by key (every partition for ``"*"``,
    #: in the order they were declared).
    partitions: Mapping[str, int]
    #: The rows of the scopes the charge may touch that exist, by key.
    scopes: Mapping[ScopeKey, ScopeRow]
    #: s(p) in the lifetime scope of the charged partitions that have spent, when the
    #: dataset has a per-partition limit (read only then).
    spends: Mapping[str, Amount]
    #: The hold a charge draws on, as it stands (None: none asked, or no such hold).
    hold: HoldState | None = None

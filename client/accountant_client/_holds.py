"""Holds: budget reserved, and charged at once, for a job that runs elsewhere; ``Hold`` for
``Client`` and ``AsyncHold`` for ``AsyncClient``, whose blocks settle in full on exit."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from accountant_client._errors import AccountantError, Conflict, _amount
from accountant_client._results import Charge, Settlement

if TYPE_CHECKING:
    # named (as strings) in the bases of Hold and AsyncHold, which ruff does not read
    from accountant_client._async_client import AsyncClient  # noqa: F401
    from accountant_client._client import Client  # noqa: F401

_C = TypeVar("_C")


@dataclass(frozen=True, kw_only=True)
class _HoldFacts(Generic[_C]):
    """A hold as the service showed it, and the client that made or read it."""

    hold_id: str
    dataset: str
    partitions: list[str]
    #: joint or parallel: the request's ``release``, named apart from the ``release`` method.
    release_kind: str
    amount: dict[str, Decimal]  # per release; charged x multiplicity (``raw["charged"]``)
    drawn: dict[str, Decimal]
    state: str  # open, settled or expired, when it was read
    expires_at: str
    #: The receipt of kind ``hold`` (only the answer that made the hold carries one).
    receipt: str | None
    remaining: dict[str, Decimal] | None  # the dataset's, right after the hold was granted
    raw: dict[str, Any]
    idempotency_key: str | None = None
    claims: dict[str, Any] = field(default_factory=dict)  # the verified receipt's claims
    _client: _C = field(repr=False, compare=False)
    _ended: list[Settlement] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def _of(
        cls, client: _C, answer: Mapping[str, Any], key: str | None, claims: dict[str, Any]
    ) -> Self:
        return cls(
            hold_id=answer["hold_id"],
            dataset=answer["dataset"],
            partitions=list(answer["partitions"]),
            release_kind=answer["release"],
            amount=_amount(answer["amount"]),
            drawn=_amount(answer["drawn"]),
            state=answer["state"],
            expires_at=answer["expires_at"],
            receipt=answer.get("receipt"),
            remaining=_amount(answer["remaining"]) if "remaining" in answer else None,
            raw=dict(answer),
            idempotency_key=key,
            claims=claims,
            _client=client,
        )

    @property
    def settlement(self) -> Settlement | None:
        """How this hold was ended through this value (or one refreshed from it): by
        ``settle``, ``release`` or its block's exit; None until then."""
        return self._ended[-1] if self._ended else None

    def _refreshed(self, fresh: Self) -> Self:
        """``fresh``, read again, with what only the first answer carried."""
        return replace(
            fresh,
            receipt=self.receipt,
            idempotency_key=self.idempotency_key,
            claims=self.claims,
            _ended=self._ended,
        )


class Hold(_HoldFacts["Client"]):
    """A hold made or read with ``Client``: what was reserved (``amount`` per release, in
    the dataset's measure, charged at once to every scope), what charges ``drawn`` of it,
    its ``state`` and ``expires_at``, and its ``receipt`` of kind ``hold``.

    Draw on it with ``charge``; end it with ``settle`` (what the job used in all, draws
    included) or ``release`` (the job published nothing of its own: settled at what the
    draws used). As a context manager it **never refunds by itself**: a block that exits,
    normally or by an exception, without having called ``settle`` or ``release`` settles
    the hold at its full amount, since a job that ran outside the accountant may have
    published. Call ``h.release()`` or ``h.settle(...)`` explicitly to give budget back. A
    hold already settled or expired (a 409) is left as it is; an expired hold keeps its
    amount charged.

        with accountant.hold(dataset="clicks", partitions=["2026-11"], expires_in=3600,
                             amount={"epsilon": 0.5}) as h:
            h.charge(mechanism="laplace", params={"epsilon": 0.1, "sensitivity": 1},
                     input={"values": [120.0]})
            h.settle(used={"epsilon": 0.3})  # 0.2 goes back
    """

    def __enter__(self) -> Hold:
        return self

    def __exit__(
        self,
        _kind: type[BaseException] | None,
        error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        if self._ended:
            return
        try:
            self.settle(used=_full_use(self.raw["amount"]))
        except AccountantError as failure:
            _unsettled(self.hold_id, failure, error)

    def charge(
        self,
        *,
        mechanism: str,
        params: Mapping[str, Any],
        input: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Charge:
        """A draw: a charge on the hold's partitions and release whose cost comes out of the
        hold's remainder (``HoldExhausted`` past it), charged to no scope again."""
        return self._client.charge(
            dataset=self.dataset,
            partitions=self.partitions,
            mechanism=mechanism,
            params=params,
            input=input,
            release=self.release_kind,
            idempotency_key=idempotency_key,
            hold=self.hold_id,
        )

    def settle(
        self,
        *,
        used: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Settlement:
        """End the hold at what its job ``used`` in all, draws included, in the dataset's
        measure; or at what its draws used plus the price of ``params`` (merged into the
        hold's mechanism parameters, such as ``{"steps": 600}``). The rest goes back to
        every scope the hold charged. Retries reuse one idempotency key."""
        settlement = self._client._end_hold(
            self.hold_id, "settle", _settle_body(used, params), idempotency_key
        )
        self._ended.append(settlement)
        return settlement

    def release(self, *, idempotency_key: str | None = None) -> Settlement:
        """End the hold at what its draws used: the job published nothing of its own."""
        settlement = self._client._end_hold(self.hold_id, "release", None, idempotency_key)
        self._ended.append(settlement)
        return settlement

    def refresh(self) -> Hold:
        """The hold as the service shows it now (``drawn``, ``state``), keeping the receipt
        of the answer that made it."""
        return self._refreshed(self._client.get_hold(self.hold_id))


class AsyncHold(_HoldFacts["AsyncClient"]):
    """A hold made or read with ``AsyncClient``: as ``Hold``, with ``async with`` and its
    methods awaited. Its block, too, settles at the full amount unless it released or
    settled the hold."""

    async def __aenter__(self) -> AsyncHold:
        return self

    async def __aexit__(
        self,
        _kind: type[BaseException] | None,
        error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        if self._ended:
            return
        try:
            await self.settle(used=_full_use(self.raw["amount"]))
        except AccountantError as failure:
            _unsettled(self.hold_id, failure, error)

    async def charge(
        self,
        *,
        mechanism: str,
        params: Mapping[str, Any],
        input: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Charge:
        """As ``Hold.charge``."""
        return await self._client.charge(
            dataset=self.dataset,
            partitions=self.partitions,
            mechanism=mechanism,
            params=params,
            input=input,
            release=self.release_kind,
            idempotency_key=idempotency_key,
            hold=self.hold_id,
        )

    async def settle(
        self,
        *,
        used: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Settlement:
        """As ``Hold.settle``."""
        settlement = await self._client._end_hold(
            self.hold_id, "settle", _settle_body(used, params), idempotency_key
        )
        self._ended.append(settlement)
        return settlement

    async def release(self, *, idempotency_key: str | None = None) -> Settlement:
        """As ``Hold.release``."""
        settlement = await self._client._end_hold(self.hold_id, "release", None, idempotency_key)
        self._ended.append(settlement)
        return settlement

    async def refresh(self) -> AsyncHold:
        """As ``Hold.refresh``."""
        return self._refreshed(await self._client.get_hold(self.hold_id))


def _hold_body(
    *,
    dataset: str,
    partitions: Sequence[str] | str,
    expires_in: int,
    release: str,
    amount: Mapping[str, Any] | None,
    mechanism: str | None,
    params: Mapping[str, Any] | None,
    purpose: str | None,
) -> dict[str, Any]:
    """A hold's request: priced by its ``amount``, or by a ``mechanism`` and its ``params``
    (a ``TypeError`` for both or neither)."""
    if (amount is None) == (mechanism is None) or (mechanism is None) != (params is None):
        raise TypeError("a hold takes an amount, or a mechanism and its params: one of the two")
    body: dict[str, Any] = {
        "dataset": dataset,
        "partitions": partitions if isinstance(partitions, str) else list(partitions),
        "release": release,
        "expires_in": expires_in,
    }
    if amount is not None:
        body["amount"] = _plain(amount)
    if mechanism is not None and params is not None:
        body["mechanism"], body["params"] = mechanism, _plain(params)
    if purpose is not None:
        body["purpose"] = purpose
    return body


def _settle_body(
    used: Mapping[str, Any] | None, params: Mapping[str, Any] | None
) -> dict[str, Any]:
    if (used is None) == (params is None):
        raise TypeError("a settle takes used, or params: one of the two")
    return {"used": _plain(used)} if used is not None else {"params": _plain(params or {})}


def _hold_query(dataset: str | None, state: str | None) -> dict[str, str]:
    return {k: v for k, v in (("dataset", dataset), ("state", state)) if v is not None}


def _plain(figures: Mapping[str, Any]) -> dict[str, Any]:
    """``figures`` as JSON can carry them: a Decimal (as results state amounts) as the
    nearest float, which JSON writes as the Decimal's own digits if it has at most 15
    significant digits."""
    return {k: float(v) if isinstance(v, Decimal) else v for k, v in figures.items()}


def _full_use(amount: Mapping[str, Any]) -> dict[str, float]:
    """A hold's whole ``amount`` (as the service showed it) as a settle's ``used`` states
    it: the figures of the dataset's measure alone, without the labels (``measure``,
    ``additive``, ``epsilon_alone``, ``mu2``) and the figures derived from them.

    On pure and approx datasets (and approx with advanced composition, whose measure is
    rho but whose amounts are stated as epsilon and delta) ``additive`` names ``delta``:
    epsilon, and delta unless it is 0, since a pure dataset refuses any delta. On zcdp
    rho, on rdp the divergence ``rdp``. These figures are the stored amount exactly, and
    JSON writes each float back as the decimal it was read from (for figures of up to 15
    significant digits: rho and rdp below 1,000; a longer one may come back as one unit
    more than the amount, a 400, which leaves the hold charged in full). On gdp ``mu``,
    which the service states as the square root of ``mu2`` rounded to its resolution and
    squares again rounding up, so that its own ``mu`` may come back as more than the
    amount: the largest mu whose square is at most ``mu2`` instead."""
    additive = amount.get("additive", ())
    measure = amount.get("measure")
    if "delta" in additive or measure == "epsilon":
        use = {"epsilon": float(amount["epsilon"])}
        if amount.get("delta"):
            use["delta"] = float(amount["delta"])
        return use
    if measure == "mu2":
        return {"mu": _root_at_most(float(amount["mu2"]))}
    return {str(measure): float(amount[str(measure)])}


def _root_at_most(square: float) -> float:
    """The largest float whose decimal form (as JSON writes it) squared is at most the
    decimal form of ``square``. Squared and rounded up to the service's resolution it is
    ``square`` again while that is below 1,000 (mu below 31), where two floats next to the
    root square to figures closer together than the resolution."""
    bound = Fraction(repr(square))
    root = math.sqrt(square)
    while root > 0 and Fraction(repr(root)) ** 2 > bound:
        root = math.nextafter(root, 0.0)
    while Fraction(repr(above := math.nextafter(root, math.inf))) ** 2 <= bound:
        root = above
    return root


def _unsettled(hold_id: str, failure: AccountantError, error: BaseException | None) -> None:
    """After a block's settle at the full amount failed: nothing more if the hold was
    already settled or expired (a 409 conflict; an expired hold keeps its amount charged);
    otherwise the failure, or, if the block itself raised, a note on its exception, which
    goes on. The hold then stays charged at its full amount until it expires."""
    if isinstance(failure, Conflict) and failure.type.endswith("/conflict"):
        return
    if error is None:
        raise failure
    error.add_note(
        f"hold {hold_id} was not settled on leaving its block ({failure}); it stays charged "
        "at its full amount until it is settled or expires"
    )

"""``Client``: the API's calls with one key, retried until a deadline (``_Backoff``, which
``AsyncClient`` shares)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from accountant_client._batches import (
    BatchPlan,
    BatchResult,
    _batch_body,
    _batch_of,
    _plan_body,
    _planned,
)
from accountant_client._errors import Unavailable, _error, _retry_after, _retryable
from accountant_client._holds import Hold, _hold_body, _hold_query
from accountant_client._populations import _limit_body, _population_body
from accountant_client._receipts import _Receipt, _remember_keys
from accountant_client._requests import (
    ChangeRequest,
    PendingApproval,
    _quota_body,
    _request_of,
    _requests_query,
)
from accountant_client._results import (
    Charge,
    Plan,
    Preview,
    Settlement,
    _charge_body,
    _charge_of,
    _preview_of,
    _settlement_of,
)


class Client:
    """The accountant's API with one key. ``deadline``: seconds a call keeps retrying;
    ``timeout``: seconds one attempt may take; ``verify_receipts``: check every receipt
    offline (default)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        deadline: float = 30.0,
        verify_receipts: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            headers={"Authorization": f"Bearer {api_key}"},
            transport=transport,
        )
        self.deadline = deadline
        self.verify_receipts = verify_receipts
        self._keys: dict[str, Ed25519PublicKey] = {}

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # charges -----------------------------------------------------------------------------

    def charge(
        self,
        *,
        dataset: str,
        partitions: Sequence[str] | str,
        mechanism: str,
        params: Mapping[str, Any],
        input: Mapping[str, Any] | None = None,
        release: str = "joint",
        idempotency_key: str | None = None,
        hold: str | None = None,
    ) -> Charge:
        """Charge and release once. Retries reuse one idempotency key, so the answer is the
        first one however many attempts it takes. With ``hold`` (a hold's id; ``Hold.charge``
        names it for you), a draw: its cost comes out of that hold."""
        key = idempotency_key or str(uuid.uuid4())
        body = _charge_body(dataset, partitions, mechanism, params, input, release, hold=hold)
        answer = self._call("POST", "/v1/charges", json=body, headers={"Idempotency-Key": key})
        claims = (
            self.verify_receipt(answer["receipt"], output=answer["output"])
            if self.verify_receipts
            else {}
        )
        return _charge_of(answer, key, claims)

    def preview(
        self,
        *,
        dataset: str,
        partitions: Sequence[str] | str,
        mechanism: str,
        params: Mapping[str, Any],
        release: str = "joint",
        hold: str | None = None,
    ) -> Preview:
        """What the charge would cost and whether it would be granted (with ``hold``, out of
        that hold's remainder); nothing is charged."""
        answer = self._call(
            "POST",
            "/v1/charges/preview",
            json=_charge_body(dataset, partitions, mechanism, params, None, release, hold=hold),
        )
        return _preview_of(answer)

    @overload
    def plan(
        self,
        *,
        dataset: str,
        partitions: Sequence[str] | str,
        mechanism: str,
        params: Mapping[str, Any],
        release: str = "joint",
        count: int | None = None,
        hold: str | None = None,
    ) -> Plan: ...

    @overload
    def plan(
        self,
        *,
        items: Iterable[Mapping[str, Any]],
        share: float | None = None,
        delta: float | None = None,
    ) -> BatchPlan: ...

    def plan(
        self,
        *,
        dataset: str | None = None,
        partitions: Sequence[str] | str | None = None,
        mechanism: str | None = None,
        params: Mapping[str, Any] | None = None,
        release: str = "joint",
        count: int | None = None,
        hold: str | None = None,
        items: Iterable[Mapping[str, Any]] | None = None,
        share: float | None = None,
        delta: float | None = None,
    ) -> Plan | BatchPlan:
        """How many more such charges fit (with ``hold``, in that hold's remainder); with
        ``count`` and the noise parameter left out of ``params``, the least-noise parameters
        for which ``count`` of them fit.

        With ``items`` instead (charge bodies, as for ``batch``, each with a ``weight`` and
        without its noise parameter), a ``BatchPlan``: the least-noise parameters for each
        such that the whole list fits ``share`` (default 1) of what remains, each item's
        share proportional to its weight; ``delta`` as for ``batch``."""
        body = _plan_body(
            dataset=dataset,
            partitions=partitions,
            mechanism=mechanism,
            params=params,
            release=release,
            count=count,
            hold=hold,
            items=items,
            share=share,
            delta=delta,
        )
        return _planned(self._call("POST", "/v1/charges/plan", json=body), items is not None)

    def get_charge(self, charge_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/charges/{charge_id}"))

    # batches -----------------------------------------------------------------------------

    def batch(
        self,
        items: Iterable[Mapping[str, Any]],
        *,
        delta: float | None = None,
        idempotency_key: str | None = None,
    ) -> BatchResult:
        """Charge and release every item or none, as one decision (a release plan). Each item
        is a charge's body, as ``charge``'s keyword arguments name it (``dataset``,
        ``partitions``, ``mechanism``, ``params``, ``input``, ``release``), on one dataset
        or several. With ``delta``, the items of an approx dataset that are joint releases
        over the same partitions are priced together, composed at that delta.

        A refusal raises ``BatchRefused`` (a ``BudgetExhausted``) or, when only windows are
        spent, ``BatchWindowRefused`` (a ``WindowExhausted``), with every overflowing scope
        in ``denials``; nothing was charged. Retries reuse one idempotency key, so the
        answer is the first one however many attempts it takes; each item's receipt is
        verified offline."""
        key = idempotency_key or str(uuid.uuid4())
        answer = self._call(
            "POST",
            "/v1/charges/batch",
            json=_batch_body(items, delta),
            headers={"Idempotency-Key": key},
        )
        claims = [
            self.verify_receipt(item["receipt"], output=item["output"])
            if self.verify_receipts
            else {}
            for item in answer["items"]
        ]
        return _batch_of(answer, key, claims)

    # holds -------------------------------------------------------------------------------

    def hold(
        self,
        *,
        dataset: str,
        partitions: Sequence[str] | str,
        expires_in: int,
        release: str = "joint",
        amount: Mapping[str, Any] | None = None,
        mechanism: str | None = None,
        params: Mapping[str, Any] | None = None,
        purpose: str | None = None,
        idempotency_key: str | None = None,
    ) -> Hold:
        """Reserve budget for a job that runs elsewhere, for ``expires_in`` seconds: an
        ``amount`` in the dataset's measure, or what ``mechanism`` with ``params`` costs;
        checked like a charge (``BudgetExhausted``, ``WindowExhausted``) and, granted,
        charged at once in full. Retries reuse one idempotency key. Used as a context
        manager the ``Hold`` settles at its full amount on exit unless it was released or
        settled: see ``Hold``."""
        key = idempotency_key or str(uuid.uuid4())
        body = _hold_body(
            dataset=dataset,
            partitions=partitions,
            expires_in=expires_in,
            release=release,
            amount=amount,
            mechanism=mechanism,
            params=params,
            purpose=purpose,
        )
        answer = self._call("POST", "/v1/holds", json=body, headers={"Idempotency-Key": key})
        claims = self.verify_receipt(answer["receipt"], kind="hold") if self.verify_receipts else {}
        return Hold._of(self, answer, key, claims)

    def holds(self, dataset: str | None = None, state: str | None = None) -> list[Hold]:
        """The holds the key may read (a service its own), newest first; of one dataset, and
        in one state (open, settled or expired), if named."""
        listed = self._call("GET", "/v1/holds", params=_hold_query(dataset, state))["holds"]
        return [Hold._of(self, answer, None, {}) for answer in listed]

    def get_hold(self, hold_id: str) -> Hold:
        return Hold._of(self, self._call("GET", f"/v1/holds/{hold_id}"), None, {})

    def _end_hold(
        self, hold_id: str, action: str, body: Mapping[str, Any] | None, key: str | None
    ) -> Settlement:
        """Settle or release a hold, under one idempotency key for every retry."""
        key = key or str(uuid.uuid4())
        answer = self._call(
            "POST", f"/v1/holds/{hold_id}/{action}", json=body, headers={"Idempotency-Key": key}
        )
        claims = (
            self.verify_receipt(answer["receipt"], kind="settle") if self.verify_receipts else {}
        )
        return _settlement_of(answer, key, claims)

    # datasets, budgets and partitions ----------------------------------------------------

    def datasets(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/datasets")["datasets"])

    def dataset(self, name: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/datasets/{name}"))

    def create_dataset(self, *, population: str | None = None, **definition: Any) -> dict[str, Any]:
        """Admin: ``create_dataset(name=..., privacy_unit=..., budget={...}, ...)``. With
        ``population`` (a population's name), the dataset joins that population for good:
        its privacy unit and accounting mode (and rdp order) must be the population's, and it
        must identify the same people by the same person-level id as its other members."""
        if population is not None:
            definition["population"] = population
        return dict(self._call("POST", "/v1/datasets", json=definition))

    def update_dataset(self, name: str, **changes: Any) -> dict[str, Any]:
        """Admin: new limits, ledgered as limit changes (``reason=...`` is recorded); the
        dataset as it now stands.

        With approvals on (``ACCOUNTANT_APPROVALS=on``), a change that raises the lifetime
        or partition limit (or removes one) is not made: it raises ``PendingApproval``
        carrying the pending request, which another admin approves or denies. ``reason``
        is then required (``InvalidRequest`` without)."""
        return dict(self._change("PATCH", f"/v1/datasets/{name}", json=changes))

    def budget(self, dataset: str) -> dict[str, Any]:
        """The budget report: loss, limit and remaining of every scope, and, for a service,
        its own quota on the dataset."""
        return dict(self._call("GET", f"/v1/datasets/{dataset}/budget"))

    def declare_partitions(self, dataset: str, keys: Sequence[str]) -> dict[str, Any]:
        return dict(
            self._call("POST", f"/v1/datasets/{dataset}/partitions", json={"keys": list(keys)})
        )

    def partitions(self, dataset: str) -> Iterator[dict[str, Any]]:
        """Every partition with its spend, page after page."""
        yield from self._pages(f"/v1/datasets/{dataset}/partitions", "partitions", {})

    # populations: budgets over several datasets of the same people -----------------------

    def populations(self) -> list[dict[str, Any]]:
        """Admin or auditor: every population. A population spans datasets a service may not
        be granted, so a service's key gets ``Forbidden`` here and on the other reads."""
        return list(self._call("GET", "/v1/populations")["populations"])

    def population(self, name: str) -> dict[str, Any]:
        """Admin or auditor: the population as created (its ``budget`` the limit as
        currently set), with its member ``datasets``."""
        return dict(self._call("GET", f"/v1/populations/{name}"))

    def create_population(
        self,
        name: str,
        *,
        accounting: str,
        budget: Mapping[str, Any],
        privacy_unit: str = "user",
        rdp_order: float | str | None = None,
    ) -> dict[str, Any]:
        """Admin: a population, a lifetime ``budget`` over the datasets that later join it
        (``create_dataset(..., population=name)``), in one ``accounting`` mode (and, on rdp,
        ``rdp_order``, fixed at creation). Its loss is the sum of its members' lifetime
        losses, which bounds what they reveal about one person only if every member
        identifies the same people by the same person-level id (the answer's ``identity``
        says so): make sure of that before a dataset joins. Populations and datasets share
        one namespace of names."""
        body = _population_body(
            name,
            accounting=accounting,
            budget=budget,
            privacy_unit=privacy_unit,
            rdp_order=rdp_order,
        )
        return dict(self._call("POST", "/v1/populations", json=body))

    def update_population(
        self, name: str, *, budget: Mapping[str, Any], reason: str | None = None
    ) -> dict[str, Any]:
        """Admin: a new limit, ledgered in the population's own chain with ``reason``; the
        population as it now stands. A limit lowered below the population's loss blocks
        further charges on its members; nothing is refunded. With approvals on, a raise is
        not made: it raises ``PendingApproval`` carrying the pending request, which another
        admin approves or denies (``reason`` is then required)."""
        return dict(
            self._change("PATCH", f"/v1/populations/{name}", json=_limit_body(budget, reason))
        )

    def population_budget(self, name: str) -> dict[str, Any]:
        """Admin or auditor: the population's budget report: ``loss`` (the sum of its
        members' lifetime losses), ``limit``, ``remaining`` and ``at_limit``, each member's
        loss by name in ``datasets``, and its ``limit_history``."""
        return dict(self._call("GET", f"/v1/populations/{name}/budget"))

    # consumers and mechanisms ------------------------------------------------------------

    def me(self) -> dict[str, Any]:
        """The caller's own consumer: grants, quotas and their current use."""
        return dict(self._call("GET", "/v1/consumers/me"))

    def consumers(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/consumers")["consumers"])

    def create_consumer(
        self,
        name: str,
        role: str,
        datasets: Sequence[str] = (),
        quotas: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Admin: a new consumer and its first key (``api_key``, shown once).

        With approvals on, an ``admin`` is not made: it raises ``PendingApproval`` carrying
        the pending request (``reason`` is then required); the approval's ``result`` holds
        the new admin's key."""
        body: dict[str, Any] = {"name": name, "role": role, "datasets": list(datasets)}
        if quotas:
            body["quotas"] = dict(quotas)
        if reason is not None:
            body["reason"] = reason
        return dict(self._change("POST", "/v1/consumers", json=body))

    def create_key(self, consumer: str, *, reason: str | None = None) -> dict[str, Any]:
        """Admin: a new key of ``consumer``: ``{"id", "prefix", "consumer", "api_key" (shown
        once), "created_at"}``; its other keys stay valid.

        With approvals on, an admin's key is not issued: it raises ``PendingApproval``
        carrying the pending request (``reason`` is then required); the approval's
        ``result`` holds the key."""
        body = {} if reason is None else {"reason": reason}
        return dict(self._change("POST", f"/v1/consumers/{consumer}/keys", json=body))

    def update_consumer(self, name: str, **changes: Any) -> dict[str, Any]:
        """Admin: new grants (``datasets=[...]``) or quotas, ledgered like limit changes."""
        return dict(self._call("PATCH", f"/v1/consumers/{name}", json=changes))

    def mechanisms(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/mechanisms")["mechanisms"])

    # approvals: changes that wait for a second admin -------------------------------------

    def requests(self, state: str | None = None) -> list[ChangeRequest]:
        """The change requests the key may read (an admin's or an auditor's: all; a
        service's: its own), newest first; only those in ``state`` (``pending``,
        ``approved``, ``denied`` or ``expired``) if given: every page of them."""
        listed = self._pages("/v1/requests", "requests", _requests_query(state))
        return [_request_of(answer) for answer in listed]

    def get_request(self, request_id: str) -> ChangeRequest:
        """One change request (a service's key reads only its own: ``NotFound`` else)."""
        return _request_of(self._call("GET", f"/v1/requests/{request_id}"))

    def approve(self, request_id: str, *, reason: str) -> ChangeRequest:
        """Admin, other than the requester: make the requested change, ledgered with both
        names and both reasons; the request, ``approved``. For a new admin or admin key, its
        ``result`` holds the key, shown this once: hand it to the requester.

        The requester's own key raises ``Forbidden``; a request already decided or expired,
        or whose target changed since it was made, raises ``Conflict`` (deny it, and ask
        again on what stands now)."""
        body = {"reason": reason}
        return _request_of(self._call("POST", f"/v1/requests/{request_id}/approve", json=body))

    def deny(self, request_id: str, *, reason: str) -> ChangeRequest:
        """Admin, other than the requester: refuse the change, which is never made; the
        request, ``denied``. ``Forbidden`` and ``Conflict`` as for ``approve``."""
        body = {"reason": reason}
        return _request_of(self._call("POST", f"/v1/requests/{request_id}/deny", json=body))

    def ask_quota(self, dataset: str, quota: Mapping[str, Any], *, reason: str) -> ChangeRequest:
        """A service, on a dataset granted to it: ask an admin for ``quota`` (an amount, as
        a sub-budget: ``{"epsilon": 3}``, optionally ``delta``) as its quota on ``dataset``;
        the pending request, which an admin approves (the quota is set then) or denies.
        Approvals on or off: quotas are limits an admin allocates."""
        body = _quota_body(dataset, quota, reason)
        return _request_of(self._call("POST", "/v1/requests", json=body))

    # the ledger ----------------------------------------------------------------------------

    def ledger(self, **filters: str) -> Iterator[dict[str, Any]]:
        """Every entry matching ``filters`` (dataset, consumer, status, since, until), oldest
        first, page after page."""
        yield from self._pages("/v1/ledger", "entries", filters)

    def export(self, format: str = "jsonl", **filters: str) -> Iterator[str]:
        """The export's lines (JSON Lines or CSV), streamed."""
        with self._http.stream(
            "GET", "/v1/ledger/export", params={"format": format, **filters}
        ) as response:
            if response.status_code != 200:
                response.read()
                raise _error(response)
            yield from response.iter_lines()

    def verify_ledger(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/ledger/verify"))

    # receipts ------------------------------------------------------------------------------

    def verify_receipt(
        self, receipt: str, *, output: Any = None, kind: str | None = None
    ) -> dict[str, Any]:
        """The receipt's claims, if the service's key signed it (checked offline against the
        cached JWK set), given ``kind`` (``charge``, ``hold`` or ``settle``), if it is a
        receipt of that kind, and, given ``output``, if it is the output the receipt names
        (a charge's receipt; a hold's or a settle's names none)."""
        token = _Receipt.read(receipt)
        if token.kid not in self._keys:  # first use, or a key rotated in since: fetch again
            _remember_keys(self._keys, self._request("GET", "/v1/receipts/public-key", {}))
        return token.check(self._keys, output, kind)

    # transport -----------------------------------------------------------------------------

    def _pages(self, path: str, items: str, params: Mapping[str, str]) -> Iterator[dict[str, Any]]:
        cursor = None
        while True:
            page = self._call(
                "GET", path, params={**params, **({"cursor": cursor} if cursor else {})}
            )
            yield from page[items]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, kwargs)

    def _change(self, method: str, path: str, **kwargs: Any) -> Any:
        """A call that makes a change approvals may hold back: its answer, or, for a 202
        (the change became a pending request), ``PendingApproval``."""
        response = self._answer(method, path, kwargs)
        if response.status_code == 202:
            raise PendingApproval(_request_of(response.json()))
        return response.json() if response.content else None

    def _request(self, method: str, path: str, kwargs: Mapping[str, Any]) -> Any:
        response = self._answer(method, path, kwargs)
        return response.json() if response.content else None

    def _answer(self, method: str, path: str, kwargs: Mapping[str, Any]) -> httpx.Response:
        """Send until answered or the deadline passes: connection errors, 503, 429 (not a
        window denial) and 409 idempotency-in-progress are retried with jittered
        exponential backoff, waiting at least what ``Retry-After`` says."""
        backoff = _Backoff(self.deadline)
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as error:
                time.sleep(backoff.after(None, error))
                continue
            if response.status_code < 400:
                return response
            time.sleep(backoff.after(response, None))


class _Backoff:
    """When to try again: connection errors, 503, 429 (not a window denial) and 409
    idempotency-in-progress are retried with jittered exponential backoff, waiting at least
    what ``Retry-After`` says, until ``deadline`` seconds have passed."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.give_up = time.monotonic() + deadline
        self.pause, self.attempts = 0.1, 0

    def after(self, response: httpx.Response | None, error: Exception | None) -> float:
        """Seconds to wait after a failed attempt (a problem ``response`` or a transport
        ``error``); raises the problem if no retry can help, or ``Unavailable`` past the
        deadline."""
        self.attempts += 1
        last: Any = error
        wait = None
        if response is not None:
            problem = _error(response)
            if not _retryable(problem):
                raise problem
            last, wait = problem, _retry_after(response)
        delay = max(wait or 0.0, self.pause * (0.5 + random.random()))
        if time.monotonic() + delay > self.give_up:
            detail = f"no answer after {self.attempts} attempts in {self.deadline:g} s: {last}"
            raise Unavailable({"detail": detail, "status": 503}) from (
                last if isinstance(last, Exception) else None
            )
        self.pause = min(self.pause * 2, 5.0)
        return delay

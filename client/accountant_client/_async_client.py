"""``AsyncClient``: the calls a charging service makes, under asyncio, with the same
retries, idempotency keys, receipt checks and errors as ``Client``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping, Sequence
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
from accountant_client._client import _Backoff
from accountant_client._holds import AsyncHold, _hold_body, _hold_query
from accountant_client._receipts import _Receipt, _remember_keys
from accountant_client._requests import (
    ChangeRequest,
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


class AsyncClient:
    """The client for asyncio (``httpx.AsyncClient``) with the calls a charging service
    makes: charge, batch, preview, plan, get_charge, hold, holds, get_hold, budget, me,
    mechanisms, datasets and verify_receipt, ask_quota, requests and get_request, and, for an
    admin's or an auditor's key, populations, population and population_budget; the same
    retries, idempotency keys, receipt checks and errors."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        deadline: float = 30.0,
        verify_receipts: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            headers={"Authorization": f"Bearer {api_key}"},
            transport=transport,
        )
        self.deadline = deadline
        self.verify_receipts = verify_receipts
        self._keys: dict[str, Ed25519PublicKey] = {}

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def charge(
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
        """As ``Client.charge``."""
        key = idempotency_key or str(uuid.uuid4())
        body = _charge_body(dataset, partitions, mechanism, params, input, release, hold=hold)
        answer = await self._request(
            "POST", "/v1/charges", {"json": body, "headers": {"Idempotency-Key": key}}
        )
        claims = (
            await self.verify_receipt(answer["receipt"], output=answer["output"])
            if self.verify_receipts
            else {}
        )
        return _charge_of(answer, key, claims)

    async def preview(
        self,
        *,
        dataset: str,
        partitions: Sequence[str] | str,
        mechanism: str,
        params: Mapping[str, Any],
        release: str = "joint",
        hold: str | None = None,
    ) -> Preview:
        body = _charge_body(dataset, partitions, mechanism, params, None, release, hold=hold)
        return _preview_of(await self._request("POST", "/v1/charges/preview", {"json": body}))

    @overload
    async def plan(
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
    async def plan(
        self,
        *,
        items: Iterable[Mapping[str, Any]],
        share: float | None = None,
        delta: float | None = None,
    ) -> BatchPlan: ...

    async def plan(
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
        """As ``Client.plan``."""
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
        answer = await self._request("POST", "/v1/charges/plan", {"json": body})
        return _planned(answer, items is not None)

    async def get_charge(self, charge_id: str) -> dict[str, Any]:
        return dict(await self._request("GET", f"/v1/charges/{charge_id}", {}))

    async def batch(
        self,
        items: Iterable[Mapping[str, Any]],
        *,
        delta: float | None = None,
        idempotency_key: str | None = None,
    ) -> BatchResult:
        """As ``Client.batch``."""
        key = idempotency_key or str(uuid.uuid4())
        answer = await self._request(
            "POST",
            "/v1/charges/batch",
            {"json": _batch_body(items, delta), "headers": {"Idempotency-Key": key}},
        )
        claims = [
            await self.verify_receipt(item["receipt"], output=item["output"])
            if self.verify_receipts
            else {}
            for item in answer["items"]
        ]
        return _batch_of(answer, key, claims)

    async def hold(
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
    ) -> AsyncHold:
        """As ``Client.hold``; ``async with`` the ``AsyncHold`` settles at its full amount
        on exit unless it was released or settled."""
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
        answer = await self._request(
            "POST", "/v1/holds", {"json": body, "headers": {"Idempotency-Key": key}}
        )
        claims = (
            await self.verify_receipt(answer["receipt"], kind="hold")
            if self.verify_receipts
            else {}
        )
        return AsyncHold._of(self, answer, key, claims)

    async def holds(self, dataset: str | None = None, state: str | None = None) -> list[AsyncHold]:
        query = {"params": _hold_query(dataset, state)}
        listed = (await self._request("GET", "/v1/holds", query))["holds"]
        return [AsyncHold._of(self, answer, None, {}) for answer in listed]

    async def get_hold(self, hold_id: str) -> AsyncHold:
        return AsyncHold._of(self, await self._request("GET", f"/v1/holds/{hold_id}", {}), None, {})

    async def _end_hold(
        self, hold_id: str, action: str, body: Mapping[str, Any] | None, key: str | None
    ) -> Settlement:
        key = key or str(uuid.uuid4())
        answer = await self._request(
            "POST",
            f"/v1/holds/{hold_id}/{action}",
            {"json": body, "headers": {"Idempotency-Key": key}},
        )
        claims = (
            await self.verify_receipt(answer["receipt"], kind="settle")
            if self.verify_receipts
            else {}
        )
        return _settlement_of(answer, key, claims)

    async def budget(self, dataset: str) -> dict[str, Any]:
        return dict(await self._request("GET", f"/v1/datasets/{dataset}/budget", {}))

    async def me(self) -> dict[str, Any]:
        return dict(await self._request("GET", "/v1/consumers/me", {}))

    async def mechanisms(self) -> list[dict[str, Any]]:
        return list((await self._request("GET", "/v1/mechanisms", {}))["mechanisms"])

    async def datasets(self) -> list[dict[str, Any]]:
        return list((await self._request("GET", "/v1/datasets", {}))["datasets"])

    async def populations(self) -> list[dict[str, Any]]:
        """As ``Client.populations``."""
        return list((await self._request("GET", "/v1/populations", {}))["populations"])

    async def population(self, name: str) -> dict[str, Any]:
        """As ``Client.population``."""
        return dict(await self._request("GET", f"/v1/populations/{name}", {}))

    async def population_budget(self, name: str) -> dict[str, Any]:
        """As ``Client.population_budget``."""
        return dict(await self._request("GET", f"/v1/populations/{name}/budget", {}))

    async def ask_quota(
        self, dataset: str, quota: Mapping[str, Any], *, reason: str
    ) -> ChangeRequest:
        """As ``Client.ask_quota``."""
        body = _quota_body(dataset, quota, reason)
        return _request_of(await self._request("POST", "/v1/requests", {"json": body}))

    async def requests(self, state: str | None = None) -> list[ChangeRequest]:
        """As ``Client.requests``."""
        listed: list[ChangeRequest] = []
        cursor = None
        while True:
            query = {**_requests_query(state), **({"cursor": cursor} if cursor else {})}
            page = await self._request("GET", "/v1/requests", {"params": query})
            listed.extend(_request_of(answer) for answer in page["requests"])
            cursor = page.get("next_cursor")
            if not cursor:
                return listed

    async def get_request(self, request_id: str) -> ChangeRequest:
        """As ``Client.get_request``."""
        return _request_of(await self._request("GET", f"/v1/requests/{request_id}", {}))

    async def verify_receipt(
        self, receipt: str, *, output: Any = None, kind: str | None = None
    ) -> dict[str, Any]:
        token = _Receipt.read(receipt)
        if token.kid not in self._keys:
            _remember_keys(self._keys, await self._request("GET", "/v1/receipts/public-key", {}))
        return token.check(self._keys, output, kind)

    async def _request(self, method: str, path: str, kwargs: Mapping[str, Any]) -> Any:
        backoff = _Backoff(self.deadline)
        while True:
            try:
                response = await self._http.request(method, path, **kwargs)
            except httpx.TransportError as error:
                await asyncio.sleep(backoff.after(None, error))
                continue
            if response.status_code < 400:
                return response.json() if response.content else None
            await asyncio.sleep(backoff.after(response, None))

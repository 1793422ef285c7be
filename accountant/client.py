"""A Python client for the accountant's HTTP API (API.md), for the services that call it.

    from accountant.client import Client, BudgetExhausted

    with Client("http://accountant:8000", api_key) as accountant:
        try:
            result = accountant.charge(dataset="clicks", partitions=["2026-11-21"],
                                       mechanism="laplace",
                                       params={"epsilon": 0.1, "sensitivity": 1},
                                       input={"values": [120.0]})
        except BudgetExhausted as denial:
            print(denial.scope, denial.limit, denial.spent, denial.requested)
        print(result.output, result.remaining)

- Each logical charge gets one idempotency key, reused across its retries, so a retry
  after a lost answer returns the first answer (same charge id, same output) and is never
  charged twice.
- Connection errors, 503, a 429 that is not a window denial and a 409 "idempotency
  in progress" are retried with exponential backoff, honouring ``Retry-After``, until
  ``deadline`` seconds have passed; then ``Unavailable`` is raised.
- Receipts are verified offline against the service's JWK set, fetched once and cached by
  key id (refetched once for an unknown key id, after a rotation), and the output's SHA-256
  is checked against the receipt.
- Denials raise ``BudgetExhausted`` (scope, partition, limit, spent, requested) or
  ``WindowExhausted`` (and ``resets_at``); invalid requests raise ``InvalidRequest`` with
  the problem's field errors.

``AsyncClient`` makes the charging calls with the same guarantees under asyncio.

The module needs only httpx (``pip install 'privacy-budget-accountant[client]'``) and
``cryptography``; it imports neither Flask nor a database driver.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import random
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "AccountantError",
    "AsyncClient",
    "BudgetExhausted",
    "Charge",
    "Client",
    "Denied",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "Plan",
    "Preview",
    "ReceiptInvalid",
    "Unauthorized",
    "Unavailable",
    "WindowExhausted",
]


# -- errors -----------------------------------------------------------------------------


class AccountantError(Exception):
    """A problem+json answer (RFC 9457), or no answer at all (``Unavailable``)."""

    def __init__(self, problem: Mapping[str, Any], status: int = 0) -> None:
        self.problem = dict(problem)
        self.status = int(self.problem.get("status", status) or status)
        self.type = str(self.problem.get("type", ""))
        self.detail = str(self.problem.get("detail", self.problem.get("title", "")))
        super().__init__(f"{self.status} {self.detail}" if self.status else self.detail)


class InvalidRequest(AccountantError):
    """400 (or 413, 422): the request is wrong; ``errors`` lists each field at fault."""

    @property
    def errors(self) -> list[dict[str, str]]:
        return list(self.problem.get("errors", []))


class Unauthorized(AccountantError):
    """401: no API key, or an unknown or revoked one."""


class Forbidden(AccountantError):
    """403: the key's role or grants do not allow this."""


class NotFound(AccountantError):
    """404: the dataset, consumer or charge does not exist."""


class Conflict(AccountantError):
    """409 other than a denial: a replay that cannot be given again, for example."""


class Denied(AccountantError):
    """A charge refused by a budget (and ledgered as denied)."""

    @property
    def scope(self) -> str:
        return str(self.problem.get("scope", ""))

    @property
    def partition(self) -> str | None:
        return self.problem.get("partition")

    @property
    def limit(self) -> dict[str, Decimal]:
        return _amount(self.problem.get("limit"))

    @property
    def spent(self) -> dict[str, Decimal]:
        return _amount(self.problem.get("spent"))

    @property
    def requested(self) -> dict[str, Decimal]:
        return _amount(self.problem.get("requested"))


class BudgetExhausted(Denied):
    """409: the lifetime, a partition's or the consumer's budget would be exceeded."""


class WindowExhausted(Denied):
    """429: a window budget is spent until ``resets_at`` (``retry_after`` seconds)."""

    @property
    def resets_at(self) -> str:
        return str(self.problem.get("resets_at", ""))

    retry_after: float | None = None


class Unavailable(AccountantError):
    """The service did not answer within the deadline (connection errors, 503s)."""


class ReceiptInvalid(AccountantError):
    """A receipt whose signature, key or output hash does not check out."""


def _amount(value: Any) -> dict[str, Decimal]:
    return {
        k: Decimal(str(v)) for k, v in (value or {}).items() if isinstance(v, int | float | Decimal)
    }


# -- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Charge:
    """A granted charge: the noisy output and what it cost."""

    charge_id: str
    dataset: str
    mechanism: str
    partitions: list[str]
    output: dict[str, Any]
    cost: dict[str, Decimal]
    charged: dict[str, Decimal]
    multiplicity: int
    remaining: dict[str, Decimal]
    receipt: str
    created_at: str
    idempotency_key: str
    claims: dict[str, Any] = field(default_factory=dict)  # the verified receipt's claims


@dataclass(frozen=True)
class Preview:
    granted: bool
    cost: dict[str, Decimal]
    remaining_after: dict[str, Decimal]
    scope: str | None
    reason: str | None


@dataclass(frozen=True)
class Plan:
    """How many more identical charges fit (``fits``, ``limited_by``), or, asked with a
    count, the least-noise parameters for it (``params``)."""

    fits: int | None
    limited_by: dict[str, Any] | None
    params: dict[str, Decimal] | None
    raw: dict[str, Any]


# -- the client -------------------------------------------------------------------------


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
    ) -> Charge:
        """Charge and release once. Retries reuse one idempotency key, so the answer is the
        first one however many attempts it takes."""
        key = idempotency_key or str(uuid.uuid4())
        body = _charge_body(dataset, partitions, mechanism, params, input, release)
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
    ) -> Preview:
        """What the charge would cost and whether it would be granted; nothing is charged."""
        answer = self._call(
            "POST",
            "/v1/charges/preview",
            json=_charge_body(dataset, partitions, mechanism, params, None, release),
        )
        return _preview_of(answer)

    def plan(
        self,
        *,
        dataset: str,
        partitions: Sequence[str] | str,
        mechanism: str,
        params: Mapping[str, Any],
        release: str = "joint",
        count: int | None = None,
    ) -> Plan:
        """How many more such charges fit; with ``count`` and the noise parameter left out
        of ``params``, the least-noise parameters for which ``count`` of them fit."""
        body = _charge_body(dataset, partitions, mechanism, params, None, release, count)
        answer = self._call("POST", "/v1/charges/plan", json=body)
        return _plan_of(answer)

    def get_charge(self, charge_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/charges/{charge_id}"))

    # datasets, budgets and partitions ----------------------------------------------------

    def datasets(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/datasets")["datasets"])

    def dataset(self, name: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/datasets/{name}"))

    def create_dataset(self, **definition: Any) -> dict[str, Any]:
        """Admin: ``create_dataset(name=..., privacy_unit=..., budget={...}, ...)``."""
        return dict(self._call("POST", "/v1/datasets", json=definition))

    def update_dataset(self, name: str, **changes: Any) -> dict[str, Any]:
        """Admin: new limits, ledgered as limit changes (``reason=...`` is recorded)."""
        return dict(self._call("PATCH", f"/v1/datasets/{name}", json=changes))

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
    ) -> dict[str, Any]:
        """Admin: a new consumer and its first key (``api_key``, shown once)."""
        body: dict[str, Any] = {"name": name, "role": role, "datasets": list(datasets)}
        if quotas:
            body["quotas"] = dict(quotas)
        return dict(self._call("POST", "/v1/consumers", json=body))

    def update_consumer(self, name: str, **changes: Any) -> dict[str, Any]:
        """Admin: new grants (``datasets=[...]``) or quotas, ledgered like limit changes."""
        return dict(self._call("PATCH", f"/v1/consumers/{name}", json=changes))

    def mechanisms(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/mechanisms")["mechanisms"])

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

    def verify_receipt(self, receipt: str, *, output: Any = None) -> dict[str, Any]:
        """The receipt's claims, if the service's key signed it (checked offline against the
        cached JWK set) and, given ``output``, if it is the output the receipt names."""
        token = _Receipt.read(receipt)
        if token.kid not in self._keys:  # first use, or a key rotated in since: fetch again
            _remember_keys(self._keys, self._request("GET", "/v1/receipts/public-key", {}))
        return token.check(self._keys, output)

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

    def _request(self, method: str, path: str, kwargs: Mapping[str, Any]) -> Any:
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
                return response.json() if response.content else None
            time.sleep(backoff.after(response, None))


class AsyncClient:
    """The client for asyncio (``httpx.AsyncClient``) with the calls a charging service
    makes: charge, preview, plan, get_charge, budget, me, mechanisms, datasets and
    verify_receipt; the same retries, idempotency keys, receipt checks and errors."""

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
    ) -> Charge:
        """As ``Client.charge``."""
        key = idempotency_key or str(uuid.uuid4())
        body = _charge_body(dataset, partitions, mechanism, params, input, release)
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
    ) -> Preview:
        body = _charge_body(dataset, partitions, mechanism, params, None, release)
        return _preview_of(await self._request("POST", "/v1/charges/preview", {"json": body}))

    async def plan(
        self,
        *,
        dataset: str,
        partitions: Sequence[str] | str,
        mechanism: str,
        params: Mapping[str, Any],
        release: str = "joint",
        count: int | None = None,
    ) -> Plan:
        body = _charge_body(dataset, partitions, mechanism, params, None, release, count)
        return _plan_of(await self._request("POST", "/v1/charges/plan", {"json": body}))

    async def get_charge(self, charge_id: str) -> dict[str, Any]:
        return dict(await self._request("GET", f"/v1/charges/{charge_id}", {}))

    async def budget(self, dataset: str) -> dict[str, Any]:
        return dict(await self._request("GET", f"/v1/datasets/{dataset}/budget", {}))

    async def me(self) -> dict[str, Any]:
        return dict(await self._request("GET", "/v1/consumers/me", {}))

    async def mechanisms(self) -> list[dict[str, Any]]:
        return list((await self._request("GET", "/v1/mechanisms", {}))["mechanisms"])

    async def datasets(self) -> list[dict[str, Any]]:
        return list((await self._request("GET", "/v1/datasets", {}))["datasets"])

    async def verify_receipt(self, receipt: str, *, output: Any = None) -> dict[str, Any]:
        token = _Receipt.read(receipt)
        if token.kid not in self._keys:
            _remember_keys(self._keys, await self._request("GET", "/v1/receipts/public-key", {}))
        return token.check(self._keys, output)

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


@dataclass(frozen=True)
class _Receipt:
    """A receipt's parts, read but not yet trusted."""

    kid: str
    claims: dict[str, Any]
    signature: bytes
    signed: bytes

    @classmethod
    def read(cls, receipt: str) -> _Receipt:
        parts = receipt.split(".")
        if len(parts) != 3:
            raise ReceiptInvalid({"detail": "not a JWS compact serialisation"})
        try:
            header = json.loads(_unb64(parts[0]))
            claims = json.loads(_unb64(parts[1]))
            signature = _unb64(parts[2])
        except ValueError:
            raise ReceiptInvalid({"detail": "the receipt's parts are not base64url JSON"}) from None
        if not isinstance(header, dict) or header.get("alg") != "EdDSA":
            raise ReceiptInvalid({"detail": "the receipt is not signed with EdDSA"})
        if not isinstance(claims, dict):
            raise ReceiptInvalid({"detail": "the receipt's claims are not a JSON object"})
        return cls(str(header.get("kid")), claims, signature, f"{parts[0]}.{parts[1]}".encode())

    def check(self, keys: Mapping[str, Ed25519PublicKey], output: Any) -> dict[str, Any]:
        """The claims, if a published key signed them and, given ``output``, if it is the
        output they name."""
        key = keys.get(self.kid)
        if key is None:
            raise ReceiptInvalid({"detail": f"no published key has id {self.kid!r}"})
        try:
            key.verify(self.signature, self.signed)
        except InvalidSignature:
            raise ReceiptInvalid({"detail": "the receipt's signature does not match"}) from None
        if output is not None:
            digest = hashlib.sha256(
                json.dumps(output, sort_keys=True, separators=(",", ":")).encode()
            ).hexdigest()
            if digest != self.claims.get("output_sha256"):
                raise ReceiptInvalid({"detail": "the output is not the one the receipt names"})
        return dict(self.claims)


def _remember_keys(keys: dict[str, Ed25519PublicKey], jwks: Mapping[str, Any]) -> None:
    for jwk in jwks["keys"]:
        keys[jwk["kid"]] = Ed25519PublicKey.from_public_bytes(_unb64(jwk["x"]))


def _charge_of(answer: Mapping[str, Any], key: str, claims: dict[str, Any]) -> Charge:
    return Charge(
        charge_id=answer["charge_id"],
        dataset=answer["dataset"],
        mechanism=answer["mechanism"],
        partitions=list(answer["partitions"]),
        output=answer["output"],
        cost=_amount(answer["cost"]),
        charged=_amount(answer.get("charged")),
        multiplicity=int(answer.get("multiplicity", 1)),
        remaining=_amount(answer.get("remaining")),
        receipt=answer["receipt"],
        created_at=answer["created_at"],
        idempotency_key=key,
        claims=claims,
    )


def _preview_of(answer: Mapping[str, Any]) -> Preview:
    return Preview(
        bool(answer["granted"]),
        _amount(answer.get("cost")),
        _amount(answer.get("remaining_after")),
        answer.get("scope"),
        answer.get("reason"),
    )


def _plan_of(answer: Mapping[str, Any]) -> Plan:
    return Plan(
        answer.get("fits"),
        answer.get("limited_by"),
        _amount(answer["params"]) if "params" in answer else None,
        dict(answer),
    )


def _charge_body(
    dataset: str,
    partitions: Sequence[str] | str,
    mechanism: str,
    params: Mapping[str, Any],
    input: Mapping[str, Any] | None,
    release: str,
    count: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "dataset": dataset,
        "mechanism": mechanism,
        "release": release,
        "partitions": partitions if isinstance(partitions, str) else list(partitions),
        "params": dict(params),
    }
    if input is not None:
        body["input"] = dict(input)
    if count is not None:
        body["count"] = count
    return body


_BY_STATUS: dict[int, type[AccountantError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    422: InvalidRequest,
    503: Unavailable,
}


def _error(response: httpx.Response) -> AccountantError:
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    problem.setdefault("status", response.status_code)
    problem.setdefault("detail", response.reason_phrase)
    kind: type[AccountantError] = _BY_STATUS.get(response.status_code, AccountantError)
    slug = str(problem.get("type", "")).rsplit("/", 1)[-1]
    if slug == "budget-exhausted":
        kind = BudgetExhausted
    elif slug == "window-exhausted" or problem.get("scope") == "window":
        kind = WindowExhausted
    error = kind(problem, response.status_code)
    if isinstance(error, WindowExhausted):
        error.retry_after = _retry_after(response)
    return error


def _retryable(problem: AccountantError) -> bool:
    if isinstance(problem, Unavailable):
        return True
    if problem.status == 429:
        return not isinstance(problem, WindowExhausted)  # a rate limit, not a denial
    return problem.status == 409 and problem.type.endswith("/idempotency-in-progress")


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After", "")
    return float(raw) if raw.isascii() and raw.isdigit() else None


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))

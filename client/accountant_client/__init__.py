"""A Python client for the accountant's HTTP API (API.md), for the services that call it.

    from accountant_client import BudgetExhausted, Client

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
- Denials raise ``BudgetExhausted`` (scope, partition, population, limit, spent,
  requested) or ``WindowExhausted`` (and ``resets_at``); a draw past its hold's remainder
  raises ``HoldExhausted``; invalid requests raise ``InvalidRequest`` with the problem's
  field errors.
- ``batch`` charges a list of charges (a release plan, on one dataset or several) all
  together or not at all; a refusal raises ``BatchRefused`` (a ``BudgetExhausted``) or
  ``BatchWindowRefused`` (a ``WindowExhausted``) listing every overflowing scope in
  ``denials``. ``plan(items=[...], share=...)`` answers the least-noise parameters for a
  weighted list of them to fit.
- ``hold`` reserves budget for a job that runs elsewhere, charged at once; the ``Hold``
  draws on it (``charge``) and ends it (``settle``, ``release``). As a context manager it
  never refunds by itself: a block that neither settled nor released it settles it at its
  full amount on exit, as the job may have published.
- ``create_population`` makes a population, a lifetime budget over several ``user``
  datasets of the same people (they join it with ``create_dataset(..., population=...)``);
  ``population_budget`` reports its loss, the sum of its members'. A charge that would take
  it over its limit raises ``BudgetExhausted`` with ``scope`` ``population`` and
  ``population`` naming it.
- Approvals (``ACCOUNTANT_APPROVALS=on``): a change that weakens a promise (a dataset's or
  population's limit raised, a new admin or admin key) is not made but raises
  ``PendingApproval``, whose ``request`` (a ``ChangeRequest``) another admin ``approve``s
  or ``deny``s; ``requests`` and ``get_request`` read them. An approved new admin's or admin
  key's ``api_key`` comes back once, in the approval's ``result`` (an ``IssuedKey``). A
  service asks for a larger quota with ``ask_quota``.

``AsyncClient`` makes the charging calls, batches and holds included, reads budgets
(populations' too) and asks for quotas, with the same guarantees under asyncio.

The distribution ``privacy-accountant-client`` (the ``client/`` folder of the accountant's
repository: ``pip install ./client``) needs only httpx and cryptography (Ed25519, for the
receipts); it installs neither the service nor Flask nor a database driver.
"""

from accountant_client._async_client import AsyncClient
from accountant_client._batches import BatchPlan, BatchResult
from accountant_client._client import Client
from accountant_client._errors import (
    AccountantError,
    BatchDenial,
    BatchDenied,
    BatchRefused,
    BatchWindowRefused,
    BudgetExhausted,
    Conflict,
    Denied,
    Forbidden,
    HoldExhausted,
    InvalidRequest,
    NotFound,
    ReceiptInvalid,
    Unauthorized,
    Unavailable,
    WindowExhausted,
)
from accountant_client._holds import AsyncHold, Hold
from accountant_client._requests import ChangeRequest, IssuedKey, PendingApproval
from accountant_client._results import Charge, Plan, Preview, Settlement

__all__ = [
    "AccountantError",
    "AsyncClient",
    "AsyncHold",
    "BatchDenial",
    "BatchDenied",
    "BatchPlan",
    "BatchRefused",
    "BatchResult",
    "BatchWindowRefused",
    "BudgetExhausted",
    "ChangeRequest",
    "Charge",
    "Client",
    "Conflict",
    "Denied",
    "Forbidden",
    "Hold",
    "HoldExhausted",
    "InvalidRequest",
    "IssuedKey",
    "NotFound",
    "PendingApproval",
    "Plan",
    "Preview",
    "ReceiptInvalid",
    "Settlement",
    "Unauthorized",
    "Unavailable",
    "WindowExhausted",
]

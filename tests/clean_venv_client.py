"""The client at work in a venv that holds only its wheel and that wheel's dependencies, run
there by tests/test_client_package.py against a real `accountant serve`: a charge, a denial
typed as BudgetExhausted and a receipt verified offline. Prints what it saw as JSON.

    python clean_venv_client.py BASE_URL ADMIN_KEY
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx

from accountant_client import BudgetExhausted, Client, ReceiptInvalid


class _Recording(httpx.HTTPTransport):
    """Remembers the path of every request sent, to show which checks needed the service."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return super().handle_request(request)


def main(base: str, key: str) -> dict[str, Any]:
    transport = _Recording()
    charge: dict[str, Any] = {
        "dataset": "reports",
        "partitions": ["2026-11-21"],
        "mechanism": "laplace",
        "params": {"epsilon": 0.75, "sensitivity": 1},
        "input": {"values": [120.0]},
    }
    with Client(base, key, transport=transport) as accountant:
        accountant.create_dataset(
            name="reports", privacy_unit="record", accounting="pure", budget={"epsilon": 1}
        )
        granted = accountant.charge(**charge)
        try:
            accountant.charge(**charge)
            denial: dict[str, Any] = {"class": None}
        except BudgetExhausted as refused:
            denial = {
                "class": type(refused).__name__,
                "scope": refused.scope,
                **{k: str(getattr(refused, k)["epsilon"]) for k in ("limit", "spent", "requested")},
            }
        sent = len(transport.paths)
        claims = accountant.verify_receipt(granted.receipt, output=granted.output)
        try:
            accountant.verify_receipt(granted.receipt, output={"values": [0.0]})
            other_output = "accepted"
        except ReceiptInvalid as invalid:
            other_output = str(invalid)
        return {
            "cost": str(granted.cost["epsilon"]),
            "remaining": str(granted.remaining["epsilon"]),
            "charge_id": granted.charge_id,
            "receipt_charge_id": claims["charge_id"],
            "denial": denial,
            "other_output": other_output,
            "requests_while_verifying": transport.paths[sent:],
            "key_set_fetches": transport.paths.count("/v1/receipts/public-key"),
        }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))

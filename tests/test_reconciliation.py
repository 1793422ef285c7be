"""The books reconcile: an auditor with nothing but the export recomputes what the service
says. Ten thousand mixed charges (Laplace and Gaussian, joint and parallel releases over one
to five partitions, two consumers, denials by the partition and lifetime limits, a limit
change) on a user-level approx dataset; from the JSON Lines export alone:

- the sum of ``charged`` equals the running total T the service keeps;
- the lifetime loss recomputed by DESIGN.md's rule for unit ``user``, L = min(T, sum of the k
  largest s(p)) per component, from the entries' integer ``cost_units``, equals the last
  entry's ``loss_after`` and the budget report's loss;
- every denial names its scope, and a partition denial its partition.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from decimal import Decimal
from typing import Any

import pytest
from flask.testing import FlaskClient

from accountant.exact import DELTA, EPSILON
from tests.conftest import ADMIN_KEY, Api, run_sql, unlabelled

pytestmark = pytest.mark.slow

CHARGES = 10_000
K = 3  # max_partitions_per_user


def _exact(client: FlaskClient, path: str) -> Any:
    response = client.get(path, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 200, response.get_data(as_text=True)
    return json.loads(response.get_data(as_text=True), parse_float=Decimal)


def test_ten_thousand_mixed_charges_reconcile(
    api: Api, client: FlaskClient, database_url: str
) -> None:
    api.make_dataset(
        "mixed",
        privacy_unit="user",
        accounting="approx",
        max_partitions_per_user=K,
        budget={"epsilon": 8, "delta": 1e-3},
        partition_budget={"epsilon": 3, "delta": 1e-4},
    )
    other = api.as_key(api.make_consumer("reports", datasets=["mixed"]))
    rng = random.Random(20261123)
    keys = [f"region-{i:02d}" for i in range(60)]
    weights = [8, 3, 3] + [1] * 57  # region-00 meets its partition limit first
    outcomes: Counter[int] = Counter()
    for index in range(CHARGES):
        if index == CHARGES // 2:
            assert (
                api.patch(
                    "/v1/datasets/mixed", {"budget": {"epsilon": 8.5}, "reason": "half-year"}
                ).status_code
                == 200
            )
        partitions = sorted(set(rng.choices(keys, weights, k=rng.choice([1, 1, 1, 2, 3, 5]))))
        if rng.random() < 0.6:
            mechanism, params = "laplace", {"epsilon": rng.choice([0.01, 0.02, 0.05])}
        else:
            mechanism, params = "gaussian", {"epsilon": 0.04, "delta": 1e-7}
        body = {
            "dataset": "mixed",
            "partitions": partitions,
            "mechanism": mechanism,
            "release": "parallel" if rng.random() < 0.5 else "joint",
            "params": {**params, "sensitivity": 1},
            "input": {"size": 1},
        }
        caller = other if index % 3 == 0 else api
        outcomes[caller.post("/v1/charges", body).status_code] += 1
    assert outcomes[201] > 3_000 and outcomes[409] > 1_000, outcomes

    lines = client.get(
        "/v1/ledger/export?format=jsonl&dataset=mixed",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    ).get_data(as_text=True)
    entries = [json.loads(line, parse_float=Decimal) for line in lines.splitlines()]
    charges = [e for e in entries if e["kind"] == "charge"]
    assert len(charges) == CHARGES and len(entries) == CHARGES + 1

    # the sum of charged is the running total T
    charged = {
        name: sum((e["charged"][name] for e in charges), Decimal(0))
        for name in ("epsilon", "delta")
    }
    [(t_epsilon, t_delta)] = run_sql(
        database_url,
        "SELECT total_epsilon, total_delta FROM tallies t JOIN datasets d "
        "ON d.id = t.dataset_id WHERE d.name = 'mixed' AND t.kind = 'lifetime'",
    )
    assert charged == {"epsilon": EPSILON.to_decimal(t_epsilon), "delta": DELTA.to_decimal(t_delta)}

    # the loss, recomputed from the export by the rule, is the ledger's and the report's
    spends: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    total = [0, 0]
    for entry in charges:
        if entry["status"] != "granted":
            continue
        epsilon, delta, _rho = entry["cost_units"]
        for key in entry["partitions"]:
            spends[key][0] += epsilon
            spends[key][1] += delta
        total[0] += epsilon * entry["multiplicity"]
        total[1] += delta * entry["multiplicity"]
    loss = [
        min(total[i], sum(sorted((s[i] for s in spends.values()), reverse=True)[:K]))
        for i in range(2)
    ]
    recomputed = {"epsilon": EPSILON.to_decimal(loss[0]), "delta": DELTA.to_decimal(loss[1])}
    assert {k: entries[-1]["loss_after"][k] for k in recomputed} == recomputed
    budget = _exact(client, "/v1/datasets/mixed/budget")
    assert {k: budget["loss"][k] for k in recomputed} == recomputed

    # denials say who denied them
    denials = [e for e in charges if e["status"] == "denied"]
    assert {e["detail"]["scope"] for e in denials} == {"dataset", "partition"}
    assert all(
        e["detail"]["partition"] in e["partitions"]
        for e in denials
        if e["detail"]["scope"] == "partition"
    )
    assert all(sum(unlabelled(e["charged"]).values()) == 0 for e in denials)
    print(
        f"{CHARGES} charges: {outcomes[201]} granted, {outcomes[409]} denied "
        f"({Counter(e['detail']['scope'] for e in denials)}); sum of charged {charged} = T; "
        f"loss {recomputed}"
    )

"""Worked examples of every loss rule of DESIGN.md, through the HTTP API.

Notation: c is the per-release cost, s(p) the spend of partition p, T the
running total (sum of c * m; m = 1 joint, min(k, |P|) parallel).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import Api, unlabelled


def loss(api: Api, dataset: str = "clicks") -> float:
    return float(api.budget(dataset)["loss"]["epsilon"])


def test_record_unit_is_the_largest_partition_spend(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 10})
    # joint over {a, b} at 0.5: s(a) = s(b) = 0.5, L = max = 0.5
    assert api.charge(partitions=["a", "b"], epsilon=0.5).status_code == 201
    assert loss(api) == 0.5
    # parallel over {a, b, c} at 0.25: s = (0.75, 0.75, 0.25), L = 0.75
    assert (
        api.charge(
            partitions=["a", "b", "c"],
            epsilon=0.25,
            release="parallel",
            input={"values": [1, 2, 3]},
        ).status_code
        == 201
    )
    assert loss(api) == 0.75
    # joint over {c} at 1: s(c) = 1.25 becomes the max
    assert api.charge(partitions=["c"], epsilon=1).status_code == 201
    assert loss(api) == 1.25
    assert api.budget()["partitions"]["max_spent"]["epsilon"] == 1.25


def test_partition_unit_composes_in_parallel_like_records(api: Api) -> None:
    api.make_dataset(privacy_unit="partition", budget={"epsilon": 1})
    # Four disjoint days at 1.0 each: each partition is its own unit, L = 1.0.
    for day in ["d1", "d2", "d3", "d4"]:
        assert api.charge(partitions=[day], epsilon=1).status_code == 201
    assert loss(api) == 1.0
    assert api.charge(partitions=["d1"], epsilon=0.1).status_code == 409


def test_user_unit_bounded_k_parallel_release(api: Api) -> None:
    api.make_dataset(privacy_unit="user", max_partitions_per_user=2, budget={"epsilon": 10})
    # parallel over 5 partitions at 1: m = min(2, 5) = 2, T = 2;
    # s(p) = 1 for 5 partitions, top-2 sum = 2; L = min(2, 2) = 2
    body = {"values": [1, 2, 3, 4, 5]}
    assert (
        api.charge(partitions=list("abcde"), epsilon=1, release="parallel", input=body).status_code
        == 201
    )
    assert loss(api) == 2
    # joint over {a} at 1: T = 3; s(a) = 2, top-2 = 2 + 1 = 3; L = 3
    assert api.charge(partitions=["a"], epsilon=1).status_code == 201
    assert loss(api) == 3


@pytest.mark.parametrize("declared", [False, True], ids=["new", "declared, never charged"])
def test_user_unit_counts_each_partition_a_charge_touches_first(api: Api, declared: bool) -> None:
    """k = 2, limit 1: 0.6 on p1, then 0.6 on p2, which has spent nothing yet. A person may
    be in both: L = min(T, s(p1) + s(p2)) = 1.2 > 1, so the second is denied. The charged
    partition never charged before counts with s(p) = 0 among the k largest (the padding
    of the read's top-k), not as absent."""
    api.make_dataset(privacy_unit="user", max_partitions_per_user=2, budget={"epsilon": 1})
    if declared:
        assert api.post("/v1/datasets/clicks/partitions", {"keys": ["p2"]}).status_code == 201
    assert api.charge(partitions=["p1"], epsilon=0.6).status_code == 201
    assert api.charge(partitions=["p2"], epsilon=0.6).status_code == 409
    assert loss(api) == 0.6


def test_user_unit_top_k_is_tighter_than_the_total(api: Api) -> None:
    api.make_dataset(privacy_unit="user", max_partitions_per_user=1, budget={"epsilon": 10})
    # k = 1: ten joint releases on ten different partitions at 0.5:
    # T = 5.0, but a person is in one partition only: top-1 = 0.5; L = 0.5
    for index in range(10):
        assert api.charge(partitions=[f"p{index}"], epsilon=0.5).status_code == 201
    assert loss(api) == 0.5


def test_user_unit_total_is_tighter_than_top_k(api: Api) -> None:
    api.make_dataset(privacy_unit="user", max_partitions_per_user=3, budget={"epsilon": 10})
    # one joint release over {a, b, c} at 1: s = (1, 1, 1), top-3 = 3 but T = 1; L = 1
    assert api.charge(partitions=["a", "b", "c"], epsilon=1).status_code == 201
    assert loss(api) == 1


def test_user_unit_bounds_joint_and_parallel_releases_apart(api: Api) -> None:
    """L = min(T, top-k s(p), min(T_J, top-k s_J) + min(T_P, top-k s_P)): here the last term
    is the exact worst person, below the first two."""
    api.make_dataset(privacy_unit="user", max_partitions_per_user=2, budget={"epsilon": 0.7})
    assert api.charge(partitions=["a", "b", "c"], epsilon=0.2).status_code == 201
    # parallel over {a, c} at 0.2: m = 2; T = 0.6, s = (0.4, 0.2, 0.4); L = min(0.6, 0.8)
    parallel: dict[str, Any] = {"release": "parallel", "input": {"values": [1, 2]}}
    assert api.charge(partitions=["a", "c"], epsilon=0.2, **parallel).status_code == 201
    assert loss(api) == 0.6
    # parallel over {b, c} at 0.1: T = 0.8 and top-2 s = 0.5 + 0.4 = 0.9, but apart:
    # joint min(T_J = 0.2, 0.4) + parallel min(T_P = 0.6, s_P(c) + s_P(a) = 0.3 + 0.2) = 0.7,
    # which a person in {a, c} reaches exactly (0.2 + 2 x 0.2 + 0.1): it fits the budget
    assert api.charge(partitions=["b", "c"], epsilon=0.1, **parallel).status_code == 201
    assert loss(api) == 0.7
    assert api.charge(partitions=["d"], epsilon=0.001).status_code == 409


def test_user_unit_unbounded_k_is_the_total(api: Api) -> None:
    api.make_dataset(privacy_unit="user", budget={"epsilon": 10})
    # parallel over 4 partitions at 0.5 with unbounded k: m = |P| = 4, T = 2
    assert (
        api.charge(
            partitions=list("abcd"), epsilon=0.5, release="parallel", input={"values": [1, 2, 3, 4]}
        ).status_code
        == 201
    )
    # joint over {a, b} at 0.25: m = 1, T = 2.25
    assert api.charge(partitions=["a", "b"], epsilon=0.25).status_code == 201
    assert loss(api) == 2.25


def test_user_unit_denies_at_exactly_the_limit(api: Api) -> None:
    api.make_dataset(privacy_unit="user", max_partitions_per_user=2, budget={"epsilon": 1})
    # parallel over 3 partitions at 0.5: m = 2, T = 1.0, top-2 = 1.0, L = 1.0: fits exactly
    assert (
        api.charge(
            partitions=list("abc"), epsilon=0.5, release="parallel", input={"values": [1, 2, 3]}
        ).status_code
        == 201
    )
    # a further 0.001 on a fresh partition d: T = 1.001, top-2 = 1.0 (0.5 + 0.5); L = 1.0
    assert api.charge(partitions=["d"], epsilon=0.001).status_code == 201
    assert loss(api) == 1.0
    # on a: s(a) = 0.5 + 0.001 = 0.501, top-2 = 1.001, T = 1.002: L = 1.001 > 1
    denied = api.charge(partitions=["a"], epsilon=0.001)
    assert denied.status_code == 409
    assert denied.get_json()["scope"] == "dataset"


def test_star_charges_every_existing_partition(api: Api) -> None:
    api.make_dataset(budget={"epsilon": 5})
    assert api.post("/v1/datasets/clicks/partitions", {"keys": ["x", "y", "z"]}).status_code == 201
    response = api.charge(
        partitions="*", epsilon=0.5, release="parallel", input={"values": [1, 2, 3]}
    )
    assert response.status_code == 201
    assert response.get_json()["partitions"] == ["x", "y", "z"]
    # a partition created later is not touched by the earlier "*"
    assert api.charge(partitions=["w"], epsilon=0.25).status_code == 201
    pages = api.get("/v1/datasets/clicks/partitions").get_json()["partitions"]
    spent = {item["key"]: item["spent"]["epsilon"] for item in pages}
    assert spent == {"x": 0.5, "y": 0.5, "z": 0.5, "w": 0.25}
    entry = api.ledger()[0]
    assert entry["partitions"] == ["x", "y", "z"]


def test_each_partition_states_what_its_budget_has_left_and_whether_it_is_at_its_limit(
    api: Api,
) -> None:
    """Under a partition budget, GET .../partitions states each partition's remaining and
    at_limit (the budget report only has the most spent one's); without one, neither."""
    api.make_dataset(budget={"epsilon": 5}, partition_budget={"epsilon": 0.5})
    for key, epsilon in (("a", 0.5), ("b", 0.2)):
        assert api.charge(partitions=[key], epsilon=epsilon).status_code == 201
    assert api.post("/v1/datasets/clicks/partitions", {"keys": ["c"]}).status_code == 201
    pages = api.get("/v1/datasets/clicks/partitions").get_json()["partitions"]
    state = {p["key"]: (p["remaining"]["epsilon"], p["at_limit"]) for p in pages}
    assert state == {"a": (0.0, True), "b": (0.3, False), "c": (0.5, False)}
    assert api.charge(partitions=["a"], epsilon=0.001).status_code == 409  # as stated
    assert api.charge(partitions=["b"], epsilon=0.3).status_code == 201
    api.make_dataset("open", budget={"epsilon": 5})
    assert api.charge("open", partitions=["a"], epsilon=0.5).status_code == 201
    (item,) = api.get("/v1/datasets/open/partitions").get_json()["partitions"]
    assert set(item) == {"key", "spent"}


def test_star_on_a_dataset_without_partitions_is_refused(api: Api) -> None:
    api.make_dataset()
    response = api.charge(partitions="*")
    assert response.status_code == 400
    assert api.ledger() == []


def test_approx_composes_epsilon_and_delta_separately(api: Api) -> None:
    api.make_dataset(accounting="approx", budget={"epsilon": 1, "delta": 1e-6})
    gaussian = {"epsilon": 0.3, "delta": 4e-7, "sensitivity": 1}
    assert api.charge(mechanism="gaussian", params=gaussian).status_code == 201
    assert api.charge(mechanism="gaussian", params=gaussian).status_code == 201
    budget = api.budget()
    assert unlabelled(budget["loss"]) == {"epsilon": 0.6, "delta": 8e-7}
    assert budget["remaining"]["delta"] == 2e-7
    # delta would reach 1.2e-6 > 1e-6 although epsilon (0.9) fits
    denied = api.charge(mechanism="gaussian", params=gaussian)
    assert denied.status_code == 409
    assert unlabelled(denied.get_json()["requested"]) == {"epsilon": 0.3, "delta": 4e-7}


def test_record_level_sensitivity_is_scaled_by_the_contribution_bounds(api: Api) -> None:
    api.make_dataset(
        privacy_unit="user",
        max_partitions_per_user=2,
        max_records_per_user=3,
        budget={"epsilon": 10},
    )
    params = {"epsilon": 1, "sensitivity": 1, "sensitivity_unit": "record"}
    response = api.charge(partitions=["a", "b", "c"], params=params)
    assert response.status_code == 201
    # The cost stays epsilon; the noise is calibrated to 1 * r * min(k, |P|) = 6.
    assert response.get_json()["cost"]["epsilon"] == 1
    # The output released is the one drawn at sensitivity 6 with the charge's own noise.
    runtime = api.client.application.extensions["accountant"]
    laplace = runtime.registry.get("laplace")
    source = runtime.charging.noise.source_for
    charge_id = response.get_json()["charge_id"]

    def drawn(sensitivity: int) -> Any:
        run_params = {"epsilon": 1, "sensitivity": Decimal(sensitivity)}
        return laplace.run(run_params, {"values": [10.0]}, source(charge_id))

    assert response.get_json()["output"] == drawn(6) != drawn(1)
    entry = api.ledger()[0]
    assert Decimal(entry["cost"]["epsilon"]) == 1
    refused = api.make_dataset("rows")
    assert refused["privacy_unit"] == "record"
    response = api.charge(dataset="rows", params=params)
    assert response.status_code == 400
    assert response.get_json()["errors"][0]["field"] == "params.sensitivity_unit"


def test_record_unit_loss_is_the_max_over_every_partition(api: Api) -> None:
    """A charge on a quiet partition leaves the loss at the busiest one: the remaining budget
    says so, and a limit lowered below that loss blocks charges on any partition."""
    api.make_dataset(budget={"epsilon": 1})
    assert api.charge(partitions=["busy"], epsilon=0.9).status_code == 201
    quiet = api.charge(partitions=["quiet"], epsilon=0.05)
    assert quiet.status_code == 201
    assert quiet.get_json()["remaining"]["epsilon"] == pytest.approx(0.1)
    assert (
        api.patch(
            "/v1/datasets/clicks", {"budget": {"epsilon": 0.5}, "reason": "tighten"}
        ).status_code
        == 200
    )
    blocked = api.charge(partitions=["other"], epsilon=0.05)
    assert blocked.status_code == 409 and blocked.get_json()["scope"] == "dataset"


def test_a_partition_unit_dataset_says_what_it_protects_wherever_it_is_shown(api: Api) -> None:
    """DESIGN.md: unit partition protects one partition, not a person; say so wherever such
    a dataset is shown: its description, the list, and its budget report."""
    api.make_dataset(privacy_unit="partition", budget={"epsilon": 1})
    listed = api.get("/v1/datasets").get_json()["datasets"][0]
    for shown in (api.get("/v1/datasets/clicks").get_json(), listed, api.budget()):
        assert "not a person" in shown["note"], shown
    api.make_dataset("orders", budget={"epsilon": 1})
    assert "note" not in api.budget("orders")


def test_a_dataset_is_shown_with_the_description_it_was_created_with(api: Api) -> None:
    """API.md: GET /v1/datasets/{name} shows the dataset as created; a description given on
    creation is kept and shown (in the list too), and one never given is not made up."""
    api.make_dataset(description="Clicks on the search page, one row per click")
    listed = api.get("/v1/datasets").get_json()["datasets"][0]
    for shown in (api.get("/v1/datasets/clicks").get_json(), listed):
        assert shown["description"] == "Clicks on the search page, one row per click", shown
    api.make_dataset("orders", budget={"epsilon": 1})
    assert "description" not in api.get("/v1/datasets/orders").get_json()

"""No charge is committed without its output: every built-in, driven through the HTTP layer
with parameters and inputs anywhere its schema allows, answers a 201 with an output or a 400
(or a budget denial) that changed nothing; never a 500, never a charge without an output."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Api, run_sql

EXAMPLES = 150  # per mechanism and mode; the @example cases below come on top
#: On PostgreSQL fewer: the property is the mechanism's and the transaction's, and what a
#: server adds (refused values, the rollback) shows in the first few dozen examples.
EXAMPLES_POSTGRES = 50


def _decimal(low_exponent: int, high: Decimal) -> st.SearchStrategy[Decimal]:
    """Positive decimals m * 10^e from 10^low_exponent up to ``high``, extremes included."""
    spread = st.builds(
        lambda m, e: Decimal(m).scaleb(e), st.integers(1, 999), st.integers(low_exponent, 15)
    ).filter(lambda d: d <= high)
    return st.one_of(
        spread,
        st.sampled_from([high, Decimal("1e-320"), Decimal("5e-324"), Decimal("1"), Decimal("0.5")]),
    )


EPSILON = _decimal(-330, Decimal(10**6))
SENSITIVITY = _decimal(-330, Decimal(10**15))
SIGMA = _decimal(-330, Decimal(10**15))
RHO = _decimal(-330, Decimal(10**6))
DELTA = st.builds(lambda m, e: Decimal(m).scaleb(e), st.integers(1, 9), st.integers(-330, -1))
REAL = st.one_of(
    st.floats(-1e300, 1e300, allow_nan=False), st.sampled_from([1e300, -1e300, 0.0, 5e-324, 1e-320])
)
INTEGER = st.one_of(st.integers(-(2**52), 2**52), st.sampled_from([2**52, -(2**52), 0]))


def _vector(item: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(lambda v: {"values": v}, st.lists(item, min_size=1, max_size=6)),
        st.builds(
            lambda n: {"size": n}, st.one_of(st.integers(1, 50), st.sampled_from([1000, 100_000]))
        ),
    )


def _gaussian_params(zcdp: bool) -> st.SearchStrategy[dict[str, Any]]:
    if zcdp:
        return st.one_of(
            st.fixed_dictionaries({"sigma": SIGMA, "sensitivity": SENSITIVITY}),
            st.fixed_dictionaries({"rho": RHO, "sensitivity": SENSITIVITY}),
        )
    return st.fixed_dictionaries({"epsilon": EPSILON, "delta": DELTA, "sensitivity": SENSITIVITY})


EPSILON_PARAMS = st.fixed_dictionaries({"epsilon": EPSILON, "sensitivity": SENSITIVITY})
#: name -> (accounting, params, input)
CASES: dict[str, tuple[str, st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "laplace": ("pure", EPSILON_PARAMS, _vector(REAL)),
    "discrete_laplace": ("pure", EPSILON_PARAMS, _vector(INTEGER)),
    "gaussian/approx": ("approx", _gaussian_params(False), _vector(REAL)),
    "gaussian/zcdp": ("zcdp", _gaussian_params(True), _vector(REAL)),
    "discrete_gaussian/approx": ("approx", _gaussian_params(False), _vector(INTEGER)),
    "discrete_gaussian/zcdp": ("zcdp", _gaussian_params(True), _vector(INTEGER)),
    "exponential": (
        "pure",
        EPSILON_PARAMS,
        st.builds(lambda u: {"utilities": u}, st.lists(REAL, min_size=1, max_size=6)),
    ),
    "randomized_response": (
        "pure",
        st.fixed_dictionaries({"epsilon": EPSILON}),
        st.builds(
            lambda v: {"values": v},
            st.lists(st.one_of(st.booleans(), st.none()), min_size=1, max_size=6),
        ),
    ),
}
BUDGETS = {
    "pure": {"epsilon": 10**6},
    "approx": {"epsilon": 10**6, "delta": 0.999999},
    "zcdp": {"epsilon": 10**6, "delta": 1e-3},
}


def _body(mechanism: str, params: dict[str, Any], data: dict[str, Any]) -> str:
    """The charge as JSON, decimals written as they are (1e-400 stays 1e-400)."""
    marked = json.dumps(
        {
            "dataset": "d",
            "partitions": ["p"],
            "mechanism": mechanism,
            "params": params,
            "input": data,
        },
        default=lambda d: f"__decimal__{d}__",
    )
    return re.sub(r'"__decimal__([^_]+)__"', r"\1", marked)


def _state(database_url: str) -> tuple[Any, ...]:
    return tuple(run_sql(database_url, "SELECT COUNT(*) FROM ledger_entries")[0]) + tuple(
        run_sql(
            database_url,
            "SELECT total_epsilon, total_delta, total_rho FROM tallies WHERE kind = 'lifetime'",
        )
        or [()]
    )


def _check(
    api: Api, database_url: str, mechanism: str, params: dict[str, Any], data: dict[str, Any]
) -> int:
    before = _state(database_url)
    response = api.post("/v1/charges", raw=_body(mechanism, params, data))
    after = _state(database_url)
    assert response.status_code in (201, 400, 409), (response.status_code, response.text[:300])
    if response.status_code == 201:
        output = response.get_json()["output"]
        assert output and after[0] == before[0] + 1
        if "values" in data:
            assert len(output["values"]) == len(data["values"])
        if "size" in data:
            assert len(output["noise"]) == data["size"]
    elif response.status_code == 400:
        assert response.content_type == "application/problem+json"
        assert after == before, response.text
    else:
        assert response.get_json()["type"].endswith("/budget-exhausted")
    return int(response.status_code)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_answer_is_an_output_or_a_refusal_that_changed_nothing(
    api: Api, database_url: str, case: str
) -> None:
    accounting, params, data = CASES[case]
    mechanism = case.split("/")[0]
    api.make_dataset("d", accounting=accounting, budget=BUDGETS[accounting])
    seen: dict[int, int] = {}

    @settings(
        max_examples=EXAMPLES_POSTGRES if database_url.startswith("postgresql") else EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(params=params, data=data)
    def run(params: dict[str, Any], data: dict[str, Any]) -> None:
        status = _check(api, database_url, mechanism, params, data)
        seen[status] = seen.get(status, 0) + 1

    run()
    print(f"{case}: answers by status {sorted(seen.items())}")  # shown with pytest -s
    assert seen.get(201, 0) > 0


_EXTREMES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("laplace", "pure", {"epsilon": Decimal("1e-320"), "sensitivity": 1}, {"values": [1.0]}),
    ("laplace", "pure", {"epsilon": Decimal("1e-12"), "sensitivity": 1}, {"size": 100_000}),
    ("laplace", "pure", {"epsilon": 10**6, "sensitivity": Decimal("1e-320")}, {"values": [1e300]}),
    (
        "laplace",
        "pure",
        {"epsilon": Decimal("1e-9"), "sensitivity": 10**15},
        {"values": [-1e300, 1e300]},
    ),
    ("discrete_laplace", "pure", {"epsilon": Decimal("1e-320"), "sensitivity": 1}, {"values": [1]}),
    (
        "discrete_laplace",
        "pure",
        {"epsilon": Decimal("1e-15"), "sensitivity": 1},
        {"values": [2**52]},
    ),
    (
        "gaussian",
        "approx",
        {"epsilon": Decimal("1e-320"), "delta": Decimal("1e-320"), "sensitivity": 1},
        {"values": [1.0]},
    ),
    (
        "gaussian",
        "approx",
        {"epsilon": 10**6, "delta": Decimal("0.9"), "sensitivity": 10**15},
        {"size": 100_000},
    ),
    ("gaussian", "zcdp", {"rho": Decimal("1e-320"), "sensitivity": 10**15}, {"values": [1.0]}),
    ("gaussian", "zcdp", {"sigma": Decimal("1e-320"), "sensitivity": 10**15}, {"values": [1.0]}),
    (
        "discrete_gaussian",
        "zcdp",
        {"sigma": 10**15, "sensitivity": Decimal("1e-320")},
        {"values": [2**52]},
    ),
    (
        "discrete_gaussian",
        "approx",
        {"epsilon": Decimal("1e-320"), "delta": Decimal("0.5"), "sensitivity": 1},
        {"values": [1]},
    ),
    (
        "exponential",
        "pure",
        {"epsilon": Decimal("1e-320"), "sensitivity": Decimal("1e-320")},
        {"utilities": [1e300, -1e300, 0.0]},
    ),
    (
        "exponential",
        "pure",
        {"epsilon": 10**6, "sensitivity": 10**15},
        {"utilities": [1e300, -1e300]},
    ),
    (
        "randomized_response",
        "pure",
        {"epsilon": Decimal("1e-320")},
        {"values": [True, None] * 50_000},
    ),
    ("randomized_response", "pure", {"epsilon": 10**6}, {"values": [False]}),
]


@pytest.mark.parametrize(("mechanism", "accounting", "params", "data"), _EXTREMES)
def test_extreme_requests_are_answered_or_refused_before_the_charge(
    api: Api,
    database_url: str,
    mechanism: str,
    accounting: str,
    params: dict[str, Any],
    data: dict[str, Any],
) -> None:
    api.make_dataset("d", accounting=accounting, budget=BUDGETS[accounting])
    status = _check(api, database_url, mechanism, params, data)
    assert status in (201, 400)


def test_a_refusal_names_the_parameter_and_the_usable_range(api: Api) -> None:
    api.make_dataset("d")
    refused = api.post(
        "/v1/charges",
        raw=_body("laplace", {"epsilon": Decimal("1e-320"), "sensitivity": 1}, {"values": [1.0]}),
    )
    assert refused.status_code == 400
    error = refused.get_json()["errors"][0]
    assert error["field"] == "params.epsilon" and "between" in error["message"]
    preview = api.post(
        "/v1/charges/preview",
        raw=_body("laplace", {"epsilon": Decimal("1e-320"), "sensitivity": 1}, {"values": [1.0]}),
    )
    assert preview.status_code == 400


def test_a_gaussian_whose_sigma_squared_passes_a_double_names_its_range(api: Api) -> None:
    """A tiny rho is a sigma whose square no double holds (above about 1.3e154): the refusal
    names the parameter and the usable range, not the overflow it met."""
    api.make_dataset("d", accounting="zcdp", budget=BUDGETS["zcdp"])
    params = {"rho": Decimal("1e-400"), "sensitivity": 1}
    refused = api.post("/v1/charges", raw=_body("gaussian", params, {"values": [1.0]}))
    assert refused.status_code == 400
    error = refused.get_json()["errors"][0]
    assert error["field"] == "params.rho" and "keep sigma/sensitivity below" in error["message"]


def test_a_mechanism_that_fails_after_preparing_charges_nothing(
    database_url: str, signing_key_file: str
) -> None:
    from accountant import hookimpl
    from accountant.app import prepared_app
    from accountant.mechanism import Mechanism
    from accountant_plugins.laplace import LAPLACE
    from tests.conftest import ADMIN_KEY

    def broken(*_: Any) -> dict[str, Any]:
        raise RuntimeError("a bug")

    class Plugin:
        @hookimpl
        def accountant_register_mechanisms(self) -> list[Mechanism]:
            from dataclasses import replace

            return [replace(LAPLACE, name="broken", run=broken)]

    app = prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
        },
        extra_plugins=[("broken", Plugin())],
    )
    api = Api(app.test_client())
    api.make_dataset("d")
    before = _state(database_url)
    failed = api.post(
        "/v1/charges", raw=_body("broken", {"epsilon": 1, "sensitivity": 1}, {"values": [1.0]})
    )
    assert failed.status_code == 500
    assert failed.get_json()["type"].endswith("/mechanism-failed")
    assert "nothing was charged" in failed.get_json()["detail"]
    assert _state(database_url) == before

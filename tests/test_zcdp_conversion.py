"""zcdp budgets by the Canonne, Kamath and Steinke (2020) conversion, checked against
dp_accounting (a test-only reference) and through HTTP."""

from __future__ import annotations

import math
from decimal import Decimal

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import optimize

from accountant.accounting.modes import epsilon_of_rho, rho_by_bun_steinke, rho_limit
from accountant.exact import DELTA, RHO
from tests.conftest import Api, run_sql


def rdp_epsilon(rho: float, delta: float) -> float:
    """dp_accounting's epsilon of rho-zCDP (a Gaussian of noise multiplier sqrt(1/(2 rho))),
    over Renyi orders refined around its best one, so that its minimum over the orders is
    within about 1e-9 of the minimum over every order."""
    orders = list(np.geomspace(1.0001, 1e6, 4000))
    for _ in range(3):
        accountant = rdp.RdpAccountant(orders=orders)
        accountant.compose(dp_accounting.GaussianDpEvent(math.sqrt(1 / (2 * rho))))
        epsilon, best = accountant.get_epsilon_and_optimal_order(delta)
        step = (orders[orders.index(best) + 1] - best) if best != orders[-1] else best
        orders = list(np.linspace(max(1.00001, best - step), best + step, 4001))
    return float(epsilon)


def cks_rho_star(epsilon: float, delta: float) -> float:
    """max over alpha > 1 of B(alpha) / alpha, by scipy (independently of the service)."""

    def minus(x: float) -> float:
        alpha = 1 + math.exp(x)
        b = (
            epsilon
            + math.log(alpha / (alpha - 1))
            - (math.log(1 / delta) - math.log(alpha)) / (alpha - 1)
        )
        return -b / alpha

    return float(
        -optimize.minimize_scalar(
            minus, bounds=(-12, 40), method="bounded", options={"xatol": 1e-12}
        ).fun
    )


@pytest.mark.parametrize(
    ("epsilon", "delta"), [("1", "1e-6"), ("10", "1e-6"), ("0.5", "1e-9"), ("3", "1e-12")]
)
def test_the_rho_limit_is_the_cks_optimum_and_sound(epsilon: str, delta: str) -> None:
    units = rho_limit(Decimal(epsilon), Decimal(delta))
    rho = units / RHO.scale
    assert rho == pytest.approx(cks_rho_star(float(epsilon), float(delta)), rel=1e-7)
    if (epsilon, delta) == ("1", "1e-6"):
        assert rho == pytest.approx(0.0243560, abs=1e-7)
    # sound: dp_accounting's conversion of that rho stays within epsilon ...
    assert rdp_epsilon(rho, float(delta)) <= float(epsilon) + 1e-6
    # ... and tight: one part in 10^5 more does not
    assert rdp_epsilon(rho * 1.00001, float(delta)) > float(epsilon) - 1e-4
    # and larger than the classic conversion
    assert units > rho_by_bun_steinke(Decimal(epsilon), Decimal(delta))


@settings(max_examples=60, deadline=None)
@given(rho=st.floats(1e-6, 50), delta_exp=st.integers(3, 15))
def test_the_reported_epsilon_is_never_below_the_reference(rho: float, delta_exp: int) -> None:
    delta = 10.0**-delta_exp
    rho_units = RHO.cost_units(Decimal(repr(rho)))
    reported = float(epsilon_of_rho(rho_units, DELTA.limit_units(Decimal(repr(delta)))))
    reference = rdp_epsilon(rho_units / RHO.scale, delta)
    assert reported >= reference - 1e-8 * max(1.0, reference)
    assert reported <= reference + 1e-6 * max(1.0, reference)


def test_gaussians_fit_until_the_cks_limit(api: Api) -> None:
    """(1, 1e-6): 487 Gaussians of sigma 100 fit, where the classic conversion fit 349."""
    api.make_dataset(accounting="zcdp", budget={"epsilon": 1, "delta": 1e-6})
    granted = 0
    while (
        reply := api.charge(mechanism="gaussian", params={"sigma": 100, "sensitivity": 1})
    ).status_code == 201:
        granted += 1
        assert granted < 1000
    assert reply.status_code == 409
    assert granted == 487


def test_the_reported_loss_matches_the_references(api: Api) -> None:
    """(10, 1e-6), 100 Gaussians of sigma 10: epsilon 5.2215 as dp_accounting's RDP says,
    never below its PLD figure (the exact loss of this composition)."""
    api.make_dataset(accounting="zcdp", budget={"epsilon": 10, "delta": 1e-6})
    for _ in range(100):
        assert (
            api.charge(mechanism="gaussian", params={"sigma": 10, "sensitivity": 1}).status_code
            == 201
        )
    loss = api.budget()["loss"]
    assert loss["rho"] == 0.5
    pld_accountant = pld.PLDAccountant()
    pld_accountant.compose(dp_accounting.GaussianDpEvent(10.0), 100)
    exact = pld_accountant.get_epsilon(1e-6)
    assert exact == pytest.approx(4.88655, abs=1e-4)
    assert loss["epsilon"] == pytest.approx(rdp_epsilon(0.5, 1e-6), abs=1e-6)
    assert loss["epsilon"] == pytest.approx(5.22154, abs=1e-4)
    assert loss["epsilon"] >= exact


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    workload=st.lists(
        st.one_of(
            st.tuples(st.just("laplace"), st.sampled_from([0.05, 0.1, 0.3])),
            st.tuples(st.just("gaussian"), st.sampled_from([5, 10, 30])),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_mixed_workloads_never_report_less_than_their_exact_loss(
    api: Api, workload: list[tuple[str, float]]
) -> None:
    name = f"mix{abs(hash(tuple(workload))) % 10**9}"
    api.make_dataset(name, accounting="zcdp", budget={"epsilon": 50, "delta": 1e-6})
    exact = pld.PLDAccountant()
    for mechanism, value in workload:
        params = (
            {"epsilon": value, "sensitivity": 1}
            if mechanism == "laplace"
            else {"sigma": value, "sensitivity": 1}
        )
        assert api.charge(name, mechanism=mechanism, params=params).status_code == 201
        exact.compose(
            dp_accounting.LaplaceDpEvent(1 / value)
            if mechanism == "laplace"
            else dp_accounting.GaussianDpEvent(value)
        )
    assert api.budget(name)["loss"]["epsilon"] >= exact.get_epsilon(1e-6)


def test_db_upgrade_raises_limits_made_under_the_classic_conversion(
    app: Flask,
    api: Api,
    database_url: str,
    signing_key_file: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pathlib import Path

    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from accountant.db import begin_write
    from accountant.migrate import upgrade
    from accountant.models import Dataset
    from accountant.services import sealing, terms

    api.make_dataset(
        accounting="zcdp",
        budget={"epsilon": 1, "delta": 1e-6},
        windows=[{"period": "1d", "epsilon": 0.5}],
    )
    assert (
        api.charge(mechanism="gaussian", params={"sigma": 100, "sensitivity": 1}).status_code == 201
    )
    classic = rho_by_bun_steinke(Decimal(1), Decimal("1e-6"))
    engine = create_engine(database_url)
    with Session(engine) as session:  # the dataset as an older service left it
        dataset = session.execute(select(Dataset)).scalar_one()
        dataset.limit_rho = classic
        dataset.windows[0].limit_rho = rho_by_bun_steinke(Decimal("0.5"), Decimal("1e-6"))
        dataset.terms_sha256 = terms.digest(dataset)
        session.commit()
    engine.dispose()
    # ... which was older than seals too
    run_sql(database_url, "UPDATE datasets SET terms_seal = NULL, head_seal = NULL")
    run_sql(database_url, "UPDATE consumers SET seal = NULL")
    run_sql(database_url, "UPDATE key_hash_secrets SET sealed_at = NULL, heads_sealed_at = NULL")
    assert api.budget()["limit"]["rho"] == classic / RHO.scale
    # run where the service runs: its key-hash secret seals what the upgrade ledgers
    secret = Path(signing_key_file).parent / "key-hash-secret"
    monkeypatch.setenv("ACCOUNTANT_KEY_HASH_SECRET_FILE", str(secret))
    upgrade(database_url)
    budget = api.budget()
    assert budget["limit"]["rho"] == rho_limit(Decimal(1), Decimal("1e-6")) / RHO.scale
    assert (
        budget["windows"][0]["limit"]["rho"]
        == rho_limit(Decimal("0.5"), Decimal("1e-6")) / RHO.scale
    )
    changes = [e for e in api.ledger() if e["kind"] == "limit_change"]
    assert [c["detail"]["scope"] for c in changes] == ["dataset", "window:1d"]
    assert all("Canonne" in c["detail"]["reason"] for c in changes)
    assert changes[0]["loss_after"]["rho"] == budget["loss"]["rho"] == 5e-5
    unsealed = api.get("/v1/ledger/verify").get_json()  # the chains hold; nothing sealed
    assert unsealed["ok"] is False and "accountant seals init" in unsealed["reason"]
    engine = create_engine(database_url)
    with Session(engine) as session:  # accountant seals init, once the operator checked
        begin_write(session)
        sealing.init(session, app.extensions["accountant"].key_hasher, 1, "operator@host")
        session.commit()
    engine.dispose()
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    upgrade(database_url)  # again: nothing more to raise
    changes = [e for e in api.ledger() if e["kind"] == "limit_change"]
    assert [c["detail"]["scope"] for c in changes] == ["dataset", "window:1d", "seals"]

"""The dashboard's populations: the population page, the overview's populations and a member
dataset's link to its population, checked against the API's figures."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from accountant.clock import FrozenClock
from accountant.services import dashboard_reads, populations
from accountant.web import db
from tests.conftest import ADMIN_KEY, Api
from tests.test_dashboard import _dataset_row, _row_of, _shown, _sign_in, _text


def _population(api: Api, name: str = "customers", **fields: Any) -> None:
    body = {"name": name, "privacy_unit": "user", "accounting": "pure", "budget": {"epsilon": 1}}
    response = api.post("/v1/populations", {**body, **fields})
    assert response.status_code == 201, response.get_json()


def _member(api: Api, name: str, population: str = "customers", **fields: Any) -> None:
    body = {"privacy_unit": "user", "accounting": "pure", "budget": {"epsilon": 10}}
    api.make_dataset(name, population=population, **{**body, **fields})


def _population_budget(api: Api, name: str = "customers") -> dict[str, Any]:
    response = api.get(f"/v1/populations/{name}/budget")
    assert response.status_code == 200, response.get_json()
    return dict(response.get_json())


def _chart_levels(html: str) -> tuple[list[float], list[float], float]:
    """The loss chart's levels, read back from where its steps are drawn: the loss line's
    and the limit's, in order, and the value of one pixel of the axis."""
    chart = re.search(r'<svg class="chart loss-chart".*?</svg>', html, re.S)
    assert chart, html
    svg = chart.group(0)

    def attribute(name: str) -> float:
        found = re.search(rf'{name}="([^"]+)"', svg)
        assert found, name
        return float(found.group(1))

    top, plot_top, plot_bottom = (
        attribute(name) for name in ("data-y-top", "data-plot-top", "data-plot-bottom")
    )

    def levels(css: str) -> list[float]:
        points = re.search(rf'<polyline class="{css}" points="([^"]+)"', svg)
        assert points, css
        values = [
            (plot_bottom - float(point.split(",")[1])) / (plot_bottom - plot_top) * top
            for point in points.group(1).split()
        ]
        return [v for i, v in enumerate(values) if i == 0 or abs(v - values[i - 1]) > 1e-9]

    return levels("series"), levels("limit"), top / (plot_bottom - plot_top)


def _reference_history(api: Api, members: list[str]) -> list[tuple[int, Decimal]]:
    """The population's loss after each member entry, from the API's ledger alone: entries
    in id order, each member's latest loss_after, summed."""
    entries = sorted(
        (entry for name in members for entry in api.ledger(dataset=name)),
        key=lambda entry: int(entry["id"]),
    )
    latest: dict[str, Decimal] = {}
    history = []
    for entry in entries:
        latest[entry["dataset"]] = Decimal(repr(entry["loss_after"]["epsilon"]))
        history.append((int(entry["created_at_us"]), sum(latest.values(), Decimal(0))))
    return history


@pytest.mark.frozen_clock  # each entry a minute after the last: every entry its own point
def test_the_population_page_shows_its_loss_shares_and_limit_history(
    api: Api, client: FlaskClient, clock: FrozenClock
) -> None:
    _population(api)
    _member(api, "orders")
    _member(api, "clicks")
    api.make_dataset("weather", privacy_unit="user", budget={"epsilon": 10})  # not a member
    for dataset, epsilon in (("orders", 0.3), ("weather", 2), ("clicks", 0.3), ("orders", 0.3)):
        clock.advance(60)
        assert api.charge(dataset, epsilon=epsilon).status_code == 201
    clock.advance(60)
    raised = {"budget": {"epsilon": 1.5}, "reason": "new quarter <b>& more</b>"}
    assert api.patch("/v1/populations/customers", raised).status_code == 200
    clock.advance(60)
    assert api.charge("clicks", epsilon=0.6).status_code == 201
    clock.advance(60)
    assert api.charge("clicks", epsilon=0.1).status_code == 409  # by the population
    budget = _population_budget(api)
    assert budget["loss"]["epsilon"] == 1.5 and budget["at_limit"] is True
    assert sorted(budget["datasets"]) == ["clicks", "orders"]
    orders, clicks = (
        budget["datasets"]["orders"]["epsilon"],
        budget["datasets"]["clicks"]["epsilon"],
    )
    assert (orders, clicks) == (0.6, 0.9)

    _sign_in(client, ADMIN_KEY)
    response = client.get("/dashboard/populations/customers")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    text = _text(page)
    assert '<span id="loss">1.5</span>' in page and '<span id="limit">1.5</span>' in page
    assert '<span id="remaining">0</span> epsilon remaining' in page
    assert '<span class="badge exhausted">at limit</span>' in page
    assert '<span id="member-count">2</span>' in page
    assert "identify the same people by the same person-level id" in text
    # the shares: each member's loss, of the population's loss and of its limit
    for name, loss in (("orders", orders), ("clicks", clicks)):
        row = _row_of(page, "members", f'data-dataset="{name}"')
        assert f'href="/dashboard/datasets/{name}"' in row
        share = _shown(round(100 * loss / 1.5, 1))  # of the loss, and of the limit: both 1.5
        assert f"{_shown(loss)} {share}% {share}% {share}%" in _text(row)  # the meter's too
    assert "weather" not in page
    # its limit history, newest first, the reason escaped
    changes = re.findall(r'<tr data-id="\d+">.*?</tr>', _table(page, "limit-changes"), re.S)
    assert len(changes) == 2
    assert "population: epsilon 1, delta 0 → epsilon 1.5, delta 0" in _text(changes[0])
    assert "admin" in changes[0]
    assert "new quarter &lt;b&gt;&amp; more&lt;/b&gt;" in changes[0] and "<b>" not in page
    assert "population created with the limit epsilon 1, delta 0" in _text(changes[1])
    assert "no reason given" in changes[1]
    # the chart: the sum of the members' latest losses after each of their entries
    series, limits, pixel = _chart_levels(page)
    reference = [v for _, v in _reference_history(api, ["orders", "clicks"])]
    expected = [0.0] + [
        float(v) for i, v in enumerate(reference) if i == 0 or v != reference[i - 1]
    ]
    assert len(series) == len(expected) and all(
        abs(a - b) <= pixel for a, b in zip(series, expected, strict=True)
    ), (series, expected)
    assert [round(v, 3) for v in limits] == [1.0, 1.5]
    assert "loss 1.5</text>" in page and "limit 1.5</text>" in page


def _table(html: str, table: str) -> str:
    body = re.search(rf'<table id="{table}">.*?</table>', html, re.S)
    assert body, html
    return body.group(0)


@pytest.mark.frozen_clock
def test_the_loss_history_sums_each_members_latest_loss(
    api: Api, app: Flask, clock: FrozenClock
) -> None:
    """The read behind the chart, exactly: at the end of each span, the sum of each
    member's loss after its last entry up to then (a settle lowering one member's loss
    included), the last point the population's loss now."""
    _population(api, budget={"epsilon": 5})
    for name in ("a", "b", "c"):
        _member(api, name)
    steps: list[tuple[str, float]] = [("a", 0.5), ("b", 0.25), ("a", 0.125), ("c", 1), ("b", 0.5)]
    for dataset, epsilon in steps:
        clock.advance(30)
        assert api.charge(dataset, epsilon=epsilon).status_code == 201
    clock.advance(30)
    held = api.post(
        "/v1/holds",
        {"dataset": "c", "partitions": ["p1"], "amount": {"epsilon": 1}, "expires_in": 600},
    )
    assert held.status_code == 201, held.get_json()
    clock.advance(30)
    settled = api.post(
        f"/v1/holds/{held.get_json()['hold_id']}/settle", {"used": {"epsilon": 0.25}}
    )
    assert settled.status_code == 200, settled.get_json()
    clock.advance(30)
    reference = _reference_history(api, ["a", "b", "c"])
    with app.app_context():
        population = populations.find(db(), "customers")
        history = dashboard_reads.population_loss_history(db(), population, clock.now_us())
        shown = [(at, population.mode.in_measure(amount)) for at, amount in history]
    assert shown == reference
    assert (
        shown[-1][1]
        == Decimal(repr(_population_budget(api)["loss"]["epsilon"]))
        == Decimal("2.625")
    )


@pytest.mark.frozen_clock  # the loss after the last entry of each span, not each entry
def test_the_loss_history_reads_at_most_one_point_per_span(
    api: Api, app: Flask, clock: FrozenClock
) -> None:
    _population(api, budget={"epsilon": 5})
    _member(api, "a")
    _member(api, "b")
    for _ in range(3):  # three entries at one moment: one point
        assert api.charge("a", epsilon=0.1).status_code == 201
        assert api.charge("b", epsilon=0.2).status_code == 201
    clock.advance(3600)
    assert api.charge("b", epsilon=0.5).status_code == 201
    with app.app_context():
        population = populations.find(db(), "customers")
        history = dashboard_reads.population_loss_history(db(), population, clock.now_us())
        shown = [population.mode.in_measure(amount) for _, amount in history]
    assert shown == [Decimal("0.9"), Decimal("1.4")]


def test_the_overview_lists_populations_and_members_name_theirs(
    api: Api, client: FlaskClient
) -> None:
    _population(api)
    _population(api, "visitors", budget={"epsilon": 2})
    _population(api, "nobody-yet")
    _member(api, "orders")
    _member(api, "clicks")
    _member(api, "pageviews", population="visitors")
    api.make_dataset("weather", privacy_unit="user", budget={"epsilon": 10})
    assert api.charge("orders", epsilon=0.5).status_code == 201
    assert api.charge("clicks", epsilon=0.35).status_code == 201  # 85% of customers
    assert api.charge("pageviews", epsilon=2).status_code == 201  # all of visitors
    _sign_in(client, ADMIN_KEY)
    overview = client.get("/dashboard").get_data(as_text=True)
    rows = {
        name: _text(_row_of(overview, "populations", f'data-population="{name}"'))
        for name in ("customers", "visitors", "nobody-yet")
    }
    for name, (members, badge) in {
        "customers": (2, "above 80%"),
        "visitors": (1, "at limit"),
        "nobody-yet": (0, "ok"),
    }.items():
        budget = _population_budget(api, name)
        loss, limit = budget["loss"]["epsilon"], budget["limit"]["epsilon"]
        left = budget["remaining"]["epsilon"]
        assert f"{_shown(loss)} / {_shown(limit)} epsilon {_shown(left)} epsilon" in rows[name]
        assert rows[name].endswith(f" {members} {badge} "), rows[name]
        assert (budget["at_limit"] is True) == (badge == "at limit")
    row = _row_of(overview, "populations", 'data-population="customers"')
    assert 'href="/dashboard/populations/customers"' in row
    # a member dataset's row names its population, and is marked by it
    orders = _dataset_row(overview, "orders")
    assert 'href="/dashboard/populations/customers"' in orders
    assert "population customers at 85%: above 80%" in _text(orders)
    assert "population visitors at 100%: exhausted" in _text(_dataset_row(overview, "pageviews"))
    assert "population" not in _dataset_row(overview, "weather")

    page = client.get("/dashboard/datasets/orders").get_data(as_text=True)
    member = re.search(r'<p id="population">.*?</p>', page, re.S)
    assert member, page
    assert 'href="/dashboard/populations/customers"' in member.group(0)
    assert "now 0.85 of 1 epsilon" in _text(member.group(0))
    scope = re.search(r'<tr class="warn" data-scope="population customers">.*?</tr>', page, re.S)
    assert scope and 'href="/dashboard/populations/customers"' in scope.group(0)
    assert "85%" in _text(scope.group(0))
    lone = client.get("/dashboard/datasets/weather").get_data(as_text=True)
    assert 'id="population"' not in lone and "population" not in _table(lone, "scopes")


def test_no_populations_and_an_unknown_one(api: Api, client: FlaskClient) -> None:
    api.make_dataset()
    _sign_in(client, ADMIN_KEY)
    overview = client.get("/dashboard").get_data(as_text=True)
    assert "No populations." in _table(overview, "populations")
    missing = client.get("/dashboard/populations/missing")
    assert missing.status_code == 404
    assert "no population named “missing”" in missing.get_data(as_text=True)
    empty = api.post(
        "/v1/populations",
        {
            "name": "customers",
            "privacy_unit": "user",
            "accounting": "pure",
            "budget": {"epsilon": 1},
        },
    )
    assert empty.status_code == 201
    page = client.get("/dashboard/populations/customers").get_data(as_text=True)
    assert '<span id="loss">0</span>' in page and "No datasets yet" in page
    assert "loss 0</text>" in page and "limit 1</text>" in page


def test_auditors_and_admins_see_a_population_services_do_not(
    api: Api, app: Flask, client: FlaskClient
) -> None:
    """As GET /v1/populations: a population sums datasets a service may not be granted."""
    _population(api)
    _member(api, "orders")
    service = api.make_consumer("svc", datasets=["orders"])
    auditor = api.make_consumer("aud", role="auditor")
    assert api.as_key(service).get("/v1/populations/customers").status_code == 403
    signed_out = client.get("/dashboard/populations/customers")
    assert signed_out.status_code == 303
    assert "/dashboard/sign-in" in signed_out.headers["Location"]
    assert _sign_in(client, service)[0] == 403
    assert client.get("/dashboard/populations/customers").status_code == 303
    assert _sign_in(client, auditor)[0] == 303
    assert client.get("/dashboard/populations/customers").status_code == 200
    admin = app.test_client()
    _sign_in(admin, ADMIN_KEY)
    assert admin.get("/dashboard/populations/customers").status_code == 200


def test_the_population_page_carries_the_security_headers(api: Api, client: FlaskClient) -> None:
    _population(api)
    _sign_in(client, ADMIN_KEY)
    for path in ("/dashboard/populations/customers", "/dashboard/populations/missing"):
        response = client.get(path)
        assert "script-src" not in response.headers["Content-Security-Policy"]
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
        assert response.headers["X-Frame-Options"] == "DENY"
        html = response.get_data(as_text=True)
        assert "<script" not in html
        assert not re.search(r'(src|href)="(https?:)?//', html)


#: A population per mode whose epsilon does not add, its members' release and its measure.
_MEASURED: dict[str, tuple[dict[str, Any], str, dict[str, Any], str]] = {
    "zcdp": ({"accounting": "zcdp"}, "laplace", {"epsilon": 0.05}, "rho"),
    "rdp": ({"accounting": "rdp", "rdp_order": 8}, "laplace", {"epsilon": 0.05}, "rdp"),
    "gdp": ({"accounting": "gdp"}, "gaussian", {"sigma": 10}, "mu2"),
}


@pytest.mark.parametrize("mode", sorted(_MEASURED))
def test_a_population_page_is_in_its_measure(api: Api, client: FlaskClient, mode: str) -> None:
    """The loss, the limit, the shares and the chart are in the measure (mu² on gdp, never
    mu), with the epsilon of the loss and of the limit beside them."""
    fields, mechanism, params, measure = _MEASURED[mode]
    name = {"mu2": "mu²"}.get(measure, measure)
    budget = {"epsilon": 3, "delta": 1e-6}
    _population(api, **fields, budget=budget)
    for member in ("orders", "clicks"):
        _member(api, member, **fields, budget=budget)
    body: dict[str, Any] = {"mechanism": mechanism, "params": {**params, "sensitivity": 1}}
    for member in ("orders", "clicks", "orders"):
        assert api.charge(member, **body).status_code == 201
    report = _population_budget(api)
    loss, limit = report["loss"], report["limit"]
    _sign_in(client, ADMIN_KEY)
    page = client.get("/dashboard/populations/customers").get_data(as_text=True)
    assert f'<span id="loss">{_shown(loss[measure])}</span>' in page
    assert f'<span id="limit">{_shown(limit[measure])}</span> {name}' in page
    assert f'<span id="loss-epsilon">{_shown(loss["epsilon"])}</span>' in page
    assert f'<span id="limit-epsilon">{_shown(limit["epsilon"])}</span>' in page
    assert f"Only {name} adds up" in _text(page)
    for member, share in report["datasets"].items():
        row = _text(_row_of(page, "members", f'data-dataset="{member}"'))
        assert f"{_shown(share[measure])} (ε {_shown(share['epsilon'])})" in row
    series, _limits, pixel = _chart_levels(page)
    assert abs(series[-1] - loss[measure]) <= pixel
    assert f"loss {loss[measure]:g}</text>" in page and f"({name})" in page
    overview = _text(
        _row_of(client.get("/dashboard").get_data(as_text=True), "populations", "customers")
    )
    assert f"{_shown(loss[measure])} / {_shown(limit[measure])} {name}" in overview
    assert f"(ε {_shown(loss['epsilon'])} of {_shown(limit['epsilon'])})" in overview
    if mode == "gdp":
        assert not re.search(r"\bmu\b", _text(page)), page

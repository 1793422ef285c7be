"""The dashboard through HTTP: sign-in rules, the cookie, the pages and their numbers."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from accountant.app import prepared_app
from accountant.clock import FrozenClock
from tests.conftest import ADMIN_KEY, Api, run_sql


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, html
    return match.group(1)


def _sign_in(client: FlaskClient, key: str) -> tuple[int, str]:
    page = client.get("/dashboard/sign-in").get_data(as_text=True)
    response = client.post("/dashboard/sign-in", data={"api_key": key, "csrf": _csrf(page)})
    return response.status_code, response.headers.get("Location", "")


def _dataset_row(html: str, name: str) -> str:
    found = re.search(rf'data-dataset="{name}".*?</tr>', html, re.S)
    assert found, html
    return found.group(0)


def test_without_a_session_the_dashboard_redirects_to_sign_in(client: FlaskClient) -> None:
    for path in ("/dashboard", "/dashboard/ledger", "/dashboard/mechanisms"):
        response = client.get(path)
        assert response.status_code in (302, 303)
        assert "/dashboard/sign-in" in response.headers["Location"]
    form = client.get("/dashboard/sign-in").get_data(as_text=True)
    assert "<form" in form and 'name="api_key"' in form


def test_auditors_and_admins_sign_in_services_cannot(api: Api, client: FlaskClient) -> None:
    api.make_dataset()
    service = api.make_consumer("svc", datasets=["clicks"])
    auditor = api.make_consumer("aud", role="auditor")
    assert _sign_in(client, service)[0] == 403
    assert client.get("/dashboard").status_code == 303
    assert _sign_in(client, "not-a-key")[0] == 401
    status, location = _sign_in(client, auditor)
    assert status == 303 and location.rstrip("/").endswith("/dashboard")
    cookie = client.get_cookie("accountant_session")
    assert cookie is not None and cookie.http_only and cookie.same_site == "Lax"
    assert auditor not in cookie.value
    assert client.get("/dashboard").status_code == 200


def test_a_form_without_its_token_is_refused(client: FlaskClient) -> None:
    response = client.post("/dashboard/sign-in", data={"api_key": ADMIN_KEY})
    assert response.status_code == 400
    assert client.get("/dashboard").status_code == 303
    client.get("/dashboard/sign-in")  # a session with a token exists now; a wrong one fails
    forged = client.post("/dashboard/sign-in", data={"api_key": ADMIN_KEY, "csrf": "forged"})
    assert forged.status_code == 400


def test_revoking_the_key_ends_its_session(api: Api, client: FlaskClient) -> None:
    new = api.post("/v1/consumers/admin/keys").get_json()
    assert _sign_in(client, new["api_key"])[0] == 303
    assert client.get("/dashboard").status_code == 200
    assert api.call("DELETE", f"/v1/keys/{new['id']}").status_code == 204
    assert client.get("/dashboard").status_code == 303


@pytest.mark.frozen_clock  # the window's share is read in the day of its charges
def test_pages_show_the_api_numbers(api: Api, client: FlaskClient) -> None:
    api.make_dataset(budget={"epsilon": 1}, windows=[{"period": "1d", "epsilon": 0.9}])
    api.make_dataset("spent", privacy_unit="partition", budget={"epsilon": 0.5})
    for _ in range(3):
        api.charge(partitions=["a"], epsilon=0.25)
    api.charge(dataset="spent", partitions=["d1"], epsilon=0.5)
    api.charge(dataset="spent", partitions=["d1"], epsilon=0.1)  # denied
    _sign_in(client, ADMIN_KEY)
    overview = client.get("/dashboard").get_data(as_text=True)
    budget = api.budget()
    clicks = _dataset_row(overview, "clicks")
    assert f'<span class="loss">{budget["loss"]["epsilon"]:g}</span>' in clicks
    assert f'<span class="limit">{budget["limit"]["epsilon"]:g}</span>' in clicks
    assert "above 80%" in clicks  # 0.75 of the window's 0.9 is 83%
    spent = _dataset_row(overview, "spent")
    assert "exhausted" in spent and "not a person" in spent
    page = client.get("/dashboard/datasets/clicks").get_data(as_text=True)
    assert page.count("<svg") == 2 and "limit 1" in page
    assert "<td>a</td><td>0.75</td>" in page
    ledger = client.get("/dashboard/ledger?dataset=spent").get_data(as_text=True)
    assert ledger.count('class="denied"') == 1 and "verify now" in ledger
    verified = client.get("/dashboard/ledger?verify=1").get_data(as_text=True)
    assert "verified" in verified
    export = client.get("/dashboard/ledger/export?format=jsonl&dataset=clicks")
    assert export.status_code == 200 and len(export.get_data(as_text=True).splitlines()) == 3
    mechanisms = client.get("/dashboard/mechanisms").get_data(as_text=True)
    assert "laplace" in mechanisms and "randomized_response" in mechanisms
    for html in (overview, page, ledger, mechanisms):
        assert not re.search(r'(src|href)="(https?:)?//', html)  # nothing from another host


def test_sign_out(client: FlaskClient) -> None:
    _sign_in(client, ADMIN_KEY)
    page = client.get("/dashboard").get_data(as_text=True)
    assert client.post("/dashboard/sign-out", data={"csrf": _csrf(page)}).status_code == 303
    assert client.get("/dashboard").status_code == 303


def _with_cookie(app: Flask, value: str) -> FlaskClient:
    other = app.test_client()
    other.set_cookie("accountant_session", value)
    return other


def test_signing_out_ends_every_copy_of_the_session(app: Flask, client: FlaskClient) -> None:
    """The session lives in the database: a copy of the cookie taken before sign-out (a
    proxy's log, a shared machine) gets the sign-in page afterwards, while another session
    of the same key stays signed in."""
    _sign_in(client, ADMIN_KEY)
    cookie = client.get_cookie("accountant_session")
    assert cookie is not None
    copy = _with_cookie(app, cookie.value)
    assert copy.get("/dashboard").status_code == 200
    elsewhere = app.test_client()
    _sign_in(elsewhere, ADMIN_KEY)
    page = client.get("/dashboard").get_data(as_text=True)
    assert client.post("/dashboard/sign-out", data={"csrf": _csrf(page)}).status_code == 303
    for path in ("/dashboard", "/dashboard/ledger", "/dashboard/ledger/export?format=csv"):
        answer = copy.get(path)
        assert answer.status_code == 303, path
        assert "/dashboard/sign-in" in answer.headers["Location"], path
    assert _with_cookie(app, cookie.value).get("/dashboard").status_code == 303
    assert elsewhere.get("/dashboard").status_code == 200


def test_a_session_ends_on_the_server_eight_hours_after_sign_in(
    database_url: str, signing_key_file: str
) -> None:
    """Whatever its cookie says, a session outlives its lifetime nowhere; a sign-in deletes
    the rows of ended sessions, so the table holds only live ones."""
    clock = FrozenClock(time.time_ns() // 1000)
    app = prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
        },
        clock=clock,
    )
    client = app.test_client()
    _sign_in(client, ADMIN_KEY)
    clock.advance(8 * 3600 - 1)
    assert client.get("/dashboard").status_code == 200
    clock.advance(1)
    assert client.get("/dashboard").status_code == 303
    _sign_in(app.test_client(), ADMIN_KEY)
    assert run_sql(database_url, "SELECT COUNT(*) FROM dashboard_sessions")[0][0] == 1


def test_sign_in_redirects_only_to_a_plain_dashboard_path(client: FlaskClient) -> None:
    """A ``next`` with a line break, a backslash or another site leads to the overview: never
    a header injection (or a 500) and never another site."""
    hostile = [
        "/dashboard\r\nSet-Cookie: forged=1",
        "/dashboard\\@evil.example",
        "/dashboard/../../evil",
        "//evil.example/dashboard",
        "https://evil.example",
        "/dashboard\u2028x",
        "/dashboard%0d%0aX: 1",
    ]
    for target in hostile:
        page = client.get("/dashboard/sign-in").get_data(as_text=True)
        response = client.post(
            "/dashboard/sign-in", data={"api_key": ADMIN_KEY, "csrf": _csrf(page), "next": target}
        )
        assert response.status_code == 303, target
        assert response.headers["Location"].rstrip("/").endswith("/dashboard"), target
        assert "forged" not in str(response.headers), target
        client.post(
            "/dashboard/sign-out",
            data={"csrf": _csrf(client.get("/dashboard").get_data(as_text=True))},
        )
    page = client.get("/dashboard/sign-in").get_data(as_text=True)
    kept = client.post(
        "/dashboard/sign-in",
        data={"api_key": ADMIN_KEY, "csrf": _csrf(page), "next": "/dashboard/ledger?dataset=a-b"},
    )
    assert kept.headers["Location"].endswith("/dashboard/ledger?dataset=a-b")


def test_limit_changes_read_as_changes_not_as_grants(api: Api, client: FlaskClient) -> None:
    """A limit change shows its old and new limits and who made it, never "granted" with a
    cost of 0; charges keep their cost and outcome (in the dataset's measure: rdp here)."""
    api.make_dataset(accounting="rdp", budget={"epsilon": 1, "delta": 1e-6})
    api.charge(mechanism="gaussian", params={"sigma": 100, "sensitivity": 1})
    assert (
        api.patch(
            "/v1/datasets/clicks", {"budget": {"epsilon": 2}, "reason": "new quarter"}
        ).status_code
        == 200
    )
    _sign_in(client, ADMIN_KEY)
    for path in ("/dashboard/ledger?dataset=clicks", "/dashboard/datasets/clicks"):
        html = client.get(path).get_data(as_text=True)
        rows = re.findall(r"<tr class=\"(?:granted|change)\".*?</tr>", html, re.S)
        assert len(rows) == 2, path
        change, charge = sorted(rows, key=lambda row: "limit change" in row, reverse=True)
        assert "limit change" in change and ">granted<" not in change
        assert "dataset: epsilon 1, delta 1e-6" in change and "→" in change
        assert "epsilon 2" in change
        assert ">granted<" in charge and ">0.001099<" in charge  # alpha D^2 / (2 sigma^2)
        assert "admin" in change


def test_every_page_carries_the_security_headers(api: Api, client: FlaskClient) -> None:
    """No script, nothing from another host, no framing, no sniffing: on the sign-in page, on
    every signed-in page, on the 404 page and on the stylesheet."""
    api.make_dataset()
    pages = ["/dashboard/sign-in"]
    _sign_in(client, ADMIN_KEY)
    pages += [
        "/dashboard",
        "/dashboard/datasets/clicks",
        "/dashboard/ledger",
        "/dashboard/mechanisms",
        "/dashboard/datasets/nothing-here",
        "/dashboard/static/style.css",
    ]
    for path in pages:
        response = client.get(path)
        assert response.status_code in (200, 404), path
        policy = response.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy, path
        assert "script-src" not in policy and "unsafe-inline" not in policy, path
        assert response.headers["X-Content-Type-Options"] == "nosniff", path
        assert response.headers["X-Frame-Options"] == "DENY", path
        html = response.get_data(as_text=True)
        response.close()
        assert "<script" not in html and " style=" not in html, path  # none inline either


def test_the_running_loss_is_called_a_guarantee_only_where_it_is_one(
    api: Api, client: FlaskClient
) -> None:
    """Only the limits are filter guarantees; a running loss is an odometer only for pure
    epsilon (docs/accounting.md, "What the running loss means")."""
    api.make_dataset("pure_one")
    for mode in ("approx", "zcdp", "rdp", "gdp"):
        api.make_dataset(f"{mode}_one", accounting=mode, budget={"epsilon": 1, "delta": 1e-6})
    _sign_in(client, ADMIN_KEY)
    for mode in ("pure", "approx", "zcdp", "rdp", "gdp"):
        page = client.get(f"/dashboard/datasets/{mode}_one").get_data(as_text=True)
        found = re.search(r'<p class="note" id="loss-meaning">(.*?)</p>', page, re.S)
        assert found, page
        note = found.group(1)
        assert "the lifetime limit is the guarantee" in note.lower()
        if mode == "pure":
            assert "the running loss is one too" in note
        else:
            assert "not a guarantee of its own" in note and "odometer" in note


#: A charge of a small part of a partition limit, and one of exactly what is left of it.
_MODES: dict[str, tuple[dict[str, Any], dict[str, Any], str, dict[str, Any] | None]] = {
    "pure": ({"epsilon": 1}, {"epsilon": 0.01, "sensitivity": 1}, "laplace", None),
    "approx": ({"epsilon": 1, "delta": 1e-6}, {"epsilon": 0.01, "sensitivity": 1}, "laplace", None),
    "zcdp": ({"epsilon": 1, "delta": 1e-6}, {"rho": 1e-4, "sensitivity": 1}, "gaussian", None),
    # at the order of a (10, 1e-6) budget, a partition limit of epsilon 1 would admit nothing
    "rdp": ({"epsilon": 8, "delta": 1e-6}, {"sigma": 100, "sensitivity": 1}, "gaussian", None),
    "gdp": ({"epsilon": 1, "delta": 1e-6}, {"sigma": 100, "sensitivity": 1}, "gaussian", None),
}


@pytest.mark.parametrize("mode", sorted(_MODES))
def test_a_partition_is_at_its_limit_only_when_nothing_more_fits(
    api: Api, client: FlaskClient, mode: str
) -> None:
    """One definition of "at limit" (checks.at_limit), in the API's budget report and on the
    dashboard, on every mode: a partition that spent a sliver of its limit is not at it
    (before, every partition of a pure dataset with any spend was shown "at limit", its
    unbound delta compared as 0 >= 0)."""
    budget, small, mechanism, _ = _MODES[mode]
    lifetime = {"epsilon": 10} if mode == "approx" else {**budget, "epsilon": 10}
    api.make_dataset(  # on approx, a lifetime delta of 0: a bound that grants nothing to use
        "spread", accounting=mode, budget=lifetime, partition_budget=budget
    )
    granted = api.charge("spread", ["a"], mechanism=mechanism, params=small)
    assert granted.status_code == 201, granted.get_json()
    report = api.budget("spread")
    assert report["partitions"]["at_limit"] is False and report["at_limit"] is False
    _sign_in(client, ADMIN_KEY)
    overview = _dataset_row(client.get("/dashboard").get_data(as_text=True), "spread")
    assert "at limit" not in overview and "exhausted" not in overview
    page = client.get("/dashboard/datasets/spread").get_data(as_text=True)
    assert "at limit</span>" not in page and 'class="exhausted"' not in page
    if mode in ("pure", "approx", "zcdp"):  # exactly what is left, in the mode's own measure
        left = report["partitions"]["remaining"]
        params = (
            {"rho": left["rho"], "sensitivity": 1}
            if mode == "zcdp"
            else {"epsilon": left["epsilon"], "sensitivity": 1}
        )
        full = api.charge("spread", ["a"], mechanism=mechanism, params=params)
        assert full.status_code == 201, full.get_json()
        assert api.budget("spread")["partitions"]["at_limit"] is True
        overview = _dataset_row(client.get("/dashboard").get_data(as_text=True), "spread")
        assert "1 partition at limit" in overview
        page = client.get("/dashboard/datasets/spread").get_data(as_text=True)
        assert re.search(r'<tr class="exhausted" data-scope="partition">', page)


def test_an_unknown_dataset_page_says_so(api: Api, client: FlaskClient) -> None:
    for name in ("a", "b"):
        api.make_dataset(name)
    _sign_in(client, ADMIN_KEY)
    response = client.get("/dashboard/datasets/missing")
    assert response.status_code == 404
    html = response.get_data(as_text=True)
    assert "no dataset named “missing”" in html and "No datasets yet" not in html


def test_the_session_cookie_is_secure_behind_tls(
    database_url: str,
    signing_key_file: str,
) -> None:
    """auto (the default): Secure over HTTPS, or through a proxy that says so; true and
    false force it."""

    def cookie(setting: str | None, **request: Any) -> str:
        config = {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
        }
        if setting is not None:
            config["cookie_secure"] = setting
        with prepared_app(config).test_client() as client:
            response = client.get("/dashboard/sign-in", **request)
            return response.headers["Set-Cookie"]

    assert "Secure" not in cookie(None)
    assert "Secure" in cookie(None, base_url="https://accountant.example")
    assert "Secure" in cookie(None, headers={"X-Forwarded-Proto": "https"})
    assert "Secure" in cookie("true")
    assert "Secure" not in cookie("false", base_url="https://accountant.example")
    assert "HttpOnly" in cookie(None) and "SameSite=Lax" in cookie(None)


def test_numbers_and_moments_are_shown_in_one_format(api: Api, client: FlaskClient) -> None:
    """No 3E-7 beside 0.000001, no ISO 8601 beside another layout: every amount on the
    pages reads like 1e-6 or 0.25, every moment like 2026-11-24 20:36:40 UTC."""
    api.make_dataset(
        accounting="approx",
        budget={"epsilon": 1, "delta": 1e-6},
        partition_budget={"epsilon": 0.5, "delta": 3e-7},
        windows=[{"period": "1d", "epsilon": 0.75, "delta": 3e-7}],
    )
    gaussian = {"epsilon": 0.1, "delta": 1e-7, "sensitivity": 1}
    assert api.charge(mechanism="gaussian", params=gaussian).status_code == 201
    api.patch("/v1/datasets/clicks", {"partition_budget": {"epsilon": 0.5, "delta": 2e-7}})
    _sign_in(client, ADMIN_KEY)
    for page in ("/dashboard/", "/dashboard/datasets/clicks", "/dashboard/ledger"):
        html = client.get(page).get_data(as_text=True)
        text = re.sub(r"<[^>]*>", " ", html)  # what a person reads, not the markup
        assert not re.search(r"\dE[-+]?\d|\de[-+]?0\d|\de\+", text), page
        assert "0.000001" not in text and "0.0000003" not in text, page
        assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", text), page
        if page != "/dashboard/":
            assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text), page
            assert "3e-7" in text or "1e-7" in text, page


#: A dataset per mode whose epsilon does not add, and two charges on it.
_MEASURED: dict[str, tuple[dict[str, Any], str, dict[str, Any], str]] = {
    "advanced": (
        {"accounting": "approx", "composition": "advanced"},
        "laplace",
        {"epsilon": 0.05},
        "rho",
    ),
    "zcdp": ({"accounting": "zcdp"}, "laplace", {"epsilon": 0.05}, "rho"),
    "rdp": ({"accounting": "rdp"}, "laplace", {"epsilon": 0.05}, "rdp"),
    "gdp": ({"accounting": "gdp"}, "gaussian", {"sigma": 10}, "mu2"),
}


def _text(html: str) -> str:
    """What a person reads: the page without its markup, blanks collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]*>", " ", html))


def _shown(value: float) -> str:
    """The pages' format (docs/dashboard.md): 6 significant digits, a power of ten outside
    0.001 to 10^9 (5e-7)."""
    if value == 0 or 1e-3 <= abs(value) < 1e9:
        return f"{value:.6g}"
    mantissa, exponent = f"{value:.5e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


@pytest.mark.parametrize("mode", sorted(_MEASURED))
def test_pages_show_one_measure_and_the_epsilon_of_loss_and_limit_beside_it(
    api: Api, client: FlaskClient, mode: str
) -> None:
    """Bars, percentages and charts are in the measure, the figure that adds up (mu^2 on gdp,
    never mu); beside the loss and the limit stands their epsilon; no cost's or remainder's
    epsilon (a figure that does not add) is shown at all."""
    fields, mechanism, params, measure = _MEASURED[mode]
    name = {"mu2": "mu²"}.get(measure, measure)
    api.make_dataset(budget={"epsilon": 3, "delta": 1e-6}, **fields)
    body: dict[str, Any] = {"mechanism": mechanism, "params": {**params, "sensitivity": 1}}
    charges = [api.charge(**body).get_json() for _ in range(2)]
    assert all("charge_id" in charge for charge in charges), charges
    report = api.budget()
    loss, limit = report["loss"], report["limit"]
    used, additive = round(100 * loss[measure] / limit[measure], 1), limit["additive"]
    _sign_in(client, ADMIN_KEY)
    page = client.get("/dashboard/datasets/clicks").get_data(as_text=True)
    text = _text(page)
    assert f'<span id="loss">{_shown(loss[measure])}</span>' in page
    assert f'<span id="limit">{_shown(limit[measure])}</span> {name}' in page
    assert f"({used}%)" in text
    assert f'<span id="loss-epsilon">{_shown(loss["epsilon"])}</span>' in page
    assert f'<span id="limit-epsilon">{_shown(limit["epsilon"])}</span>' in page
    assert f"Only {name} adds up" in text
    lifetime = re.search(r'<tr class="\w+" data-scope="lifetime">.*?</tr>', page, re.S)
    assert lifetime, page
    cells = _text(lifetime.group(0))
    for amount in (loss, limit):  # with delta where it adds (advanced composition)
        shown = ", ".join(f"{name if n == measure else n} {_shown(amount[n])}" for n in additive)
        assert f"{shown} (ε {_shown(amount['epsilon'])})" in cells
    assert f"{used}%" in cells
    chart = re.search(r'<svg class="chart loss-chart".*?</svg>', page, re.S)
    assert chart and f"loss {loss[measure]:g}" in chart.group(0) and f"({name})" in chart.group(0)
    recent = re.search(r'<table id="recent">.*?</table>', page, re.S)
    assert recent and f"Cost ({name})" in recent.group(0)
    assert f"<td>{_shown(charges[0]['cost'][measure])}</td>" in recent.group(0)
    ledger = client.get("/dashboard/ledger").get_data(as_text=True)
    assert f'{_shown(charges[0]["cost"][measure])} <small class="measure">{name}</small>' in ledger
    overview = _text(_dataset_row(client.get("/dashboard").get_data(as_text=True), "clicks"))
    assert f"{_shown(loss[measure])} / {_shown(limit[measure])} {name}" in overview
    assert f"(ε {_shown(loss['epsilon'])} of {_shown(limit['epsilon'])})" in overview
    for html in (page, ledger, overview):
        words = _text(re.sub(r"<svg.*?</svg>", "", html, flags=re.S))  # not the axes' ticks
        for charge in charges:  # the epsilon of one cost, or of what remains, by itself
            for figure in (charge["cost"]["epsilon"], charge["remaining"]["epsilon"]):
                assert not re.search(rf"(?<![\d.]){re.escape(_shown(figure))}(?!\d)", words), figure
        if mode == "gdp":
            assert not re.search(r"\bmu\b", _text(html)), html  # mu², never mu


def _row_of(html: str, table: str, marker: str) -> str:
    """The row of table ``table`` that carries ``marker`` (an attribute or a text)."""
    body = re.search(rf'<table id="{table}">.*?</table>', html, re.S)
    assert body, html
    rows = [row for row in re.findall(r"<tr.*?</tr>", body.group(0), re.S) if marker in row]
    assert len(rows) == 1, (marker, rows)
    return str(rows[0])


@pytest.mark.frozen_clock  # a hold expires as the clock is moved, without waiting
def test_holds_show_as_held_apart_from_spent_with_their_draws_and_settles(
    api: Api, client: FlaskClient, clock: FrozenClock
) -> None:
    """An open hold is part of the loss, shown apart as held on the dataset page and the
    overview; an expired one keeps its amount, as spent; the ledger names holds, draws and
    settles, a settle with what it gave back as a negative charged amount."""
    api.make_dataset(budget={"epsilon": 1})
    api.make_dataset("plain", budget={"epsilon": 1})
    assert api.charge(epsilon=0.1).status_code == 201
    assert api.charge("plain", epsilon=0.1).status_code == 201

    def hold(amount: float, expires_in: int, purpose: str) -> str:
        body = {"dataset": "clicks", "partitions": ["p1"], "amount": {"epsilon": amount}}
        response = api.post("/v1/holds", {**body, "expires_in": expires_in, "purpose": purpose})
        assert response.status_code == 201, response.get_json()
        return str(response.get_json()["hold_id"])

    lapsing = hold(0.05, 60, "a job that never came back")
    clock.advance(60)  # expired: still charged, no longer held
    nightly = hold(0.4, 3600, "nightly report")
    drew = api.charge(hold=nightly, epsilon=0.1)
    assert drew.status_code == 201 and drew.get_json()["charged"]["epsilon"] == 0
    training = hold(0.3, 3600, "ranker v7")
    settle = api.post(f"/v1/holds/{training}/settle", {"used": {"epsilon": 0.1}})
    assert settle.status_code == 200
    budget = api.budget()
    loss, held = budget["loss"]["epsilon"], budget["held"]["epsilon"]
    assert (loss, held) == (0.65, 0.4)  # 0.1 + 0.05 expired + 0.4 open + 0.1 used
    shown = {h: api.get(f"/v1/holds/{h}").get_json() for h in (lapsing, nightly, training)}
    _sign_in(client, ADMIN_KEY)

    page = client.get("/dashboard/datasets/clicks").get_data(as_text=True)
    assert f'<span id="loss">{_shown(loss)}</span>' in page
    assert f'<span id="held">{_shown(held)}</span> epsilon is <strong>held</strong>' in page
    assert f'<span id="spent">{_shown(loss - held)}</span>' in page
    words = _text(page)
    assert "Held is part of the loss" in words and "an expired hold keeps its whole amount" in words
    chart = re.search(r'<svg class="chart loss-chart".*?</svg>', page, re.S)
    assert chart and f"loss {_shown(loss)}<" in chart.group(0)  # after the settle gave back
    listed = re.findall(r'<tr class="(\w+)" data-hold="([^"]+)"', page)
    assert listed == [("open", nightly), ("expired", lapsing), ("settled", training)]
    for hold_id, facts in shown.items():
        row = _text(_row_of(page, "holds", f'data-hold="{hold_id}"'))
        amount, drawn = facts["amount"]["epsilon"], facts["drawn"]["epsilon"]
        cells = f"{hold_id[:8]} admin p1 {_shown(amount)} {_shown(drawn)} {facts['state']}"
        assert cells in row and facts["purpose"] in row
    used, returned = shown[training]["used"]["epsilon"], shown[training]["returned"]["epsilon"]
    assert f"used {_shown(used)}, returned {_shown(returned)}" in _text(
        _row_of(page, "holds", f'data-hold="{training}"')
    )

    overview = client.get("/dashboard").get_data(as_text=True)
    clicks = _dataset_row(overview, "clicks")
    assert f'<span class="loss">{_shown(loss)}</span>' in clicks
    assert f'<span class="held-amount">{_shown(held)}</span> held' in clicks
    assert "held" not in _dataset_row(overview, "plain")

    ledger = client.get("/dashboard/ledger?dataset=clicks").get_data(as_text=True)
    kinds = dict(re.findall(r'data-id="(\d+)" data-kind="(\w+)"', ledger))
    assert sorted(kinds.values()) == ["charge", "charge", "hold", "hold", "hold", "settle"]
    for entry in api.ledger(dataset="clicks"):
        assert kinds[str(entry["id"])] == entry["kind"]
        row = _text(_row_of(ledger, "entries", f'data-id="{entry["id"]}"'))
        short, charged = (entry["hold_id"] or "")[:8], _shown(entry["charged"]["epsilon"])
        if entry["kind"] == "hold":
            assert f"hold {short}" in row and f" {charged} " in row
        elif entry["kind"] == "settle":
            assert entry["charged"]["epsilon"] == -returned
            assert f"settle of hold {short}" in row and f" {charged} given back" in row
        elif entry["hold_id"]:
            assert f"draw on hold {short}" in row and charged == "0"
            assert f" 0 drew on hold {short}, charged nothing" in row
        else:
            assert "hold" not in row


def test_a_lifetime_limit_of_0_is_shown_exhausted(api: Api, client: FlaskClient) -> None:
    """An rdp order that does not suit the budget leaves a lifetime limit of 0: nothing
    fits, so the dashboard shows it exhausted at 100%, as the budget report's at_limit says
    (it showed "0% ... ok")."""
    api.make_dataset(accounting="rdp", rdp_order=8, budget={"epsilon": 1, "delta": 1e-6})
    assert api.budget()["at_limit"] is True
    _sign_in(client, ADMIN_KEY)
    row = _dataset_row(client.get("/dashboard").get_data(as_text=True), "clicks")
    assert "exhausted" in row and "100%" in row and "ok" not in row, row


def test_a_dataset_page_shows_its_description_escaped(api: Api, client: FlaskClient) -> None:
    api.make_dataset(description="Clicks <script>alert(1)</script> & more")
    api.make_dataset("plain")
    _sign_in(client, ADMIN_KEY)
    page = client.get("/dashboard/datasets/clicks").get_data(as_text=True)
    shown = '<p id="description">Clicks &lt;script&gt;alert(1)&lt;/script&gt; &amp; more</p>'
    assert shown in page and "<script>alert" not in page
    assert 'id="description"' not in client.get("/dashboard/datasets/plain").get_data(as_text=True)

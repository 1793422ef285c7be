"""The dashboard in a real headless Chromium (Debian's package, driven by Playwright).

Screenshots of every page are written to test-artifacts/screenshots/ (not committed).
The browser comes from the system (``apt-get install chromium``, as .ci/run does).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import requests

from tests.conftest import ADMIN_KEY
from tests.server import running_service

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = Path(__file__).parent.parent / "test-artifacts" / "screenshots"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="needs Debian's chromium package (apt-get install chromium; .ci/run installs it)",
    ),
]


def _api(base: str, method: str, path: str, body: Any = None, key: str = ADMIN_KEY) -> Any:
    response = requests.request(
        method, base + path, json=body, timeout=10, headers={"Authorization": f"Bearer {key}"}
    )
    return response


def test_the_dashboard_in_a_browser(server: str) -> None:
    from playwright.sync_api import sync_playwright

    _api(
        server,
        "POST",
        "/v1/datasets",
        {
            "name": "clicks",
            "privacy_unit": "record",
            "budget": {"epsilon": 2},
            "windows": [{"period": "1d", "epsilon": 1}],
        },
    )
    _api(
        server,
        "POST",
        "/v1/datasets",
        {
            "name": "used-up",
            "privacy_unit": "user",
            "max_partitions_per_user": 2,
            "budget": {"epsilon": 0.5},
        },
    )
    _api(
        server,
        "POST",
        "/v1/datasets",
        {
            "name": "by-day",
            "privacy_unit": "record",
            "budget": {"epsilon": 5},
            "partition_budget": {"epsilon": 0.3},
        },
    )
    for _ in range(3):  # the third is denied by the partition limit
        _api(
            server,
            "POST",
            "/v1/charges",
            {
                "dataset": "by-day",
                "partitions": ["monday"],
                "mechanism": "laplace",
                "params": {"epsilon": 0.15, "sensitivity": 1},
                "input": {"values": [3.0]},
            },
        )
    for index in range(6):
        _api(
            server,
            "POST",
            "/v1/charges",
            {
                "dataset": "clicks",
                "partitions": [f"day-{index % 3}"],
                "mechanism": "laplace",
                "params": {"epsilon": 0.15, "sensitivity": 1},
                "input": {"values": [10.0]},
            },
        )
    _api(
        server,
        "POST",
        "/v1/charges",
        {
            "dataset": "used-up",
            "partitions": ["a"],
            "mechanism": "laplace",
            "params": {"epsilon": 0.5, "sensitivity": 1},
            "input": {"values": [1.0]},
        },
    )
    denied = _api(
        server,
        "POST",
        "/v1/charges",
        {
            "dataset": "used-up",
            "partitions": ["b"],
            "mechanism": "laplace",
            "params": {"epsilon": 0.1, "sensitivity": 1},
            "input": {"values": [1.0]},
        },
    )
    assert denied.status_code == 409
    assert (
        _api(
            server,
            "PATCH",
            "/v1/datasets/clicks",
            {"budget": {"epsilon": 3}, "reason": "new quarter"},
        ).status_code
        == 200
    )
    _api(
        server,
        "POST",
        "/v1/charges",
        {
            "dataset": "clicks",
            "partitions": ["day-9"],
            "mechanism": "laplace",
            "params": {"epsilon": 0.2, "sensitivity": 1},
            "input": {"values": [10.0]},
        },
    )
    service_key = _api(
        server, "POST", "/v1/consumers", {"name": "svc", "role": "service", "datasets": ["clicks"]}
    ).json()["api_key"]
    _wide_ledger_entries(server)
    _gaussian_dp_dataset(server)
    _held_dataset(server)
    _population(server)
    budgets = {
        name: _api(server, "GET", f"/v1/datasets/{name}/budget").json()
        for name in ("clicks", "used-up", "by-day", "gauss", "training")
    }
    customers = _api(server, "GET", "/v1/populations/customers/budget").json()
    SHOTS.mkdir(parents=True, exist_ok=True)
    requests_seen: list[str] = []
    console: list[str] = []  # a Content-Security-Policy violation is reported here
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        page.on("request", lambda r: requests_seen.append(r.url))
        page.on("console", lambda m: console.append(m.text))
        page.goto(server + "/dashboard")
        assert "/dashboard/sign-in" in page.url
        page.screenshot(path=str(SHOTS / "sign-in.png"), full_page=True)
        page.fill("input[name=api_key]", service_key)
        page.click("button[type=submit]")
        assert "auditor" in page.inner_text("p.error")
        page.fill("input[name=api_key]", ADMIN_KEY)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r".*/dashboard/?$"))
        row = page.locator('tr[data-dataset="clicks"]')
        assert float(row.locator(".loss").inner_text()) == budgets["clicks"]["loss"]["epsilon"]
        assert float(row.locator(".limit").inner_text()) == budgets["clicks"]["limit"]["epsilon"]
        exhausted = page.locator('tr[data-dataset="used-up"]')
        assert exhausted.locator(".badge.exhausted").count() == 1
        full = page.locator('tr[data-dataset="by-day"] .badge.exhausted')
        assert full.inner_text() == "1 partition at limit"  # its lifetime use is only 6%
        held = page.locator('tr[data-dataset="training"] .held-amount')
        assert float(held.inner_text()) == budgets["training"]["held"]["epsilon"]
        assert page.locator('tr[data-dataset="clicks"] .held').count() == 0
        group = page.locator('tr[data-population="customers"]')
        assert float(group.locator(".loss").inner_text()) == customers["loss"]["epsilon"]
        assert float(group.locator(".limit").inner_text()) == customers["limit"]["epsilon"]
        assert float(group.locator(".remaining").inner_text()) == pytest.approx(
            customers["remaining"]["epsilon"]
        )
        assert group.locator(".members").inner_text() == "2"
        assert group.locator(".badge").inner_text() == "ok"
        page.screenshot(path=str(SHOTS / "overview.png"), full_page=True)
        page.click("text=clicks")
        page.wait_for_load_state()
        assert page.locator("svg.chart").count() == 2
        assert float(page.inner_text("#loss")) == budgets["clicks"]["loss"]["epsilon"]
        assert page.locator("#partitions tbody tr").count() == 4
        _check_loss_chart(page, budgets["clicks"]["loss"]["epsilon"], [2.0, 3.0])
        page.screenshot(path=str(SHOTS / "dataset.png"), full_page=True)
        page.goto(server + "/dashboard/datasets/by-day")
        marked = page.locator('#scopes tr[data-scope="partition"]')
        assert "monday" in marked.inner_text() and "at limit" in marked.inner_text()
        page.screenshot(path=str(SHOTS / "dataset-partition-at-limit.png"), full_page=True)
        _check_one_measure(page, server, budgets["gauss"])
        _check_holds(page, server, budgets["training"])
        _check_population(page, server, customers)
        missing = page.goto(server + "/dashboard/datasets/no-such-dataset")
        assert missing is not None and missing.status == 404
        assert "no dataset named" in page.inner_text("#not-found")
        page.screenshot(path=str(SHOTS / "not-found.png"), full_page=True)
        page.goto(server + "/dashboard/datasets/clicks")
        page.click("header >> text=Ledger")
        assert page.locator("#entries tbody tr.denied").count() == 2
        ids = [
            int(i)
            for i in page.locator("#entries tbody tr").evaluate_all(
                "rows => rows.map(r => r.dataset.id)"
            )
        ]
        assert ids == sorted(ids, reverse=True) and int(page.inner_text("#count")) == len(ids)
        assert sorted(page.locator("#entries tr.denied .denied-by").all_inner_texts()) == [
            "dataset",
            "partition monday",
        ]
        page.select_option("select[name=status]", "denied")
        page.select_option("select[name=dataset]", "by-day")
        page.click("form >> text=Filter")
        page.wait_for_url(re.compile(r".*status=denied.*"))  # the filtered page, not the last
        assert page.locator("#entries tbody tr").count() == 1
        page.click("text=verify now")
        assert "verified" in page.inner_text("#chain")
        page.screenshot(path=str(SHOTS / "ledger.png"), full_page=True)
        wide = browser.new_page(viewport={"width": 1280, "height": 800})
        wide.context.add_cookies(cast(Any, page.context.cookies()))
        wide.goto(server + "/dashboard/ledger")
        assert _overflow(wide, "#entries") == 0, "the ledger table needs a scrollbar at 1280 px"
        wide.screenshot(path=str(SHOTS / "ledger-1280px.png"), full_page=True)
        wide.close()
        narrow = browser.new_page(viewport={"width": 390, "height": 844})
        narrow.context.add_cookies(cast(Any, page.context.cookies()))
        for name, path in (
            ("overview", "/dashboard"),
            ("dataset", "/dashboard/datasets/clicks"),
            ("ledger", "/dashboard/ledger"),
            ("population", "/dashboard/populations/customers"),
        ):
            narrow.goto(server + path)
            assert narrow.evaluate("document.documentElement.scrollWidth") <= 390, name
            narrow.screenshot(path=str(SHOTS / f"{name}-390px.png"), full_page=True)
        narrow.close()
        signed_out = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
        signed_out.goto(server + "/dashboard/sign-in")
        signed_out.screenshot(path=str(SHOTS / "sign-in-390px.png"), full_page=True)
        assert _overflow(signed_out, "form") == 0, "the sign-in page is wider than 390 px"
        signed_out.close()
        page.click("header >> text=Mechanisms")
        assert page.locator("#mechanisms tbody tr").count() >= 6
        page.screenshot(path=str(SHOTS / "mechanisms.png"), full_page=True)
        page.click("text=Sign out")
        page.goto(server + "/dashboard")
        assert "/dashboard/sign-in" in page.url
        browser.close()
    assert all(url.startswith(server) for url in requests_seen), [
        u for u in requests_seen if not u.startswith(server)
    ]
    assert not [text for text in console if "Content Security Policy" in text], console
    assert len(list(SHOTS.glob("*.png"))) >= 13


@pytest.fixture
def approvals_server(
    server: str, database_url: str, signing_key_file: str, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """``accountant serve`` with approvals on, on the database of ``server`` (served with
    them off), and the key of a second admin made there first: approvals need two admins to
    begin with (docs/api.md, "Approvals: two admins for a weaker promise")."""
    made = _api(server, "POST", "/v1/consumers", {"name": "second", "role": "admin"})
    assert made.status_code == 201, made.text
    env = {
        **os.environ,
        "ACCOUNTANT_DATABASE_URL": database_url,
        "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file,
        "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
        "ACCOUNTANT_LOG_LEVEL": "WARNING",
        "ACCOUNTANT_APPROVALS": "on",
    }
    with running_service(env, tmp_path / "serve-approvals.log") as running:
        yield running.base, made.json()["api_key"]


def test_approving_requests_in_a_browser(approvals_server: tuple[str, str]) -> None:
    """A second admin approves a raise and a new admin through the requests page's forms:
    the raise applies, the new admin's key is shown once; the requester's own request has
    no buttons."""
    from playwright.sync_api import sync_playwright

    server, second_key = approvals_server
    created = {"name": "clicks", "privacy_unit": "record", "budget": {"epsilon": 1}}
    assert _api(server, "POST", "/v1/datasets", created).status_code == 201
    service: dict[str, Any] = {"name": "reporter", "role": "service", "datasets": ["clicks"]}
    service["quotas"] = {"clicks": {"epsilon": 0.2}}
    service_key = _api(server, "POST", "/v1/consumers", service).json()["api_key"]
    quota = {"kind": "quota", "dataset": "clicks", "quota": {"epsilon": 0.5}}
    asks: list[tuple[str, str, str, dict[str, Any], str]] = [
        ("raise", "PATCH", "/v1/datasets/clicks", {"budget": {"epsilon": 2}}, ADMIN_KEY),
        ("admin", "POST", "/v1/consumers", {"name": "on-call", "role": "admin"}, ADMIN_KEY),
        ("quota", "POST", "/v1/requests", quota, service_key),
        ("mine", "PATCH", "/v1/datasets/clicks", {"budget": {"epsilon": 3}}, second_key),
        ("denied", "PATCH", "/v1/datasets/clicks", {"budget": {"epsilon": 9}}, ADMIN_KEY),
    ]
    asked = {}
    for name, method, path, body, key in asks:
        response = _api(server, method, path, {**body, "reason": f"the {name} request"}, key)
        assert response.status_code == 202, response.text
        asked[name] = response.json()["request_id"]
    denial = {"reason": "not this quarter"}
    denied = _api(server, "POST", f"/v1/requests/{asked['denied']}/deny", denial, second_key)
    assert denied.status_code == 200, denied.text
    SHOTS.mkdir(parents=True, exist_ok=True)
    requests_seen: list[str] = []
    console: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        page.on("request", lambda r: requests_seen.append(r.url))
        page.on("console", lambda m: console.append(m.text))
        page.goto(server + "/dashboard/sign-in")
        page.fill("input[name=api_key]", second_key)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r".*/dashboard/?$"))
        page.click("header >> text=Requests")
        page.wait_for_url(re.compile(r".*/dashboard/requests$"))
        cards = page.locator("article.request")
        assert cards.count() == 4
        for name in ("raise", "admin", "quota"):
            card = page.locator(f'article[data-request="{asked[name]}"]')
            assert card.locator("button.approve").count() == 1, name
            assert f"the {name} request" in card.locator(".reason").inner_text()
        mine = page.locator(f'article[data-request="{asked["mine"]}"]')
        assert mine.locator("button").count() == 0
        assert "another admin must approve or deny it" in mine.inner_text()
        raise_card = page.locator(f'article[data-request="{asked["raise"]}"]')
        assert "epsilon 1, delta 0 → epsilon 2" in raise_card.locator(".what").inner_text()
        row = page.locator(f'#decided tr[data-request="{asked["denied"]}"]')
        assert "not this quarter" in row.inner_text() and "denied" in row.inner_text()
        page.screenshot(path=str(SHOTS / "requests.png"), full_page=True)
        raise_card.locator("button.approve").click()  # no reason: the browser holds the form
        assert page.locator(".flash").count() == 0 and cards.count() == 4
        raise_card.locator("textarea[name=reason]").fill("budget review ok")
        with page.expect_navigation():
            raise_card.locator("button.approve").click()
        assert page.inner_text(".flash.done").startswith("Approved: admin's request to raise")
        assert cards.count() == 3
        approved = page.locator(f'#decided tr[data-request="{asked["raise"]}"]')
        assert "approved" in approved.inner_text() and "budget review ok" in approved.inner_text()
        budget = _api(server, "GET", "/v1/datasets/clicks/budget").json()
        assert budget["limit"]["epsilon"] == 2
        admin_card = page.locator(f'article[data-request="{asked["admin"]}"]')
        admin_card.locator("textarea[name=reason]").fill("on-call rota for December")
        with page.expect_navigation():
            admin_card.locator("button.approve").click()
        key = page.inner_text("#api-key")
        assert "shown this once" in page.inner_text("#new-key")
        assert "hand it to admin" in page.inner_text("#new-key")
        page.screenshot(path=str(SHOTS / "requests-new-key.png"), full_page=True)
        on_call = _api(server, "GET", "/v1/consumers/me", key=key).json()
        assert on_call["name"] == "on-call" and on_call["role"] == "admin"
        assert key not in str(page.context.cookies())
        page.goto(server + "/dashboard/requests")
        assert page.locator("#new-key").count() == 0 and key not in page.content()
        narrow = browser.new_page(viewport={"width": 390, "height": 844})
        narrow.context.add_cookies(cast(Any, page.context.cookies()))
        narrow.goto(server + "/dashboard/requests")
        assert narrow.evaluate("document.documentElement.scrollWidth") <= 390
        narrow.screenshot(path=str(SHOTS / "requests-390px.png"), full_page=True)
        narrow.close()
        requester = browser.new_context().new_page()
        requester.goto(server + "/dashboard/sign-in")
        requester.fill("input[name=api_key]", ADMIN_KEY)
        requester.click("button[type=submit]")
        requester.goto(server + "/dashboard/requests")
        own = requester.locator(f'article[data-request="{asked["quota"]}"] button.approve')
        assert own.count() == 1  # a service's request: the first admin may decide it
        assert requester.locator(f'#decided tr[data-request="{asked["raise"]}"]').count() == 1
        requester.close()
        browser.close()
    assert all(url.startswith(server) for url in requests_seen), requests_seen
    assert not [text for text in console if "Content Security Policy" in text], console


def _wide_ledger_entries(server: str) -> None:
    """Entries whose cells are the widest a ledger shows: a long dataset and consumer name,
    a small delta, limit changes of windows and of a quota."""
    name, team = "quarterly-revenue-by-region-and-product", "ads-reporting-service-eu-west"
    windows = [{"period": "1d", "epsilon": 0.5, "delta": 3e-7}, {"period": "7d", "epsilon": 1}]
    created: dict[str, Any] = {"name": name, "privacy_unit": "record", "accounting": "approx"}
    created |= {"budget": {"epsilon": 4, "delta": 1e-6}, "windows": windows}
    assert _api(server, "POST", "/v1/datasets", created).status_code == 201
    key = _api(
        server,
        "POST",
        "/v1/consumers",
        {"name": team, "role": "service", "datasets": [name], "quotas": {name: {"epsilon": 2}}},
    ).json()["api_key"]
    charge: dict[str, Any] = {"dataset": name, "partitions": ["2026-11-21", "2026-11-22"]}
    charge |= {"mechanism": "gaussian", "input": {"values": [1.0, 2.0]}}
    charge["params"] = {"epsilon": 0.123456789, "delta": 1.23e-7, "sensitivity": 1}
    assert _api(server, "POST", "/v1/charges", charge, key=key).status_code == 201
    windows[0]["epsilon"] = 0.45
    changed = {"windows": windows, "reason": "a narrower daily window for the audit period"}
    assert _api(server, "PATCH", f"/v1/datasets/{name}", changed).status_code == 200
    quota = {"quotas": {name: {"epsilon": 1.5, "delta": 2e-7}}, "reason": "shared with finance"}
    assert _api(server, "PATCH", f"/v1/consumers/{team}", quota).status_code == 200


def _gaussian_dp_dataset(server: str) -> None:
    """A gdp dataset with three Gaussian releases: mu 0.1 each, mu^2 0.01 each."""
    created: dict[str, Any] = {"name": "gauss", "privacy_unit": "record", "accounting": "gdp"}
    created["budget"] = {"epsilon": 1, "delta": 1e-6}
    assert _api(server, "POST", "/v1/datasets", created).status_code == 201
    charge: dict[str, Any] = {"dataset": "gauss", "partitions": ["a"], "mechanism": "gaussian"}
    charge |= {"params": {"sigma": 10, "sensitivity": 1}, "input": {"values": [1.0]}}
    for _ in range(3):
        assert _api(server, "POST", "/v1/charges", charge).status_code == 201


def _held_dataset(server: str) -> None:
    """A dataset with a release, an open hold a job drew on, and a hold settled below its
    amount: held is the open hold's 1, spent the release's 0.2 and the settled job's 0.2."""
    created = {"name": "training", "privacy_unit": "record", "budget": {"epsilon": 3}}
    assert _api(server, "POST", "/v1/datasets", created).status_code == 201
    charge: dict[str, Any] = {"dataset": "training", "partitions": ["2026-11"]}
    charge |= {"mechanism": "laplace", "input": {"values": [1.0]}}
    charge["params"] = {"epsilon": 0.2, "sensitivity": 1}
    assert _api(server, "POST", "/v1/charges", charge).status_code == 201
    ids = []
    for amount, purpose in ((0.5, "weekly report"), (1.0, "ranker v7, DP-SGD")):
        hold = {"dataset": "training", "partitions": ["2026-11"], "expires_in": 86400}
        hold |= {"amount": {"epsilon": amount}, "purpose": purpose}
        response = _api(server, "POST", "/v1/holds", hold)
        assert response.status_code == 201, response.text
        ids.append(response.json()["hold_id"])
    settle = {"used": {"epsilon": 0.2}}
    assert _api(server, "POST", f"/v1/holds/{ids[0]}/settle", settle).status_code == 200
    charge["params"] = {"epsilon": 0.25, "sensitivity": 1}
    assert _api(server, "POST", "/v1/charges", {**charge, "hold": ids[1]}).status_code == 201


def _population(server: str) -> None:
    """A population of two user datasets, three releases on them and a raised limit: its
    loss is 0.3 + 0.25 + 0.2 = 0.75 of 1.2 (it was 1), orders' 0.5 and sessions' 0.25."""
    created: dict[str, Any] = {"name": "customers", "privacy_unit": "user", "accounting": "pure"}
    created["budget"] = {"epsilon": 1}
    assert _api(server, "POST", "/v1/populations", created).status_code == 201
    for name in ("orders", "sessions"):
        member: dict[str, Any] = {"name": name, "privacy_unit": "user", "accounting": "pure"}
        member |= {"budget": {"epsilon": 5}, "population": "customers"}
        assert _api(server, "POST", "/v1/datasets", member).status_code == 201
    for name, epsilon in (("orders", 0.3), ("sessions", 0.25)):
        charge: dict[str, Any] = {"dataset": name, "partitions": ["2026-11"]}
        charge |= {"mechanism": "laplace", "input": {"values": [1.0]}}
        charge["params"] = {"epsilon": epsilon, "sensitivity": 1}
        assert _api(server, "POST", "/v1/charges", charge).status_code == 201
    raised = {"budget": {"epsilon": 1.2}, "reason": "a second product line"}
    assert _api(server, "PATCH", "/v1/populations/customers", raised).status_code == 200
    charge["dataset"], charge["params"] = "orders", {"epsilon": 0.2, "sensitivity": 1}
    assert _api(server, "POST", "/v1/charges", charge).status_code == 201


def _check_population(page: Any, server: str, budget: dict[str, Any]) -> None:
    """A member dataset's page links to its population; the population's page shows its
    loss against its limit (the chart ends at the API's loss, the limit's steps at 1 and
    1.2), each member's share with a link to it, its limit history and the identity rule."""
    page.goto(server + "/dashboard/datasets/orders")
    assert "customers" in page.inner_text("#population")
    scope = page.locator('#scopes tr[data-scope="population customers"]')
    assert "62.5%" in scope.inner_text()  # 0.75 of 1.2
    page.screenshot(path=str(SHOTS / "dataset-in-population.png"), full_page=True)
    page.click("#population >> text=customers")
    page.wait_for_url(re.compile(r".*/dashboard/populations/customers$"))
    assert float(page.inner_text("#loss")) == budget["loss"]["epsilon"] == 0.75
    assert float(page.inner_text("#limit")) == budget["limit"]["epsilon"] == 1.2
    assert float(page.inner_text("#remaining")) == pytest.approx(budget["remaining"]["epsilon"])
    assert "same person-level id" in page.inner_text("#identity")
    rows = page.locator("#members tbody tr")
    assert rows.count() == 2
    for name, loss in budget["datasets"].items():
        row = page.locator(f'#members tr[data-dataset="{name}"]')
        assert float(row.locator(".loss").inner_text()) == loss["epsilon"]
        share = round(100 * loss["epsilon"] / budget["loss"]["epsilon"], 1)
        assert float(row.locator(".of-loss").inner_text().rstrip("%")) == share
        assert row.locator("a").get_attribute("href") == f"/dashboard/datasets/{name}"
    _check_loss_chart(page, budget["loss"]["epsilon"], [1.0, 1.2])
    changes = page.locator("#limit-changes tbody tr").all_inner_texts()
    assert len(changes) == 2 and "a second product line" in changes[0]
    page.screenshot(path=str(SHOTS / "population.png"), full_page=True)
    page.click("#members >> text=sessions")
    page.wait_for_url(re.compile(r".*/dashboard/datasets/sessions$"))


def _check_holds(page: Any, server: str, budget: dict[str, Any]) -> None:
    """The page of a dataset with an open hold shows held apart from spent (the loss less
    held) and its holds, the open one first."""
    loss, held = budget["loss"]["epsilon"], budget["held"]["epsilon"]
    page.goto(server + "/dashboard/datasets/training")
    assert float(page.inner_text("#held")) == held == 1.0
    assert float(page.inner_text("#spent")) == pytest.approx(loss - held) == 0.4
    states = page.locator("#holds tbody td.state .badge").all_inner_texts()
    assert states == ["open", "settled"]
    assert float(page.inner_text("#holds tbody tr.open td.drawn")) == 0.25
    page.screenshot(path=str(SHOTS / "dataset-hold.png"), full_page=True)


def _check_one_measure(page: Any, server: str, budget: dict[str, Any]) -> None:
    """A gdp page shows one measure, mu^2, the one that adds: the loss, the limit, the share
    used (the meter), the loss chart and the costs are in it, with the epsilon of the loss
    and of the limit beside them; mu itself appears nowhere."""
    loss, limit = budget["loss"], budget["limit"]
    page.goto(server + "/dashboard/datasets/gauss")
    assert float(page.inner_text("#loss")) == pytest.approx(loss["mu2"], rel=1e-5)
    assert float(page.inner_text("#limit")) == pytest.approx(limit["mu2"], rel=1e-5)
    assert float(page.inner_text("#loss-epsilon")) == pytest.approx(loss["epsilon"], rel=1e-5)
    assert float(page.inner_text("#limit-epsilon")) == pytest.approx(limit["epsilon"], rel=1e-5)
    meter = page.locator('#scopes tr[data-scope="lifetime"] meter')
    assert float(meter.get_attribute("value")) == round(100 * loss["mu2"] / limit["mu2"], 1)
    assert "(ε " in page.inner_text('#scopes tr[data-scope="lifetime"] td.used')
    _check_loss_chart(page, float(f"{loss['mu2']:.6g}"), [float(f"{limit['mu2']:.6g}")])
    assert page.locator("svg.loss-chart title").text_content().endswith("(mu²) against the limit")
    assert not re.search(r"\bmu\b", page.inner_text("main"))
    page.screenshot(path=str(SHOTS / "dataset-gdp.png"), full_page=True)


def _overflow(page: Any, selector: str) -> int:
    """How many pixels the page, or the element at ``selector`` inside its scrolling box,
    is wider than what shows: 0 when nothing needs a horizontal scrollbar."""
    return int(
        page.evaluate(
            """selector => {
                const root = document.documentElement;
                const element = document.querySelector(selector);
                const box = element.closest('.scroll') || element.parentElement;
                return Math.max(
                    root.scrollWidth - root.clientWidth,
                    element.scrollWidth - element.clientWidth,
                    box.scrollWidth - box.clientWidth,
                    element.getBoundingClientRect().right - root.clientWidth,
                );
            }""",
            selector,
        )
    )


def _check_loss_chart(page: Any, api_loss: float, limits: list[float]) -> None:
    """The loss line ends at the API's loss, read back from where it is drawn on the axis
    (to within a pixel of a 224-pixel axis) and from its label; the limit's steps are drawn
    at each limit it had."""
    chart = page.locator("svg.loss-chart")
    top = float(chart.get_attribute("data-y-top"))
    plot_top = float(chart.get_attribute("data-plot-top"))
    plot_bottom = float(chart.get_attribute("data-plot-bottom"))

    def value_at(y: float) -> float:
        return (plot_bottom - y) / (plot_bottom - plot_top) * top

    last_y = float(chart.locator(".series").get_attribute("points").split()[-1].split(",")[1])
    assert abs(value_at(last_y) - api_loss) <= top / (plot_bottom - plot_top)
    assert chart.locator(".final-loss").text_content() == f"loss {api_loss:g}"
    steps = {
        round(value_at(float(point.split(",")[1])), 6)
        for point in chart.locator(".limit").get_attribute("points").split()
    }
    assert all(any(abs(s - limit) <= top / 200 for s in steps) for limit in limits), steps

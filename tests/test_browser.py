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
from typing import Any

import pytest
import requests

from tests.conftest import ADMIN_KEY
from tests.server import running_service

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = Path(__file__).parent.parent / "test-artifacts" / "screenshots"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package "
                                 "(apt-get install chromium; .ci/run installs it)")]


@pytest.fixture
def server(database_url: str, signing_key_file: str, tmp_path: Path) -> Iterator[str]:
    env = {**os.environ, "ACCOUNTANT_DATABASE_URL": database_url,
           "ACCOUNTANT_SIGNING_KEY_FILE": signing_key_file, "ACCOUNTANT_ADMIN_KEY": ADMIN_KEY,
           "ACCOUNTANT_LOG_LEVEL": "WARNING"}
    with running_service(env, tmp_path / "serve.log") as running:
        yield running.base


def _api(base: str, method: str, path: str, body: Any = None, key: str = ADMIN_KEY) -> Any:
    response = requests.request(method, base + path, json=body, timeout=10,
                                headers={"Authorization": f"Bearer {key}"})
    return response


def test_the_dashboard_in_a_browser(server: str) -> None:
    from playwright.sync_api import sync_playwright

    _api(server, "POST", "/v1/datasets", {"name": "clicks", "privacy_unit": "record",
                                          "budget": {"epsilon": 2},
                                          "windows": [{"period": "1d", "epsilon": 1}]})
    _api(server, "POST", "/v1/datasets", {"name": "used-up", "privacy_unit": "user",
                                          "max_partitions_per_user": 2,
                                          "budget": {"epsilon": 0.5}})
    for index in range(6):
        _api(server, "POST", "/v1/charges", {
            "dataset": "clicks", "partitions": [f"day-{index % 3}"], "mechanism": "laplace",
            "params": {"epsilon": 0.15, "sensitivity": 1}, "input": {"values": [10.0]}})
    _api(server, "POST", "/v1/charges", {
        "dataset": "used-up", "partitions": ["a"], "mechanism": "laplace",
        "params": {"epsilon": 0.5, "sensitivity": 1}, "input": {"values": [1.0]}})
    denied = _api(server, "POST", "/v1/charges", {
        "dataset": "used-up", "partitions": ["b"], "mechanism": "laplace",
        "params": {"epsilon": 0.1, "sensitivity": 1}, "input": {"values": [1.0]}})
    assert denied.status_code == 409
    service_key = _api(server, "POST", "/v1/consumers", {
        "name": "svc", "role": "service", "datasets": ["clicks"]}).json()["api_key"]
    budgets = {name: _api(server, "GET", f"/v1/datasets/{name}/budget").json()
               for name in ("clicks", "used-up")}
    SHOTS.mkdir(parents=True, exist_ok=True)
    requests_seen: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        page.on("request", lambda r: requests_seen.append(r.url))
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
        page.screenshot(path=str(SHOTS / "overview.png"), full_page=True)
        page.click("text=clicks")
        assert page.locator("svg.chart").count() == 2
        assert float(page.inner_text("#loss")) == budgets["clicks"]["loss"]["epsilon"]
        assert page.locator("#partitions tbody tr").count() == 3
        page.screenshot(path=str(SHOTS / "dataset.png"), full_page=True)
        page.click("header >> text=Ledger")
        assert page.locator("#entries tbody tr.denied").count() == 1
        page.select_option("select[name=status]", "denied")
        page.click("form >> text=Filter")
        assert page.locator("#entries tbody tr").count() == 1
        page.click("text=verify now")
        assert "verified" in page.inner_text("#chain")
        page.screenshot(path=str(SHOTS / "ledger.png"), full_page=True)
        page.click("header >> text=Mechanisms")
        assert page.locator("#mechanisms tbody tr").count() >= 6
        page.screenshot(path=str(SHOTS / "mechanisms.png"), full_page=True)
        page.click("text=Sign out")
        page.goto(server + "/dashboard")
        assert "/dashboard/sign-in" in page.url
        browser.close()
    assert all(url.startswith(server) for url in requests_seen), \
        [u for u in requests_seen if not u.startswith(server)]
    assert len(list(SHOTS.glob("*.png"))) >= 5

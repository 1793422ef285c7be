"""The dashboard's requests page: pending and decided requests, and an admin's decision
through its CSRF-protected form (DESIGN.md, "Approvals"; docs/dashboard.md, "Requests")."""

from __future__ import annotations

import html as markup
import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from markupsafe import escape
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from accountant.app import prepared_app
from accountant.clock import FrozenClock
from accountant.models import ChangeRequest
from tests.conftest import ADMIN_KEY, FROZEN_AT_US, Api
from tests.test_dashboard import _csrf, _sign_in, _text

WEEK_S = 7 * 24 * 3600


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(FROZEN_AT_US)


@pytest.fixture
def app(database_url: str, signing_key_file: str, clock: FrozenClock) -> Flask:
    settings = {
        "database_url": database_url,
        "admin_key": ADMIN_KEY,
        "signing_key_file": signing_key_file,
        "approvals": "on",
    }
    return prepared_app(settings, clock=clock)


@pytest.fixture
def second_key(api: Api, database_url: str, signing_key_file: str) -> str:
    """The key of another admin, made as the first admins are: before approvals apply to it
    (here by the same database served with approvals off, as tests/test_approvals.py)."""
    bootstrap = prepared_app(
        {"database_url": database_url, "admin_key": ADMIN_KEY, "signing_key_file": signing_key_file}
    )
    client = bootstrap.test_client()
    made = Api(client).post("/v1/consumers", {"name": "second", "role": "admin"})
    assert made.status_code == 201, made.get_json()
    return str(made.get_json()["api_key"])


def _signed_in(app: Flask, key: str) -> FlaskClient:
    """A browser of its own (a test client without ``with``: the ``client`` fixture's keeps
    its request context open, and only one may)."""
    browser = app.test_client()
    status, _ = _sign_in(browser, key)
    assert status == 303
    return browser


@pytest.fixture
def second(app: Flask, second_key: str) -> FlaskClient:
    """The dashboard, signed in as the second admin."""
    return _signed_in(app, second_key)


@pytest.fixture
def first(app: Flask) -> FlaskClient:
    """The dashboard, signed in as the first admin, who makes the requests here."""
    return _signed_in(app, ADMIN_KEY)


def _ask_raise(api: Api, reason: str = "Q4 report", epsilon: float = 2.0) -> str:
    asked = api.patch("/v1/datasets/clicks", {"budget": {"epsilon": epsilon}, "reason": reason})
    assert asked.status_code == 202, asked.get_json()
    return str(asked.get_json()["request_id"])


def _page(browser: FlaskClient) -> str:
    response = browser.get("/dashboard/requests")
    assert response.status_code == 200
    return response.get_data(as_text=True)


def _card(html: str, request_id: str) -> str:
    """The pending request's card."""
    found = re.search(
        rf'<article class="request"[^>]*data-request="{request_id}".*?</article>', html, re.S
    )
    assert found, html
    return found.group(0)


def _decided_row(html: str, request_id: str) -> str:
    found = re.search(rf'<tr data-request="{request_id}".*?</tr>', html, re.S)
    assert found, html
    return found.group(0)


def _decide(
    browser: FlaskClient,
    request_id: str,
    decision: str,
    reason: str,
    csrf: str | None = "from the page",
) -> Any:
    """Send the page's form, with the page's token unless ``csrf`` says otherwise (None: no
    token at all)."""
    form = {"decision": decision, "reason": reason}
    if csrf == "from the page":
        form["csrf"] = _csrf(_page(browser))
    elif csrf is not None:
        form["csrf"] = csrf
    return browser.post(f"/dashboard/requests/{request_id}/decide", data=form)


def _flash(html: str) -> str:
    found = re.findall(r'<p class="flash [a-z]+" role="[a-z]+">(.*?)</p>', html, re.S)
    assert len(found) == 1, html
    return markup.unescape(found[0])


def test_an_admin_approves_another_admins_request_through_the_form(
    api: Api, second: FlaskClient
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    request_id = _ask_raise(api)
    page = _page(second)
    card = _card(page, request_id)
    assert "dataset limits raised" in card and ">clicks</a>" in card
    assert "lifetime limit: epsilon 1, delta 0 → epsilon 2" in _text(card)
    assert "admin, 2026-03-02 10:30:00 UTC" in _text(card) and "Q4 report" in card
    assert "2026-03-09 10:30:00 UTC" in card  # when it expires
    assert card.count('type="submit"') == 2 and 'name="reason" required' in card
    answer = _decide(second, request_id, "approve", "budget review ok")
    assert answer.status_code == 303
    assert answer.headers["Location"].endswith("/dashboard/requests")
    after = second.get(answer.headers["Location"]).get_data(as_text=True)
    assert _flash(after).startswith(
        "Approved: admin's request to raise the limits of dataset “clicks”"
    )
    assert 'data-request="' + request_id + '"' not in after.split('<table id="decided">')[0]
    row = _decided_row(after, request_id)
    assert '<span class="badge ok">approved</span>' in row and "Q4 report" in row
    assert '"decided-by">second</span>' in row and '"decision-reason">budget review ok<' in row
    assert _page(second).count('class="flash') == 0  # the message is shown once
    assert api.budget()["limit"]["epsilon"] == 2.0
    [change] = [e for e in api.ledger() if e["kind"] == "limit_change"]
    detail = change["detail"]
    assert (detail["approved_by"], detail["approval_reason"]) == ("second", "budget review ok")
    assert api.get("/v1/ledger/verify").get_json()["ok"] is True
    approval = '<small class="approval">approved by second: budget review ok</small>'
    for path in ("/dashboard/datasets/clicks", "/dashboard/ledger"):
        assert approval in second.get(path).get_data(as_text=True), path


def test_an_admin_denies_a_request_and_nothing_changes(api: Api, second: FlaskClient) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    request_id = _ask_raise(api, epsilon=5.0)
    answer = _decide(second, request_id, "deny", "not this quarter")
    assert answer.status_code == 303
    after = second.get("/dashboard/requests").get_data(as_text=True)
    assert _flash(after) == (
        "Denied: admin's request to raise the limits of dataset “clicks”. Nothing changed."
    )
    row = _decided_row(after, request_id)
    assert '<span class="badge denied">denied</span>' in row
    assert '"decided-by">second</span>' in row and '"decision-reason">not this quarter<' in row
    assert "lifetime limit: to epsilon 5" in row  # what it asked; the limit stands
    assert api.budget()["limit"]["epsilon"] == 1.0
    assert not [e for e in api.ledger() if e["kind"] == "limit_change"]
    again = _decide(second, request_id, "approve", "changed my mind")
    assert again.status_code == 303
    refused = _flash(second.get("/dashboard/requests").get_data(as_text=True))
    assert refused == (
        f"Not approved: request '{request_id}' is denied: only a pending request is decided."
    )
    assert api.budget()["limit"]["epsilon"] == 1.0


def test_a_decision_without_the_forms_token_is_refused(api: Api, second: FlaskClient) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    request_id = _ask_raise(api)
    for token in (None, "", "forged"):
        refused = _decide(second, request_id, "approve", "looks fine", csrf=token)
        assert refused.status_code == 400, token
        assert "did not come from this site" in refused.get_data(as_text=True)
    other = second.application.test_client()  # another browser: a session of its own
    _sign_in(other, ADMIN_KEY)
    foreign = _decide(second, request_id, "approve", "x", csrf=_csrf(_page(other)))
    assert foreign.status_code == 400  # a token of another session is no token of this one
    assert api.get(f"/v1/requests/{request_id}").get_json()["state"] == "pending"
    assert api.budget()["limit"]["epsilon"] == 1.0


def test_the_requester_sees_no_buttons_on_their_own_request(
    api: Api, first: FlaskClient, second_key: str
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    request_id = _ask_raise(api)
    card = _card(_page(first), request_id)
    assert "<form" not in card and "<button" not in card
    assert "You made this request: another admin must approve or deny it." in card
    assert "admin (you)" in _text(card)
    forced = _decide(first, request_id, "approve", "I approve myself")  # a hand-made form
    assert forced.status_code == 303
    message = _flash(first.get("/dashboard/requests").get_data(as_text=True))
    assert message.startswith("Not approved: you made this request: another admin must")
    assert api.get(f"/v1/requests/{request_id}").get_json()["state"] == "pending"


def test_an_auditor_reads_requests_but_decides_none(app: Flask, api: Api, second_key: str) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    request_id = _ask_raise(api)
    auditor_key = api.make_consumer("aud", role="auditor")
    auditor = app.test_client()
    assert _sign_in(auditor, auditor_key)[0] == 303
    overview = auditor.get("/dashboard").get_data(as_text=True)
    assert 'href="/dashboard/requests"' in overview  # in the navigation
    page = _page(auditor)
    card = _card(page, request_id)
    assert "<form" not in card and "<button" not in card
    assert "Waiting for an admin other than admin." in card
    assert "You are signed in as an auditor" in page
    forced = _decide(auditor, request_id, "approve", "as an auditor")
    assert forced.status_code == 303
    message = _flash(auditor.get("/dashboard/requests").get_data(as_text=True))
    assert message == (
        "Not approved: only an admin approves or denies a request; you are signed in as auditor."
    )
    assert api.get(f"/v1/requests/{request_id}").get_json()["state"] == "pending"


@pytest.mark.parametrize("reason", ["", "   \n ", "x" * 1001])
def test_a_decision_needs_a_reason(api: Api, second: FlaskClient, reason: str) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    request_id = _ask_raise(api)
    answer = _decide(second, request_id, "deny", reason)
    assert answer.status_code == 303
    message = _flash(second.get("/dashboard/requests").get_data(as_text=True))
    expected = "a reason is required" if len(reason) < 1000 else "at most 1000 characters"
    assert message.startswith("Not denied: ") and expected in message
    assert api.get(f"/v1/requests/{request_id}").get_json()["state"] == "pending"


def test_a_bad_decision_or_request_id_is_a_message_not_an_error_page(
    api: Api, second: FlaskClient
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    request_id = _ask_raise(api)
    cases = {
        request_id: ("maybe", "Not decided: choose Approve or Deny."),
        "no-such-request": ("approve", "Not approved: there is no such request; reload the page."),
        "00000000-0000-4000-8000-000000000000": ("deny", "Not denied: no request with id"),
    }
    for target, (decision, expected) in cases.items():
        answer = _decide(second, target, decision, "a reason")
        assert answer.status_code == 303, target
        message = _flash(second.get("/dashboard/requests").get_data(as_text=True))
        assert message.startswith(expected), message
    assert api.get(f"/v1/requests/{request_id}").get_json()["state"] == "pending"


def test_reasons_and_names_are_escaped(api: Api, second: FlaskClient) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    hostile = '<script>alert("asked")</script><img src=x onerror=alert(1)>'
    request_id = _ask_raise(api, reason=hostile)
    page = _page(second)
    assert "<script" not in page and "<img" not in page
    assert escape(hostile) in _card(page, request_id)
    _decide(second, request_id, "deny", '"><script>alert("denied")</script>')
    after = second.get("/dashboard/requests").get_data(as_text=True)
    assert "<script" not in after and "<img" not in after
    row = _decided_row(after, request_id)
    assert escape('"><script>alert("denied")</script>') in row
    assert escape(hostile) in row


def test_an_approved_admin_key_is_shown_once_with_a_warning(
    api: Api, second: FlaskClient, second_key: str
) -> None:
    asked = api.post("/v1/consumers", {"name": "third", "role": "admin", "reason": "on call"})
    assert asked.status_code == 202, asked.get_json()
    request_id = asked.get_json()["request_id"]
    card = _card(_page(second), request_id)
    assert "new admin" in card and "a new consumer “third” of role admin" in card
    answer = _decide(second, request_id, "approve", "welcome")
    assert answer.status_code == 200  # the key is on this answer alone, never in a cookie
    shown = answer.get_data(as_text=True)
    key = re.search(r'<code class="api-key" id="api-key">([^<]+)</code>', shown)
    assert key, shown
    section = re.search(r'<section class="new-key".*?</section>', shown, re.S)
    assert section, shown
    warning = _text(section.group(0))
    assert "shown this once" in warning and "hand it to admin, who asked for it" in warning
    assert _flash(shown).startswith("Approved: admin's request to make a new admin “third”")
    assert answer.headers["Cache-Control"] == "no-store"
    cookie = second.get_cookie("accountant_session")
    assert cookie is not None and key.group(1) not in cookie.value
    third = api.as_key(markup.unescape(key.group(1)))
    assert third.get("/v1/consumers/me").get_json()["role"] == "admin"
    later = _page(second)
    assert key.group(1) not in later and 'id="new-key"' not in later
    reload = _decide(second, request_id, "approve", "welcome", csrf=_csrf(later))
    assert reload.status_code == 303  # a form sent again decides nothing, shows no key
    again = second.get("/dashboard/requests").get_data(as_text=True)
    assert key.group(1) not in again and _flash(again).startswith("Not approved: request")
    # a new key of an existing admin, likewise
    asked = api.post("/v1/consumers/second/keys", {"reason": "new laptop"})
    assert asked.status_code == 202, asked.get_json()
    card = _card(_page(second), asked.get_json()["request_id"])
    assert "a new API key for the admin “second”" in card
    other = second.application.test_client()
    _sign_in(other, markup.unescape(key.group(1)))
    issued = _decide(other, asked.get_json()["request_id"], "approve", "ok")
    assert issued.status_code == 200 and 'id="api-key"' in issued.get_data(as_text=True)


def test_expired_and_stale_requests(
    api: Api, second: FlaskClient, second_key: str, clock: FrozenClock
) -> None:
    api.make_dataset(budget={"epsilon": 1.0})
    stale = _ask_raise(api)
    lowered = api.patch("/v1/datasets/clicks", {"budget": {"epsilon": 0.9}})
    assert lowered.status_code == 200
    _decide(second, stale, "approve", "ok")
    message = _flash(second.get("/dashboard/requests").get_data(as_text=True))
    assert message.startswith("Not approved: the dataset limits of 'clicks' changed since")
    card = _card(_page(second), stale)  # still pending, against the limit now
    assert "lifetime limit: epsilon 0.9, delta 0 → epsilon 2" in _text(card)
    clock.advance(WEEK_S)
    assert _sign_in(second, second_key)[0] == 303  # a session lasts 8 hours
    page = _page(second)
    assert "No request is waiting." in page
    row = _text(_decided_row(page, stale))
    assert "expired" in row and "nobody, in time" in row
    _decide(second, stale, "approve", "late")
    late = _flash(second.get("/dashboard/requests").get_data(as_text=True))
    assert late == f"Not approved: request '{stale}' is expired: only a pending request is decided."
    assert api.budget()["limit"]["epsilon"] == 0.9


def test_population_and_quota_requests_say_what_changes(api: Api, second: FlaskClient) -> None:
    body = {"name": "customers", "privacy_unit": "user", "budget": {"epsilon": 1}}
    assert api.post("/v1/populations", body).status_code == 201
    raised = api.patch("/v1/populations/customers", {"budget": {"epsilon": 2}, "reason": "merge"})
    assert raised.status_code == 202
    api.make_dataset(budget={"epsilon": 1.0}, partition_budget={"epsilon": 0.5})
    removed = api.patch("/v1/datasets/clicks", {"partition_budget": None, "reason": "drop it"})
    assert removed.status_code == 202
    key = api.make_consumer("reporter", datasets=["clicks"], quotas={"clicks": {"epsilon": 0.2}})
    quota = {"kind": "quota", "dataset": "clicks", "quota": {"epsilon": 0.5}, "reason": "grew"}
    asked = api.as_key(key).post("/v1/requests", quota)
    assert asked.status_code == 202, asked.get_json()
    page = _page(second)
    population = _text(_card(page, raised.get_json()["request_id"]))
    assert "population limit raised" in population
    assert "population limit: epsilon 1, delta 0" in population and "→ epsilon 2" in population
    assert "partition limit: epsilon 0.5, delta 0 → none (the limit removed)" in _text(
        _card(page, removed.get_json()["request_id"])
    )
    card = _card(page, asked.get_json()["request_id"])
    assert "clicks (for reporter)" in _text(card)
    assert "quota of reporter: epsilon 0.2, delta 0 → epsilon 0.5" in _text(card)
    assert _decide(second, asked.get_json()["request_id"], "approve", "ok").status_code == 303
    message = _flash(second.get("/dashboard/requests").get_data(as_text=True))
    assert message == (
        "Approved: reporter's request to raise the quota of “reporter” on “clicks”. "
        "The change is applied."
    )
    assert api.as_key(key).get("/v1/consumers/me").get_json()["quotas"]["clicks"]["epsilon"] == 0.5


def test_the_page_needs_a_session_and_carries_the_security_headers(
    client: FlaskClient, second: FlaskClient
) -> None:
    assert client.get("/dashboard/requests").status_code == 303
    anonymous = client.post(
        "/dashboard/requests/00000000-0000-4000-8000-000000000000/decide",
        data={"decision": "approve", "reason": "x"},
    )
    assert anonymous.status_code == 303 and "/dashboard/sign-in" in anonymous.headers["Location"]
    page = second.get("/dashboard/requests")
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert "No request is waiting." in page.get_data(as_text=True)


@pytest.mark.parametrize("newer", ["denied", "pending"])
def test_a_pending_request_shows_behind_a_thousand_newer_ones(
    api: Api, second: FlaskClient, database_url: str, newer: str
) -> None:
    """Pending requests are read page by page to the last: one behind 1,001 newer requests
    (decided, or pending too) is on the page."""
    api.make_dataset(budget={"epsilon": 1.0})
    request_id = _ask_raise(api)
    engine = create_engine(database_url)
    with Session(engine) as session, session.begin():
        for n in range(1001):  # newer, as if made since
            session.add(
                ChangeRequest(
                    id=f"newer-{n:04d}",
                    kind="quota",
                    target="clicks",
                    change={},
                    target_sha256="0" * 64,
                    reason="r",
                    requested_by_name="admin",
                    state=newer,
                    created_at=FROZEN_AT_US + 1 + n,
                    expires_at=FROZEN_AT_US + WEEK_S * 1_000_000,
                )
            )
    engine.dispose()
    assert "dataset limits raised" in _card(_page(second), request_id)

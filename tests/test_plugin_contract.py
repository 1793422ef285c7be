"""The plugin contract, checked for every hook and every registered mechanism: each hook
spec is documented and called, and each mechanism (built-in or third-party) keeps the
promises the accountant relies on."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from accountant import hookimpl, hookspecs
from accountant.alerts import AlertSettings, BudgetAlert
from accountant.app import prepared_app
from accountant.mechanism import Accuracy, Cost, Mechanism, PrivacyContext
from accountant.noise import from_bytes
from accountant.plugins import MechanismRegistry, make_plugin_manager
from accountant.services import charge_responses
from tests.conftest import ADMIN_KEY, Api
from tests.test_mechanisms import ACCOUNTING_ONLY, CASES

#: Every registered mechanism needs a valid request here: (mode, params, input).
REQUESTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    name: (mode, params, data) for name, (mode, params, data, _key) in CASES.items()
} | {"bounded_sum": ("pure", {"epsilon": 0.5, "lower": 0, "upper": 10}, {"values": [1, 2, 100]})}
REGISTRY = MechanismRegistry(*make_plugin_manager())
HOOKS = sorted(name for name in dir(hookspecs) if name.startswith("accountant_"))


def _decimals(value: Any) -> Any:
    """Numbers as the JSON layer hands them to a mechanism: floats as Decimal."""
    return json.loads(json.dumps(value), parse_float=Decimal)


def test_every_registered_mechanism_has_a_request_here() -> None:
    assert {m.name for m in REGISTRY.all()} == set(REQUESTS) | set(ACCOUNTING_ONLY)


@pytest.mark.parametrize("name", sorted(ACCOUNTING_ONLY))
def test_every_accounting_only_mechanism_keeps_the_contract(name: str) -> None:
    """A cost that is pure, deterministic and positive in each mode it lists, and no run."""
    mechanism = REGISTRY.get(name)
    assert isinstance(mechanism, Mechanism) and not mechanism.runs and mechanism.run is None
    _mode, params = ACCOUNTING_ONLY[name]
    params = _decimals(params)
    Draft202012Validator(dict(mechanism.params_schema)).validate(params)
    context = PrivacyContext("record", "rdp", Decimal(8))
    cost = mechanism.cost(params, context)
    assert isinstance(cost, Cost) and cost == mechanism.cost(params, context)
    assert cost.rdp is not None and cost.rdp > 0
    with pytest.raises(TypeError, match="accounting-only"):
        mechanism.runner()


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_every_mechanism_keeps_the_contract(name: str) -> None:
    mechanism = REGISTRY.get(name)
    assert isinstance(mechanism, Mechanism)
    mode, params, data = REQUESTS[name]
    params, data = _decimals(params), _decimals(data)
    assert mechanism.implementation == f"{mechanism.plugin}/{name}/" + (
        mechanism.version or mechanism.implementation.rsplit("/", 1)[-1]
    )
    Draft202012Validator(dict(mechanism.params_schema)).validate(params)
    Draft202012Validator(dict(mechanism.input_schema)).validate(data)
    # cost: pure and deterministic, a Cost with finite non-negative parts
    assert mode in mechanism.accounting
    context = PrivacyContext("record", mode)
    cost = mechanism.cost(params, context)
    assert isinstance(cost, Cost) and cost == mechanism.cost(params, context)
    assert cost.epsilon >= 0 and cost.delta >= 0 and (cost.rho is None or cost.rho >= 0)
    if mechanism.check_input is not None:
        mechanism.check_input(data)
    if mechanism.prepare is not None:
        mechanism.prepare(params, data)
        mechanism.prepare(params, None)  # a preview without input
    # accuracy, if stated: an Accuracy (or None) with or without input, as plain JSON
    if mechanism.accuracy is not None:
        for shape in (data, None):
            stated = mechanism.accuracy(params, shape)
            assert stated is None or isinstance(stated, Accuracy)
            if stated is not None:
                json.dumps(charge_responses.as_json(stated), allow_nan=False)
    # run: the same output for the same charge's random words (what a replay relies on),
    # plain JSON without NaN or infinities
    noise = from_bytes(b"k" * 32)
    first = mechanism.runner()(params, data, noise.source_for("charge-1"))
    again = mechanism.runner()(params, data, noise.source_for("charge-1"))
    text = json.dumps(first, sort_keys=True, allow_nan=False)
    assert text == json.dumps(again, sort_keys=True, allow_nan=False)
    assert isinstance(first, dict)


class _Recorder:
    """A plugin implementing every hook, recording each call."""

    def __init__(self) -> None:
        self.calls: dict[str, list[dict[str, Any]]] = {}

    @hookimpl
    def accountant_register_mechanisms(self) -> list[Mechanism]:
        self.calls.setdefault("accountant_register_mechanisms", []).append({})
        return []

    @hookimpl
    def accountant_budget_alert(self, alert: BudgetAlert, alerting: AlertSettings) -> None:
        self.calls.setdefault("accountant_budget_alert", []).append(
            {"alert": alert, "alerting": alerting}
        )


def test_every_hook_is_implemented_by_the_recorder() -> None:
    assert sorted(name for name in vars(_Recorder) if name.startswith("accountant_")) == HOOKS


def test_every_hook_is_called_with_what_its_spec_promises(
    database_url: str, signing_key_file: str
) -> None:
    recorder = _Recorder()
    app = prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
            "alert_thresholds": (50,),
        },
        extra_plugins=[("recorder", recorder)],
    )
    api = Api(app.test_client())
    api.make_dataset(budget={"epsilon": 1})
    assert api.charge(epsilon=0.6).status_code == 201
    assert set(recorder.calls) == set(HOOKS)
    [call] = recorder.calls["accountant_budget_alert"]
    assert call["alert"].scope == "dataset" and call["alert"].threshold == 50
    # the alert hook sees the alert settings and nothing else of the configuration
    alerting = call["alerting"]
    assert isinstance(alerting, AlertSettings) and alerting.thresholds == (50,)
    assert ADMIN_KEY not in repr(alerting) and database_url not in repr(alerting)


def test_one_failing_alert_plugin_reaches_neither_the_others_nor_the_charge(
    database_url: str, signing_key_file: str
) -> None:
    class Failing:
        @hookimpl
        def accountant_budget_alert(self, alert: BudgetAlert) -> None:
            raise RuntimeError("a plugin's bug")

    recorder = _Recorder()
    app = prepared_app(
        {
            "database_url": database_url,
            "admin_key": ADMIN_KEY,
            "signing_key_file": signing_key_file,
            "alert_thresholds": (50,),
        },
        extra_plugins=[("recorder", recorder), ("failing", Failing())],
    )
    api = Api(app.test_client())
    api.make_dataset(budget={"epsilon": 1})
    assert api.charge(epsilon=0.6).status_code == 201
    assert len(recorder.calls["accountant_budget_alert"]) == 1

"""The plugin contract end to end, with an out-of-tree plugin installed like a third party's."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from accountant.app import prepared_app
from accountant.plugins import MechanismRegistry, make_plugin_manager
from tests.conftest import ADMIN_KEY, Api

BIN = Path(sys.executable).parent / "accountant"


def test_the_example_is_an_installed_distribution_with_an_entry_point() -> None:
    distribution = importlib.metadata.distribution("accountant-example-bounded-sum")
    points = [ep for ep in distribution.entry_points if ep.group == "accountant"]
    assert [(ep.name, ep.value) for ep in points] == [("bounded_sum", "accountant_example")]
    registry = MechanismRegistry(*make_plugin_manager())
    mechanism = registry.get("bounded_sum")
    assert mechanism is not None and mechanism.plugin == "bounded_sum"


def test_the_example_charges_and_runs_through_the_api(api: Api, client: FlaskClient) -> None:
    api.make_dataset(budget={"epsilon": 1})
    listed = {m["name"] for m in api.get("/v1/mechanisms").get_json()["mechanisms"]}
    assert "bounded_sum" in listed
    params = {"epsilon": 0.5, "lower": 0, "upper": 10}
    response = api.charge(mechanism="bounded_sum", params=params, input={"values": [1, 2, 100]})
    assert response.status_code == 201, response.get_json()
    output = response.get_json()["output"]
    assert abs(output["sum"] - 13) < 400  # clamped: 1 + 2 + 10, plus Laplace of scale 20
    assert (output["sum"] / output["grid"]).is_integer()
    assert api.budget()["loss"]["epsilon"] == 0.5
    refused = api.charge(
        mechanism="bounded_sum", params={**params, "lower": 20}, input={"values": [1]}
    )
    assert refused.status_code == 400 and "lower must be below upper" in refused.text


def test_disabling_the_example_by_configuration(database_url: str) -> None:
    app = prepared_app(
        {"database_url": database_url, "admin_key": ADMIN_KEY, "disabled_plugins": ("bounded_sum",)}
    )
    names = {
        m["name"] for m in Api(app.test_client()).get("/v1/mechanisms").get_json()["mechanisms"]
    }
    assert "bounded_sum" not in names and "laplace" in names


@pytest.fixture
def broken_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A third-party distribution whose plugin module raises on import."""
    (tmp_path / "exploding_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    info = tmp_path / "exploding_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: exploding-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[accountant]\nexploding = exploding_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_plugin_that_raises_on_import_is_refused_not_fatal(
    broken_distribution: Path, database_url: str
) -> None:
    _, refusals = make_plugin_manager()
    assert [(r.plugin, "boom at import" in r.reason) for r in refusals] == [("exploding", True)]
    app = prepared_app({"database_url": database_url, "admin_key": ADMIN_KEY})
    mechanisms = Api(app.test_client()).get("/v1/mechanisms").get_json()["mechanisms"]
    assert "laplace" in {m["name"] for m in mechanisms}
    env = {**os.environ, "PYTHONPATH": str(broken_distribution)}
    listing = subprocess.run([BIN, "plugins", "list"], env=env, capture_output=True, text=True)
    assert listing.returncode == 1
    assert "REFUSED exploding" in listing.stdout and "laplace" in listing.stdout

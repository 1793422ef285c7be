"""The plugin manager: built-ins register through the entry-point group like anyone else."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from accountant import hookimpl
from accountant.mechanism import Cost, Mechanism
from accountant.plugins import ENTRY_POINT_GROUP, MechanismRegistry, make_plugin_manager

PLUGINS = Path(__file__).parent.parent / "plugins"


def test_every_builtin_module_is_an_entry_point() -> None:
    modules = {p.stem for p in PLUGINS.glob("*.py") if not p.stem.startswith("_")} - {"samplers"}
    points = {
        ep.name: ep.value
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if ep.value.startswith("accountant_plugins.")
    }
    assert set(points) == modules
    assert all(value == f"accountant_plugins.{name}" for name, value in points.items())


def test_disabling_an_entry_point_removes_its_mechanism() -> None:
    registry = MechanismRegistry(*make_plugin_manager(disabled=["gaussian"]))
    assert "gaussian" not in {m.name for m in registry.all()}
    assert "laplace" in {m.name for m in registry.all()}


class _Broken:
    @hookimpl
    def accountant_register_mechanisms(self) -> list[object]:
        good = Mechanism(
            "fine",
            "ok",
            {"type": "object"},
            {"type": "object"},
            ("pure",),
            cost=lambda p, c: Cost(epsilon=1),
            run=lambda p, d, r: {},
        )
        return [
            good,
            Mechanism(
                "laplace",
                "a duplicate",
                {"type": "object"},
                {"type": "object"},
                ("pure",),
                cost=lambda p, c: Cost(epsilon=1),
                run=lambda p, d, r: {},
            ),
            Mechanism(
                "bad_schema",
                "x",
                {"type": 5},
                {"type": "object"},
                ("pure",),
                cost=lambda p, c: Cost(epsilon=1),
                run=lambda p, d, r: {},
            ),
            Mechanism(
                "no_cost",
                "x",
                {"type": "object"},
                {"type": "object"},
                ("pure",),
                cost=None,  # type: ignore[arg-type]  # the registry must refuse a missing cost
                run=lambda p, d, r: {},
            ),
            Mechanism(
                "odd_mode",
                "x",
                {"type": "object"},
                {"type": "object"},
                ("renyi",),
                cost=lambda p, c: Cost(epsilon=1),
                run=lambda p, d, r: {},
            ),
            "not a mechanism",
        ]


def test_the_registry_refuses_bad_mechanisms_and_keeps_the_rest() -> None:
    registry = MechanismRegistry(*make_plugin_manager(extra_plugins=[("broken", _Broken())]))
    assert {"fine", "gaussian", "laplace"} <= {m.name for m in registry.all()}
    laplace = registry.get("laplace")
    assert laplace is not None and laplace.plugin == "laplace"
    refused = {r.mechanism: r.reason for r in registry.refusals}
    assert "duplicate" in refused["laplace"]
    assert "JSON Schema" in refused["bad_schema"]
    assert "cost" in refused["no_cost"]
    assert "accounting" in refused["odd_mode"]
    assert any("not a Mechanism" in r.reason for r in registry.refusals)


def test_every_hook_is_documented() -> None:
    from accountant import hookspecs

    docs = (PLUGINS.parent / "docs" / "plugins.md").read_text()
    hooks = [name for name in dir(hookspecs) if name.startswith("accountant_")]
    assert hooks and all(f"`{name}(" in docs for name in hooks)
    assert all(getattr(hookspecs, name).__doc__ for name in hooks)

"""The plugin manager and the typed mechanism registry.

Two places call ``pm.hook``: ``MechanismRegistry`` here, which validates what each
plugin's ``accountant_register_mechanisms`` returns, and ``alerts.AlertDispatcher``,
which calls ``accountant_budget_alert`` one plugin at a time so that one plugin's failure
reaches no other. Every other module reaches plugins through these two.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import pluggy
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from accountant import hookspecs
from accountant.accounting.modes import MODES
from accountant.mechanism import Mechanism

ENTRY_POINT_GROUP = "accountant"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    """A plugin or mechanism the registry would not accept, and why."""

    plugin: str
    mechanism: str | None
    reason: str


def make_plugin_manager(
    disabled: Iterable[str] = (), extra_plugins: Iterable[tuple[str, object]] = ()
) -> tuple[pluggy.PluginManager, list[Refusal]]:
    """Load every plugin of the entry-point group, except the disabled ones.

    A plugin that fails to import is refused and reported, never fatal.
    ``extra_plugins`` registers objects directly (tests use it for plugins
    that are not installed as distributions).
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    refusals: list[Refusal] = []
    skip = set(disabled)
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name in skip or pm.get_plugin(entry_point.name) is not None:
            continue
        try:
            plugin = entry_point.load()
        except Exception as error:  # a third-party import may raise anything
            refusals.append(Refusal(entry_point.name, None, f"import failed: {error!r}"))
            log.error("plugin refused", extra={"plugin": entry_point.name, "error": repr(error)})
            continue
        pm.register(plugin, name=entry_point.name)
    for name, plugin in extra_plugins:
        pm.register(plugin, name=name)
    pm.check_pending()
    return pm, refusals


class MechanismRegistry:
    """The validated mechanisms of all plugins, by name, and what was refused (a plugin that
    failed to import, a mechanism that failed validation)."""

    def __init__(self, pm: pluggy.PluginManager, refusals: Iterable[Refusal] = ()) -> None:
        self.refusals: list[Refusal] = list(refusals)
        self._mechanisms: dict[str, Mechanism] = {}
        for impl in pm.hook.accountant_register_mechanisms.get_hookimpls():
            plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
            try:
                offered = list(cast(Iterable[object], impl.function()))
            except Exception as error:
                self._refuse(plugin_name, None, f"accountant_register_mechanisms raised {error!r}")
                continue
            for mechanism in offered:
                self._admit(plugin_name, mechanism, impl.plugin)

    def _refuse(self, plugin: str, mechanism: str | None, reason: str) -> None:
        self.refusals.append(Refusal(plugin, mechanism, reason))
        log.error(
            "mechanism refused", extra={"plugin": plugin, "mechanism": mechanism, "reason": reason}
        )

    def _admit(self, plugin: str, mechanism: Any, plugin_object: object) -> None:
        if not isinstance(mechanism, Mechanism):
            self._refuse(plugin, None, f"not a Mechanism: {mechanism!r}")
            return
        problem = _problem_with(mechanism)
        if problem is None and mechanism.name in self._mechanisms:
            owner = self._mechanisms[mechanism.name].plugin
            problem = f"duplicate name, already provided by {owner}"
        if problem is not None:
            self._refuse(plugin, getattr(mechanism, "name", None), problem)
            return
        version = mechanism.version or _distribution_version(plugin_object)
        self._mechanisms[mechanism.name] = dataclasses.replace(
            mechanism, plugin=plugin, implementation=f"{plugin}/{mechanism.name}/{version}"
        )

    def get(self, name: str) -> Mechanism | None:
        return self._mechanisms.get(name)

    def all(self) -> list[Mechanism]:
        return [self._mechanisms[name] for name in sorted(self._mechanisms)]


def _distribution_version(plugin: object) -> str:
    """ "name==version" of the distribution that ships ``plugin``'s module, for mechanisms that
    declare no version of their own: then any upgrade of that package counts as a new
    implementation (replays of older charges are refused, never answered with new noise)."""
    module = getattr(plugin, "__name__", None) or type(plugin).__module__
    top = module.split(".")[0]
    for distribution in _distributions_of(tuple(sys.path)).get(top, []):
        return f"{distribution}=={importlib.metadata.version(distribution)}"
    return "unversioned"


@lru_cache(maxsize=4)
def _distributions_of(path: tuple[str, ...]) -> Mapping[str, list[str]]:
    """The distributions that ship each top-level package on ``path`` (``sys.path``, the
    key: read again when it changes). Reading them takes a third of a second, which every
    app made in one process would pay; the versions themselves are read each time."""
    return importlib.metadata.packages_distributions()


def _problem_with(mechanism: Mechanism) -> str | None:
    if not isinstance(mechanism.name, str) or not _NAME.match(mechanism.name):
        return f"name must match {_NAME.pattern}, got {mechanism.name!r}"
    if not callable(mechanism.cost):
        return "cost is not callable"
    if mechanism.run is not None and not callable(mechanism.run):
        return "run is not callable (leave it out for an accounting-only mechanism)"
    if mechanism.prepare is not None and not callable(mechanism.prepare):
        return "prepare is not callable"
    if mechanism.accuracy is not None and not callable(mechanism.accuracy):
        return "accuracy is not callable"
    if not isinstance(mechanism.version, str) or len(mechanism.version) > 100:
        return "version must be a string of at most 100 characters"
    unknown = set(mechanism.accounting) - set(MODES)
    if not mechanism.accounting or unknown:
        return (
            f"accounting must be a non-empty subset of {sorted(MODES)}, got {mechanism.accounting}"
        )
    for label, schema in (
        ("params_schema", mechanism.params_schema),
        ("input_schema", mechanism.input_schema),
    ):
        try:
            problem = _schema_problem(dict(schema))
        except TypeError as error:
            problem = str(error)
        if problem is not None:
            return f"{label} is not a valid JSON Schema: {problem}"
        if dict(schema).get("type") != "object":
            return f"{label} must describe an object"
    return None


def _schema_problem(schema: dict[str, Any]) -> str | None:
    """What ``check_schema`` finds wrong with ``schema`` (None: nothing), remembered for a
    schema of JSON values by its ``repr``, which tells such values apart (a tuple from a
    list), since every app a process makes admits the same plugins again."""
    try:
        json.dumps(schema)
    except (TypeError, ValueError):
        return _checked(schema)
    text = repr(schema)
    if text not in _CHECKED:
        _CHECKED[text] = _checked(schema)
    return _CHECKED[text]


#: ``_schema_problem``'s verdicts, by the schema's ``repr``.
_CHECKED: dict[str, str | None] = {}


def _checked(schema: dict[str, Any]) -> str | None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        return str(error.message)
    return None

"""A dataset's accounting terms, and the digest kept with them to catch a direct edit.

The terms are everything that decides what a charge may spend: the privacy unit, the
accounting mode (with its rdp order, or its composition and delta'), the contribution
bounds, the lifetime, partition and window limits in exact units, and the population the
dataset belongs to. Their SHA-256 (of
sorted-key JSON) is stored with the dataset when it is created and whenever a PATCH changes
a limit, and each limit change's ledger entry records it, inside the hash chain. ``ledger
verify`` recomputes it: a limit edited in the database behind the service's back no longer
matches (docs/ledger.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from accountant.models import Dataset

FIELDS = (
    "privacy_unit",
    "accounting",
    "rdp_order",
    "composition",
    "composition_delta",
    "max_partitions_per_user",
    "max_records_per_user",
    "limit_epsilon",
    "limit_delta",
    "limit_rho",
    "has_partition_limit",
    "partition_limit_epsilon",
    "partition_limit_delta",
    "partition_limit_rho",
    "population_id",
)


def digest_of(values: Mapping[str, Any], windows: Iterable[Iterable[Any]]) -> str:
    """The digest of a dataset row's ``FIELDS`` and its window budgets, given as
    (period_seconds, limit_epsilon, limit_delta, limit_rho)."""
    content = {name: values.get(name) for name in FIELDS}
    if content["rdp_order"] is None:  # digests of datasets other than rdp stay as they were
        del content["rdp_order"]
    if content["composition"] in (None, "basic"):  # and those of basic composition
        del content["composition"], content["composition_delta"]
    if content["population_id"] is None:  # and those outside a population
        del content["population_id"]
    content["has_partition_limit"] = bool(content["has_partition_limit"])
    content["windows"] = sorted([list(window) for window in windows])
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def digest(dataset: Dataset) -> str:
    return digest_of(
        {name: getattr(dataset, name) for name in FIELDS},
        [(w.period_seconds, w.limit_epsilon, w.limit_delta, w.limit_rho) for w in dataset.windows],
    )

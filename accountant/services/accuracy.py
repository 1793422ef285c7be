"""The accuracy a grant, preview or plan states: the mechanism's ``Accuracy`` as JSON.

Figures are doubles rounded toward the safe side: a half-width up (it still
covers 95%), a probability of the truth down, a scale and a grid to nearest.
A figure beyond the largest double is null. A mechanism that states no
accuracy, or whose ``accuracy`` fails (logged as a bug of the plugin), is
answered with null: accuracy not stated, never a guess.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any

from accountant.mechanism import CONFIDENCE, Accuracy, Mechanism, Number

log = logging.getLogger(__name__)


def stated(
    mechanism: Mechanism, run_params: Mapping[str, Any], data: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """What ``mechanism`` states of its accuracy at the parameters it runs with (after
    ``prepare`` accepted them), for ``data``'s shape (None: no input sent)."""
    if mechanism.accuracy is None:
        return None
    try:
        accuracy = mechanism.accuracy(run_params, data)
        return None if accuracy is None else as_json(accuracy)
    except Exception:  # informative only: a plugin's failure here must not fail the answer
        log.exception(
            "mechanism %r (plugin %r) failed to state its accuracy; answered with null",
            mechanism.name,
            mechanism.plugin,
        )
        return None


def as_json(accuracy: Accuracy) -> dict[str, Any]:
    if not isinstance(accuracy, Accuracy):
        raise TypeError(f"accuracy must return an Accuracy or None, not {accuracy!r}")
    try:
        return dict(_json(accuracy))
    except TypeError:  # a field that cannot be hashed: not cached
        return _json.__wrapped__(accuracy)


@lru_cache(maxsize=4096)  # the built-ins cache their Accuracy: the same few, charge after charge
def _json(accuracy: Accuracy) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": str(accuracy.kind),
        "distribution": str(accuracy.distribution),
        "scale": _double(accuracy.scale, 0),
        "half_width_95": _double(accuracy.half_width, 1),
        "confidence": float(CONFIDENCE),
        "exact": bool(accuracy.exact),
    }
    if accuracy.grid is not None:
        body["grid"] = _double(accuracy.grid, 0)
    if accuracy.candidates is not None:
        body["candidates"] = int(accuracy.candidates)
    if accuracy.categories is not None:
        body["categories"] = int(accuracy.categories)
    if accuracy.probability_true is not None:
        body["probability_true"] = _double(accuracy.probability_true, -1)
    return body


def _double(value: Number | None, direction: int) -> float | None:
    """``value`` as the nearest double (``direction`` 0), the least double at or above it (1)
    or the largest at or below it (-1); None when there is none."""
    if value is None:
        return None
    exact = Fraction(value)
    try:
        near = float(exact)
    except OverflowError:
        return None
    if direction > 0 and Fraction(near) < exact:
        near = math.nextafter(near, math.inf)
    elif direction < 0 and Fraction(near) > exact:
        near = math.nextafter(near, -math.inf)
    return near if math.isfinite(near) else None

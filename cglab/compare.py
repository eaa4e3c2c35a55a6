"""How a difference from eager is judged and written, NaN-proof (``d > tolerance`` is False for a NaN, and
``max`` may drop one): verdicts ask ``exceeds`` and ``worst``, JSON goes through ``dumps``. Free of torch."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

# Why a run with a NaN or an infinity diverged. The eager reference is taken as sound.
NON_FINITE = "the graph runner produced NaN/inf"


def exceeds(difference: float, tolerance: float) -> bool:
    """Whether ``difference`` is a divergence: above ``tolerance``, or NaN (never "within" anything)."""
    return not difference <= tolerance


def worst(differences: Iterable[float]) -> float | None:
    """The largest difference, NaN if any is NaN; None if there are none."""
    return max(differences, key=lambda d: (math.isnan(d), d), default=None)


class HasState(Protocol):
    def state_tensors(self) -> dict[str, torch.Tensor]: ...


def state_differences(runner: HasState, reference: HasState) -> dict[str, float]:
    """Largest absolute difference of every cache and state tensor between two runners (NaN stays NaN)."""
    ref = reference.state_tensors()
    return {name: (t.float() - ref[name].float()).abs().max().item() for name, t in runner.state_tensors().items()}


def json_safe(value: Any) -> Any:
    """``value`` with each NaN or infinity as a string ``float()`` reads back: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` of ``json_safe(value)``, refusing any non-finite number that slipped through."""
    return json.dumps(json_safe(value), allow_nan=False, **options)

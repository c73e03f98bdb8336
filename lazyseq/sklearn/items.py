"""What a batch holds for scikit-learn: ``(X, y)``, ``(X, y, sample_weight)`` or ``X`` alone."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

__all__ = ["ITEM_SHAPES", "fields"]

ITEM_SHAPES = "(X, y), (X, y, sample_weight) or X alone"


def fields(batch: Any, where: str) -> tuple[Any, Any, Any]:
    """``(X, y, sample_weight)`` of a batch, ``None`` for what it does not hold."""
    if isinstance(batch, (tuple, list)):
        if len(batch) == 2:
            return batch[0], batch[1], None
        if len(batch) == 3:
            return batch[0], batch[1], batch[2]
        raise ValueError(f"{where} is a {type(batch).__name__} of {len(batch)} items; it must be {ITEM_SHAPES}")
    if batch is None or isinstance(batch, (Mapping, str, bytes, numbers.Number)) or getattr(batch, "ndim", None) == 0:
        raise TypeError(f"{where} is a {type(batch).__name__}; it must be {ITEM_SHAPES}")
    return batch, None, None

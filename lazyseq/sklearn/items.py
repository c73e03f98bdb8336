"""What a batch holds for scikit-learn: ``(X, y)``, ``(X, y, sample_weight)`` or ``X`` alone."""

from __future__ import annotations

import numbers
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["ITEM_SHAPES", "features", "fields", "rows_of"]

ITEM_SHAPES = "(X, y), (X, y, sample_weight) or X alone"


def fields(batch: Any, where: str) -> tuple[Any, Any, Any]:
    """``(X, y, sample_weight)`` of a batch, ``None`` for what it does not hold."""
    if _tensor_rows(batch):  # tensor items, batched: X alone
        return rows_of(batch), None, None
    if isinstance(batch, (tuple, list)):
        if len(batch) == 2:
            return rows_of(batch[0]), rows_of(batch[1]), None
        if len(batch) == 3:
            return rows_of(batch[0]), rows_of(batch[1]), rows_of(batch[2])
        raise ValueError(f"{where} is a {type(batch).__name__} of {len(batch)} items; it must be {ITEM_SHAPES}")
    if batch is None or isinstance(batch, (Mapping, str, bytes, numbers.Number)) or getattr(batch, "ndim", None) == 0:
        raise TypeError(f"{where} is a {type(batch).__name__}; it must be {ITEM_SHAPES}")
    return batch, None, None


def features(batch: Any) -> Any:
    """X of a batch: the batch itself, or its first field."""
    if isinstance(batch, (tuple, list)) and not _tensor_rows(batch):
        return rows_of(batch[0])
    return rows_of(batch)


def _tensor_rows(batch: Any) -> bool:
    """Whether ``batch`` is a list of tensor items, rows of X (``view.batch`` makes one), rather than of fields.

    The rows are tensors of one shape, each a row of X (at most one
    dimension); fields are a 2-D X and its targets (and weights).
    """
    if not _tensors(batch):
        return False
    shape = batch[0].shape
    return len(shape) <= 1 and all(x.shape == shape for x in batch)


def rows_of(field: Any) -> Any:
    """``field``, or one array of the torch tensors it lists (``view.batch`` makes a list of tensor items or fields).

    >>> import numpy as np
    >>> rows_of([np.zeros(2), np.ones(2)])  # not tensors: as it is
    [array([0., 0.]), array([1., 1.])]
    """
    if _tensors(field):
        return sys.modules["torch"].stack(field).numpy(force=True)
    return field


def _tensors(values: Any) -> bool:
    """Whether ``values`` is a non-empty list of torch tensors (only where torch was imported)."""
    if type(values) is not list or not values:
        return False
    torch = sys.modules.get("torch")
    return torch is not None and all(isinstance(x, torch.Tensor) for x in values)

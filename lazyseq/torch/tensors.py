"""Numpy batches as torch tensors, sharing their memory instead of copying it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["to_tensors"]

# The dtypes torch.from_numpy accepts (in native byte order); other arrays are left as they are.
_TORCH_DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
)


def to_tensors(batch: Any) -> Any:
    """``batch`` with every numpy array replaced by a tensor that shares its memory (``torch.from_numpy``).

    Arrays may be nested in tuples, lists, namedtuples and dicts; the
    structure is kept (a dict subclass comes back as a plain dict). The
    tensor keeps its array alive, so a batch that a process loader delivered
    in a shared-memory slot keeps that slot until the tensor is gone.

    Three kinds of arrays are copied, because torch cannot share them:
    read-only arrays (a memory map opened with ``mmap_mode="r"``: writing
    through the tensor would crash, and torch warns), arrays with negative
    strides (``a[::-1]``) and arrays in non-native byte order. Arrays of
    dtypes torch has no tensor for (strings, objects, dates) and everything
    that is not an array (numbers, strings, tensors) are returned unchanged.

    >>> import numpy as np
    >>> from lazyseq.torch import to_tensors
    >>> x = np.arange(6.0).reshape(3, 2)
    >>> batch = to_tensors({"x": x, "y": np.array([1, 0, 1]), "name": "train"})
    >>> batch["x"].dtype, batch["y"].tolist(), batch["name"]
    (torch.float64, [1, 0, 1], 'train')
    >>> x[0, 0] = 10.0  # shared memory: the tensor sees the change
    >>> batch["x"][0, 0].item()
    10.0
    """
    kind = type(batch)
    if isinstance(batch, np.ndarray):
        return _tensor(batch)
    if kind is tuple or kind is list:
        return kind(to_tensors(x) for x in batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return kind(*(to_tensors(x) for x in batch))
    if isinstance(batch, Mapping):
        return {key: to_tensors(value) for key, value in batch.items()}
    if isinstance(batch, list):
        return [to_tensors(x) for x in batch]
    return batch


def _tensor(array: np.ndarray) -> Any:
    dtype = array.dtype
    if dtype not in _TORCH_DTYPES:
        native = dtype.newbyteorder("=")
        if native not in _TORCH_DTYPES:
            return array  # no tensor type for it: strings, objects, dates, structured
        return torch.from_numpy(array.astype(native))
    if not array.flags.writeable or any(stride < 0 for stride in array.strides):
        return torch.from_numpy(np.array(array))  # a writable, positively strided copy
    return torch.from_numpy(array)

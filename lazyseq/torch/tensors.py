"""Numpy batches as torch tensors, sharing their memory instead of copying it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..nested import is_plain_array, map_leaves

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

    Arrays may be nested in tuples, lists, namedtuples and mappings; the
    structure is kept, by the rule of :mod:`lazyseq.nested` (a namedtuple or
    an ``OrderedDict`` keeps its type, another mapping comes back as a plain
    dict, another tuple or list subclass as a plain tuple or list). The
    tensor keeps its array alive, so a batch that a process loader delivered
    in a shared-memory slot keeps that slot until the tensor is gone.

    Four kinds of arrays are copied, because torch cannot share them:
    read-only arrays (a memory map opened with ``mmap_mode="r"``: writing
    through the tensor would crash, and torch warns), arrays with negative
    strides (``a[::-1]``), strides that are not whole elements (a field of a
    structured array) and arrays in non-native byte order. Arrays of
    dtypes torch has no tensor for (strings, objects, dates), subclasses of
    arrays (a masked array: its mask would be lost) and everything that is
    not an array (numbers, strings, tensors) are returned unchanged.

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
    return map_leaves(_tensor, batch)


def _becomes_tensor(x: Any) -> bool:
    """Whether ``x`` is a tensor, or an array that :func:`_tensor` makes one."""
    return isinstance(x, torch.Tensor) or (is_plain_array(x) and _has_tensor_type(x.dtype))


def _has_tensor_type(dtype: np.dtype) -> bool:
    return dtype in _TORCH_DTYPES or dtype.newbyteorder("=") in _TORCH_DTYPES


def _tensor(array: np.ndarray) -> Any:
    dtype = array.dtype
    if dtype not in _TORCH_DTYPES:
        if not _has_tensor_type(dtype):
            return array  # no tensor type for it: strings, objects, dates, structured
        return torch.from_numpy(array.astype(dtype.newbyteorder("=")))
    size = dtype.itemsize
    if not array.flags.writeable or any(stride < 0 or stride % size for stride in array.strides):
        # a writable copy, strided in whole elements: a field of a structured array is not
        return torch.from_numpy(np.array(array))
    return torch.from_numpy(array)

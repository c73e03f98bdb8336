"""Results as a skeleton plus array leaves, so that arrays can travel through shared memory.

A result is split by :func:`lazyseq.nested.flatten` into its arrays of plain
data and a small picklable *skeleton* that holds everything else (which
containers are walked, and what they are rebuilt as, is the rule of
:mod:`lazyseq.nested`). The arrays are written into a shared-memory slot; the
skeleton travels by pickle and says where each array lies in the slot.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import cast

import numpy as np

from ..nested import describe, flatten, rebuild, skeleton_key
from ..views.chunks import aligned  # one alignment for arrays built in a slot and arrays copied into it

__all__ = [
    "bytes_of_spec",
    "ONE_ARRAY",
    "address_of",
    "flatten",
    "layout_of",
    "one_array_in_slot",
    "place_in_slot",
    "rebuild",
    "shape_key",
    "signature",
]


def layout_of(arrays: list[np.ndarray]) -> tuple[list[tuple[np.dtype, tuple, int]], int]:
    """Where each array goes in a slot: ``(dtype, shape, offset)`` each, and the bytes needed."""
    layout, offset = [], 0
    for a in arrays:
        layout.append((a.dtype, a.shape, offset))
        offset += aligned(a.nbytes)
    return layout, offset


def bytes_of_spec(spec: tuple | None) -> int:
    """The bytes a slot needs for an item that ``spec`` describes (see ``View._item_spec``); 0 if that is not known.

    >>> bytes_of_spec(("array", np.dtype("float64"), (256, 248))), bytes_of_spec(None)
    (507904, 0)
    >>> bytes_of_spec(("tuple", (("array", np.dtype("float32"), (3,)), ("array", np.dtype("int64"), ()))))
    128
    """
    if spec is None:
        return 0
    if spec[0] == "array":
        dtype, shape = spec[1], spec[2]
        if dtype.hasobject:  # pickled, never in a slot
            return 0
        return aligned(dtype.itemsize * math.prod(shape))
    sizes = [bytes_of_spec(part) for part in spec[1]]
    return 0 if 0 in sizes else sum(sizes)


def place_in_slot(slot: np.ndarray, address: int, arrays: list[np.ndarray]) -> list | None:
    """Put ``arrays`` in ``slot`` (bytes, at ``address``); their ``(dtype, shape, offset)`` each, or None if they do not fit.

    Arrays already written in the slot (see :func:`lazyseq.views.chunks.writing_into`)
    stay where they are; the others are copied after them.
    """
    base, size = address, len(slot)
    # dtypes travel as their short string where it says everything: it pickles ten times faster
    placed: list = [None] * len(arrays)
    free = 0
    for k, a in enumerate(arrays):
        offset = address_of(a) - base
        if 0 <= offset < size and a.flags.c_contiguous:
            placed[k] = (_portable(a.dtype), a.shape, offset)
            free = max(free, offset + a.nbytes)
    for k, a in enumerate(arrays):
        if placed[k] is None:
            offset = aligned(free)
            if offset + a.nbytes > size:
                return None
            np.copyto(np.ndarray(a.shape, a.dtype, buffer=slot, offset=offset), a, casting="no")
            placed[k] = (_portable(a.dtype), a.shape, offset)
            free = offset + a.nbytes
    return placed


ONE_ARRAY = ("a", 0)  # the skeleton of a result that is one array (see lazyseq.nested.flatten)


def address_of(array: np.ndarray) -> int:
    """Where the data of ``array`` begins in memory: ``array.ctypes.data``, a third of its cost where possible.

    >>> a = np.arange(4.0)
    >>> address_of(a[1:]) - address_of(a), address_of(a[::-1]) == a[::-1].ctypes.data
    (8, True)
    """
    try:  # a writable, C-contiguous, non-empty array exports a buffer that ctypes can point to
        return _addressof(_from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return array.ctypes.data


def one_array_in_slot(array: np.ndarray, offset: int) -> tuple[tuple, list]:
    """The skeleton and layout of a result that is ``array`` alone, C-contiguous at ``offset`` in its slot."""
    return ONE_ARRAY, [(_portable(array.dtype), array.shape, offset)]


# an ndarray is a buffer, which the stubs of numpy before 2.5 say only for Python 3.12 on
_from_buffer = cast("Callable[[np.ndarray], ctypes.c_char]", ctypes.c_char.from_buffer)
_addressof = ctypes.addressof


def _portable(dtype: np.dtype) -> str | np.dtype:
    return dtype.str if dtype.fields is None and dtype.subdtype is None else dtype


def signature(skeleton: tuple, layout: list) -> str:
    """What must stay the same from one fixed-shape batch to the next, readable: ``(float64 (64, 248), int64 (64,))``.

    >>> arrays = []
    >>> skeleton = flatten((np.zeros((4, 2)), {"y": np.arange(4)}), arrays)
    >>> signature(skeleton, layout_of(arrays)[0])
    "(float64 (4, 2), {'y': int64 (4,)})"
    """
    return describe(skeleton, [f"{dtype} {shape}" for dtype, shape, _ in layout])


def shape_key(skeleton: tuple, arrays: list[np.ndarray]) -> tuple:
    """A cheap comparable form of :func:`signature`: equal for batches of the same structure, shapes and dtypes.

    >>> def key(batch):
    ...     arrays = []
    ...     return shape_key(flatten(batch, arrays), arrays)
    >>> key((np.zeros((4, 2)), np.arange(4))) == key((np.ones((4, 2)), np.arange(4, 8)))
    True
    >>> key((np.zeros((4, 2)), np.arange(4))) == key((np.zeros((3, 2)), np.arange(3)))
    False
    """
    return skeleton_key(skeleton, [(a.dtype, a.shape) for a in arrays])

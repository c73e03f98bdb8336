"""Results as a skeleton plus array leaves, so that arrays can travel through shared memory.

A result (an array, or tuples, lists, namedtuples and dicts nesting arrays and
other values) is split into its *arrays* and a small picklable *skeleton* that
holds everything else. The arrays are written into a shared-memory slot; the
skeleton travels by pickle and says where each array lies in the slot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..views.chunks import ALIGN  # one alignment for arrays built in a slot and arrays copied into it

__all__ = ["flatten", "layout_of", "place_in_slot", "rebuild", "shape_key", "signature"]


# Skeleton nodes: ("a", k) is the k-th array; ("t"|"l", children); ("n", type, children);
# ("d", keys, children); ("v", value) any other value, pickled as it is.


def flatten(result: Any, arrays: list[np.ndarray]) -> tuple:
    """The skeleton of ``result``; its shareable arrays are appended to ``arrays``."""
    kind = type(result)
    if kind is np.ndarray:  # the common case first
        if result.dtype.hasobject:
            return ("v", result)
        arrays.append(result)
        return ("a", len(arrays) - 1)
    if kind is tuple:
        return ("t", [flatten(x, arrays) for x in result])
    if kind is list:
        return ("l", [flatten(x, arrays) for x in result])
    if kind is dict:
        return ("d", list(result), [flatten(x, arrays) for x in result.values()])
    if isinstance(result, tuple) and hasattr(result, "_fields"):
        return ("n", kind, [flatten(x, arrays) for x in result])
    if isinstance(result, np.ndarray) and not result.dtype.hasobject:  # subclasses: memmap, matrix...
        arrays.append(np.asarray(result))
        return ("a", len(arrays) - 1)
    return ("v", result)


def layout_of(arrays: list[np.ndarray]) -> tuple[list[tuple[np.dtype, tuple, int]], int]:
    """Where each array goes in a slot: ``(dtype, shape, offset)`` each, and the bytes needed."""
    layout, offset = [], 0
    for a in arrays:
        layout.append((a.dtype, a.shape, offset))
        offset += -(-a.nbytes // ALIGN) * ALIGN
    return layout, offset


def place_in_slot(slot: np.ndarray, arrays: list[np.ndarray]) -> list | None:
    """Put ``arrays`` in ``slot`` (bytes); their ``(dtype, shape, offset)`` each, or None if they do not fit.

    Arrays already written in the slot (see :func:`lazyseq.views.chunks.writing_into`)
    stay where they are; the others are copied after them.
    """
    base, size = slot.ctypes.data, len(slot)
    # dtypes travel as their short string where it says everything: it pickles ten times faster
    placed: list = [None] * len(arrays)
    free = 0
    for k, a in enumerate(arrays):
        offset = a.ctypes.data - base
        if 0 <= offset < size and a.flags.c_contiguous:
            placed[k] = (_portable(a.dtype), a.shape, offset)
            free = max(free, offset + a.nbytes)
    for k, a in enumerate(arrays):
        if placed[k] is None:
            offset = -(-free // ALIGN) * ALIGN
            if offset + a.nbytes > size:
                return None
            np.copyto(np.ndarray(a.shape, a.dtype, buffer=slot, offset=offset), a, casting="no")
            placed[k] = (_portable(a.dtype), a.shape, offset)
            free = offset + a.nbytes
    return placed


def _portable(dtype: np.dtype):
    return dtype.str if dtype.fields is None and dtype.subdtype is None else dtype


def rebuild(skeleton: tuple, leaves: list) -> Any:
    """The result that ``skeleton`` describes, with ``leaves[k]`` as its k-th array."""
    tag = skeleton[0]
    if tag == "a":
        return leaves[skeleton[1]]
    if tag == "v":
        return skeleton[1]
    if tag == "t":
        return tuple(rebuild(node, leaves) for node in skeleton[1])
    if tag == "l":
        return [rebuild(node, leaves) for node in skeleton[1]]
    if tag == "d":
        return dict(zip(skeleton[1], (rebuild(node, leaves) for node in skeleton[2])))
    return skeleton[1](*(rebuild(node, leaves) for node in skeleton[2]))  # namedtuple


def signature(skeleton: tuple, layout: list) -> str:
    """What must stay the same from one fixed-shape batch to the next, readable: ``(float64 (64, 248), int64 (64,))``."""

    def describe(node) -> str:
        tag = node[0]
        if tag == "a":
            dtype, shape, _ = layout[node[1]]
            return f"{dtype} {shape}"
        if tag == "v":
            return type(node[1]).__name__
        if tag == "d":
            return "{" + ", ".join(f"{k!r}: {describe(n)}" for k, n in zip(node[1], node[2])) + "}"
        inner = ", ".join(describe(n) for n in (node[2] if tag == "n" else node[1]))
        return f"[{inner}]" if tag == "l" else f"({inner})"

    return describe(skeleton)


def shape_key(skeleton: tuple, arrays: list[np.ndarray]) -> tuple:
    """A cheap comparable form of :func:`signature`: equal for batches of the same structure, shapes and dtypes."""
    tag = skeleton[0]
    if tag == "a":
        a = arrays[skeleton[1]]
        return (a.dtype, a.shape)
    if tag == "v":
        return (type(skeleton[1]),)
    if tag == "d":
        return (tuple(skeleton[1]), *(shape_key(n, arrays) for n in skeleton[2]))
    children = skeleton[2] if tag == "n" else skeleton[1]
    return (tag, *(shape_key(n, arrays) for n in children))

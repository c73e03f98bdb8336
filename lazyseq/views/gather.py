"""Items of a view picked by position: ``gather`` (alias ``take``) and slices.

Gathers and slices of gathers collapse onto the base view, so that a chain of
slices costs one lookup per item whatever its depth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

import numpy as np

from ..arguments import indexable_length
from .base import View
from .errors import EndOfData
from .itemtypes import Indexes, SequenceLike, T
from .keys import Positions, array_key, compose, range_length, shift, tidy
from .sources import as_view

__all__ = ["GatherView", "StridedView", "gather", "take"]


class GatherView(View[Any]):
    """Item ``i`` is ``parent[positions[i]]``; ``positions`` is a range (a slice) or an index array."""

    kind = "gather"
    _items_like_parents = True
    _parent: View
    _positions: Positions

    @property
    def _reads_new_rows(self) -> bool:
        return self._parent._reads_new_rows

    def __init__(self, parent: View, positions: Positions) -> None:
        if type(positions) is range:
            positions = _indexable(positions)
        if type(parent) is GatherView:
            positions = compose(parent._positions, positions)
            parent = parent._parent
        self._parent = parent
        self._parents = (parent,)
        self._positions = positions
        self._position = positions.__getitem__ if type(positions) is range else positions.item
        self._len = len(positions)

    def _get(self, i: int) -> Any:
        return self._parent._get(self._position(i))

    def _get_many(self, idx: Positions) -> Any:
        return self._parent._get_many(compose(self._positions, idx))

    def _writes_many(self, idx: Positions, values: list | np.ndarray) -> Callable[[], None] | None:
        return self._parent._writes_many(compose(self._positions, idx), values)

    def _spec_of(self, idx: Positions) -> tuple | None:
        return self._parent._spec_of(compose(self._positions, idx))

    def _stored_rows(self, rows: range) -> np.ndarray | None:
        positions = compose(self._positions, rows)
        if type(positions) is not range or positions.step != 1:
            return None
        return self._parent._stored_rows(positions)

    def _set(self, i: int, value: Any) -> None:
        self._parent._set(self._position(i), value)

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return ((self._parent, self._position(i)),)

    def _label(self) -> str:
        return "slice" if type(self._positions) is range else "gather"

    def _describe(self) -> str:
        p = self._positions
        if type(p) is range:
            # A range down to item 0 stops below it, where a slice would count from the end.
            stop = None if p.stop < 0 else p.stop
            return f"slice({p.start}, {stop}, {p.step})"
        return "gather"


class StridedView(View[Any]):
    """A slice of a view without a length: item ``i`` is ``parent[start + i * step]``.

    With ``stop`` (a parent position, for a parent that may end where its
    data does: ``uniter``), the slice ends there or where the parent ends,
    whichever comes first, as a list's slice does: its length stays unknown.
    """

    kind = "slice"
    _items_like_parents = True
    _parent: View
    _start: int
    _step: int
    _stop: int | None = None

    @property
    def _reads_new_rows(self) -> bool:
        return self._parent._reads_new_rows

    def __init__(self, parent: View, start: int, step: int, stop: int | None = None) -> None:
        if type(parent) is StridedView and parent._stop is None:
            if stop is not None:
                stop = parent._start + parent._step * stop
            start, step = parent._start + parent._step * start, parent._step * step
            parent = parent._parent
        self._parent = parent
        self._parents = (parent,)
        self._start = start
        self._step = step
        self._len = None
        if stop is not None:
            self._stop = stop
            self._length_unknown = True  # it ends at stop, found by reading there

    def _position(self, i: int) -> int:
        j = self._start + i * self._step
        if self._stop is not None and j >= self._stop:
            raise EndOfData(f"slice index {i} out of range: the slice ends at item {self._stop} of its parent")
        return j

    def _get(self, i: int) -> Any:
        j = self._position(i)
        try:
            return self._parent._get(j)
        except EndOfData as end:  # the parent's index is not the one asked for
            raise EndOfData(f"slice index {i} out of range: {end}") from None

    def _get_many(self, idx: Positions) -> Any:
        if self._stop is not None and len(idx):  # the furthest item asked for must lie before stop
            self._position(max(idx[0], idx[-1]) if type(idx) is range else int(idx.max()))
        return self._parent._get_many(shift(self._start, self._step, idx))

    def _set(self, i: int, value: Any) -> None:
        self._parent._set(self._position(i), value)

    def _check_writable(self, i: int) -> None:
        self._parent._check_writable(self._position(i))

    def _set_element(self, i: int, r: int, value: Any) -> bool:
        return self._parent._set_element(self._position(i), r, value)

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return ((self._parent, self._start + i * self._step),)

    def _describe(self) -> str:
        return f"slice({self._start}, {self._stop}, {self._step})"


@overload
def gather(sequence: np.ndarray, indexes: Indexes | np.ndarray) -> View[np.ndarray]: ...


@overload
def gather(sequence: SequenceLike[T], indexes: Indexes | np.ndarray) -> View[T]: ...


def gather(sequence: SequenceLike[Any] | np.ndarray, indexes: Indexes | np.ndarray) -> View[Any]:
    """A view of ``sequence`` reordered by ``indexes``: item ``i`` is ``sequence[indexes[i]]``.

    ``indexes`` may contain negative positions and repeats; it is read once,
    when the view is created. Booleans are refused (a mask selects with
    ``view[mask]``). Assigning to the view writes through to
    ``sequence``.

    >>> import lazyseq
    >>> letters = ['a', 'b', 'c', 'd']
    >>> list(lazyseq.gather(letters, [3, 0, -1]))
    ['d', 'a', 'd']
    >>> g = lazyseq.gather(letters, [1, 2])
    >>> g[0] = 'B'
    >>> letters
    ['a', 'B', 'c', 'd']
    """
    parent = as_view(sequence)
    if isinstance(indexes, range) and _within(indexes, parent._len):
        return GatherView(parent, indexes)
    if isinstance(indexes, View):
        indexes._need_length("gather's indexes")  # an infinite view would be read for ever
    if not isinstance(indexes, (list, np.ndarray)):
        try:
            indexes = list(indexes)
        except TypeError:
            raise TypeError(
                f"gather: indexes must be a sequence of integers (one item is sequence[i]), got {indexes!r:.60}"
            ) from None
    return GatherView(
        parent, array_key(indexes, parent._len, "gather", "gather's sequence", masks=False, endless=parent.endless)
    )


take = gather
"""The same as :func:`gather`, under numpy's name: ``take(sequence, indexes)``."""


def _indexable(positions: range) -> range:
    """``tidy(positions)``; a ``ValueError`` if they are more than a view can index (a slice of an infinite view)."""
    try:
        return tidy(positions)
    except OverflowError:  # more than len() can count: the ValueError that says so
        indexable_length(range_length(positions), "slice")
        raise


def _within(positions: range, length: int | None) -> bool:
    """Whether every position of the range is a valid non-negative index."""
    if not positions:
        return True
    low, high = (positions[0], positions[-1]) if positions.step > 0 else (positions[-1], positions[0])
    return low >= 0 and (length is None or high < length)

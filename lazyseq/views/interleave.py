"""Items taken in turn from several views: ``interleave``."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import Any, overload

import numpy as np

from ..arguments import indexable_length
from .base import View
from .itemtypes import SequenceLike, T
from .keys import Positions, positions_array
from .sources import as_view

__all__ = ["InterleaveView", "interleave"]


class InterleaveView(View[Any]):
    """Round robin over the parents; when one runs out, over the ones left.

    The output is cut into phases: during phase ``p`` the ``active[p]``
    parents that still have items alternate, starting at their item
    ``depth[p]``.
    """

    kind = "interleave"
    _items_like_parents = True

    def __init__(self, parents: tuple[View, ...]) -> None:
        if not parents:
            raise ValueError("interleave needs at least one sequence")
        self._parents = parents
        for k, p in enumerate(parents):  # where its items go depends on where it ends: unknown before reading it
            if p._len is None and p._may_end():
                raise TypeError(
                    f"interleave: sequence {k} has no known length (uniter): give it a size (uniter(..., size=n)) "
                    "or read it into a list first"
                )
        infinite = [k for k, p in enumerate(parents) if p._len is None]
        finite = sorted((p._len, k) for k, p in enumerate(parents) if p._len is not None)
        self._phase_starts: list[int] = []  # output position where each phase begins
        self._active: list[list[int]] = []  # parents alternating in each phase
        self._depth: list[int] = []  # parent item where each phase begins
        out, depth, remaining = 0, 0, sorted(range(len(parents)))
        for length, k in finite:
            if length > depth:
                self._phase_starts.append(out)
                self._active.append(list(remaining))
                self._depth.append(depth)
                out += (length - depth) * len(remaining)
                depth = length
            remaining.remove(k)
        if infinite:
            self._phase_starts.append(out)
            self._active.append(infinite)
            self._depth.append(depth)
            self._len = None
        else:
            self._len = indexable_length(out, "interleave")

    def _locate(self, i: int) -> tuple[int, int]:
        phase = bisect_right(self._phase_starts, i) - 1
        turns, which = divmod(i - self._phase_starts[phase], len(self._active[phase]))
        return self._active[phase][which], self._depth[phase] + turns

    def _get(self, i: int) -> Any:
        k, j = self._locate(i)
        return self._parents[k]._get(j)

    def _set(self, i: int, value: Any) -> None:
        k, j = self._locate(i)
        self._parents[k]._set(j, value)

    def _writes_many(self, idx: Positions, values: list | np.ndarray) -> Callable[[], None] | None:
        located = np.array([self._locate(i) for i in positions_array(idx).tolist()], dtype=np.intp).reshape(-1, 2)
        return self._writes_to_parents(self._parents, located[:, 0], located[:, 1], values)

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        k, j = self._locate(i)
        return ((self._parents[k], j),)


@overload
def interleave(*sequences: np.ndarray) -> View[np.ndarray]: ...


@overload
def interleave(*sequences: SequenceLike[T]) -> View[T]: ...


def interleave(*sequences: SequenceLike[Any] | np.ndarray) -> View[Any]:
    """A view taking one item from each sequence in turn; sequences that run out are skipped.

    >>> import lazyseq
    >>> list(lazyseq.interleave([1, 2, 3], 'ab', [10]))
    [1, 'a', 10, 2, 'b', 3]
    """
    return InterleaveView(tuple(as_view(s) for s in sequences))

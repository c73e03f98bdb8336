"""A lazy ``range``: ``arange``."""

from __future__ import annotations

from collections.abc import Iterator

from ..arguments import indexable_length, integer
from .base import View
from .itemtypes import Integer
from .keys import Positions, compose

__all__ = ["ArangeView", "arange"]


class ArangeView(View[int]):
    """Item ``i`` is ``range_[i]``, a Python ``int``."""

    kind = "arange"

    def __init__(self, range_: range) -> None:
        self._range = range_
        try:
            n = len(range_)
        except OverflowError:  # more than len() can give
            step = range_.step
            n = (range_.stop - range_.start + step - (1 if step > 0 else -1)) // step
        self._len = indexable_length(n, "arange")

    def _get(self, i: int) -> int:
        return self._range[i]

    def _get_many(self, idx: Positions) -> list:
        positions = compose(self._range, idx)
        return list(positions) if type(positions) is range else positions.tolist()

    def _iter(self) -> Iterator[int]:
        return iter(self._range)

    def _describe(self) -> str:
        r = self._range
        return f"arange({r.start}, {r.stop}, {r.step})"


def arange(start: Integer, stop: Integer | None = None, step: Integer | None = None) -> View[int]:
    """A view of the integers of ``range(start, stop, step)``.

    >>> import lazyseq
    >>> list(lazyseq.arange(5)), list(lazyseq.arange(10, 0, -3))
    ([0, 1, 2, 3, 4], [10, 7, 4, 1])
    """
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else integer(step, "arange: step")
    if step == 0:
        raise ValueError("arange: step must not be zero")
    return ArangeView(range(integer(start, "arange: start"), integer(stop, "arange: stop"), step))

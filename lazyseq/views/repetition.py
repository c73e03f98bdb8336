"""Items that come back: ``cycle`` a sequence, ``repeat`` a value."""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Any, overload

import numpy as np

from ..arguments import indexable_length, integer
from .base import View
from .itemtypes import Integer, SequenceLike, T
from .keys import Positions, modulo
from .sources import as_view

__all__ = ["CycleView", "RepeatView", "cycle", "repeat"]


def _size_limit(name: str, limit: Integer | None) -> int | None:
    if limit is None:
        return None
    return indexable_length(integer(limit, name, low=0, expected="a non-negative integer or None"), name.split(":")[0])


class CycleView(View[Any]):
    """Item ``i`` is ``parent[i % len(parent)]``, up to ``limit`` items (or forever)."""

    kind = "cycle"
    _items_like_parents = True

    def __init__(self, parent: View, limit: Integer | None) -> None:
        n = parent._need_length("cycle")
        limit = _size_limit("cycle: limit", limit)
        if n == 0 and limit != 0:
            raise ValueError("cycle: cannot repeat an empty sequence (only limit=0 is possible)")
        self._parent = parent
        self._parents = (parent,)
        self._period = n
        self._len = limit

    def _get(self, i: int) -> Any:
        return self._parent._get(i % self._period)

    def _get_many(self, idx: Positions) -> Any:
        if type(idx) is range and idx.step == 1 and idx and idx.start // self._period == (idx.stop - 1) // self._period:
            offset = idx.start - idx.start % self._period
            return self._parent._get_many(range(idx.start - offset, idx.stop - offset))
        return self._parent._get_many(modulo(idx, self._period))

    def _set(self, i: int, value: Any) -> None:
        self._parent._set(i % self._period, value)

    def _writes_many(self, idx: Positions, values: list | np.ndarray) -> Callable[[], None] | None:
        return self._parent._writes_many(modulo(idx, self._period), values)

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return ((self._parent, i % self._period),)


class RepeatView(View[Any]):
    """Every item is the same ``value``."""

    kind = "repeat"

    def __init__(self, value: Any, times: Integer | None) -> None:
        self._value = value
        self._len = _size_limit("repeat: times", times)

    def _get(self, i: int) -> Any:
        return self._value

    def _get_many(self, idx: Positions) -> list:
        return [self._value] * len(idx)

    def _describe(self) -> str:
        return f"repeat({_brief(self._value)})"


def _brief(value: Any) -> str:
    """A short repr of ``value``: never a whole long list, never an error (a view's repr must not fail)."""
    if isinstance(value, np.ndarray) and value.size > 8:  # (reprlib cuts through its text, brackets left open)
        return f"array {value.dtype} {value.shape}"
    try:
        text = reprlib.repr(value)
    except Exception:  # the value's own __repr__ failed
        return f"<{type(value).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."


@overload
def cycle(sequence: np.ndarray, limit: Integer | None = None) -> View[np.ndarray]: ...


@overload
def cycle(sequence: SequenceLike[T], limit: Integer | None = None) -> View[T]: ...


def cycle(sequence: SequenceLike[Any] | np.ndarray, limit: Integer | None = None) -> View[Any]:
    """A view repeating ``sequence`` over and over, for ``limit`` items or forever.

    An infinite view has no ``len()``; negative indices and other operations
    that need a length raise ``TypeError`` instead of looping.

    >>> import lazyseq
    >>> list(lazyseq.cycle([1, 2, 3], limit=7))
    [1, 2, 3, 1, 2, 3, 1]
    >>> forever = lazyseq.cycle('ab')
    >>> forever[1001], list(forever[:3])
    ('b', ['a', 'b', 'a'])
    """
    return CycleView(as_view(sequence), limit)


def repeat(value: T, times: Integer | None = None) -> View[T]:
    """A view whose items are all ``value``: ``times`` of them, or infinitely many.

    >>> import lazyseq
    >>> list(lazyseq.repeat('x', 3)), len(lazyseq.repeat('x', 0))
    (['x', 'x', 'x'], 0)
    """
    return RepeatView(value, times)

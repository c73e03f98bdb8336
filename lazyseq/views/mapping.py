"""Functions applied item by item: ``smap`` and ``starmap``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

import numpy as np

from ..arguments import function
from .base import View, lengths_must_match
from .chunks import chunk_rows
from .itemtypes import R, S, SequenceLike, T, Ts, U
from .keys import Positions
from .sources import as_view

__all__ = ["MapView", "smap", "starmap"]


def function_name(f: Callable) -> str:
    """A readable name for ``f`` in reprs and error chains."""
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None)
    if name is None:
        inner = getattr(f, "func", None)  # functools.partial
        return f"partial({function_name(inner)})" if inner is not None else type(f).__name__
    return name


class MapView(View[Any]):
    """Item ``i`` is ``f(parents[0][i], parents[1][i], ...)``, or ``f(*parent[i])`` when ``star``."""

    kind = "smap"

    def __init__(self, f: Callable, parents: tuple[View, ...], star: bool = False) -> None:
        if not parents:
            raise TypeError("smap needs at least one sequence")
        self._len = lengths_must_match("smap", parents)
        self._func = f
        self._parents = parents
        self._star = star
        if star:
            self.kind = "starmap"

    def _get(self, i: int) -> Any:
        if self._star:
            return self._func(*self._parents[0]._get(i))
        if len(self._parents) == 1:
            return self._func(self._parents[0]._get(i))
        return self._func(*[p._get(i) for p in self._parents])

    def _get_many(self, idx: Positions) -> list:
        # The loop variable ``i`` is unused on purpose: error chains read it from the frame.
        f = self._func
        columns = [chunk_rows(p._get_many(idx)) for p in self._parents]
        results = []
        if self._star:
            for i, args in zip(idx, columns[0]):  # noqa: B007
                results.append(f(*args))
        elif len(columns) == 1:
            for i, arg in zip(idx, columns[0]):  # noqa: B007
                results.append(f(arg))
        else:
            for i, args in zip(idx, zip(*columns)):  # noqa: B007
                results.append(f(*args))
        return results

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return tuple((p, i) for p in self._parents)

    def _label(self) -> str:
        return f"{self.kind}({function_name(self._func)})"


@overload
def smap(f: Callable[[T], R], sequence: SequenceLike[T], /) -> View[R]: ...


@overload
def smap(f: Callable[[T, S], R], sequence: SequenceLike[T], other: SequenceLike[S], /) -> View[R]: ...


@overload
def smap(
    f: Callable[[T, S, U], R], sequence: SequenceLike[T], other: SequenceLike[S], another: SequenceLike[U], /
) -> View[R]: ...


@overload
def smap(  # four sequences or more: what f takes is not checked
    f: Callable[..., R],
    sequence: SequenceLike[Any],
    other: SequenceLike[Any],
    another: SequenceLike[Any],
    third: SequenceLike[Any],
    /,
    *others: SequenceLike[Any],
) -> View[R]: ...


def smap(f: Callable[..., R], *sequences: SequenceLike[Any]) -> View[R]:
    """A view of ``f`` applied to the items of one or more sequences, computed on access.

    With several sequences, item ``i`` is ``f(s1[i], s2[i], ...)``; they must
    have the same length (a ``ValueError`` otherwise).

    >>> import lazyseq
    >>> squares = lazyseq.smap(lambda x: x * x, range(5))
    >>> list(squares)
    [0, 1, 4, 9, 16]
    >>> lazyseq.smap(max, [1, 5], [4, 2])[1]
    5
    """
    _check_function(f, star=False)  # before the sequences: smap(data, f) names the argument out of place
    return MapView(f, tuple(as_view(s) for s in sequences))


@overload
def starmap(f: Callable[[*Ts], R], sequence: SequenceLike[tuple[*Ts]]) -> View[R]: ...


@overload
def starmap(
    f: Callable[..., R], sequence: SequenceLike[list[Any]] | SequenceLike[np.ndarray] | np.ndarray
) -> View[R]: ...


def starmap(f: Callable[..., R], sequence: SequenceLike[Any] | np.ndarray) -> View[R]:
    """A view of ``f(*item)`` for each item of ``sequence`` (like ``itertools.starmap``).

    For type checkers, items are tuples, whose fields ``f`` must take (as
    ``collate`` and ``zip`` make them), or lists or arrays, whose fields are
    not checked.

    >>> import lazyseq
    >>> list(lazyseq.starmap(pow, [(2, 3), (3, 2)]))
    [8, 9]
    """
    _check_function(f, star=True)
    return MapView(f, (as_view(sequence),), star=True)


def _check_function(f: Any, star: bool) -> None:
    name = "starmap" if star else "smap"
    function(f, f"{name}: f", f"the function comes first: {name}(f, sequence), or view.{name}(f)")

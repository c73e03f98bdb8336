"""A view cut into consecutive pieces: ``split``."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias, overload

import numpy as np

from ..arguments import integer
from .base import View
from .gather import GatherView
from .itemtypes import Indexes, Integer, SequenceLike, T
from .sources import as_view

__all__ = ["Edges", "SplitView", "split"]

# Where to cut: a number of equal parts less one, the positions of the cuts, or (start, stop) pairs.
Edges: TypeAlias = Integer | Indexes | Sequence[tuple[Integer, Integer]] | np.ndarray


class SplitView(View[Any]):
    """Item ``i`` is the slice ``parent[starts[i]:stops[i]]``, itself a lazy view."""

    kind = "split"

    def __init__(self, parent: View, edges: Any) -> None:
        n = parent._need_length("split")
        self._parent = parent
        self._parents = (parent,)
        self._spans = _spans(edges, n)
        self._len = len(self._spans)

    def _get(self, i: int) -> View:
        return GatherView(self._parent, range(*self._spans[i]))

    def _set(self, i: int, value: Any) -> None:
        self._get(i)._assign_all(value)

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return tuple((self._parent, j) for j in range(*self._spans[i]))


def _spans(edges: Any, n: int) -> list[tuple[int, int]]:
    if isinstance(edges, np.ndarray):  # arrays of any size have __index__: read them as Python values
        edges = edges.tolist()
    if isinstance(edges, (bool, np.bool_)):
        raise TypeError(f"split: edges must be a number of cuts, not a bool, got {edges!r}")
    if isinstance(edges, int) or hasattr(edges, "__index__"):
        cuts = operator.index(edges)
        if cuts < 0:
            raise ValueError(f"split: a number of cuts must be 0 or more, got {cuts}")
        if n % (cuts + 1):
            raise ValueError(f"split: {cuts} cuts must divide the length {n} into {cuts + 1} equal parts")
        size = n // (cuts + 1)
        return [(k * size, (k + 1) * size) for k in range(cuts + 1)]
    if not isinstance(edges, Iterable):
        raise TypeError(
            f"split: edges must be a number of cuts, a list of positions or a list of (start, stop) pairs, got {edges!r}"
        )
    edges = list(edges)
    if edges and isinstance(edges[0], (tuple, list)):
        if any(not isinstance(span, (tuple, list)) or len(span) != 2 for span in edges):
            raise ValueError(f"split: spans must all be (start, stop) pairs, got {edges!r:.80}")
        spans = [(integer(a, "split: a span's start"), integer(b, "split: a span's stop")) for a, b in edges]
    else:
        bounds = [0, *(integer(e, "split: an edge") for e in edges), n]
        for before, edge in zip(bounds[:-2], bounds[1:-1]):  # (the edges given, each after the one before)
            if not 0 <= edge <= n:
                raise ValueError(f"split: edge {edge} is not within 0..{n}")
            if edge < before:
                raise ValueError(f"split: edges must not decrease, got {edge} after {before}")
        spans = list(zip(bounds[:-1], bounds[1:]))
    for start, stop in spans:
        if not 0 <= start <= stop <= n:
            raise ValueError(f"split: span ({start}, {stop}) is not within 0..{n} in increasing order")
    return spans


@overload
def split(sequence: np.ndarray, edges: Edges) -> View[View[np.ndarray]]: ...


@overload
def split(sequence: SequenceLike[T], edges: Edges) -> View[View[T]]: ...


def split(sequence: SequenceLike[Any] | np.ndarray, edges: Edges) -> View[View[Any]]:
    """A view of consecutive pieces of ``sequence``, each a lazy slice.

    ``edges`` is either the positions where to cut (start and end are
    implicit), a number of cuts that divide the sequence into equal parts,
    or a list of ``(start, stop)`` pairs.

    >>> import lazyseq
    >>> [list(piece) for piece in lazyseq.split(range(6), [1, 4])]
    [[0], [1, 2, 3], [4, 5]]
    >>> [list(piece) for piece in lazyseq.split(range(6), 2)]
    [[0, 1], [2, 3], [4, 5]]
    >>> [list(piece) for piece in lazyseq.split(range(6), [(0, 2), (3, 6)])]
    [[0, 1], [3, 4, 5]]
    """
    return SplitView(as_view(sequence), edges)

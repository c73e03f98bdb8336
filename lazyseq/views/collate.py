"""Sequences side by side: ``collate``, whose item ``i`` is the tuple of their items ``i``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import View, lengths_must_match
from .chunks import Columns
from .itemtypes import SequenceLike
from .keys import Positions
from .sources import as_view

__all__ = ["CollateView", "collate"]


class CollateView(View):
    """Item ``i`` is ``(s0[i], s1[i], ...)``; batches keep each field vectorized."""

    kind = "collate"

    @property
    def _reads_new_rows(self) -> bool:
        return all(parent._reads_new_rows for parent in self._parents)

    def __init__(self, parents: tuple[View, ...]) -> None:
        if not parents:
            raise ValueError("collate needs at least one sequence")
        self._len = lengths_must_match("collate", parents)
        self._parents = parents

    def _get(self, i: int) -> tuple:
        return tuple([p._get(i) for p in self._parents])

    def _get_many(self, idx: Positions) -> Columns:
        return Columns(tuple([p._get_many(idx) for p in self._parents]))

    def _set(self, i: int, value: Any) -> None:
        if len(value) != len(self._parents):
            raise ValueError(f"collate item {i} has {len(self._parents)} fields, cannot assign {len(value)} values")
        for parent, field in zip(self._parents, value):
            parent._set(i, field)

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return tuple((p, i) for p in self._parents)

    def _item_spec(self) -> tuple | None:
        specs = tuple(p._item_spec() for p in self._parents)
        return None if all(s is None for s in specs) else ("tuple", specs)


def collate(sequences: Sequence[SequenceLike[Any]]) -> View[tuple[Any, ...]]:
    """A view whose item ``i`` is the tuple of item ``i`` of each sequence (a lazy ``zip``).

    The sequences must have the same length (a ``ValueError`` otherwise).

    >>> import numpy as np
    >>> import lazyseq
    >>> pairs = lazyseq.collate([np.array([0.5, 1.5, 2.5]), ['a', 'b', 'c']])
    >>> pairs[1]
    (np.float64(1.5), 'b')
    >>> lazyseq.batch(pairs, 2)[0]
    (array([0.5, 1.5]), ['a', 'b'])
    """
    return CollateView(tuple(as_view(s) for s in sequences))

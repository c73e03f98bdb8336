"""A reproducible random order: ``shuffle``."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, cast, overload

import numpy as np

from ..arguments import integer
from .base import View
from .itemtypes import Integer, SequenceLike, T
from .keys import Positions, compose
from .sources import as_view

__all__ = ["EPOCH_CHANGES", "EpochWatch", "ShuffleView", "shuffle"]

EPOCH_CHANGES = [0]  # how many times a shuffle's epoch was set, anywhere: loaders holding items of one look again


class EpochWatch:
    """Whether the epochs of the shuffles below ``view`` changed: what a view that keeps items looks at before using them.

    A loader's items computed ahead, or a cache's items, are of the epochs
    they were read in; ``set_epoch`` may be called on any view below, not
    only on the one that keeps them. Cheap while no epoch is set anywhere: a
    count of the epochs set is compared first.
    """

    def __init__(self, view: View) -> None:
        self._view = view
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.reset()

    def reset(self) -> None:
        """Take the epochs as they are now as the ones the kept items are of."""
        self._changes = EPOCH_CHANGES[0]
        self._epochs = self._view._epochs()

    def follow(self, forget: Callable[[], None], look: bool = False) -> None:
        """Call ``forget`` if the epochs changed since the last reset or change (``look``: even if none was set since).

        A read in another thread meanwhile waits until ``forget`` is done: no
        thread goes on with the items of the old epochs once one has seen it.
        """
        if not look and self._changes == EPOCH_CHANGES[0]:
            return
        if self._pid != os.getpid():  # a forked child: another thread of the parent may have held the lock then
            self._lock, self._pid = threading.Lock(), os.getpid()
        with self._lock:
            changes = EPOCH_CHANGES[0]
            if not look and self._changes == changes:  # another thread followed meanwhile
                return
            epochs = self._view._epochs()
            if epochs != self._epochs:
                forget()
                self._epochs = epochs
            self._changes = changes


COMPACT_ABOVE = 1 << 24  # items: longer permutations are stored as int32, half the size of intp


class ShuffleView(View[Any]):
    """Item ``i`` is ``parent[permutation[i]]``, the permutation drawn from ``(seed, epoch)``.

    The permutation is drawn when the first item is read, and again after
    :meth:`set_epoch`; it takes 4 bytes per item (8 beyond 2**31 items).
    """

    kind = "shuffle"
    _items_like_parents = True
    _len: int  # a shuffle needs a length

    @property
    def _reads_new_rows(self) -> bool:
        return self._parent._reads_new_rows

    def __init__(self, parent: View, seed: Integer | None, epoch: Integer) -> None:
        self._len = parent._need_length("shuffle")
        self._parent = parent
        self._parents = (parent,)
        self.seed = (
            int(cast(int, np.random.SeedSequence().entropy)) if seed is None else integer(seed, "shuffle: seed", low=0)
        )
        self._use_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch

    def __getstate__(self) -> dict:
        """Without the permutation drawn: a copy (sent to a worker process) draws it again, the same, if it reads."""
        return {**self.__dict__, "_drawn": None}

    def set_epoch(self, epoch: int) -> None:
        """Use the permutation of ``epoch`` from now on, here and in the shuffles this view reads from."""
        self._use_epoch(epoch)
        self._parent.set_epoch(epoch)

    def _use_epoch(self, epoch: Integer) -> None:
        self._epoch = integer(epoch, "shuffle: epoch", low=0)
        self._epoch_sets = getattr(self, "_epoch_sets", 0) + 1  # what loaders and caches look at (View._epochs)
        EPOCH_CHANGES[0] += 1
        self._drawn: tuple[int, np.ndarray] | None = None  # the permutation, with the epoch it was drawn for

    @property
    def permutation(self) -> np.ndarray:
        """The positions in the parent, in the order this view reads them."""
        drawn, epoch = self._drawn, self._epoch
        # With its epoch: a thread that drew it as another one set a new epoch stores the old epoch's permutation,
        # which the next read draws again rather than use.
        if drawn is None or drawn[0] != epoch:
            # intp (what numpy indexes with, no conversion per batch) up to 16M items; then half the memory
            dtype = np.intp if self._len <= COMPACT_ABOVE else np.int32 if self._len < 2**31 else np.int64
            order = np.random.default_rng([self.seed, epoch]).permutation(self._len).astype(dtype, copy=False)
            order.flags.writeable = False
            drawn = self._drawn = (epoch, order)
        return drawn[1]

    def _get(self, i: int) -> Any:
        return self._parent._get(self.permutation.item(i))

    def _get_many(self, idx: Positions) -> Any:
        positions = compose(self.permutation, idx)
        return self._parent._get_many(positions.astype(np.intp, copy=False))  # intp: fast numpy indexing

    def _set(self, i: int, value: Any) -> None:
        self._parent._set(self.permutation.item(i), value)

    def _writes_many(self, idx: Positions, values: list | np.ndarray) -> Callable[[], None] | None:
        return self._parent._writes_many(compose(self.permutation, idx), values)

    def _spec_of(self, idx: Positions) -> tuple | None:
        return self._parent._spec_of(compose(self.permutation, idx))

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return ((self._parent, self.permutation.item(i)),)

    def _describe(self) -> str:
        return f"shuffle(seed={self.seed}, epoch={self._epoch})"


@overload
def shuffle(sequence: np.ndarray, seed: Integer | None = None, epoch: Integer = 0) -> View[np.ndarray]: ...


@overload
def shuffle(sequence: SequenceLike[T], seed: Integer | None = None, epoch: Integer = 0) -> View[T]: ...


def shuffle(sequence: SequenceLike[Any] | np.ndarray, seed: Integer | None = None, epoch: Integer = 0) -> View[Any]:
    """A view of ``sequence`` in a random order that depends only on ``seed`` and ``epoch``.

    Each epoch has its own permutation: pass ``epoch`` or call
    ``set_epoch`` on the view (or on any view built on it). A loader built
    on it (``prefetch``) follows a ``set_epoch`` called below it from its
    next read on, and its own ``set_epoch`` at once. With
    ``seed=None`` a seed is drawn and kept in the ``seed`` attribute.

    >>> import lazyseq
    >>> s = lazyseq.shuffle(range(6), seed=0)
    >>> sorted(s) == list(range(6)), list(s) == list(lazyseq.shuffle(range(6), seed=0))
    (True, True)
    >>> first = list(s)
    >>> s.set_epoch(1)
    >>> list(s) != first
    True
    """
    return ShuffleView(as_view(sequence), seed, epoch)

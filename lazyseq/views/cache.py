"""Recently read items kept for reuse: ``add_cache``."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, overload

import numpy as np

from ..arguments import integer
from .base import View
from .itemtypes import Integer, SequenceLike, T
from .keys import Positions
from .shuffle import EpochWatch
from .sources import as_view

__all__ = ["CacheView", "add_cache"]


class CacheView(View[Any]):
    """Item ``i`` is ``parent[i]``, kept among the ``cache_size`` most recently used items."""

    kind = "add_cache"
    _items_like_parents = True

    def __init__(self, parent: View, cache_size: Integer) -> None:
        cache_size = integer(cache_size, "add_cache: cache_size", low=1)
        self._parent = parent
        self._parents = (parent,)
        self._len = parent._len
        self._size = cache_size
        self._cache: OrderedDict[int, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._changes = 0  # counts writes and epochs: a value read before one is not kept after it
        self._epoch_watch = EpochWatch(parent)  # set_epoch may be called on a shuffle below, not through this view

    def _get(self, i: int) -> Any:
        self._epoch_watch.follow(self._forget)
        with self._lock:
            if i in self._cache:
                self._cache.move_to_end(i)
                return self._cache[i]
            changes = self._changes
        value = self._parent._get(i)  # computed outside the lock: other threads read on
        with self._lock:
            if self._changes == changes:  # else item i may have been written, or the epoch changed, meanwhile
                self._cache[i] = value
                self._cache.move_to_end(i)
                while len(self._cache) > self._size:
                    self._cache.popitem(last=False)
        return value

    def _set(self, i: int, value: Any) -> None:
        self._parent._set(i, value)
        self._forget()  # other positions may show the item written (cycle, gather with repeats)

    def _writes_many(self, idx: Positions, values: list | np.ndarray) -> Callable[[], None] | None:
        write = self._parent._writes_many(idx, values)
        return None if write is None else functools.partial(self._write_and_forget, write)

    def _spec_of(self, idx: Positions) -> tuple | None:
        return self._parent._spec_of(idx)

    def _write_and_forget(self, write: Callable[[], None]) -> None:
        write()
        self._forget()

    def _set_element(self, i: int, r: int, value: Any) -> bool:
        written = super()._set_element(i, r, value)
        if written:
            self._forget()
        return written

    def set_epoch(self, epoch: int) -> None:
        """Give the pipeline's shuffles ``epoch``; items cached from an epoch that changed below are forgotten.

        So are they when ``set_epoch`` is called on a view below this one.
        """
        super().set_epoch(epoch)
        self._epoch_watch.follow(self._forget)  # a cache above no shuffle keeps its items: they do not depend on it

    def _forget(self) -> None:
        with self._lock:
            self._changes += 1
            self._cache.clear()

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return ((self._parent, i),)

    def _describe(self) -> str:
        return f"add_cache({self._size})"

    def __reduce__(self) -> tuple:  # no lock to pickle, and a worker process caches its own items
        return (CacheView, (self._parent, self._size))


@overload
def add_cache(sequence: np.ndarray, cache_size: Integer = 1) -> View[np.ndarray]: ...


@overload
def add_cache(sequence: SequenceLike[T], cache_size: Integer = 1) -> View[T]: ...


def add_cache(sequence: SequenceLike[Any] | np.ndarray, cache_size: Integer = 1) -> View[Any]:
    """A view of ``sequence`` that keeps the ``cache_size`` most recently used items.

    The least recently used item is evicted first. Items are kept by
    reference: a mutable item changed by the caller stays changed in the cache.
    An assignment through the view forgets every item kept: other positions
    may show the item written (a cycle, a gather with repeats). A change
    made to the data by other means is not seen while the item is kept.

    >>> import lazyseq
    >>> calls = []
    >>> def square(x):
    ...     calls.append(x)
    ...     return x * x
    >>> v = lazyseq.add_cache(lazyseq.smap(square, range(10)), cache_size=2)
    >>> v[3], v[3], v[4], v[3], calls
    (9, 9, 16, 9, [3, 4])
    """
    return CacheView(as_view(sequence), cache_size)

"""Random access over something that can only be iterated: ``uniter``."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sized
from typing import Any, NamedTuple

from ..arguments import indexable_length, integer
from .base import View
from .errors import EndOfData
from .itemtypes import Integer, T

__all__ = ["PASSED_OVER", "UniterView", "uniter"]

PASSED_OVER = 64  # items drawn on the way to a later one and not read yet, kept until read, at most
_MISSING = object()


class _Failed(NamedTuple):
    """An item whose drawing raised ``error`` on the way to a later one: raised when it is read."""

    error: Exception


class UniterView(View[Any]):
    """Item ``i`` is the ``i``-th item of ``iter(iterable)``.

    Up to ``n_parallel`` iterators are kept, each at its own position; a read
    moves forward the closest one behind the requested item, or starts a new
    one from the beginning. The ``cache_size`` most recently read items are
    kept. A one-shot iterator cannot be started again: reading an item it has
    already passed, and that is no longer kept, is a ``ValueError``. So the
    items a read draws from one on its way to a later one are kept until
    they are read (the last ``PASSED_OVER`` of them), and so is the failure
    of one whose drawing raised (the iterator is asked for the next item
    after it: a generator that raised has ended): threads that read in turn
    (the worker threads of a loader) may ask for item 11 before item 5.
    """

    kind = "uniter"
    _length_unknown = True

    def __init__(self, iterable: Iterable[Any], cache_size: Integer, n_parallel: Integer, size: Integer | None) -> None:
        if not isinstance(iterable, Iterable):
            raise TypeError(f"uniter needs an iterable, got {type(iterable).__name__}")
        self._cache_size = integer(cache_size, "uniter: cache_size", low=0)
        self._n_parallel = integer(n_parallel, "uniter: n_parallel", low=1)
        self._iterable = iterable
        self._one_shot = isinstance(iterable, Iterator)
        if size is None and not self._one_shot and isinstance(iterable, Sized):
            size = len(iterable)
        self._len = (
            None
            if size is None
            else indexable_length(
                integer(size, "uniter: size", low=0, expected="a non-negative integer or None"), "uniter"
            )
        )
        self._size_known = size is not None
        self._cursors: list[list] = []  # [next position, iterator, last use]
        self._cache: OrderedDict[int, Any] = OrderedDict()
        self._passed: OrderedDict[int, Any] = OrderedDict()  # drawn on the way to a later item, not read yet
        self._clock = 0
        self._end: int | None = None  # where a one-shot iterator ended: it cannot start over to find out again
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple:  # no lock to pickle
        size = self._len if self._size_known else None
        arguments = (self._iterable, self._cache_size, self._n_parallel, size)
        if not self._one_shot:  # a copy reads the iterable from its start, caching its own
            return (UniterView, arguments)
        with self._lock:  # a one-shot iterator cannot start over: a copy goes on from where it stands (if it pickles)
            position = self._cursors[0][0] if self._cursors else None
            state = {
                "position": position,
                "clock": self._clock,
                "cache": list(self._cache.items()),
                "passed": list(self._passed.items()),
                "end": self._end,
            }
        return (UniterView, arguments, state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy of a one-shot iterator's view: its iterator where the original's stood, its cache, its end."""
        if state["position"] is not None:
            self._cursors = [[state["position"], iter(self._iterable), 0]]
        self._clock = state["clock"]
        self._cache = OrderedDict(state["cache"])
        self._passed = OrderedDict(state.get("passed", ()))
        self._end = state["end"]

    def _get(self, i: int) -> Any:
        with self._lock:
            passed = self._passed.pop(i, _MISSING)  # (drawn by another read, for this one)
            if i in self._cache:
                self._cache.move_to_end(i)
                return self._cache[i]
            if type(passed) is _Failed:
                raise passed.error
            if passed is not _MISSING:
                return passed
            if self._end is not None and i >= self._end:
                raise self._ended(i, self._end)
            cursor = self._cursor_for(i)
            self._clock += 1
            cursor[2] = self._clock
            while True:
                position = cursor[0]
                try:
                    item = next(cursor[1])
                except StopIteration:
                    self._cursors.remove(cursor)
                    if self._one_shot:
                        self._end = position
                    raise self._ended(i, position) from None
                except Exception as error:
                    if not self._one_shot:  # a failed iterator cannot go on: the next read starts another
                        self._cursors.remove(cursor)
                        raise
                    # one that cannot start over is asked for its next item (a generator that raised has ended): the
                    # failure is this item's, for the read that asks for it
                    cursor[0] = position + 1
                    if position == i:
                        raise
                    tb = error.__traceback__  # (from this read's frame: the read of the item names it in errors)
                    self._pass_over(position, _Failed(error.with_traceback(tb.tb_next if tb else None)))
                    continue
                cursor[0] = position + 1
                self._remember(position, item)
                if position == i:
                    return item
                self._pass_over(position, item)

    def _cursor_for(self, i: int) -> list:
        behind = [c for c in self._cursors if c[0] <= i]
        if behind:
            return max(behind, key=lambda c: c[0])
        if self._one_shot and (self._cursors or self._clock):
            ahead = f"at item {self._cursors[0][0]}" if self._cursors else "at its end"
            raise ValueError(
                f"uniter cannot go back to item {i}: the iterable is a one-shot iterator, already "
                f"{ahead}, and item {i} is not kept (read before and not cached, or one of more than {PASSED_OVER} "
                "passed over on the way to later items); pass a re-iterable object (a list, or a class whose "
                "__iter__ starts over) or a larger cache_size"
            )
        cursor = [0, iter(self._iterable), 0]
        if len(self._cursors) >= self._n_parallel:
            self._cursors.remove(min(self._cursors, key=lambda c: c[2]))
        self._cursors.append(cursor)
        return cursor

    def _pass_over(self, position: int, item: Any) -> None:
        """Keep ``item``, drawn on the way to a later one, until it is read: from a one-shot iterator (another
        iterator over a re-iterable draws it again), which draws each item once."""
        if self._one_shot:
            passed = self._passed
            passed[position] = item
            if len(passed) > PASSED_OVER:
                passed.popitem(last=False)

    def _remember(self, position: int, item: Any) -> None:
        if self._cache_size:
            self._cache[position] = item
            self._cache.move_to_end(position)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _ended(self, i: int, count: int) -> Exception:
        if self._size_known:
            return ValueError(f"uniter: the iterable ended after {count} items, but its size was given as {self._len}")
        return EndOfData(f"uniter index {i} out of range: the iterable ended after {count} items")

    def _iter(self) -> Iterator[Any]:
        i = 0
        while self._len is None or i < self._len:
            try:
                yield self._get(i)
            except EndOfData:
                return
            i += 1

    def _describe(self) -> str:
        return f"uniter({type(self._iterable).__name__})"


def uniter(
    iterable: Iterable[T], cache_size: Integer = 0, n_parallel: Integer = 1, size: Integer | None = None
) -> View[T]:
    """A random-access view over an iterable, by iterating (and restarting) it as needed.

    ``size`` gives the length if ``len(iterable)`` does not; without either,
    the view has no known length and reading past the end raises
    ``IndexError``. ``cache_size`` recent items are kept, and up to
    ``n_parallel`` iterators run at different positions to avoid restarts.
    Of a one-shot iterator, the items drawn on the way to a later one are
    kept until read (the last 64 of them), so that threads reading in turn,
    as a loader's worker threads do, may ask for them in any order.

    >>> import lazyseq
    >>> squares = lazyseq.uniter(x * x for x in range(5))  # a one-shot generator
    >>> squares[3], squares[1], squares[4]  # 0, 1 and 2 drawn on the way to 3: kept until read
    (9, 1, 16)
    >>> squares[1]
    Traceback (most recent call last):
    ...
    lazyseq.EvaluationError: failed to compute uniter[1]: ValueError: uniter cannot go back to item 1: the iterable is a one-shot iterator, already at item 5, and item 1 is not kept (read before and not cached, or one of more than 64 passed over on the way to later items); pass a re-iterable object (a list, or a class whose __iter__ starts over) or a larger cache_size
    """
    return UniterView(iterable, cache_size, n_parallel, size)

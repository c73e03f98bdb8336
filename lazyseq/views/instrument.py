"""Views that watch what is read through them: ``debug`` and ``monitor_throughput``.

Both give the items of their parent unchanged, and show in ``repr`` where
they sit in a pipeline. What they record happens where the items are
computed: a ``prefetch`` with process workers calls ``debug``'s function
(and counts ``monitor_throughput``'s reads) in the workers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, overload

import numpy as np

from ..arguments import function, integer
from .base import View
from .chunks import chunk_rows
from .itemtypes import SequenceLike, T
from .keys import Positions
from .mapping import function_name
from .sources import as_view

__all__ = ["DebugView", "ThroughputView", "debug", "monitor_throughput"]

_clock = time.monotonic  # when debug last called its function
_timer = time.perf_counter  # how long reads take


class DebugView(View[T]):
    """Item ``i`` is ``parent[i]``; ``func(i, item)`` is called as it is read, within the limits given."""

    kind = "debug"
    _items_like_parents = True

    @property
    def _reads_new_rows(self) -> bool:
        return self._parent._reads_new_rows

    def __init__(
        self, parent: View[Any], func: Callable[[int, Any], Any], max_calls: int | None, max_rate: float | None
    ) -> None:
        function(func, "debug: func")
        if max_calls is not None:
            max_calls = integer(max_calls, "debug: max_calls", low=0, expected="a non-negative integer or None")
        if max_rate is not None and not max_rate > 0:
            raise ValueError(f"debug: max_rate must be a positive number of calls per second or None, got {max_rate}")
        self._parent = parent
        self._parents = (parent,)
        self._len = parent._len
        self._func = func
        self._max_calls = max_calls
        self._min_interval = 0.0 if max_rate is None else 1.0 / max_rate
        self.calls = 0  # how many times func was called
        self._last_call: float | None = None
        self._lock = threading.Lock()

    def _report(self, i: int, item: Any) -> None:
        if self._quiet():
            return
        with self._lock:  # counted before the call: a reentrant read cannot exceed the limits
            if self._quiet():
                return
            self.calls += 1
            self._last_call = _clock()
        self._func(i, item)

    def _quiet(self) -> bool:
        if self._max_calls is not None and self.calls >= self._max_calls:
            return True
        last = self._last_call
        return last is not None and _clock() - last < self._min_interval

    def _get(self, i: int) -> Any:
        item = self._parent._get(i)
        self._report(i, item)
        return item

    def _get_many(self, idx: Positions) -> Any:
        chunk = self._parent._get_many(idx)
        if not self._quiet():
            for i, item in zip(idx, chunk_rows(chunk)):
                self._report(int(i), item)
        return chunk

    def _iter(self) -> Iterator[Any]:
        i = 0  # the item being read: what an error in the parent names
        for item in self._parent._iter():
            self._report(i, item)
            yield item
            i += 1

    def _set(self, i: int, value: Any) -> None:
        self._parent._set(i, value)

    def _sources(self, i: int) -> tuple[tuple[View[Any], int], ...]:
        return ((self._parent, i),)

    def _describe(self) -> str:
        options = [function_name(self._func)]
        if self._max_calls is not None:
            options.append(f"max_calls={self._max_calls}")
        if self._min_interval:
            options.append(f"max_rate={1.0 / self._min_interval:g}")
        return f"debug({', '.join(options)})"

    def __reduce__(self) -> tuple[Any, ...]:  # no lock to pickle: a worker process counts its own calls
        rate = None if not self._min_interval else 1.0 / self._min_interval
        return (DebugView, (self._parent, self._func, self._max_calls, rate))


class ThroughputView(View[T]):
    """Item ``i`` is ``parent[i]``; the items read and the time spent reading them are counted."""

    kind = "monitor_throughput"
    _items_like_parents = True

    @property
    def _reads_new_rows(self) -> bool:
        return self._parent._reads_new_rows

    def __init__(self, parent: View[Any]) -> None:
        self._parent = parent
        self._parents = (parent,)
        self._len = parent._len
        self.items = 0  # items read so far
        self.seconds = 0.0  # time spent reading them
        self._lock = threading.Lock()

    def _count(self, items: int, seconds: float) -> None:
        with self._lock:
            self.items += items
            self.seconds += seconds

    def _get(self, i: int) -> Any:
        start = _timer()
        item = self._parent._get(i)
        self._count(1, _timer() - start)
        return item

    def _get_many(self, idx: Positions) -> Any:
        start = _timer()
        chunk = self._parent._get_many(idx)
        self._count(len(idx), _timer() - start)
        return chunk

    def _iter(self) -> Iterator[Any]:
        items = iter(self._parent._iter())
        i = 0  # the item being read: what an error in the parent names
        while True:
            start = _timer()
            try:
                item = next(items)
            except StopIteration:
                return
            self._count(1, _timer() - start)
            yield item  # the time the consumer takes is not counted
            i += 1

    def _set(self, i: int, value: Any) -> None:
        self._parent._set(i, value)

    def _sources(self, i: int) -> tuple[tuple[View[Any], int], ...]:
        return ((self._parent, i),)

    def read_delay(self) -> float:
        """Seconds spent reading one item, on average over the items read since the last :meth:`reset`."""
        if not self.items:
            raise RuntimeError("monitor_throughput: no item has been read yet")
        return self.seconds / self.items

    def throughput(self) -> float:
        """Items read per second spent reading them, since the last :meth:`reset`."""
        if not self.items:
            raise RuntimeError("monitor_throughput: no item has been read yet")
        return self.items / self.seconds if self.seconds else float("inf")

    def reset(self) -> None:
        """Start counting again from zero."""
        with self._lock:
            self.items, self.seconds = 0, 0.0

    def _describe(self) -> str:
        if not self.items:
            return "monitor_throughput(nothing read yet)"
        return f"monitor_throughput({self.items} items read, {_duration(self.read_delay())} each)"

    def __reduce__(self) -> tuple[Any, ...]:  # no lock to pickle: a worker process counts its own reads
        return (ThroughputView, (self._parent,))


def _duration(seconds: float) -> str:
    """``3.2 µs``, ``15 ms``, ``2.5 s``: three significant digits in a unit that fits."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-6:.3g} µs"


@overload
def debug(
    sequence: np.ndarray, func: Callable[[int, Any], Any], max_calls: int | None = None, max_rate: float | None = None
) -> DebugView[np.ndarray]: ...


@overload
def debug(
    sequence: SequenceLike[T],
    func: Callable[[int, Any], Any],
    max_calls: int | None = None,
    max_rate: float | None = None,
) -> DebugView[T]: ...


def debug(
    sequence: SequenceLike[Any] | np.ndarray,
    func: Callable[[int, Any], Any],
    max_calls: int | None = None,
    max_rate: float | None = None,
) -> DebugView[Any]:
    """A view of ``sequence`` that calls ``func(i, item)`` whenever item ``i`` is read (to print or log it).

    ``max_calls`` stops the calls after that many; ``max_rate`` leaves at
    least ``1 / max_rate`` seconds between two calls (items read in between
    are not reported). Reading batches through it reports each item.

    >>> import lazyseq
    >>> watched = lazyseq.debug(lazyseq.smap(abs, [-1, 2, -3]), lambda i, x: print(f"item {i}: {x}"), max_calls=2)
    >>> total = sum(watched)
    item 0: 1
    item 1: 2
    >>> watched
    debug(<lambda>, max_calls=2)  [len 3]
    └─ smap(abs)  [len 3]
       └─ list  [len 3]
    """
    return DebugView(as_view(sequence), func, max_calls, max_rate)


@overload
def monitor_throughput(sequence: np.ndarray) -> ThroughputView[np.ndarray]: ...


@overload
def monitor_throughput(sequence: SequenceLike[T]) -> ThroughputView[T]: ...


def monitor_throughput(sequence: SequenceLike[Any] | np.ndarray) -> ThroughputView[Any]:
    """A view of ``sequence`` that measures how fast its items are read.

    ``read_delay()`` is the average time spent reading an item,
    ``throughput()`` its inverse (items per second), ``reset()`` starts
    counting again; ``items`` and ``seconds`` hold the counts. Only the time
    spent computing items counts, not the time the reader spends between
    reads.

    >>> import lazyseq
    >>> monitored = lazyseq.monitor_throughput(lazyseq.smap(abs, range(1000)))
    >>> total = sum(monitored)
    >>> monitored.items, monitored.read_delay() < 0.01 < monitored.throughput()
    (1000, True)
    """
    return ThroughputView(as_view(sequence))

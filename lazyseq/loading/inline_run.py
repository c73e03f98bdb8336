"""Items that a loader's reader computed several at a time, read in order: the reads that follow take them.

Items far cheaper than a read's bookkeeping (see
:attr:`~lazyseq.loading.item_cost.ItemCost.in_runs`) are computed a run at a
time when they are read in order; each of the next reads then takes its item
without a lock or any other step. A run is of the engine and of the epochs of
the shuffles below that it was computed with: once either changes, its items
are not used.

Items read in order that are cheap enough for the reader, but not that cheap,
are computed one at a time; the reads that follow are :class:`InlineReads`:
each computes its item at once, without the checks of a read through the
loader, while nothing changed since the last one (engine, epochs, process)
and items stay cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..views.shuffle import EPOCH_CHANGES
from .fork_safety import fork_generation

__all__ = ["MISSING", "InlineReads", "InlineRun", "epoch_stamp"]

MISSING: Any = object()  # not in the run (or taken already): the read computes its item


class InlineRun:
    """Items ``start``, ``start + 1``, ... computed by ``engine``'s reader; ``error``, that of the item after them.

    Each item is taken once; a read of another item, or of one taken
    already, finds it ``MISSING``.

    >>> import lazyseq
    >>> data = lazyseq.arange(10)
    >>> run = InlineRun("engine", 5, [25, 36], ValueError("no item 7"), data, epoch_stamp(data))
    >>> run.take(6, "engine"), run.take(6, "engine") is MISSING, run.take(5, "another engine") is MISSING
    (36, True, True)
    >>> run.take(7, "engine", raising=False) is MISSING
    True
    >>> run.take(7, "engine")
    Traceback (most recent call last):
    ...
    ValueError: no item 7
    """

    __slots__ = ("_changes", "_engine", "_epochs", "_error", "_start", "_values", "_view")

    def __init__(
        self, engine: Any, start: int, values: list[Any], error: BaseException | None, view: Any, stamp: tuple[int, Any]
    ) -> None:
        self._engine = engine
        self._start = start
        self._values = values
        self._error = error
        self._view = view  # the pipeline the items were read from
        self._changes, self._epochs = stamp  # of the shuffles below, before the items were computed

    def take(self, i: int, engine: Any, raising: bool = True) -> Any:
        """Item ``i``, if the run holds it and ``engine`` is the one it was computed by; its error is raised.

        ``raising=False`` leaves the error in the run (``MISSING``): for a read
        that goes on through the view, to raise it there.
        """
        k = i - self._start
        if k < 0 or engine is not self._engine:
            return MISSING
        if self._changes != EPOCH_CHANGES[0]:  # an epoch was set somewhere: on a shuffle below?
            changes = EPOCH_CHANGES[0]
            if self._view._epochs() != self._epochs:
                return MISSING
            self._changes = changes
        values = self._values
        if k < len(values):
            value = values[k]
            values[k] = MISSING  # the run does not keep what was read
            return value
        error = self._error
        if k == len(values) and error is not None and raising:
            self._error = None
            raise error
        return MISSING


class InlineReads:
    """The reads in order from item ``start`` on, each computed by ``engine``'s reader with ``read(i)``.

    Items are timed as any the reader computes (``engine.compute_with``). A
    read of any other item, or with another engine, after an epoch was set
    anywhere, in a forked child, or once items are too slow for the reader
    (or cheap enough for runs), finds it ``MISSING``: the loader reads that
    item itself. ``order`` follows the reads. Each holds ``lock``, the
    loader's, while it computes (the reader computes one item at a time, as
    through the loader); one that finds it held is ``MISSING`` too.

    >>> import threading
    >>> from lazyseq.loading.item_cost import ItemCost
    >>> from lazyseq.loading.read_order import ReadOrder
    >>> class Engine:
    ...     cost, closed = ItemCost(inline_below=1e-3), False
    ...     def compute_with(self, read, i):
    ...         return read(i)
    ...     def check_open(self):
    ...         pass
    >>> engine, order = Engine(), ReadOrder(length=10, capacity=3)
    >>> reads = InlineReads(engine, 4, lambda i: i * i, order, threading.RLock())
    >>> reads.take(4, engine), reads.take(4, engine) is MISSING, reads.take(5, engine), order.last
    (16, True, 25, 5)
    >>> engine.cost.add(0.5)  # slow items (twice): the loader's workers compute the next ones
    >>> engine.cost.add(0.5)
    >>> reads.take(6, engine) is MISSING
    True
    """

    __slots__ = (
        "_changes",
        "_cost",
        "_engine",
        "_failed",
        "_generation",
        "_lock",
        "_next",
        "_order",
        "_read",
        "_timings",
    )

    def __init__(self, engine: Any, start: int, read: Callable[[int], Any], order: Any, lock: Any) -> None:
        self._engine = engine
        self._lock = lock
        self._next = start
        self._read = read
        self._cost = engine.cost
        self._timings = self._cost.count
        self._order = order
        self._changes = EPOCH_CHANGES[0]
        self._generation = fork_generation()
        self._failed: tuple[int, Exception] | None = None  # an item and its error, kept for its read

    def take(self, i: int, engine: Any, raising: bool = True) -> Any:
        """Item ``i``, computed now, if it is the next one in order, with ``engine``, and items are still cheap.

        An item's error is raised; ``raising=False`` keeps it, for the read
        that goes on through the view to raise it there (as :meth:`InlineRun.take`).
        """
        if i != self._next or engine is not self._engine or engine.closed or self._changes != EPOCH_CHANGES[0]:
            failed = self._failed
            if failed is not None and failed[0] == i and raising:
                self._failed = None
                raise failed[1]
            return MISSING
        cost = self._cost
        if cost.count != self._timings:  # timed since: still an item at a time (not slow, nor cheap enough for runs)?
            if not cost.inline or cost.in_runs:
                return MISSING
            self._timings = cost.count
        if self._generation != fork_generation():  # a forked child
            return MISSING
        lock = self._lock
        if not lock.acquire(blocking=False):  # another thread computes an item here: this one waits its turn there
            return MISSING
        try:
            self._next = i + 1
            self._order.last = i  # read, as far as guessing the next reads goes (at step 1, as before)
            try:
                value = engine.compute_with(self._read, i)
            except Exception as error:
                if raising:
                    raise
                self._failed = (i, error)
                return MISSING
        finally:
            lock.release()
        engine.check_open()  # closed by another thread while this one computed
        return value


def epoch_stamp(view: Any) -> tuple[int, Any]:
    """What a run computed from ``view`` now is of: the count of epochs set anywhere, and those of its shuffles."""
    changes = EPOCH_CHANGES[0]  # first: an epoch set meanwhile makes the stamp look old, never new
    return changes, view._epochs()

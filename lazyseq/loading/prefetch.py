"""Items computed ahead by background workers, delivered in order: ``prefetch``."""

from __future__ import annotations

import functools
import operator
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..views import errors
from ..views.base import View
from ..views.sources import as_view
from .deferred_workers import DeferredWorkers, make_workers
from .item_cost import FIRST_ONLY_ABOVE, INLINE_BELOW, ItemCost, start_if_slow
from .jobs import ReadItem
from .options import blas_threads_for, check_method, needs_pickling, resolve_workers, serialize

__all__ = ["PrefetchIterator", "PrefetchView", "prefetch"]

POLL_SECONDS = 0.5  # how often a wait checks that the workers are alive


class PrefetchView(View):
    """Item ``i`` is ``parent[i]``, computed ahead by workers in the order the items are being read.

    The view guesses the next items from the last two reads (ascending by
    default, or any constant step) and keeps up to ``max_buffered`` of them
    computed or in progress. Reads that follow no step fetch only what is asked.
    """

    kind = "prefetch"
    _items_like_parents = True

    def __init__(
        self,
        parent: View,
        nworkers: int,
        method: str,
        max_buffered: int,
        start_hook: Callable[[int], Any] | None,
        shm_size: int,
        start_method: str | None,
        blas_threads: int | None,
        inline_below: float = INLINE_BELOW,
    ) -> None:
        check_method(method, start_method, "prefetch")
        self._nworkers = resolve_workers(nworkers)
        self._max_buffered = operator.index(max_buffered)
        if self._max_buffered < 1:
            raise ValueError(f"prefetch: max_buffered must be a positive integer, got {max_buffered}")
        if start_hook is not None and not callable(start_hook):
            raise TypeError(f"prefetch: start_hook must be callable, got {type(start_hook).__name__}")
        if not inline_below >= 0:
            raise ValueError(f"prefetch: inline_below must be a number of seconds >= 0, got {inline_below!r}")
        self._inline_below = float(inline_below)
        self._shm_size = operator.index(shm_size)
        if self._shm_size < 0:
            raise ValueError(f"prefetch: shm_size must be >= 0, got {shm_size}")
        self._parent = parent
        self._parents = (parent,)
        self._len = parent._len
        self._method = method
        self._start_hook = start_hook
        self._start_method = start_method
        self._blas_threads = blas_threads_for(blas_threads, self._nworkers)
        if self._nworkers and needs_pickling(method, start_method):  # fail now, not when reading starts
            serialize(ReadItem(parent), "the pipeline", "prefetch")
            if start_hook is not None:
                serialize(start_hook, "start_hook", "prefetch")
        self._lock = threading.RLock()
        self._schedule: _Schedule | None = None
        self._finalizer: weakref.finalize | None = None

    # -- lifetime ---------------------------------------------------------------

    def _start(self) -> _Schedule:
        cost = None
        if self._inline_below and self._start_hook is None:  # a start_hook may prepare state only workers have
            cost = ItemCost(self._inline_below)
        make = functools.partial(
            make_workers,
            ReadItem(self._parent),
            self._method,
            self._nworkers,
            self._start_hook,
            "prefetch",
            self._start_method,
            self._blas_threads,
            self._max_buffered + 2,  # slots: the items being read hold one or two
            self._shm_size,
            "item",
            cost,
        )
        workers = make() if cost is None else DeferredWorkers(make)  # not a method of self: no cycle
        if self._finalizer is not None:  # workers of the process this view was forked from: not ours to stop
            self._finalizer.detach()
        collect_early = self._method == "process"  # threads take their next tasks from a queue themselves
        self._schedule = _Schedule(workers, self._len, self._max_buffered, cost, collect_early)
        self._finalizer = weakref.finalize(self, workers.close)
        return self._schedule

    def close(self) -> None:
        """Stop the workers and drop the items computed ahead; reading again starts them anew."""
        with self._lock:
            self._schedule = None
            if self._finalizer is not None:
                self._finalizer()
                self._finalizer = None

    def __enter__(self) -> PrefetchView:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def workers_running(self) -> bool:
        """Whether background workers are up: from the first read, or from the first item worth handing over."""
        schedule = self._schedule
        return schedule is not None and getattr(schedule.workers, "started", True)

    # -- reading ----------------------------------------------------------------

    def _get(self, i: int) -> Any:
        if not self._nworkers:
            return self._parent._get(i)
        try:
            with self._lock:
                schedule = self._schedule
                if schedule is None or schedule.pid != os.getpid():  # not started, or inherited by a fork
                    schedule = self._start()
                cost = schedule.cost
                if cost is not None and cost.inline and not schedule.holds(i):
                    return self._compute_here(schedule, cost, i)
                return schedule.get(i)
        except Exception:
            schedule = self._schedule
            if schedule is not None and schedule.workers.closed:  # a worker died: start afresh at the next read
                self.close()
            raise
        except BaseException:  # KeyboardInterrupt and the like: stop everything now
            self.close()
            raise

    def _compute_here(self, schedule: _Schedule, cost: ItemCost, i: int) -> Any:
        """Item ``i`` computed in the reader's thread, timed: items this cheap are not worth a worker."""
        schedule.passed(i)
        if cost.count == 0 and self._method == "thread":  # the first item: threads start on the next if it is slow
            try:
                with start_if_slow(FIRST_ONLY_ABOVE * cost.inline_below, functools.partial(schedule.send_ahead, i)):
                    start = time.perf_counter()
                    value = self._parent._get(i)
                    cost.add(time.perf_counter() - start)
            finally:
                schedule.adopt_sent()  # whatever item i gave: the items sent are on their way
            return value
        start = time.perf_counter()
        value = self._parent._get(i)
        cost.add(time.perf_counter() - start)
        return value

    def __iter__(self) -> PrefetchIterator:
        return PrefetchIterator(self)

    def _iter(self) -> Iterator:
        return PrefetchIterator(self)

    def _describe(self) -> str:
        if not self._nworkers:
            return "prefetch(synchronous)"
        kind = {"thread": "threads", "process": "processes"}[self._method]
        return f"prefetch({self._nworkers} {kind}, max_buffered={self._max_buffered})"

    def __reduce__(self):
        settings = (self._nworkers, self._method, self._max_buffered, self._start_hook, self._shm_size)
        return (PrefetchView, (self._parent, *settings, self._start_method, self._blas_threads, self._inline_below))


class PrefetchIterator:
    """Reads a prefetched view in order; its position can be saved and restored.

    ``state_dict()`` says which item comes next; ``load_state_dict(state)``
    resumes there, so an interrupted run gives the items a run without
    interruption would have given.
    """

    def __init__(self, view: PrefetchView, position: int = 0) -> None:
        self._view = view
        self._position = position

    def __iter__(self) -> PrefetchIterator:
        return self

    def __next__(self) -> Any:
        i = self._position
        n = self._view._len
        if n is not None and i >= n:
            raise StopIteration
        self._position = i + 1  # a failed item is skipped if iteration goes on
        try:
            return self._view._get(i)
        except errors.EndOfData:  # data of unknown length ended here (uniter)
            self._position = i
            raise StopIteration from None
        except Exception as error:
            errors.reraise(error)

    def state_dict(self) -> dict:
        """Where the iteration stands: ``{"position": next item, "length": len of the view}``."""
        return {"position": self._position, "length": self._view._len}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a position that ``state_dict`` gave, on a view of the same length."""
        if state.get("length") != self._view._len:
            raise ValueError(
                f"prefetch: the saved state is for a view of length {state.get('length')}, "
                f"this one has length {self._view._len}"
            )
        self._position = operator.index(state["position"])


class _Schedule:
    """Which items are being computed or are waiting to be read, for one set of running workers."""

    def __init__(
        self, workers, length: int | None, max_buffered: int, cost: ItemCost | None, collect_early: bool
    ) -> None:
        self.workers = workers
        self._collect_early = collect_early  # collect results at every read, not only when waiting
        self.cost = cost  # whether items are cheap enough for the reader to compute (None: never)
        self.pid = os.getpid()
        self._length = length
        self._capacity = max_buffered
        self._refill = max(1, max_buffered // 2)
        self._ready: dict[int, tuple[str, Any]] = {}  # item -> (status, value)
        self._pending: set[int] = set()  # items sent to a worker
        self._cancelled: set[int] = set()  # pending items no longer wanted
        self._last = -1  # reads start out assumed to be ascending
        self._step = 1
        self._frontier: int | None = None  # the next item to send when reads go on at this step
        self._sent: list = []  # items that send_ahead sent, not recorded as pending yet

    def get(self, i: int) -> Any:
        step = i - self._last
        steady = step == self._step
        self._step, self._last = step, i
        ready, pending = self._ready, self._pending
        if pending and self._collect_early:  # process workers get their next tasks as results are collected
            for task, status, value in self.workers.poll(0):
                self._arrived(task, status, value)
        if not steady or self._frontier is None:
            self._replan(i, steady)
        if i not in ready and i not in pending:
            self._submit(i)  # before the items expected next, so that it is computed first
        self._extend(i)
        while i not in ready:
            if i not in pending:  # skipped after a cancel that came too late
                self._submit(i)
            for task, status, value in self.workers.poll(POLL_SECONDS):
                self._arrived(task, status, value)
            self._extend(i)
        status, value = ready.pop(i)
        self._extend(i)
        if status == "error":
            raise value
        return value

    def holds(self, i: int) -> bool:
        """Whether item ``i`` is computed or on its way."""
        return i in self._ready or i in self._pending

    def passed(self, i: int) -> None:
        """The reader read item ``i`` without the workers: keep track of its pace all the same."""
        self._step, self._last = i - self._last, i

    def send_ahead(self, i: int) -> None:
        """From another thread, while the reader computes item ``i``: send the items after it to the workers.

        Only the workers are touched here; :meth:`adopt_sent` records what was sent, in the reader's thread.
        """
        stop = self._stop(i) if self._step == 1 else i + 1
        self._sent = [(j, j) for j in range(i + 1, stop)]
        self.workers.submit_many(self._sent)

    def adopt_sent(self) -> None:
        """Count the items that :meth:`send_ahead` sent, if it ran, as on their way."""
        sent, self._sent = self._sent, []
        if sent:
            self._pending.update(j for j, _ in sent)
            self._frontier = sent[-1][0] + 1

    def _arrived(self, task: int, status: str, value: Any) -> None:
        self._pending.discard(task)
        self._cancelled.discard(task)
        if status != "skipped":
            self._ready[task] = (status, value)

    def _submit(self, j: int) -> None:
        self.workers.submit(j, j)
        self._pending.add(j)

    def _replan(self, i: int, steady: bool) -> None:
        """After a change of pace: drop or cancel what is no longer expected, keep what still is."""
        ahead = range(i + self._step, self._stop(i), self._step) if steady and self._step else range(0)
        ready, pending, cancelled = self._ready, self._pending, self._cancelled
        for j in [j for j in ready if j != i and j not in ahead]:
            del ready[j]
        for j in pending:
            if j != i and j not in ahead and j not in cancelled:
                self.workers.cancel(j)
                cancelled.add(j)
        for j in [j for j in cancelled if j in ahead]:  # wanted again before a worker skipped it
            self.workers.resume(j)
            cancelled.discard(j)
        self._frontier = i + self._step if len(ahead) else None

    def _extend(self, i: int) -> None:
        """Send the next expected items, up to ``max_buffered`` computed or in progress."""
        frontier = self._frontier
        if frontier is None or (self.cost is not None and self.cost.inline):
            return
        step, stop = self._step, self._stop(i)
        if (frontier - (i + step)) * step < 0:  # fell behind the reader
            frontier = i + step
        ready, pending = self._ready, self._pending
        room = self._capacity - len(ready) - len(pending) + len(self._cancelled)
        if room < self._refill and pending:
            return  # send in bulk: one message wakes a worker for several items
        batch = []
        while room > 0 and (frontier - stop) * step < 0:
            if frontier not in ready and frontier not in pending:
                batch.append((frontier, frontier))
                pending.add(frontier)
                room -= 1
            frontier += step
        if batch:
            self.workers.submit_many(batch)
        self._frontier = frontier

    def _stop(self, i: int) -> int:
        """Where the items expected after ``i`` end (exclusive), within the view."""
        stop = i + self._step * (self._capacity + 1)
        n = self._length
        return stop if n is None else max(-1, min(n, stop))


def prefetch(
    sequence: Sequence,
    nworkers: int = 0,
    method: str = "thread",
    max_buffered: int = 10,
    start_hook: Callable[[int], Any] | None = None,
    shm_size: int = 0,
    start_method: str | None = None,
    blas_threads: int | None = None,
    inline_below: float = INLINE_BELOW,
) -> PrefetchView:
    """A view of ``sequence`` whose next items are computed ahead by background workers.

    ``nworkers`` threads or processes (``method``) compute up to
    ``max_buffered`` items ahead of the reader, delivered in order. It is a
    view like any other (``len``, negative indices, slices and gathers that
    read through it, errors naming the item); reading in order is the fast
    path, and any other order still gets the right items. ``nworkers=0``
    computes each item when it is read, in the reader's thread; a negative
    ``nworkers`` means all available cores but ``-nworkers``.

    Workers start at the first read and stop with ``close()`` (or ``with``,
    or when the view is garbage collected); reading again starts them again.
    ``start_hook(worker_index)`` runs once in each worker when it starts.

    With processes, the pipeline is sent to each worker once (with
    cloudpickle where installed; memory-mapped arrays travel as their file
    name and offset), and arrays in the results come back through a fixed
    pool of shared-memory slots of ``shm_size`` bytes each (``0``: sized
    from the first result). An item read from a slot is not copied; the slot
    is reused only once nothing refers to that item any more. Results that
    do not fit, or are not arrays, are pickled. ``start_method`` picks
    ``"fork"``, ``"forkserver"`` or ``"spawn"`` (``None``: the platform's
    default); ``blas_threads`` caps BLAS threads in each worker process
    (default: the available cores divided among the workers).

    Items that take less than ``inline_below`` seconds to compute (default
    0.25 ms) are computed by the reader when it reads them, with threads and
    processes alike: handing such an item over from a worker costs about as
    much (with processes, a batch of 256 rows gathered from memory maps was
    read 0.75 times as fast as without a loader), and worker threads running
    Python would take the GIL from a reader running Python too (a
    ``partial_fit`` loop ran twice as slow). The first items are computed by
    the reader to time them, and the workers start only once items cost more
    than twice ``inline_below`` (a first item alone counts only above ten
    times: it is often slow for reasons of its own); the reader takes the
    work back if items get cheap again. ``inline_below=0`` always uses the
    workers, as code that may crash its process should; so does a
    ``start_hook``, which may prepare state only workers have.

    >>> import lazyseq
    >>> squares = lazyseq.smap(lambda x: x * x, range(1000))
    >>> with lazyseq.prefetch(squares, nworkers=2) as ahead:
    ...     total = sum(ahead)
    ...     last = ahead[-1]
    >>> total, last
    (332833500, 998001)
    """
    return PrefetchView(
        as_view(sequence),
        nworkers,
        method,
        max_buffered,
        start_hook,
        shm_size,
        start_method,
        blas_threads,
        inline_below,
    )

"""The loader engine: tasks handed to background workers, and their results on the way back.

Both loaders are thin layers over one :class:`Engine`: ``prefetch`` asks for
items by index and reads them in order, ``load_buffers`` numbers endless tasks
and reads whichever is done first. The engine owns everything else:

- where an item is computed: by the workers, or by the reader when items are
  cheap and the options allow it (:attr:`inline`, :meth:`compute_here`; the
  policy is :class:`~lazyseq.loading.item_cost.ItemCost`, the options
  :class:`~lazyseq.loading.options.LoaderOptions`);
- the tasks in flight and the results not read yet, and how many more may be
  sent (:meth:`room`: refills go out in bulk, one message waking a worker for
  several tasks; how many in all is :attr:`capacity`, which for Ray by default
  follows the items' timings, see :mod:`~lazyseq.loading.buffering`);
- waiting, with a check that the workers are alive at least every
  ``POLL_SECONDS`` (:meth:`wait_for` in order, :meth:`next_done` in order of
  completion);
- closing: on ``close()``, on garbage collection, when a worker dies, and on
  KeyboardInterrupt; never in a process forked from the one that started the
  workers (it inherited a copy of the engine, not the workers).

The workers are a :class:`~lazyseq.loading.backends.WorkerBackend`, started
at the first task that goes to them.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from time import perf_counter
from typing import Any

from . import item_cost
from .backends import DeferredWorkers, Done, WorkerBackend, start_workers
from .buffering import Buffering, refill_size
from .closing import Finalizer, daemon_thread_at_exit, interrupts_deferred
from .failures import LoaderClosed
from .fork_safety import fork_generation
from .item_cost import FIRST_ONLY_ABOVE, ItemCost, start_if_slow
from .options import LoaderOptions
from .seeding import base_seed

__all__ = ["Engine"]

POLL_SECONDS = 0.5  # how often a wait checks that the workers are alive


Refill = Callable[[], None]


class Engine:
    """Runs ``job(arg)`` for a loader's tasks, with at most ``capacity`` computed or in progress.

    ``capacity`` is a number of tasks, or a
    :class:`~lazyseq.loading.buffering.Buffering` that sizes it from the
    seconds a task takes (timed by the engine). ``start`` counts how many
    times this loader started workers before (it picks their random seeds).
    ``slot_count`` and ``slot_bytes`` size the shared-memory pool of process
    workers (``slot_bytes=0``: from the first result; ``slot_budget``, if
    given, bytes that the pool takes at most, down to ``ITEMS_AHEAD + 2``
    slots: ``slot_count`` is then what a capacity left to the loader could
    use); ``task_name`` names a task in messages ("item", "batch").
    ``launch()`` makes the workers, at the first task sent to them (default:
    the backend that ``options.method`` names, see :func:`.backends.start_workers`).

    >>> from lazyseq.loading.options import LoaderOptions
    >>> engine = Engine(abs, LoaderOptions.check("example", 2, inline_below=0), capacity=4)
    >>> engine.submit([(k, -k) for k in range(4)])
    >>> [engine.wait_for(k, -k).value for k in (2, 0)], engine.room()
    ([2, 0], 2)
    >>> engine.close()
    """

    def __init__(
        self,
        job: Callable[[Any], Any],
        options: LoaderOptions,
        capacity: int | Buffering,
        *,
        start: int = 0,
        slot_count: int = 0,
        slot_bytes: int = 0,
        slot_budget: int = 0,
        task_name: str = "task",
        launch: Callable[[], WorkerBackend] | None = None,
        cost: ItemCost | None = None,
    ) -> None:
        self.options = options
        self._generation = fork_generation()  # an engine made before a fork belongs to the parent
        self.closed = False
        self.buffering = capacity if isinstance(capacity, Buffering) else Buffering(capacity)
        self._sized_for: float | None = None  # the estimate that the capacity below follows (when sized from timings)
        self._capacity = self.buffering.capacity(None)
        # Ray sizes its runs of tasks from the timings, and a capacity left to the loader follows them
        timed = options.inline_below or options.method == "ray" or self.buffering.size is None
        # a cost given is what items took under an earlier engine of the same loader: they are not timed anew
        self.cost = (cost if cost is not None else ItemCost(options.inline_below)) if timed else None
        launch = launch or functools.partial(
            start_workers,
            job,
            options,
            base_seed(options.seed, start),
            slot_count,
            slot_bytes,
            task_name,
            self.cost,
            slot_budget,
        )
        self.workers = DeferredWorkers(launch, interruptible_start=options.method == "ray")
        self._job = job
        self.ready: dict[Hashable, Done] = {}  # in order of arrival
        self.pending: set[Hashable] = set()  # sent to the workers
        self.cancelled: set[Hashable] = set()  # pending, no longer wanted
        self._sent: list = []  # tasks sent from the timer thread of compute_here, not recorded yet
        self._finalizer = Finalizer(self, _close_in, os.getpid(), self._generation, self.workers.close)

    # -- state -------------------------------------------------------------------

    @property
    def inherited(self) -> bool:
        """Whether this process is a fork of the one that made the engine (whose workers are not ours)."""
        return self._generation != fork_generation()

    @property
    def started(self) -> bool:
        """Whether workers are running (they start with the first task sent to them)."""
        return self.workers.started and not self.workers.closed

    @property
    def inline(self) -> bool:
        """Whether the reader computes items now: they cost less than handing them over."""
        return self.cost is not None and self.cost.inline

    def holds(self, task: Hashable) -> bool:
        """Whether ``task`` is done or on its way."""
        return task in self.ready or task in self.pending

    @property
    def capacity(self) -> int:
        """How many tasks may be computed or in progress now."""
        size = self.buffering.size
        if size is not None:  # a number: the common case, read at every refill
            return size
        estimate = None if self.cost is None else self.cost.estimate
        if estimate != self._sized_for:  # sized again only when the timings say something new
            capacity = self.buffering.capacity(estimate)
            most = self.workers.most_held()  # no more than the workers' shared slots can hold
            self._sized_for, self._capacity = estimate, capacity if most is None else max(1, min(capacity, most))
        return self._capacity

    def room(self) -> int:
        """How many more tasks to send now: 0 until a refill (half the capacity) is worth a message, unless a worker
        has no task left (see :func:`~lazyseq.loading.buffering.refill_size`)."""
        capacity = self.buffering.size  # a number: the common case, read at every refill
        if capacity is None:
            capacity = self.capacity
        pending = len(self.pending)
        return refill_size(capacity, len(self.ready) + pending - len(self.cancelled), pending, self.options.nworkers)

    # -- sending -----------------------------------------------------------------

    def submit(self, tasks: Sequence[tuple[Hashable, Any]]) -> None:
        """Send ``(task, arg)`` pairs to the workers, in the order they are wanted."""
        if tasks:
            try:
                self.workers.submit_many(tasks)
            except BaseException as error:
                self.failed(error)
                raise
            self.pending.update(task for task, _ in tasks)

    def refill(self, next_tasks: Callable[[int], Sequence[tuple[Hashable, Any]]]) -> None:
        """Send the tasks that ``next_tasks(room)`` names, at most ``room``; nothing while the reader computes."""
        cost = self.cost
        if cost is not None and cost.inline:
            return
        room = self.room()
        if room:
            self.submit(next_tasks(room))

    def keep_only(self, wanted: Iterable[Hashable], current: Hashable) -> None:
        """Forget results and cancel tasks that are neither ``current`` nor ``wanted``; resume wanted ones."""
        wanted = set(wanted)
        wanted.add(current)
        ready, cancelled = self.ready, self.cancelled
        for task in [task for task in ready if task not in wanted]:
            del ready[task]
        for task in self.pending:
            if task not in wanted and task not in cancelled:
                self.workers.cancel(task)
                cancelled.add(task)
        for task in [task for task in cancelled if task in wanted]:  # wanted again before it was skipped
            self.workers.resume(task)
            cancelled.discard(task)

    # -- computing in the reader ---------------------------------------------------

    def compute_here(self, arg: Any, ahead: Callable[[], list] | None = None) -> Any:
        """``job(arg)`` computed in the reader's thread and timed: items this cheap are not worth a worker.

        An exception from ``job`` propagates. For the first item with worker
        threads, ``ahead()`` (called from a timer thread, if the item runs long)
        names the tasks to start them on.
        """
        cost: ItemCost = self.cost  # type: ignore[assignment]  # items are computed here only with a cost (inline)
        if cost.count == 0 and ahead is not None and self.options.method == "thread":
            try:
                try:
                    with start_if_slow(FIRST_ONLY_ABOVE * cost.inline_below, functools.partial(self._send, ahead)):
                        return self._timed(self._job, arg, cost)
                finally:  # whatever the item gave: the tasks sent are on their way
                    sent, self._sent = self._sent, []
                    self.pending.update(t for t, _ in sent)
            except BaseException as error:  # only now: the timer thread has finished starting the workers
                self.failed(error)
                raise
        return self.compute_with(self._job, arg)

    def compute_run_here(self, args: Iterable[Any]) -> tuple[list, BaseException | None]:
        """``job(arg)`` for ``args`` in turn, in the reader's thread, until about ``RUN_SECONDS`` of work is done.

        The items are far cheaper than handing them over (:attr:`ItemCost.in_runs`):
        their average is timed. An exception from ``job`` (a ``SystemExit``
        too) ends the run, and is returned with the values computed before it
        (to be raised at the read of its item); a KeyboardInterrupt, which
        cannot be told from a Ctrl-C, propagates at once.
        """
        cost: ItemCost = self.cost  # type: ignore[assignment]  # as in compute_here
        job, values, error = self._job, [], None
        began = now = perf_counter()
        end = began + item_cost.RUN_SECONDS
        try:
            for arg in args:
                try:
                    values.append(job(arg))
                except KeyboardInterrupt:
                    raise
                except BaseException as failure:
                    error = failure
                    break
                now = perf_counter()
                if now >= end:
                    break
        except BaseException as interrupt:
            self.failed(interrupt)
            raise
        if values:
            cost.add((now - began) / len(values))
        return values, error

    def compute_with(self, read: Callable[[Any], Any], arg: Any, count: int = 1) -> Any:
        """``read(arg)``, the ``count`` items that ``arg`` names, computed in the reader's thread and timed as any.

        The items are cheap enough to compute here (:attr:`inline`); read
        together they may cost less still (vectorized): their average is
        timed. Timed, unless the cost lets them go untimed; an error closes
        the engine as :meth:`failed` says.
        """
        cost: ItemCost = self.cost  # type: ignore[assignment]  # as in compute_here
        try:
            if cost.untimed > 0:  # (reads in other threads may take it below 0)
                cost.untimed -= 1
                began = perf_counter()
                value = read(arg)
                if perf_counter() - began > cost.slow_above * count:  # the items may have got slow
                    cost.untimed_was_slow()
                return value
            return self._timed(read, arg, cost, count)
        except BaseException as error:
            self.failed(error)
            raise

    @staticmethod
    def _timed(call: Callable[[Any], Any], arg: Any, cost: ItemCost, count: int = 1) -> Any:
        """``call(arg)``, its seconds (per item, for ``count`` items) added to ``cost``."""
        began = perf_counter()
        value = call(arg)
        cost.add((perf_counter() - began) / count)
        return value

    def _send(self, ahead: Callable[[], list]) -> None:
        """From the timer thread: only the workers are touched here, the reader records what was sent."""
        tasks = ahead()
        self.workers.submit_many(tasks)
        self._sent = tasks

    # -- receiving -----------------------------------------------------------------

    def collect(self, timeout: float) -> None:
        """Move the results that have arrived into :attr:`ready`, waiting up to ``timeout`` for one."""
        try:  # not a context manager: this runs at every read
            found = self.workers.poll(timeout)
        except BaseException as error:
            self.failed(error)
            raise
        pending, cancelled, ready = self.pending, self.cancelled, self.ready
        for done in found:
            pending.discard(done.task)
            if done.task in cancelled:  # no longer wanted: skipped, or done all the same
                cancelled.discard(done.task)
            elif done.status != "skipped":
                ready[done.task] = done

    def collect_early(self) -> None:
        """At a read that finds its result: collect what arrived if the workers get their next tasks only then.

        Results that arrived meanwhile are collected at the next wait.
        """
        if self.pending and self.workers.unsent:
            self.collect(0.0)

    def wait_for(self, task: Hashable, arg: Any, refill: Refill | None = None) -> Done:
        """The outcome of ``task`` (sent again if the workers skipped it); ``refill()`` runs before each wait.

        A task that arrived already is taken at once; what else arrived is
        collected then too, for workers that get their next tasks only then.
        """
        ready = self.ready
        if task in ready:
            self.collect_early()
            return ready.pop(task)
        if task in self.cancelled:  # wanted after all
            self.workers.resume(task)
            self.cancelled.discard(task)
        while task not in ready:
            self.check_open()
            if task not in self.pending:  # skipped after a cancel that came too late
                self.submit([(task, arg)])
            if refill is not None:
                refill()
            self.collect(POLL_SECONDS)
        self.check_open()  # closed by another thread while this one waited: what arrived is not delivered
        return ready.pop(task)

    def next_done(self, refill: Refill) -> Done:
        """The outcome that arrived first among those not read yet; ``refill()`` runs after each wait."""
        ready = self.ready
        if ready:
            self.collect_early()
        while not ready:
            self.check_open()
            if not self.pending:
                raise RuntimeError(f"{self.options.owner}: waiting for a result while no task is on its way")
            self.collect(POLL_SECONDS)
            refill()
        self.check_open()  # closed by another thread while this one waited: what arrived is not delivered
        return ready.pop(next(iter(ready)))

    def check_open(self) -> None:
        """``LoaderClosed`` if the engine or its workers were closed (by another thread, while this one waited).

        The workers alone are closed by the engine's finalizer at exit, while a
        daemon thread may still be reading: that thread waits for the end of
        the program, as one blocked on a queue would, rather than print a
        traceback as the program ends.
        """
        if self.closed or self.workers.closed:
            if not self.closed and daemon_thread_at_exit():
                threading.Event().wait()
            raise LoaderClosed(f"{self.options.owner}: the loader was closed while a result was awaited")

    # -- closing -------------------------------------------------------------------

    def failed(self, error: BaseException) -> None:
        """Close if ``error``, raised while reading, means the loader cannot go on.

        That is a worker that died or a start hook that failed (the workers
        closed themselves), or KeyboardInterrupt and the like: stop everything
        now. Loaders call it for any error raised while they read.
        """
        if not isinstance(error, Exception) or self.workers.closed:
            self.close()

    def close(self) -> None:
        """Stop the workers and forget every result; idempotent."""
        # A Ctrl-C from here on waits for the end: the finalizer counts as run the moment it starts.
        with interrupts_deferred():
            self.closed = True
            self.ready.clear()
            self.pending.clear()
            self.cancelled.clear()
            self._finalizer()


def _close_in(pid: int, generation: int, close: Callable[[], None]) -> None:
    """Close the workers, but only in the process that started them (a forked child inherits the finalizer).

    The process id says it even while a child is being forked: a garbage
    collection there may run the finalizer before the fork is counted.
    """
    if os.getpid() == pid and fork_generation() == generation:
        close()

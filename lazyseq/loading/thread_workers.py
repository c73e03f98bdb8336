"""Worker threads: tasks in, results out, objects handed over without a copy.

A :class:`~lazyseq.loading.backends.WorkerBackend` (see that module for the protocol).
"""

from __future__ import annotations

import atexit
import functools
import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence, Sized
from typing import Any, Literal

from .backends import Done
from .closing import collected_while_running, interrupts_deferred, wait_unless_hurried
from .failures import LoaderError, could_not_start
from .options import LoaderOptions
from .result_signal import ResultSignal

__all__ = ["ThreadWorkers", "worker_stopping"]

JOIN_SECONDS = 10.0  # a thread cannot be stopped: one busy in a user function finishes its item first

_this_worker = threading.local()  # in a worker thread: .stopping, set when its loader closes


def worker_stopping() -> bool:
    """Whether this is a worker thread whose loader is closing: a long job can check it, and stop early.

    >>> worker_stopping()  # not a worker thread
    False
    """
    stopping = getattr(_this_worker, "stopping", None)
    return stopping is not None and stopping.is_set()


class ThreadWorkers:
    """``options.nworkers`` threads that take tasks from one queue, so the least busy thread takes the next.

    A task still in the queue can be cancelled. (Letting a waiting reader compute queued
    tasks itself was measured: the extra thread contending for the GIL made it slower.)
    """

    unsent: Sized = ()  # idle threads take the next task from the queue themselves

    def __init__(self, job: Callable[[Any], Any], options: LoaderOptions) -> None:
        owner = self._owner = options.owner
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._tickets: dict = {}  # task -> its latest _Ticket
        self._signal = ResultSignal()
        self._stopping = threading.Event()  # what worker_stopping() reads in the threads
        self._threads = [
            threading.Thread(
                target=_serve,
                args=(k, job, options.start_hook, self._tasks, self._results, self._signal, self._stopping),
                name=f"lazyseq-{owner}-{k}",
                daemon=True,
            )
            for k in range(options.nworkers)
        ]
        self.closed = False
        started = 0
        try:
            with interrupts_deferred():  # a Ctrl-C in start(), once the thread runs, would leave it unknown here
                for thread in self._threads:
                    thread.start()
                    started += 1
        except BaseException as error:  # past the system's limit on threads, say: none is left running
            self._threads = self._threads[:started]
            self.close()
            if isinstance(error, RuntimeError):
                raise LoaderError(
                    f"{owner}: could not start worker thread {started + 1} of {options.nworkers} (nworkers): {error}"
                ) from error
            raise

    def submit_many(self, tasks: Sequence[tuple[Hashable, Any]]) -> None:
        tickets, queued = self._tickets, self._tasks
        for task, arg in tasks:
            ticket = tickets[task] = _Ticket(task, arg)
            queued.put(ticket)

    def has_room(self, count: int) -> bool:
        return True  # results are handed over as they are: no slots to run out of

    def most_held(self) -> int | None:
        return None

    def cancel(self, task: Hashable) -> None:
        """Skip ``task`` if no thread has started it yet (a "skipped" result says so)."""
        ticket = self._tickets.get(task)
        if ticket is not None:
            ticket.move("queued", "cancelled")

    def resume(self, task: Hashable) -> None:
        """Undo ``cancel``, unless a thread already skipped the task."""
        ticket = self._tickets.get(task)
        if ticket is not None:
            ticket.move("cancelled", "queued")

    def fds(self) -> list[int]:
        """A pipe the threads write a byte to after each result (made at the first call)."""
        return self._signal.fds()

    def poll(self, timeout: float) -> list[Done]:
        results = self._results
        self._signal.clear()  # before the queue: a result put after this writes again
        try:
            found: list[tuple[_Ticket, Literal["ok", "error", "skipped", "hook_failed"], Any]] = [
                results.get(timeout=timeout)
            ]
        except queue.Empty:
            if not any(t.is_alive() for t in self._threads):
                raise LoaderError(f"{self._owner}: every worker thread has stopped") from None
            return []
        while True:
            try:
                found.append(results.get_nowait())
            except queue.Empty:
                break
        delivered = []
        tickets = self._tickets
        for ticket, status, value in found:
            if status == "hook_failed":
                self.close()
                raise could_not_start(
                    f"{self._owner}: start_hook failed in worker thread {ticket.task}", value
                ) from value
            if tickets.get(ticket.task) is ticket:
                del tickets[ticket.task]
            delivered.append(Done(ticket.task, status, value))
        return delivered

    def busy_with(self) -> set[Hashable]:
        """The tasks that a thread is computing still, after :meth:`close` (a thread busy with an item outlives it)."""
        if not any(thread.is_alive() for thread in self._threads):
            return set()
        return {ticket.task for ticket in list(self._tickets.values()) if ticket.state == "running"}

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stopping.set()
        for ticket in list(self._tickets.values()):  # queued tasks are skipped: the threads go straight to the end
            ticket.move("queued", "cancelled")
        for _ in self._threads:
            self._tasks.put(None)
        current = threading.current_thread()
        others = [thread for thread in self._threads if thread is not current]
        if collected_while_running():  # nobody waits for its results: the threads end their items on their own,
            _finish_before_exit(others)  # before the program ends, though, as an explicit close would have waited
        else:  # a second Ctrl-C meanwhile: the threads end their items on their own
            wait_unless_hurried(functools.partial(_ended, others), _join_seconds())
        self._signal.close()


def _join_seconds() -> float:
    """How long a close waits for busy threads: ``JOIN_SECONDS``; at the program's end, what is left of one wait of
    ``JOIN_SECONDS`` for every loader still open or collected (not one each)."""
    if threading.main_thread().is_alive():
        return JOIN_SECONDS
    if not _exit_deadline:
        _exit_deadline.append(time.monotonic() + JOIN_SECONDS)
    return max(0.0, _exit_deadline[0] - time.monotonic())


_exit_deadline: list[float] = []


def _ended(threads: list[threading.Thread], timeout: float) -> bool:
    """Whether ``threads`` have ended, waited for ``timeout`` seconds at most (in all, not each)."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)


# Threads a collected loader left busy in an item. Added to with one call (the collector may close loaders in
# several threads at once, or within this module's own code); its ended threads are dropped now and then.
_busy_at_exit: list[threading.Thread] = []
_pruning = threading.Lock()
PRUNE_AT = 256


def _finish_before_exit(threads: list[threading.Thread]) -> None:
    """Have the program's exit wait for ``threads`` (``JOIN_SECONDS`` in all), as closing their loader would have."""
    if not _exit_hook_set:
        _exit_hook_set.append(True)
        atexit.register(_join_busy_threads)
    _busy_at_exit.extend(threads)
    if len(_busy_at_exit) > PRUNE_AT and _pruning.acquire(blocking=False):  # (never waits: a collector may be here)
        try:
            known = list(_busy_at_exit)
            alive = [thread for thread in known if thread.is_alive()]
            if len(_busy_at_exit) == len(known):  # none added meanwhile
                _busy_at_exit[:] = alive
        finally:
            _pruning.release()


_exit_hook_set: list[bool] = []


def _join_busy_threads() -> None:
    """At exit: wait for them; a Ctrl-C ends the wait, quietly (the program is ending, as asked)."""
    try:  # (not contextlib.suppress: a Ctrl-C while it is made got through)
        threads = list(_busy_at_exit)
        with interrupts_deferred():
            wait_unless_hurried(functools.partial(_ended, threads), _join_seconds())
    except KeyboardInterrupt:
        pass


class _Ticket:
    """One submitted task and where it stands: queued, running, done, cancelled or skipped."""

    __slots__ = ("task", "arg", "state", "lock")

    def __init__(self, task: Hashable, arg: Any) -> None:
        self.task, self.arg, self.state = task, arg, "queued"
        self.lock = threading.Lock()

    def move(self, expected: str, new: str) -> bool:
        with self.lock:
            if self.state != expected:
                return False
            self.state = new
            return True


def _serve(
    index: int,
    job: Callable[[Any], Any],
    start_hook: Callable[[int], Any] | None,
    tasks: queue.SimpleQueue,
    results: queue.SimpleQueue,
    signal: ResultSignal,
    stopping: threading.Event,
) -> None:
    _this_worker.stopping = stopping

    def put(entry: tuple) -> None:
        results.put(entry)
        signal.notify()

    if start_hook is not None:
        try:
            start_hook(index)
        except BaseException as error:
            put((_Ticket(index, None), "hook_failed", error))
            return
    while True:
        ticket = tasks.get()
        if ticket is None:
            return
        _run(ticket, job, put)
        del ticket  # hold no reference to a delivered item, or to a task's argument, between tasks


def _run(ticket: _Ticket, job: Callable[[Any], Any], put: Callable[[tuple], None]) -> None:
    """Compute ``ticket``'s task (or skip it, cancelled) and put its result."""
    if not ticket.move("queued", "running"):
        if ticket.move("cancelled", "skipped"):
            put((ticket, "skipped", None))
        return
    try:
        value = job(ticket.arg)
    except BaseException as error:  # whatever it is, the consumer must hear of it
        ticket.move("running", "done")
        put((ticket, "error", error))
        return
    ticket.move("running", "done")
    put((ticket, "ok", value))

"""The protocol between the loader engine and its workers, and the backends that implement it.

A *backend* runs ``job(arg)`` for tasks somewhere else than the reader's
thread: worker threads (:mod:`.thread_workers`), worker processes
(:mod:`.process_workers`), Ray tasks (:mod:`.ray_workers`), or anything that
can take a task and give back its result. The engine (:mod:`.engine`) talks
to it only through :class:`WorkerBackend`:

- ``submit_many([(task, arg), ...])`` hands tasks over, in the order they are
  wanted. ``task`` is any hashable name the engine chooses; the backend gives
  it back with the result.
- ``poll(timeout)`` returns the results that have arrived, as :class:`Done`,
  waiting up to ``timeout`` seconds for the first. It also checks that the
  workers are alive: a backend that cannot go on raises a
  :class:`~lazyseq.LoaderError` (``WorkerDied`` for a process that ended) and
  is closed. ``status`` is ``"ok"`` (``value`` is the result), ``"error"``
  (``value`` is the exception, raised where the result is read) or
  ``"skipped"`` (a cancelled task that never ran).
- ``cancel(task)`` asks to skip a task that has not started; ``resume(task)``
  takes that back. A backend may ignore both: the task then runs.
- ``has_room(count)`` says whether ``count`` more tasks would each get a
  shared-memory slot for their result (always true without slots), and
  ``most_held()`` how many results the slots hold at most while items are
  read (None without slots): a capacity left to the loader stays within it.
- ``fds()`` lists file descriptors that become readable when ``poll`` may
  have something to return (a result, a worker that died): a reader that waits for
  other things too (a data server waiting for requests) adds them to its own
  ``select``/``poll``, then calls ``poll(0)``.
- ``unsent`` is, for a backend that sends the tasks it was given to its
  workers only from ``poll``, what holds those not sent yet (its backlog's
  deque): the engine then polls at every read while it is not empty. A
  backend whose workers take their tasks themselves has ``unsent = ()``.
- ``close()`` stops every worker and releases what they hold; ``closed`` says
  whether that happened (by ``close()`` or because a worker died).

:func:`start_workers` makes the backend a loader's ``method`` names;
:class:`DeferredWorkers` is a backend that starts the real one at its first task.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Sequence, Sized
from typing import Any, Literal, NamedTuple, Protocol

from .closing import interrupts_deferred
from .item_cost import ItemCost, TimedJob
from .options import LoaderOptions

__all__ = ["DeferredWorkers", "Done", "WorkerBackend", "start_workers"]


class Done(NamedTuple):
    """The outcome of one task."""

    task: Hashable
    status: Literal["ok", "error", "skipped"]
    value: Any


class WorkerBackend(Protocol):
    """What the engine needs of the workers that compute its tasks (see the module's description)."""

    closed: bool
    unsent: Sized

    def submit_many(self, tasks: Sequence[tuple[Hashable, Any]]) -> None: ...

    def poll(self, timeout: float) -> list[Done]: ...

    def cancel(self, task: Hashable) -> None: ...

    def resume(self, task: Hashable) -> None: ...

    def has_room(self, count: int) -> bool: ...

    def most_held(self) -> int | None: ...

    def fds(self) -> list[int]: ...

    def close(self) -> None: ...


def start_workers(
    job: Callable[[Any], Any],
    options: LoaderOptions,
    seed: int,
    slot_count: int,
    slot_bytes: int,
    task_name: str,
    cost: ItemCost | None,
    slot_budget: int = 0,
) -> WorkerBackend:
    """The workers that ``options.method`` names, computing ``job(arg)``; their timings go to ``cost``."""
    if options.method == "thread":
        from .thread_workers import ThreadWorkers

        return ThreadWorkers(job if cost is None else TimedJob(job, cost), options)
    if options.method == "ray":
        from .ray_workers import RayWorkers  # here: Ray is imported only by a loader that uses it

        return RayWorkers(job, options, seed, task_name, cost)
    from .process_workers import ProcessWorkers  # here: multiprocessing is not imported with lazyseq

    return ProcessWorkers(job, options, seed, slot_count, slot_bytes, task_name, cost, slot_budget)


class DeferredWorkers:
    """A :class:`WorkerBackend` that starts the real one when it is given its first task.

    A loader that may compute cheap items in the reader uses it, so that a
    pipeline of cheap items never pays for starting threads or processes.

    >>> from lazyseq.loading.options import LoaderOptions
    >>> from lazyseq.loading.thread_workers import ThreadWorkers
    >>> workers = DeferredWorkers(lambda: ThreadWorkers(abs, LoaderOptions.check("example", 1)))
    >>> workers.poll(0.01), workers.started  # nothing to wait for, nothing started
    ([], False)
    >>> workers.submit_many([("task 0", -3)])
    >>> workers.started, workers.poll(5.0)
    (True, [Done(task='task 0', status='ok', value=3)])
    >>> workers.close()
    """

    def __init__(self, start: Callable[[], WorkerBackend], *, interruptible_start: bool = False) -> None:
        self._start = start
        # Whether a Ctrl-C may cut the start short (Ray's, which may wait seconds for a cluster, holding nothing that
        # needs closing meanwhile); otherwise it is raised once the workers are published, for close() to close them
        self._interruptible_start = interruptible_start
        self.workers: WorkerBackend | None = None
        self._closed = False
        # Held to publish the workers once started (not while they start: a close() meanwhile returns at once, and the
        # workers are closed by whoever started them); reentrant, for a finalizer that closes in that thread.
        self._publishing = threading.RLock()
        self.unsent: Sized = ()  # the real one's, once started: read at every read, without a call

    @property
    def started(self) -> bool:
        return self.workers is not None

    @property
    def closed(self) -> bool:
        return self._closed or (self.workers is not None and self.workers.closed)

    def submit_many(self, tasks: Sequence[tuple[Hashable, Any]]) -> None:
        if not tasks or self._closed:
            return
        if self.workers is None:
            with contextlib.nullcontext() if self._interruptible_start else interrupts_deferred():
                workers = self._start()
                try:
                    with self._publishing:
                        unwanted = self._closed_meanwhile() or self.workers is not None  # closed, or started by another
                        if not unwanted:
                            self.unsent = workers.unsent
                            self.workers = workers
                # An error (a Ctrl-C, for Ray) before they were published: nobody else would close them
                except BaseException:
                    if self.workers is not workers:
                        with interrupts_deferred():
                            workers.close()
                    raise
                if unwanted:
                    with interrupts_deferred():  # all the way, whatever Ctrl-C says meanwhile (see .closing)
                        workers.close()
                    if self._closed_meanwhile():
                        return
        assert self.workers is not None
        self.workers.submit_many(tasks)

    def _closed_meanwhile(self) -> bool:
        """Whether close() was called, read anew (another thread, or a finalizer, may have set it since)."""
        return self._closed

    def poll(self, timeout: float) -> list[Done]:
        return [] if self.workers is None else self.workers.poll(timeout)

    def cancel(self, task: Hashable) -> None:
        if self.workers is not None:
            self.workers.cancel(task)

    def resume(self, task: Hashable) -> None:
        if self.workers is not None:
            self.workers.resume(task)

    def has_room(self, count: int) -> bool:
        return self.workers is None or self.workers.has_room(count)

    def most_held(self) -> int | None:
        return None if self.workers is None else self.workers.most_held()

    def fds(self) -> list[int]:
        return [] if self.workers is None else self.workers.fds()

    def close(self) -> None:
        with self._publishing:  # workers starting now are closed by the thread that starts them
            self._closed = True
            workers = self.workers
        if workers is not None:
            with interrupts_deferred():  # all the way, whatever Ctrl-C says meanwhile (see .closing)
                workers.close()

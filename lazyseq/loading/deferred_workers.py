"""How a loader gets its workers: :func:`make_workers` now, or :class:`DeferredWorkers` at the first task.

A loader that may compute cheap items in the reader (see
:mod:`lazyseq.loading.item_cost`) starts its threads or processes only once
items turn out to be worth handing over: a pipeline of cheap items never pays
for starting them, and the reader times its first items before any worker
process is forked (after a fork, every page the reader writes to is copied
once, which would make those first items look far more costly than they are).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .item_cost import ItemCost, TimedJob
from .thread_workers import ThreadWorkers

__all__ = ["DeferredWorkers", "make_workers"]


def make_workers(
    job: Callable[[Any], Any],
    method: str,
    count: int,
    start_hook: Callable[[int], Any] | None,
    owner: str,
    start_method: str | None,
    blas_threads: int,
    slot_count: int,
    slot_bytes: int,
    task_name: str,
    cost: ItemCost | None,
):
    """``count`` worker threads or processes (``method``) computing ``job(arg)``; with ``cost``, timed into it."""
    if method == "thread":
        return ThreadWorkers(job if cost is None else TimedJob(job, cost), count, start_hook, owner)
    from .process_workers import ProcessWorkers  # here: multiprocessing is not imported with lazyseq

    return ProcessWorkers(
        job,
        count,
        start_hook,
        owner,
        start_method,
        blas_threads,
        slot_count=slot_count,
        slot_bytes=slot_bytes,
        task_name=task_name,
        cost=cost,
    )


class DeferredWorkers:
    """The interface of :class:`ThreadWorkers` / :class:`ProcessWorkers`, starting them at the first task.

    >>> from lazyseq.loading.thread_workers import ThreadWorkers
    >>> workers = DeferredWorkers(lambda: ThreadWorkers(abs, 1, None, "example"))
    >>> workers.poll(0.01), workers.started  # nothing to wait for, nothing started
    ([], False)
    >>> workers.submit("task 0", -3)
    >>> workers.started, workers.poll(5.0)
    (True, [('task 0', 'ok', 3)])
    >>> workers.close()
    """

    def __init__(self, start: Callable[[], Any]) -> None:
        self._start = start
        self._workers: Any = None
        self._closed = False

    @property
    def started(self) -> bool:
        return self._workers is not None

    @property
    def closed(self) -> bool:
        return self._closed or (self._workers is not None and self._workers.closed)

    def _running(self):
        if self._workers is None:
            self._workers = self._start()
        return self._workers

    def submit(self, task, arg) -> None:
        self._running().submit(task, arg)

    def submit_many(self, tasks: list) -> None:
        self._running().submit_many(tasks)

    def poll(self, timeout: float) -> list:
        return [] if self._workers is None else self._workers.poll(timeout)

    def cancel(self, task) -> None:
        if self._workers is not None:
            self._workers.cancel(task)

    def resume(self, task) -> None:
        if self._workers is not None:
            self._workers.resume(task)

    def free_slots(self, count: int = 1) -> bool:
        """Whether ``count`` tasks sent now would each get a shared slot (always, for threads or before start)."""
        free_slots = getattr(self._workers, "free_slots", None)
        return free_slots is None or free_slots(count)

    @property
    def pids(self) -> list[int]:
        return getattr(self._workers, "pids", [])

    def close(self) -> None:
        self._closed = True
        if self._workers is not None:
            self._workers.close()

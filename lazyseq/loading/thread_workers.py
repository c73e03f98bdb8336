"""Worker threads: tasks in, results out, objects handed over without a copy.

Every loader talks to its workers through the same small interface:
``submit(task, arg)``, ``poll(timeout)`` (the results that arrived, as
``(task, status, value)``), ``cancel(task)`` and ``close()``.
"""

from __future__ import annotations

import queue
import threading

from .failures import LoaderError

__all__ = ["ThreadWorkers"]

JOIN_SECONDS = 1.0


class ThreadWorkers:
    """``count`` threads that take tasks from one queue, so the least busy thread takes the next."""

    def __init__(self, job, count: int, start_hook, owner: str) -> None:
        self._owner = owner
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled: set = set()
        self._threads = [
            threading.Thread(
                target=_serve,
                args=(k, job, start_hook, self._tasks, self._results, self._cancelled),
                name=f"lazyseq-{owner}-{k}",
                daemon=True,
            )
            for k in range(count)
        ]
        for thread in self._threads:
            thread.start()
        self.closed = False

    def submit(self, task, arg) -> None:
        self._cancelled.discard(task)
        self._tasks.put((task, arg))

    def cancel(self, task) -> None:
        """Skip ``task`` if no thread has started it yet."""
        self._cancelled.add(task)

    def resume(self, task) -> None:
        """Undo ``cancel`` (too late if a thread already skipped the task: it then reports "skipped")."""
        self._cancelled.discard(task)

    def poll(self, timeout: float) -> list:
        results = self._results
        try:
            found = [results.get(timeout=timeout)]
        except queue.Empty:
            if not any(t.is_alive() for t in self._threads):
                raise LoaderError(f"{self._owner}: every worker thread has stopped") from None
            return []
        while True:
            try:
                found.append(results.get_nowait())
            except queue.Empty:
                break
        for task, status, value in found:
            if status == "hook_failed":
                self.close()
                raise LoaderError(f"{self._owner}: start_hook failed in worker thread {task}") from value
        return found

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for _ in self._threads:
            self._tasks.put(None)
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join(JOIN_SECONDS)


def _serve(index: int, job, start_hook, tasks, results, cancelled) -> None:
    if start_hook is not None:
        try:
            start_hook(index)
        except BaseException as error:
            results.put((index, "hook_failed", error))
            return
    while True:
        item = tasks.get()
        if item is None:
            return
        task, arg = item
        if task in cancelled:
            cancelled.discard(task)
            results.put((task, "skipped", None))
            continue
        try:
            value = job(arg)
        except BaseException as error:  # whatever it is, the consumer must hear of it
            results.put((task, "error", error))
            del error
            continue
        results.put((task, "ok", value))
        del value  # hold no reference to a delivered item between tasks

"""A worker process's one helper thread: it ends the worker once its parent is gone, and runs calls that may hang.

A worker process must not outlive the consumer that started it, whatever the
start method: the thread looks at the parent's pid every
``check_seconds`` and exits the process when it changed. Between two looks
it runs the calls handed to :meth:`ParentWatch.run_within`, for the worker
whose call could block for ever (seeding a generator whose lock was held when
the worker was forked, see :mod:`.seeding`): the worker waits for the call
with a bound, and no thread is started for it, so a worker has exactly two
threads (its own and this one) from its first task on.

>>> watch = ParentWatch(check_seconds=0.25)
>>> watch.run_within(5.0, lambda: None)
True
>>> watch.close()
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

__all__ = ["ParentWatch"]


class ParentWatch:
    """The thread that watches the parent process and runs calls for the worker (see the module)."""

    def __init__(self, check_seconds: float) -> None:
        self._parent = os.getppid()
        self._check_seconds = check_seconds
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._watch, name="lazyseq-parent-watch", daemon=True)
        self._thread.start()

    def run_within(self, seconds: float, call: Callable[[], None]) -> bool:
        """Run ``call()`` in the watching thread: ``False`` if it has not returned after ``seconds``.

        An exception raised by ``call`` is raised here.
        """
        outcome: list[BaseException | None] = []
        done = threading.Event()

        def run() -> None:
            try:
                call()
            except BaseException as error:
                outcome.append(error)
            else:
                outcome.append(None)
            done.set()

        self._calls.put(run)
        if not done.wait(seconds):
            return False
        if outcome[0] is not None:
            raise outcome[0]
        return True

    def close(self) -> None:
        """Stop the thread once the call it runs (if any) has returned; a worker process never needs to."""
        self._calls.put(None)
        self._thread.join()

    def _watch(self) -> None:
        while os.getppid() == self._parent:
            try:
                call = self._calls.get(timeout=self._check_seconds)
            except queue.Empty:
                continue
            if call is None:
                return
            call()
        os._exit(1)

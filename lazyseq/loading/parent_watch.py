"""A worker process's one helper thread: it ends the worker once its parent is gone.

A worker process must not outlive the consumer that started it, whatever the
start method: the thread looks at the parent's pid every ``check_seconds``
and exits the process when it changed, or when the consumer, where it is not
the parent (a forkserver's worker, whose parent is the forkserver, which the
worker itself keeps alive), has ended. A worker runs three threads: its own,
this one, and the one that writes results held too long (see
:class:`~.worker_process.LateSender`).

>>> watch = ParentWatch(check_seconds=0.25)
>>> watch.close()
"""

from __future__ import annotations

import os
import threading

__all__ = ["ParentWatch"]


class ParentWatch:
    """The thread that watches the parent process (see the module)."""

    def __init__(self, check_seconds: float, consumer: int | None = None) -> None:
        self._parent = os.getppid()
        self._consumer = None if consumer in (None, self._parent) else consumer  # watched apart: not the parent
        self._check_seconds = check_seconds
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lazyseq-parent-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread; a worker process never needs to."""
        self._closing.set()
        self._thread.join()

    def _watch(self) -> None:
        while os.getppid() == self._parent and (self._consumer is None or _alive(self._consumer)):
            if self._closing.wait(self._check_seconds):
                return
        os._exit(1)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (or is a zombie its parent has yet to reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True

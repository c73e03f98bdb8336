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

__all__ = ["ParentWatch", "consumer_gone", "watched"]

_this_process: list[ParentWatch] = []  # the watch of this worker process, if it is one


class ParentWatch:
    """The thread that watches the parent process (see the module)."""

    def __init__(self, check_seconds: float, consumer: int | None = None) -> None:
        self._parent = os.getppid()
        self._consumer = None if consumer in (None, self._parent) else consumer  # watched apart: not the parent
        self._check_seconds = check_seconds
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lazyseq-parent-watch", daemon=True)
        self._thread.start()
        _this_process[:] = [self]

    def close(self) -> None:
        """Stop the thread; a worker process never needs to."""
        self._closing.set()
        self._thread.join()

    def gone(self) -> bool:
        """Whether the consumer is gone (this process is about to end)."""
        return os.getppid() != self._parent or (self._consumer is not None and not _alive(self._consumer))

    def _watch(self) -> None:
        while not self.gone():
            if self._closing.wait(self._check_seconds):
                return
        os._exit(1)


def watched() -> bool:
    """Whether this is a worker process of lazyseq's, which ends with its consumer."""
    return bool(_this_process) and _this_process[0]._thread.is_alive()


def consumer_gone() -> bool:
    """Whether this is a worker process whose consumer is gone (its watch ends it within ``check_seconds``)."""
    return watched() and _this_process[0].gone()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (or is a zombie its parent has yet to reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True

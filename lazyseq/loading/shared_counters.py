"""Integers shared with worker processes, in memory of their own.

Process workers count the tasks they begin and finish in them, so that the
consumer knows what a worker was computing when it died. The memory is an
anonymous file mapped in each process (see :mod:`.shared_slots`): a forked
worker inherits it, a spawned one receives its descriptor as it starts. It is
released by :meth:`SharedCounters.close`, or when the counters are garbage
collected, and nothing of it outlives the processes that map it.
(``multiprocessing.RawArray`` would keep the descriptors of its heap open for
the life of the program, and a Ctrl-C inside it can leave that heap broken.)
"""

from __future__ import annotations

import mmap
import weakref
from typing import Any

from .shared_slots import anonymous_file, close_quietly

__all__ = ["SharedCounters"]

_WIDTH = 8  # bytes of a signed 64-bit integer


class SharedCounters:
    """``count`` signed 64-bit integers, all 0 at first, read and written by index from any process that has them.

    >>> counters = SharedCounters(2)
    >>> counters[1] += 3
    >>> counters[0], counters[1]
    (0, 3)
    >>> counters.close()
    """

    def __init__(self, count: int, *, fd: int | None = None) -> None:
        self.count = count
        self._fd = anonymous_file(count * _WIDTH, "lazyseq-progress") if fd is None else fd
        try:
            self._map = mmap.mmap(self._fd, count * _WIDTH)
        except BaseException:
            close_quietly(self._fd)
            raise
        self._values = memoryview(self._map).cast("q")
        self._release = weakref.finalize(self, _release, self._values, self._map, self._fd)

    def __getitem__(self, k: int) -> int:
        return self._values[k]

    def __setitem__(self, k: int, value: int) -> None:
        self._values[k] = value

    def close(self) -> None:
        """Let go of the memory here (the workers' copies are theirs); idempotent."""
        self._release()

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled for a worker that is spawned: its descriptor goes with the worker's start (multiprocessing's DupFd)
        from multiprocessing import reduction

        return (_attach, (self.count, reduction.DupFd(self._fd)))


def _attach(count: int, fd: Any) -> SharedCounters:
    return SharedCounters(count, fd=fd.detach())


def _release(values: memoryview, memory: mmap.mmap, fd: int) -> None:
    values.release()
    memory.close()
    close_quietly(fd)

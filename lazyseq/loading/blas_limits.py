"""BLAS threads in worker processes: at most ``blas_threads`` each.

Two workers on two cores each running a BLAS with two threads would fight over
the cores, so every worker process is limited to ``blas_threads`` BLAS
threads. A BLAS reads its thread count once, when it loads: a spawned worker
loads its BLAS after it starts, so the environment variables set for it while
it is started are enough (:func:`limits_for_workers`). A forked worker
inherits a BLAS that is already loaded, whose thread count must be set with
threadpoolctl (:class:`WorkerLimit`). With OpenBLAS, setting it starts the
library's thread pool, whose threads busy-wait for a while (measured: 0.12 s
of CPU per worker, taken from the other workers), so a forked worker sets it
only once its BLAS has started threads, that is after the first task that
used it: a pipeline that does no linear algebra never pays for it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["WorkerLimit", "limits_for_workers"]

VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


@contextmanager
def limits_for_workers(start_method: str, blas_threads: int) -> Iterator[bool]:
    """While worker processes are started: yields whether they start with the limit already set."""
    if start_method != "spawn":  # forked, directly or from a server: the worker limits what it has loaded
        yield False
        return
    saved = {name: os.environ.get(name) for name in VARIABLES}
    os.environ.update({name: str(blas_threads) for name in VARIABLES})
    try:
        yield True
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class WorkerLimit:
    """In a worker process: the BLAS limit, set at once for libraries loaded later, and for loaded ones when
    they first start threads (call :meth:`after_task` after each task), unless ``inherited`` already.

    Whether threads started is asked of the system after each of the first
    ``CHECK_FIRST`` tasks (a pipeline that uses BLAS does so from its first
    items), then after one task in ``CHECK_EVERY``: the question costs a
    system call, a good part of what a cheap task costs.
    """

    CHECK_FIRST = 8
    CHECK_EVERY = 32

    def __init__(self, blas_threads: int, inherited: bool) -> None:
        for name in VARIABLES:
            os.environ[name] = str(blas_threads)
        self._blas_threads = blas_threads
        self.pending = not inherited
        self._tasks = 0
        if self.pending and _native_threads_started():  # loaded here already (forkserver, or the hook did)
            self._set()

    def after_task(self) -> None:
        self._tasks += 1
        checked = self._tasks <= self.CHECK_FIRST or self._tasks % self.CHECK_EVERY == 0
        if checked and self.pending and _native_threads_started():
            self._set()

    def _set(self) -> None:
        self.pending = False
        libraries = _libraries_over(self._blas_threads)
        if libraries is not None:
            libraries.limit(limits=self._blas_threads)


def _native_threads_started() -> bool:
    """Whether this process runs threads that Python did not start (a BLAS thread pool, say).

    Where the system does not say, assume so.
    """
    try:
        threads = os.stat("/proc/self/task").st_nlink - 2
    except OSError:
        return True
    return threads > threading.active_count()


def _libraries_over(blas_threads: int) -> Any:
    """The loaded BLAS libraries (a threadpoolctl controller) if one of them uses more threads; else None."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    libraries = ThreadpoolController()
    if all(library.num_threads <= blas_threads for library in libraries.lib_controllers):
        return None
    return libraries

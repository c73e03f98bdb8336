"""BLAS threads in worker processes: at most ``blas_threads`` each.

Two workers on two cores each running a BLAS with two threads would fight over
the cores, so every worker process is limited to ``blas_threads`` BLAS
threads. A BLAS reads its thread count once, when it loads: a spawned worker
loads its BLAS after it starts, so the environment variables set for it while
it is started are enough (:func:`limits_for_workers`). A forked worker
inherits a BLAS that is already loaded, whose thread count is then set with
threadpoolctl where it is installed (:func:`limit_in_worker`). With OpenBLAS
that starts its thread pool, whose threads busy-wait for a while (measured:
about 0.12 s of CPU per worker, once, at start); without the limit the same
happens after every burst of BLAS calls in a worker. Setting the limit in the
consumer around the fork instead only moves that cost to the consumer
(restoring its own limit starts its pool), at every start.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["limit_in_worker", "limits_for_workers"]

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
    if start_method != "spawn":  # forked, directly or from a server: the worker limits what it inherited
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


def limit_in_worker(blas_threads: int, inherited: bool) -> None:
    """In a worker: the limit for BLAS libraries loaded from now on and, unless already set, for loaded ones."""
    for name in VARIABLES:
        os.environ[name] = str(blas_threads)
    if inherited:
        return
    libraries = _libraries_over(blas_threads)
    if libraries is not None:
        libraries.limit(limits=blas_threads)


def _libraries_over(blas_threads: int):
    """The loaded BLAS libraries (a threadpoolctl controller) if one of them uses more threads; else None."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    libraries = ThreadpoolController()
    if all(library.num_threads <= blas_threads for library in libraries.lib_controllers):
        return None
    return libraries

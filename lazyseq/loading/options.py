"""The options that every loader shares, checked once: worker count, method, start method, BLAS threads."""

from __future__ import annotations

import multiprocessing
import operator
import os
import pickle
import select

from ..views.errors import LoaderFailure

__all__ = [
    "UnpicklablePipeline",
    "available_cores",
    "blas_threads_for",
    "check_method",
    "needs_pickling",
    "resolve_workers",
    "serialize",
]

METHODS = ("thread", "process")


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform tells it)."""
    if hasattr(os, "process_cpu_count"):  # Python 3.13
        return os.process_cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def resolve_workers(nworkers: int) -> int:
    """``nworkers`` as a count: negative means all available cores but ``-nworkers`` (at least one)."""
    n = operator.index(nworkers)
    if n < 0:
        return max(1, available_cores() + n)
    return n


def check_method(method: str, start_method: str | None, owner: str) -> None:
    if method not in METHODS:
        raise ValueError(f"{owner}: method must be 'thread' or 'process', got {method!r}")
    if method == "process" and not hasattr(select, "poll"):  # Windows: no poll(), no descriptor passing
        raise NotImplementedError(f"{owner}: method='process' needs a POSIX system (Linux, macOS); use 'thread'")
    if start_method is not None:
        available = multiprocessing.get_all_start_methods()
        if start_method not in available:
            raise ValueError(f"{owner}: start_method must be one of {available} or None, got {start_method!r}")
        if method != "process":
            raise ValueError(f"{owner}: start_method only applies to method='process'")


def blas_threads_for(blas_threads: int | None, nworkers: int) -> int:
    """BLAS threads per worker process: by default the cores shared out between the workers."""
    if blas_threads is None:
        return max(1, available_cores() // max(1, nworkers))
    n = operator.index(blas_threads)
    if n < 1:
        raise ValueError(f"blas_threads must be a positive integer, got {blas_threads}")
    return n


class UnpicklablePipeline(LoaderFailure, TypeError):
    """What a loader cannot send to its worker processes (raised as it is, not as an item's failure)."""


def needs_pickling(method: str, start_method: str | None) -> bool:
    """Whether workers get the pipeline pickled (not for threads, nor for forked processes)."""
    return method == "process" and multiprocessing.get_context(start_method).get_start_method() != "fork"


def serialize(obj, what: str, owner: str) -> bytes:
    """``obj`` pickled for a worker process (cloudpickle where installed, so lambdas travel too).

    A failure names the innermost part of a pipeline that cannot be pickled.
    """
    try:
        import cloudpickle

        dumps = cloudpickle.dumps
    except ImportError:  # plain pickle: functions must then be importable by name
        cloudpickle, dumps = None, pickle.dumps
    try:
        return dumps(obj)
    except Exception as error:
        culprit = _unpicklable_part(obj, dumps) or what
        hint = (
            ""
            if cloudpickle
            else " (installing cloudpickle, lazyseq[processes], lets lambdas and local functions travel)"
        )
        raise UnpicklablePipeline(
            f"{owner}: cannot send {culprit} to worker processes: {type(error).__name__}: {error}{hint}; "
            "use method='thread', or make it picklable"
        ) from error


def _unpicklable_part(obj, dumps) -> str | None:
    """The label of the innermost view of a pipeline that fails to pickle, if ``obj`` is a view."""
    from ..views.base import View

    target = getattr(obj, "view", obj)  # a job wraps the view it reads
    if not isinstance(target, View):
        return None
    for parent in target._parents:
        try:
            dumps(parent)
        except Exception:
            return _unpicklable_part(parent, dumps) or f"the {parent._label()} view"
    return f"the {target._label()} view"

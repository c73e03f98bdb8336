"""The main loop of a worker process.

A worker receives tasks over its own connection, computes each one and sends
back either the skeleton of the result (its arrays written into the shared
slot the task came with) or the pickled result, with the seconds the task took
(the consumer decides from them where cheap items are best computed). It ignores SIGINT (the
consumer decides what an interrupt means), limits its BLAS threads, and exits
on its own when the consumer's process goes away.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from multiprocessing.reduction import recv_handle
from time import perf_counter

from ..views.chunks import writing_into
from .failures import capture
from .shared_slots import WorkerSlots
from .structure import flatten, layout_of, place_in_slot

__all__ = ["run_worker"]

BLAS_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
PARENT_CHECK_SECONDS = 0.25
NICENESS = 10
loads = pickle.loads


def dumps(message) -> bytes:
    return pickle.dumps(message, protocol=5)


def run_worker(index: int, conn, job, start_hook, blas_threads: int) -> None:
    """Serve tasks until told to stop, until the connection closes, or until the parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _lower_priority()
    _exit_with_parent()
    _limit_blas_threads(blas_threads)
    try:
        if isinstance(job, bytes):
            job = pickle.loads(job)
        if isinstance(start_hook, bytes):
            start_hook = pickle.loads(start_hook)
        if start_hook is not None:
            start_hook(index)
    except BaseException as error:
        conn.send_bytes(dumps(("hook_failed", index, capture(error))))
        return
    conn.send_bytes(dumps(("ready", index, os.getpid())))
    in_place = getattr(job, "writes_in_place", False)
    slots = None
    while True:
        try:
            message = loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        tag = message[0]
        if tag == "run":
            for task, arg, slot in message[1]:
                start = perf_counter()
                try:
                    if slot >= 0 and slots is not None and in_place:
                        with writing_into(slots.slot(slot)):
                            result = job(arg)
                    else:
                        result = job(arg)
                except Exception as error:
                    conn.send_bytes(dumps(("failed", task, slot, capture(error))))
                    continue
                _send_result(conn, task, slot, result, slots, perf_counter() - start)
                del result
        elif tag == "slots":
            slots = WorkerSlots(recv_handle(conn), message[1], message[2])
        elif tag == "stop":
            return


def _send_result(conn, task, slot: int, result, slots: WorkerSlots | None, seconds: float) -> None:
    arrays: list = []
    skeleton = flatten(result, arrays)
    if arrays and slot >= 0 and slots is not None:
        layout = place_in_slot(slots.slot(slot), arrays)
        if layout is not None:
            conn.send_bytes(dumps(("shared", task, slot, skeleton, layout, seconds)))
            return
    needed = layout_of(arrays)[1]
    try:
        conn.send_bytes(dumps(("pickled", task, slot, result, needed, seconds)))
    except Exception as error:  # pickling failed before anything was written: the stream is intact
        message = f"the result cannot be sent from the worker process: {type(error).__name__}: {error}"
        try:
            raise TypeError(message) from error
        except TypeError as wrapped:
            conn.send_bytes(dumps(("failed", task, slot, capture(wrapped))))


def _lower_priority() -> None:
    """Run below the consumer: workers take idle cores first and never slow a busy consumer down."""
    try:
        os.nice(NICENESS)
    except (AttributeError, OSError):  # no nice() here, or not allowed
        pass


def _exit_with_parent() -> None:
    """Exit as soon as the process that started this one is gone (no orphans, whatever the start method)."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="lazyseq-parent-watch", daemon=True).start()


def _limit_blas_threads(count: int) -> None:
    for name in BLAS_VARIABLES:  # read by BLAS libraries that are loaded from now on
        os.environ[name] = str(count)
    try:  # and for those already loaded (always the case after fork)
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=count)

"""The main loop of a worker process.

A worker seeds its random generators (see :mod:`.seeding`), receives tasks
over its own connection (see :mod:`.messages`), computes each one and sends
back either the skeleton of the result (its arrays written into the shared
slot the task came with) or the pickled result, with the seconds the task took
(they size each worker's share of the tasks). Results of cheap tasks go back
several to a write (see :class:`Outbox`): each write wakes the consumer, and a
wake-up costs more than such a task; one held while a task turns out long goes
all the same after ``LateSender.LATE_SECONDS`` (see :class:`LateSender`). It
ignores SIGINT (the consumer decides what an interrupt means), limits its BLAS
threads, and exits on its own when the consumer's process goes away (see
:mod:`.parent_watch`).
"""

from __future__ import annotations

import os
import pickle
import select
import threading
import time
from collections.abc import Hashable
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from time import perf_counter
from typing import Any

import numpy as np

from ..views.errors import seterr
from .array_pickling import cloud_dumps
from .blas_limits import WorkerLimit
from .closing import ignore_interrupts
from .crash_reports import report_crashes
from .failures import capture
from .fork_safety import forked_worker
from .messages import (
    PickledResult,
    Ready,
    RunTasks,
    SharedResult,
    StartFailed,
    Stop,
    TaskFailed,
    UseSlots,
    WorkerStart,
    decode,
    encode,
    encode_alike,
    encode_shape,
    frame_header,
    pack_numbers,
    read_frame,
    write_all,
)
from .parent_watch import ParentWatch
from .seeding import seed_this_worker
from .shared_counters import SharedCounters
from .shared_slots import WorkerSlots
from .structure import address_of, flatten, layout_of, one_array_in_slot, place_in_slot, rebuild

__all__ = ["run_worker"]

PARENT_CHECK_SECONDS = 0.25
NICENESS = 10


def run_worker(conn: Connection, start: WorkerStart) -> None:
    """Serve tasks until told to stop, until the connection closes, or until the parent dies."""
    ignore_interrupts()
    _lower_priority()
    ParentWatch(PARENT_CHECK_SECONDS, start.consumer)  # exits this process once the consumer's is gone
    try:
        report_crashes(conn)  # (the consumer's first message)
    except (EOFError, OSError, RuntimeError):  # the consumer closed the loader as this worker started
        return
    work = start.work
    seterr(start.error_mode)  # a spawned worker starts with the default: the pipeline's reads raise as the consumer's
    stage = "unpickling the pipeline"
    try:
        if isinstance(work, bytes):
            work = pickle.loads(work)
        job, start_hook = work
        stage = "seeding the random generators"
        # after unpickling (torch?), before the hook
        seed_this_worker(start.seed, start.index, forked=forked_worker())
        stage = "start_hook"
        if start_hook is not None:
            start_hook(start.index)
        stage = "limiting BLAS threads"
        blas = WorkerLimit(start.blas_threads, start.blas_inherited)  # after the hook: its threads are not BLAS
    except BaseException as error:
        conn.send_bytes(encode(StartFailed(start.index, stage, capture(error))))
        return
    conn.send_bytes(encode(Ready(start.index, os.getpid())))
    outbox = Outbox(conn.fileno())
    try:
        _serve(conn, job, blas, outbox, start.progress, start.index)
    except ConnectionError:  # its pipe broke: the consumer is gone (before the parent watch noticed)
        return
    finally:  # whatever ended the loop, what was computed before it still arrives
        try:
            outbox.send()
        except OSError:
            pass


def _serve(conn: Connection, job: Any, blas: WorkerLimit, outbox: Outbox, progress: SharedCounters, index: int) -> None:
    """Compute the tasks received, in order; a message that arrives meanwhile is read between two tasks.

    So ``Stop`` ends the work at once (the tasks still queued are dropped: the
    consumer stopped wanting them), and tasks sent while others run join them.
    ``progress[2 * index]`` counts the tasks begun and ``progress[2 * index + 1]``
    those finished: should the worker die, the consumer knows which one it
    was in, if any (results wait in the outbox).
    """
    late = LateSender(outbox)
    try:
        _serve_tasks(conn, job, blas, outbox, late, progress, index)
    finally:
        late.close()


def _serve_tasks(
    conn: Connection,
    job: Any,
    blas: WorkerLimit,
    outbox: Outbox,
    late: LateSender,
    progress: SharedCounters,
    index: int,
) -> None:
    slots = None
    built_in_place = BuiltInPlace()
    fd = conn.fileno()
    incoming = select.poll()
    incoming.register(fd, select.POLLIN)
    tasks: list = []  # the tasks received and not computed yet, the next one last
    while True:
        if not tasks or incoming.poll(0):  # nothing to do, or a message waits
            try:
                message = decode(read_frame(fd))
            except (EOFError, OSError):
                return
            kind = type(message)
            if kind is RunTasks:
                tasks[:0] = reversed(message.tasks)  # after those received before: the list is popped from its end
            elif kind is UseSlots:
                try:
                    handle = recv_handle(conn)
                except (RuntimeError, OSError):  # "received 0 items of ancdata": a Stop sent by a close() came first
                    return
                slots = WorkerSlots(handle, message.count, message.slot_bytes)
            elif kind is Stop:
                return
            continue
        task, arg, slot = tasks.pop()
        if outbox.holding:  # held while this task runs: sent by the late sender should it take long
            late.watch()
        progress[2 * index] += 1
        began = perf_counter()
        try:
            if slot >= 0 and slots is not None:
                result = job.write_into(arg, slots.slot(slot))
            else:
                result = job(arg)
        except BaseException as error:  # SystemExit too; KeyboardInterrupt: SIGINT is ignored, so the item's own
            seconds = perf_counter() - began
            outbox.add(encode(TaskFailed(task, slot, capture(error))))
        else:
            seconds = perf_counter() - began
            shape = built_in_place.shape(task, slot, result, slots)
            if shape is not None:
                outbox.add_alike(shape, pack_numbers(task, slot, seconds))
            else:
                outbox.add(_result_message(task, slot, result, slots, seconds))
            del result
        progress[2 * index + 1] += 1
        if blas.pending:
            blas.after_task()
        if outbox.due(len(tasks), seconds):
            outbox.send()


def _result_message(task: Hashable, slot: int, result: Any, slots: WorkerSlots | None, seconds: float) -> bytes:
    """The message that brings ``result`` back, or the failure of its task if some part of it cannot be pickled."""
    arrays: list = []
    skeleton = None
    try:
        skeleton = flatten(result, arrays)
        return _encode_result(task, slot, skeleton, arrays, slots, seconds)
    except Exception as error:
        if skeleton is not None:  # as _encode_result sends it
            result = rebuild(skeleton, arrays)
        by_value = _by_value(PickledResult(task, slot, result, 0, seconds))
        if by_value is not None:
            return by_value
        message = f"the result cannot be sent from the worker process: {type(error).__name__}: {error}"
        try:
            raise TypeError(message) from error
        except TypeError as wrapped:
            return encode(TaskFailed(task, slot, capture(wrapped)))


def _by_value(message: PickledResult) -> bytes | None:
    """``message`` pickled with cloudpickle, if installed, which sends classes of the main script by value.

    A worker unpickled the pipeline with those classes in it, copies of the
    consumer's, while the main script it runs again (``spawn``,
    ``forkserver``) defined its own: pickle refuses such a copy ("not the same
    object as __main__.Pair"). Sent by value, the consumer gets its own class.
    """
    try:
        return cloud_dumps(message)
    except Exception:
        return None


def _encode_result(
    task: Hashable, slot: int, skeleton: tuple, arrays: list, slots: WorkerSlots | None, seconds: float
) -> bytes:
    """A result that :func:`~lazyseq.nested.flatten` split into ``skeleton`` and ``arrays``, encoded: the skeleton
    (the parts other than arrays, pickled) if its arrays fit in the slot, else all of it."""
    if arrays and slot >= 0 and slots is not None:
        layout = place_in_slot(slots.slot(slot), slots.address(slot), arrays)
        if layout is not None:
            return encode(SharedResult(task, slot, skeleton, layout, seconds))
    # rebuilt: its containers are those of results in slots (see lazyseq.nested), whether it fits in a slot or not,
    # and its arrays in C order as there (one in Fortran order would come back so, until the slots exist)
    arrays = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrays]
    return encode(PickledResult(task, slot, rebuild(skeleton, arrays), layout_of(arrays)[1], seconds))


class BuiltInPlace:
    """Results that are one array built in their slot (a batch of a view): the common case, made short.

    The part of their message that describes such a result is made once per
    dtype, shape and place in the slot (:meth:`shape`), and results alike go
    back in one message (see :class:`Outbox`). Anything else gets None (see
    :func:`_result_message`).
    """

    KEPT = 64  # descriptions kept: batches of a few shapes at most (the last one may be shorter)

    def __init__(self) -> None:
        self._shapes: dict[tuple, bytes] = {}

    def shape(self, task: Any, slot: int, result: Any, slots: WorkerSlots | None) -> bytes | None:
        """What describes ``result`` in its slot (the same object for results alike), or None if it is not one array there."""
        if type(result) is not np.ndarray or type(task) is not int or slots is None or slot < 0:
            return None
        offset = address_of(result) - slots.address(slot)
        if not (0 <= offset <= slots.slot_bytes - result.nbytes and result.flags.c_contiguous):
            return None  # not in its slot: copied there by _result_message
        if not -(1 << 63) <= task < 1 << 63:
            return None
        key = (result.dtype, result.shape, offset)
        shape = self._shapes.get(key)
        if shape is None:
            if len(self._shapes) >= self.KEPT:
                self._shapes.clear()
            shape = self._shapes[key] = encode_shape(*one_array_in_slot(result, offset))
        return shape


class Outbox:
    """Messages to the consumer not written yet, written together with one system call.

    A result waits here while the worker computes the next task of its run, as
    long as that is quick: tasks take under half of ``HOLD_SECONDS``, and the
    oldest message waiting is younger than that. Results then go ``TOGETHER``
    to a write at least (the consumer, woken once, reads them all), or half of
    those the worker has in hand (results held and tasks left) if that is
    more, or fewer when the run ends: a worker far ahead of the consumer wakes
    it less often (each wake-up takes both sides' CPU), one close behind it
    holds back little. A quick task's result held while a slow one of the same
    run is computed goes after ``LateSender.LATE_SECONDS`` (see
    :class:`LateSender`). Results alike in their slots that follow each other
    go as one :class:`~.messages.AlikeResults`. The framing is
    :mod:`multiprocessing.connection`'s, so the consumer reads them as
    messages sent one by one.
    """

    HOLD_SECONDS = 0.0005
    TOGETHER = 3
    IN_HAND_SHARE = 0.5

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._frames: list[bytes] = []
        self._count = 0  # results waiting
        self._shape: bytes | None = None  # of the results alike that come last, not framed yet
        self._alike: list[bytes] = []  # their numbers
        self._oldest = 0.0
        self._lock = threading.Lock()  # the worker's thread adds and sends, a LateSender sends too

    @property
    def holding(self) -> bool:
        """Whether results wait to be written."""
        return self._count > 0

    def add(self, message: bytes) -> None:
        with self._lock:
            if not self._count:
                self._oldest = perf_counter()
            if self._alike:
                self._frame_alike()
            self._count += 1
            self._frames += (frame_header(len(message)), message)

    def add_alike(self, shape: bytes, numbers: bytes) -> None:
        """A result in its slot described by ``shape`` (see :class:`BuiltInPlace`), its ``numbers`` packed."""
        with self._lock:
            if not self._count:
                self._oldest = perf_counter()
            if shape is not self._shape and self._alike:
                self._frame_alike()
            self._shape = shape
            self._alike.append(numbers)
            self._count += 1

    def _frame_alike(self) -> None:
        message = encode_alike(self._shape, self._alike)  # type: ignore[arg-type]  # set with _alike
        self._frames += (frame_header(len(message)), message)
        self._alike = []

    def due(self, remaining: int, seconds: float) -> bool:
        """Whether to write now: ``remaining`` tasks of the current run are left, the last one took ``seconds``."""
        if remaining == 0 or seconds >= self.HOLD_SECONDS / 2:  # nothing to wait for, or the next comes late
            return True
        count = self._count
        return count >= max(self.TOGETHER, int((remaining + count) * self.IN_HAND_SHARE)) or (
            perf_counter() - self._oldest >= self.HOLD_SECONDS
        )

    def send(self) -> None:
        with self._lock:
            self._send()

    def send_if_older(self, seconds: float) -> bool:
        """Write what waits if the oldest result has waited ``seconds``; whether results still wait after."""
        with self._lock:
            if self._count and perf_counter() - self._oldest >= seconds:
                self._send()
            return self._count > 0

    def _send(self) -> None:
        if not self._count:
            return
        if self._alike:
            self._frame_alike()
        data = b"".join(self._frames)
        self._frames.clear()
        self._count = 0
        write_all(self._fd, data)


class LateSender:
    """A thread that writes the results an :class:`Outbox` holds once they have waited ``LATE_SECONDS``.

    The worker holds a quick task's result while it computes the next task
    of its run (see :class:`Outbox`); should that task take long (items of
    uneven cost, one that waits on a file), the result would wait for it,
    and the consumer with it, while another worker may be idle. The worker
    calls :meth:`watch` as it starts a task while results wait: the thread
    then looks every ``LATE_SECONDS`` until none waits. It costs nothing to
    a worker whose tasks are slow (each result goes at once) and a wake-up
    every ``LATE_SECONDS`` to one whose tasks are quick.
    """

    LATE_SECONDS = 0.02

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._watching = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lazyseq-late-sender", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (once its current look is done) and wait for it."""
        self._closing.set()
        self._watching.set()
        self._thread.join()

    def watch(self) -> None:
        """Results wait while a task starts: look at them until none waits."""
        if not self._watching.is_set():
            self._watching.set()

    def _run(self) -> None:
        watching, outbox = self._watching, self._outbox
        while True:
            watching.wait()
            if self._closing.is_set():
                return
            time.sleep(self.LATE_SECONDS)
            watching.clear()  # then looked at: a result added meanwhile is seen here, or watched anew
            if self._closing.is_set():  # set before the event: a close() that the clear() undid is seen here
                return
            try:
                if outbox.send_if_older(self.LATE_SECONDS):
                    watching.set()
            except OSError:  # the consumer is gone: the worker's own thread finds out too
                return


def _lower_priority() -> None:
    """Run below the consumer: workers take idle cores first and never slow a busy consumer down."""
    try:
        os.nice(NICENESS)
    except (AttributeError, OSError):  # no nice() here, or not allowed
        pass

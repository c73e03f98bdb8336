"""The messages between a loader and its worker processes, each a named tuple.

Consumer to worker: :class:`RunTasks` (tasks to compute, in order),
:class:`UseSlots` (the shared-memory pool; its file descriptor follows on the
connection), :class:`Stop`. Worker to consumer: :class:`Ready` once started,
:class:`StartFailed` if starting failed, then one of :class:`SharedResult`,
:class:`PickledResult` or :class:`TaskFailed` per task. All travel pickled
(plain pickle, protocol 5) over the worker's own pipe.

>>> import pickle
>>> message = RunTasks([Task(task=3, arg=3, slot=-1)])
>>> pickle.loads(pickle.dumps(message)).tasks[0].arg
3
"""

from __future__ import annotations

import pickle
from typing import Any, NamedTuple

__all__ = [
    "CapturedError",
    "decode",
    "encode",
    "StartFailed",
    "PickledResult",
    "Ready",
    "RunTasks",
    "SharedResult",
    "Stop",
    "Task",
    "TaskFailed",
    "UseSlots",
    "WorkerStart",
]


def encode(message: tuple) -> bytes:
    """A message as bytes for the pipe: plain pickle (multiprocessing's own pickler costs microseconds more)."""
    return pickle.dumps(message, protocol=5)


decode = pickle.loads


class WorkerStart(NamedTuple):
    """What a worker process is started with (pipeline and hook pickled unless the worker was forked)."""

    index: int  # type: ignore[assignment]  # a field named like tuple.index: read by name only
    job: Any
    start_hook: Any
    blas_threads: int
    blas_inherited: bool  # whether the consumer set the BLAS limit before starting the worker (see blas_limits)
    seed: int


class CapturedError(NamedTuple):
    """An exception raised in a worker, described so that it always pickles (see :mod:`.failures`)."""

    type_name: str
    message: str
    traceback: str
    chain: str
    pickled: bytes | None


class Task(NamedTuple):
    task: Any
    arg: Any
    slot: int  # the shared slot to write the result into, or -1


class RunTasks(NamedTuple):
    tasks: list[Task]


class UseSlots(NamedTuple):
    count: int  # type: ignore[assignment]  # a field named like tuple.count: read by name only
    slot_bytes: int


class Stop(NamedTuple):
    pass


class Ready(NamedTuple):
    worker: int
    pid: int


class StartFailed(NamedTuple):
    worker: int
    stage: str  # what failed: "unpickling the pipeline", "start_hook", "limiting BLAS threads"
    error: CapturedError


class SharedResult(NamedTuple):
    """A result whose arrays are in the task's slot: ``layout`` says where, ``skeleton`` how they nest."""

    task: Any
    slot: int
    skeleton: tuple
    layout: list
    seconds: float


class PickledResult(NamedTuple):
    """A result sent whole; ``array_bytes`` is what its arrays would need in a slot."""

    task: Any
    slot: int
    result: Any
    array_bytes: int
    seconds: float


class TaskFailed(NamedTuple):
    task: Any
    slot: int
    error: CapturedError

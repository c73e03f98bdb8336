"""The messages between a loader and its worker processes, each a named tuple.

Consumer to worker: :class:`RunTasks` (tasks to compute, in order),
:class:`UseSlots` (the shared-memory pool; its file descriptor follows on the
connection), :class:`Stop`. Worker to consumer: :class:`Ready` once started,
:class:`StartFailed` if starting failed, then one of :class:`SharedResult`,
:class:`PickledResult` or :class:`TaskFailed` per task, or
:class:`AlikeResults` for several results in slots that share one shape (the
batches of a view). They travel over the worker's own pipe as :func:`encode`
writes them.

The messages sent for every task have a packed form, as they cost the
consumer's thread more to pickle than a cheap task costs to compute: tasks
numbered by ``int`` (those of both loaders) as 64-bit integers, and results
in slots as their numbers plus their pickled skeleton and layout (no class to
look up by name), said once for results alike. Everything else is pickled
(protocol 5; a result sent whole with its arrays' byte order, see
:mod:`.array_pickling`).

>>> message = RunTasks([Task(task=3, arg=3, slot=-1), Task(task=4, arg=4, slot=0)])
>>> encode(message)[:1], decode(encode(message)) == message
(b't', True)
>>> done = SharedResult(task=7, slot=2, skeleton=("a", 0), layout=[("<f8", (4, 2), 0)], seconds=0.25)
>>> encode(done)[:1], decode(encode(done)) == done
(b's', True)
>>> shape = encode_shape(("a", 0), [("<f8", (4, 2), 0)])
>>> decode(encode_alike(shape, [pack_numbers(7, 2, 0.25), pack_numbers(8, 0, 0.5)])).numbers
[(7, 2, 0.25), (8, 0, 0.5)]
"""

from __future__ import annotations

import operator
import os
import pickle
import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..views.errors import ErrorMode
from .array_pickling import dumps
from .structure import ONE_ARRAY

if TYPE_CHECKING:
    from .shared_counters import SharedCounters

__all__ = [
    "AlikeResults",
    "CapturedError",
    "decode",
    "decode_alike",
    "decode_shared",
    "is_alike",
    "is_shared",
    "pack_numbers",
    "encode",
    "encode_alike",
    "encode_run",
    "encode_shape",
    "encode_shared",
    "FRAME_SIZE",
    "LONG_FRAME_SIZE",
    "frame_header",
    "read_frame",
    "write_all",
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


_PICKLED = 0x80  # the first byte of every pickle of protocol 2 or later
_TASKS_OWN_ARG = ord("t")  # RunTasks of int tasks, each its own arg (prefetch: task i reads item i)
_TASKS_NO_ARG = ord("n")  # RunTasks of int tasks, arg None (load_buffers)
_OWN_ARG_TAG, _NO_ARG_TAG = bytes((_TASKS_OWN_ARG,)), bytes((_TASKS_NO_ARG,))
_SHARED = ord("s")  # SharedResult of an int task
_SHARED_TAG = bytes((_SHARED,))
_NUMBERS = struct.Struct("<qqd")  # a SharedResult's task, slot and seconds
_ALIKE = ord("g")  # AlikeResults: the shape's length, the shape, then each result's numbers
_ALIKE_TAG = bytes((_ALIKE,))
_SHAPE_SIZE = struct.Struct("<I")
pack_numbers = _NUMBERS.pack  # (task, slot, seconds) of one result, for encode_alike
_INT64 = (-(1 << 63), 1 << 63)


def encode(message: tuple) -> bytes:
    """A message as bytes for the pipe: packed (see the module's description), else plain pickle.

    Plain pickle: multiprocessing's own pickler costs microseconds more.
    """
    if isinstance(message, RunTasks):
        return encode_run([(task, arg) for task, arg, _ in message.tasks], [slot for _, _, slot in message.tasks])
    if isinstance(message, SharedResult) and type(message.task) is int and _INT64[0] <= message.task < _INT64[1]:
        shape = encode_shape(message.skeleton, message.layout)
        return encode_shared(message.task, message.slot, message.seconds, shape)
    if isinstance(message, PickledResult):  # (pickle.dumps would change the byte order of some arrays: see
        return dumps(message)  # .array_pickling; the arrays of other results are in slots, their dtypes said)
    return pickle.dumps(message, protocol=5)


def encode_run(tasks: Sequence[tuple[Any, Any]], slots: Sequence[int]) -> bytes:
    """:class:`RunTasks` for the ``(task, arg)`` pairs ``tasks``, each with its slot, as :func:`encode` gives it.

    Packed when every task is an ``int`` of 64 bits and every arg is its
    task (``prefetch``) or every arg is None (``load_buffers``).
    """
    names = [task for task, _ in tasks]
    args = [arg for _, arg in tasks]
    tag = None
    if not names or set(map(type, names)) == {int}:
        if all(map(operator.is_, args, names)) or (set(map(type, args)) == {int} and args == names):
            tag = _OWN_ARG_TAG
        elif args.count(None) == len(args):
            tag = _NO_ARG_TAG
    if tag is not None:
        numbers = array("q", bytes(16 * len(names)))
        try:
            numbers[::2] = array("q", names)
        except OverflowError:  # beyond 64 bits
            pass
        else:
            numbers[1::2] = array("q", slots)
            return tag + numbers.tobytes()
    return pickle.dumps(RunTasks([Task(task, arg, slot) for (task, arg), slot in zip(tasks, slots)]), protocol=5)


def encode_shape(skeleton: tuple, layout: list) -> bytes:
    """The part of a packed :class:`SharedResult` that says what its slot holds (the same for like results)."""
    return pickle.dumps((skeleton, layout), protocol=5)


def encode_shared(task: int, slot: int, seconds: float, shape: bytes) -> bytes:
    """A packed :class:`SharedResult` of the int ``task`` (64 bits), ``shape`` made by :func:`encode_shape`."""
    return _SHARED_TAG + _NUMBERS.pack(task, slot, seconds) + shape


def encode_alike(shape: bytes, numbers: Sequence[bytes]) -> bytes:
    """:class:`AlikeResults` packed: ``shape`` by :func:`encode_shape`, each result's ``numbers`` by :func:`pack_numbers`."""
    return _ALIKE_TAG + _SHAPE_SIZE.pack(len(shape)) + shape + b"".join(numbers)


def decode(raw: bytes | bytearray) -> Any:
    """The message that :func:`encode` (or :func:`encode_alike`) gave ``raw`` for."""
    tag = raw[0]
    if tag == _PICKLED:
        return pickle.loads(raw)
    if tag == _SHARED:
        return SharedResult._make(decode_shared(raw))
    if tag == _ALIKE:
        skeleton, layout, results = decode_alike(raw)
        return AlikeResults(skeleton, layout, list(results))
    if tag in (_TASKS_OWN_ARG, _TASKS_NO_ARG):
        numbers = array("q")
        numbers.frombytes(memoryview(raw)[1:])
        tasks, slots = numbers[::2], numbers[1::2]
        if tag == _TASKS_OWN_ARG:
            return RunTasks([Task(task, task, slot) for task, slot in zip(tasks, slots)])
        return RunTasks([Task(task, None, slot) for task, slot in zip(tasks, slots)])
    raise ValueError(f"unknown message kind {tag:#x}")


def is_shared(raw: bytes | bytearray) -> bool:
    """Whether ``raw`` is a packed :class:`SharedResult` (read with :func:`decode_shared`)."""
    return raw[0] == _SHARED


def decode_shared(raw: bytes | bytearray) -> tuple[int, int, tuple, list, float]:
    """The fields of the packed :class:`SharedResult` ``raw``, in order, without making the tuple's class.

    A one-array result's skeleton is :data:`~.structure.ONE_ARRAY` itself,
    so a reader can tell it by identity.
    """
    task, slot, seconds = _NUMBERS.unpack_from(raw, 1)
    skeleton, layout = _shape_of(bytes(raw[_SHAPE_START:]))
    return task, slot, skeleton, layout, seconds


def is_alike(raw: bytes | bytearray) -> bool:
    """Whether ``raw`` is a packed :class:`AlikeResults` (read with :func:`decode_alike`)."""
    return raw[0] == _ALIKE


def decode_alike(raw: bytes | bytearray) -> tuple[tuple, list, Iterator[tuple[int, int, float]]]:
    """The skeleton and layout of the packed :class:`AlikeResults` ``raw``, and its results' numbers."""
    (size,) = _SHAPE_SIZE.unpack_from(raw, 1)
    start = 1 + _SHAPE_SIZE.size
    skeleton, layout = _shape_of(bytes(raw[start : start + size]))
    return skeleton, layout, _NUMBERS.iter_unpack(memoryview(raw)[start + size :])


_SHAPE_START = 1 + _NUMBERS.size
_shapes_seen: dict[bytes, tuple[tuple, list]] = {}  # what the shapes of one-array results said (a batch, mostly)
SHAPES_KEPT = 64


def _shape_of(shape: bytes) -> tuple[tuple, list]:
    """The skeleton and layout that :func:`encode_shape` gave ``shape`` for: remembered, or decoded now."""
    known = _shapes_seen.get(shape)
    return known if known is not None else _decode_shape(shape)


def _decode_shape(shape: bytes) -> tuple[tuple, list]:
    """What :func:`encode_shape` gave ``shape`` for; remembered for one-array results, which hold no values."""
    skeleton, layout = pickle.loads(shape)
    if skeleton == ONE_ARRAY:  # nothing in it that a consumer could change: it may serve every like result
        skeleton = ONE_ARRAY
        layout = [(np.dtype(dtype), shape, offset) for dtype, shape, offset in layout]  # made once, not per result
        if len(_shapes_seen) >= SHAPES_KEPT:
            _shapes_seen.clear()
        _shapes_seen[shape] = skeleton, layout
    return skeleton, layout


FRAME_SIZE = struct.Struct(">i")  # a message's length, or -1: then the length follows in LONG_FRAME_SIZE
LONG_FRAME_SIZE = struct.Struct(">Q")


def frame_header(size: int) -> bytes:
    """What goes before a message of ``size`` bytes on the pipe, as :mod:`multiprocessing.connection` frames it.

    A 4-byte big-endian length, or ``-1`` then an 8-byte one. Either side
    reads it with ``Connection.recv_bytes`` or :mod:`.message_reader`.

    >>> frame_header(5), frame_header(2**31)
    (b'\\x00\\x00\\x00\\x05', b'\\xff\\xff\\xff\\xff\\x00\\x00\\x00\\x00\\x80\\x00\\x00\\x00')
    """
    return size.to_bytes(4, "big") if size < 0x7FFFFFFF else b"\xff\xff\xff\xff" + size.to_bytes(8, "big")


def read_frame(fd: int) -> bytes:
    """The next message on ``fd``, framed by :func:`frame_header`; ``EOFError`` if the other end closed.

    It reads the message and nothing after it (a file descriptor may follow
    on the connection, see :class:`UseSlots`).

    >>> read, write = os.pipe()
    >>> write_all(write, frame_header(3) + b"abc")
    >>> read_frame(read)
    b'abc'
    >>> os.close(write), os.close(read)
    (None, None)
    """
    (size,) = FRAME_SIZE.unpack(_read_exactly(fd, FRAME_SIZE.size))
    if size == -1:
        (size,) = LONG_FRAME_SIZE.unpack(_read_exactly(fd, LONG_FRAME_SIZE.size))
    return _read_exactly(fd, size)


def _read_exactly(fd: int, count: int) -> bytes:
    data = os.read(fd, count)
    if len(data) == count:  # the common case: all of it at once
        return data
    parts, left = [data], count - len(data)
    while left:
        if not data:
            raise EOFError("the connection closed")
        data = os.read(fd, left)
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to ``fd`` (a pipe may take a large write in parts)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class WorkerStart(NamedTuple):
    """What a worker process is started with."""

    index: int  # type: ignore[assignment]  # a field named like tuple.index: read by name only
    work: Any  # (job, start_hook), pickled together (bytes) unless the worker was forked: see serialize_work
    progress: (
        SharedCounters  # shared integers, two per worker: the tasks it began and finished (what it was in if it died)
    )
    blas_threads: int
    blas_inherited: bool  # whether the consumer set the BLAS limit before starting the worker (see blas_limits)
    seed: int
    error_mode: ErrorMode  # the consumer's seterr: how errors computing items propagate, in the worker too
    consumer: int  # the consumer's pid: the worker ends with it (not its parent under forkserver: see parent_watch)


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


class AlikeResults(NamedTuple):
    """Results of int tasks whose arrays are in their slots, all alike: ``(task, slot, seconds)`` for each."""

    skeleton: tuple
    layout: list
    numbers: list[tuple[int, int, float]]


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

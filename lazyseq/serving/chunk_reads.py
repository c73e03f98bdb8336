"""A served view's reads of several items at once: the requests they make, and the chunks that answer them.

A read of many items (a batch of a served view) asks for them in one request
(or one per :data:`~lazyseq.serving.wire.MAX_POSITIONS`), answered with one
message holding them as a chunk (see :mod:`.chunk_wire`). Reads of
consecutive runs that follow one another (the batches of a served view, in
order) also ask for the next run of as many items, so that the server
computes it while the consumer uses this one: :data:`AHEAD_RUNS` runs ahead
at most (reads by two threads may come in either order).

>>> numbers = iter(range(100))
>>> reads = ChunkReads()
>>> reads.plan(range(0, 4), 10, lambda: next(numbers))  # (the requests answering it, those to send)
([0], [(0, [0, 1, 2, 3]), (1, [4, 5, 6, 7])])
>>> reads.plan(range(4, 8), 10, lambda: next(numbers))  # asked already; and the end, ahead
([1], [(2, [8, 9])])
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..loading.failures import LoaderError
from ..loading.jobs import ItemsAt
from ..views.chunks import scatter
from ..views.keys import Positions
from . import wire
from .chunk_wire import from_wire
from .failures import restore_failure

__all__ = ["ChunkReads", "Taken"]

Run = tuple[int, int]  # consecutive positions: (start, stop)
AHEAD_RUNS = 2  # runs asked for ahead and not read yet, at most: reads of two threads may come in either order


class Taken(NamedTuple):
    """What :meth:`ChunkReads.take` found: the chunk; or the error, and the position of the item that failed where
    known; or that the server sends these items one by one only (``apart``: each can travel, not all in one)."""

    chunk: Any = None
    error: BaseException | None = None
    at: int | None = None
    apart: bool = False


class ChunkReads:
    """The chunks one reader (a :class:`~lazyseq.serving.remote_view.RemoteView`) asked for and has received."""

    def __init__(self) -> None:
        self.asked: dict[int, list[int]] = {}  # request number -> its positions, until answered
        self.arrived: dict[int, tuple[str, Any]] = {}  # request number -> ("ok", chunk), ("error", exception)...
        self.failed_at: dict[int, int] = {}  # request number -> the position of the item that failed, where known
        self._ahead: dict[Run, list[int]] = {}  # runs asked for before they were read, oldest first: their requests
        self._read: deque[Run] = deque(maxlen=2 * AHEAD_RUNS)  # the last runs read

    def plan(self, idx: Positions, length: int, number: Callable[[], int]) -> tuple[list, list]:
        """The requests whose answers hold items ``idx`` (of a view of ``length``), and the ``(request, positions)``
        to send for them (``number()`` numbers each new one)."""
        positions = idx.tolist() if isinstance(idx, np.ndarray) else list(idx)
        first, stop = positions[0], positions[-1] + 1
        run = (first, stop) if stop - first == len(positions) and positions == list(range(first, stop)) else None
        to_send: list[tuple[int, list[int]]] = []
        wanted = self._ahead.pop(run, None) if run is not None else None
        if wanted is None:
            wanted, to_send = self._ask(positions, number)
        if run is None:
            return wanted, to_send
        in_order = first == 0 or any(first == read[1] for read in self._read)
        self._read.append(run)
        following = (stop, min(length, stop + len(positions)))
        if in_order and stop < length and following not in self._ahead and following not in self._read:
            requests, more = self._ask(list(range(*following)), number)
            self._ahead[following] = requests
            to_send += more
            while len(self._ahead) > AHEAD_RUNS:  # the oldest was not read (a jump elsewhere): its answer dropped
                self.drop(self._ahead.pop(next(iter(self._ahead))))
        return wanted, to_send

    def _ask(self, positions: list[int], number: Callable[[], int]) -> tuple[list[int], list]:
        requests: list[int] = []
        to_send: list[tuple[int, list[int]]] = []
        for start in range(0, len(positions), wire.MAX_POSITIONS):
            part, req = positions[start : start + wire.MAX_POSITIONS], number()
            self.asked[req] = part
            requests.append(req)
            to_send.append((req, part))
        return requests, to_send

    def drop(self, requests: list[int]) -> None:
        """Forget ``requests``: their answers, arrived or still to come, are dropped."""
        for req in requests:
            self.asked.pop(req, None)
            self.arrived.pop(req, None)
            self.failed_at.pop(req, None)

    def abandon(self, requests: list[int]) -> None:
        """Forget ``requests``, which a read that did not end (a Ctrl-C, a lost server) made or was waiting for."""
        self.drop(requests)
        gone = set(requests)
        for run in [run for run, asked in self._ahead.items() if gone.intersection(asked)]:
            self.drop(self._ahead.pop(run))

    def waiting(self, requests: list[int]) -> bool:
        return not all(req in self.arrived for req in requests)

    def answered(self, req: int, kind: bytes, header: dict, buffers: list, where: str) -> None:
        """Take the answer to request ``req`` (one of :attr:`asked`): its chunk, or the error it says."""
        positions = self.asked.pop(req)
        if kind == b"item" and header.get("apart") is True:
            self.arrived[req] = ("apart", None)
        elif kind == b"item":
            try:
                if "places" in header:
                    raise wire.ProtocolError("items asked for at once came in shared memory: they travel in the answer")
                chunk = from_wire(wire.decode(header.get("tree"), buffers), len(positions))
                self.arrived[req] = ("ok", chunk)
            except wire.ProtocolError as error:
                self.arrived[req] = ("error", error)
        elif kind == b"error":
            self.arrived[req] = ("error", restore_failure(header, where))
            at = header.get("at")
            if type(at) is int and at in positions:
                self.failed_at[req] = at
        else:
            message = header.get("message")
            named = ItemsAt(np.array(positions))
            self.arrived[req] = ("error", LoaderError(f"{where} could not compute items {named}: {message}"))

    def take(self, requests: list[int], count: int) -> Taken:
        """What the answers to ``requests`` make together: the chunk of their ``count`` items, or the first error."""
        answers = [self.arrived.pop(req) for req in requests]
        failed_at = [self.failed_at.pop(req, None) for req in requests]
        for (status, value), at in zip(answers, failed_at):
            if status == "error":
                return Taken(error=value, at=at)
        if any(status == "apart" for status, _ in answers):
            return Taken(apart=True)
        pieces = [value for _, value in answers]
        if len(pieces) == 1:
            return Taken(pieces[0])
        step = wire.MAX_POSITIONS  # (each request but the last asked for that many)
        places = [np.arange(start, min(start + step, count)) for start in range(0, count, step)]
        return Taken(scatter(pieces, places, count))

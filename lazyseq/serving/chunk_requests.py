"""A consumer's request for several items at once, on the server: the tasks that read them, and the one answer.

The items are read as a chunk (see :mod:`lazyseq.views.chunks`): with one
vectorized call where the view allows, by one task; or, where reading them
takes long enough that workers gain by sharing it (:class:`Splitting`), in
parts read side by side by several workers, put back together in request
order for the one message that answers (see :mod:`.chunk_wire`). The failure
of an item answers the whole request, naming that item: the first in request
order, as a local read would.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np

from ..loading.backends import Done
from ..loading.jobs import ItemsAt
from ..views.chunks import scatter
from . import wire
from .chunk_wire import to_wire, unsendable_item
from .failures import failure_header, unsendable_header

__all__ = ["ChunkPart", "ChunkRequest", "Splitting"]

# A request is split into parts of about this many seconds of reading at least: handing a part to a worker and putting
# the parts back together costs a few hundred microseconds (more with worker processes), which a part must be worth.
PART_SECONDS = 2e-3
SMOOTHING = 0.3  # weight of the newest timing in the running estimate of the seconds an item takes


class Splitting:
    """How many parts a request for items at once is read in: one per worker at most, each worth handing over.

    The cost of an item follows the requests answered (their seconds from
    being asked to being read, times the workers that shared them); until one
    was, requests are read whole.

    >>> splitting = Splitting(workers=4)
    >>> splitting.parts(64)
    1
    >>> splitting.timed(64, parts=1, seconds=0.064)  # a millisecond an item
    >>> splitting.parts(64), splitting.parts(2), splitting.parts(1000)
    (4, 1, 4)
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._item_seconds: float | None = None

    def parts(self, count: int) -> int:
        if self._item_seconds is None:
            return 1
        return max(1, min(self.workers, count, int(self._item_seconds * count / PART_SECONDS)))

    def timed(self, count: int, parts: int, seconds: float) -> None:
        """A request for ``count`` items, read in ``parts``, was answered ``seconds`` after it was asked."""
        item_seconds = seconds * parts / count
        estimate = self._item_seconds
        self._item_seconds = item_seconds if estimate is None else SMOOTHING * item_seconds + (1 - SMOOTHING) * estimate


class ChunkPart(NamedTuple):
    """The key of one task of a :class:`ChunkRequest` in the server's engine.

    ``serial`` tells the request from another of the same number (the same
    consumer asking again, after the server forgot it): a task still in
    progress for the one before is not taken for a part of this one.
    """

    consumer: bytes
    req: int
    part: int
    serial: int


class ChunkRequest:
    """Items at ``positions`` (of the view labelled ``label``), read in ``parts`` tasks and answered at once.

    >>> request = ChunkRequest([4, 0, 2], parts=2, label="view", serial=0)
    >>> request.parts
    2
    >>> [str(task) for _, task in request.tasks(b"c", 7)]
    ['4, 0', '2']
    >>> request.take(1, Done(None, "ok", np.array([20])))
    >>> request.complete
    False
    >>> request.take(0, Done(None, "ok", np.array([40, 0])))
    >>> request.complete
    True
    >>> kind, fields, buffers = request.answer()
    >>> kind, fields["count"], wire.decode(fields["tree"], buffers)
    (b'item', 3, ('rows', array([40,  0, 20])))
    """

    __slots__ = ("positions", "asked", "serial", "_parts", "_done", "_label")

    def __init__(self, positions: list[int], parts: int, label: str, serial: int) -> None:
        self.positions = np.array(positions, np.intp)
        self.serial = serial
        self.asked = time.monotonic()
        self._parts = [ItemsAt(part) for part in np.array_split(self.positions, max(1, min(parts, len(positions))))]
        self._done: dict[int, Done] = {}
        self._label = label

    @property
    def parts(self) -> int:
        return len(self._parts)

    def tasks(self, consumer: bytes, req: int) -> list[tuple[ChunkPart, ItemsAt]]:
        """The tasks still to compute (all but those done): ``(key, argument)`` for the engine."""
        parts = enumerate(self._parts)
        return [(ChunkPart(consumer, req, k, self.serial), part) for k, part in parts if k not in self._done]

    def take(self, part: int, done: Done) -> None:
        """The outcome of a task of this request (one skipped is still to compute: see :meth:`tasks`)."""
        if done.status != "skipped":
            self._done[part] = done

    @property
    def complete(self) -> bool:
        return len(self._done) == len(self._parts)

    def answer(self) -> tuple[bytes, dict[str, Any], list]:
        """The answer, once :attr:`complete`: ``(kind, fields, buffers)`` of an ``item`` or an ``error``."""
        done = [self._done[k] for k in range(len(self._parts))]
        failed = next((d.value for d in done if d.status == "error"), None)
        if failed is not None:
            header = failure_header(failed)
            at = _position_in(header["chain"], self._label)
            if at is not None and at in self.positions:  # the item that failed, for the chain the consumer shows
                header["at"] = at
            return b"error", header, []
        count = len(self.positions)
        places = np.array_split(np.arange(count), len(self._parts))  # (where each part's items go: as split)
        chunk = scatter([d.value for d in done], places, count)
        try:
            tree, buffers = wire.encode(to_wire(chunk))
        except TypeError:
            unsendable = unsendable_item(chunk)
            if unsendable is None:  # each item can travel, not all together (an array of objects): one by one then
                return b"item", {"apart": True, "count": count}, []
            at = int(self.positions[unsendable[0]])  # named by its position, as a read of it alone names it
            return b"error", {**unsendable_header(f"item {at}", unsendable[1]), "at": at}, []
        return b"item", {"tree": tree, "count": count}, buffers


def _position_in(chain: str, label: str) -> int | None:
    """Which item of the view labelled ``label`` the chain of a failure starts at (``smap(f)[12] -> ...``: 12)."""
    if not chain.startswith(f"{label}["):
        return None
    digits = chain[len(label) + 1 :].split("]", 1)[0]
    return int(digits) if digits.isdigit() else None

"""Which items a reader will want next, guessed from its last reads: what ``prefetch`` sends its workers ahead."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..views.keys import Positions

__all__ = ["ReadOrder"]


class ReadOrder:
    """Which items the reader will want next, guessed from the last two reads.

    ``holds(i)`` says whether item ``i`` is computed or on its way already.

    >>> order = ReadOrder(length=100, capacity=3)
    >>> [order.read(i) for i in (0, 2, 4)]  # ascending by default; a step of 2 is steady from the third read
    [True, False, True]
    >>> list(order.expected(4))
    [6, 8, 10]
    >>> order.frontier = 6
    >>> order.advance(room=2), order.frontier  # the tasks to send after the read of item 4
    ([(6, 6), (8, 8)], 10)
    """

    def __init__(self, length: int | None, capacity: int, holds: Callable[[int], bool] = lambda i: False) -> None:
        self._length = length
        self.capacity = capacity  # how many items are expected ahead
        self._holds = holds
        self.last = -1  # reads start out assumed to be ascending
        self.step = 1
        self.frontier: int | None = None  # the next item to send while reads go on at this step

    def read(self, i: int) -> bool:
        """Note a read of item ``i``; whether it kept the step of the one before."""
        step = i - self.last
        steady = step == self.step
        self.step, self.last = step, i
        return steady

    def read_many(self, positions: Sequence[int] | Positions) -> None:
        """Note reads of ``positions`` (two at least), in that order: the last two say the step."""
        self.read(int(positions[-2]))
        self.read(int(positions[-1]))

    def expected(self, i: int) -> range:
        """The items expected after item ``i``, within the view."""
        return range(i + self.step, self._stop(i), self.step) if self.step else range(0)

    def upcoming(self, i: int) -> list[tuple[int, int]]:
        """Tasks for the items after ``i`` when reads go in order (step 1): all those expected; else none."""
        stop = self._stop(i) if self.step == 1 else i + 1
        return [(j, j) for j in range(i + 1, stop)]

    def advance(self, room: int) -> list[tuple[int, int]]:
        """Up to ``room`` tasks for the items expected after the last read and not held yet, moving the frontier."""
        frontier = self.frontier
        if frontier is None:  # reads follow no step: nothing is expected
            return []
        i, step, holds = self.last, self.step, self._holds
        stop = self._stop(i)
        if (frontier - (i + step)) * step < 0:  # fell behind the reader
            frontier = i + step
        tasks = []
        while room > 0 and (frontier - stop) * step < 0:
            if not holds(frontier):
                tasks.append((frontier, frontier))
                room -= 1
            frontier += step
        self.frontier = frontier
        return tasks

    def _stop(self, i: int) -> int:
        """Where the items expected after ``i`` end (exclusive), within the view."""
        stop = i + self.step * (self.capacity + 1)
        n = self._length
        return stop if n is None else max(-1, min(n, stop))

"""When each thread's read of one consumer began, until it ends: the server's silence is counted from the earliest.

Threads reading one served view (or stream) share its connection: one reads
while the others wait for their turn. A read that waited for another one,
and lost the connection as it was let go to a read begun after it, would
hear :class:`~lazyseq.ServerLost` only once that read had waited its own
``timeout``: one timeout after another. The read that holds the connection
therefore counts the server's silence from the earliest read under way, and
every read waiting behind it hears of a lost server within its own timeout.

>>> reads = ReadsBegun()
>>> with reads.begun() as began:
...     with reads.begun() as again:  # a read within a read (a batch's items one by one): the first one counts
...         again == began == reads.earliest(None)
True
>>> reads.earliest(None) is None
True
"""

from __future__ import annotations

import threading
import time

__all__ = ["ReadsBegun"]


class ReadsBegun:
    """When each thread's read under way began (``time.monotonic()``)."""

    def __init__(self) -> None:
        self._began: dict[int, float] = {}  # thread -> when its read began

    def begun(self) -> _Read:
        """A read of this thread, under way within the ``with`` block: when it began (an outer read's start, within
        one)."""
        return _Read(self._began)

    def earliest(self, default: float | None) -> float | None:
        """When the earliest read under way began (``default`` if none is)."""
        return min(self._began.values(), default=default)  # (one call into C: other threads' reads wait for it)

    def only_this_thread(self) -> None:
        """Forget the reads of other threads (in a forked process: its parent's threads are not there)."""
        me = threading.get_ident()
        for thread in [thread for thread in self._began if thread != me]:
            del self._began[thread]


class _Read:
    __slots__ = ("_began", "_mine")

    def __init__(self, began: dict[int, float]) -> None:
        self._began = began

    def __enter__(self) -> float:
        me, began = threading.get_ident(), self._began
        self._mine = me not in began
        if self._mine:
            began[me] = time.monotonic()
        return began[me]

    def __exit__(self, *exc_info: object) -> None:
        if self._mine:
            self._began.pop(threading.get_ident(), None)

"""Whether items are cheap enough that the reader should compute them itself rather than wait on worker threads.

Handing an item over from a worker thread costs tens of microseconds (a
wake-up, the GIL changing hands several times), and worker threads running
Python take the GIL from a reader that runs Python too: with items that cost
less than that to compute, threads make a pipeline slower, not faster. So a
thread ``prefetch`` computes its first items in the reader to time them
undisturbed, keeps doing so while an item costs less than ``inline_below``
seconds, and hands the work to its threads as soon as items cost more than
twice that (then timed in the workers, so that it notices if they get cheap).
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["INLINE_BELOW", "ItemCost", "TimedJob"]

INLINE_BELOW = 250e-6  # seconds: about what handing an item over from a worker thread costs on a small VM
SMOOTHING = 0.2  # weight of the newest timing in the running estimate


class ItemCost:
    """A running estimate of the seconds one item takes, and where items are computed now.

    >>> cost = ItemCost(inline_below=1e-3)
    >>> cost.inline  # the first items are computed by the reader, to time them
    True
    >>> for seconds in (1e-4, 2e-4, 1e-4):
    ...     cost.add(seconds)
    >>> cost.inline
    True
    >>> cost.add(0.05)  # one slow item: the workers take over
    >>> cost.inline
    False
    """

    def __init__(self, inline_below: float) -> None:
        self.inline_below = inline_below
        self.estimate: float | None = None
        self.inline = inline_below > 0

    def add(self, seconds: float) -> None:
        estimate = self.estimate
        estimate = seconds if estimate is None else estimate + SMOOTHING * (seconds - estimate)
        self.estimate = estimate
        if self.inline:
            if estimate > 2 * self.inline_below:
                self.inline = False
        elif estimate < self.inline_below:
            self.inline = True


class TimedJob:
    """A worker job that adds the seconds each call takes to an :class:`ItemCost`."""

    def __init__(self, job: Any, cost: ItemCost) -> None:
        self.job = job
        self.cost = cost

    def __call__(self, arg: Any) -> Any:
        start = time.perf_counter()
        result = self.job(arg)
        self.cost.add(time.perf_counter() - start)
        return result

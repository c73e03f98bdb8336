"""Whether items are cheap enough that the reader should compute them itself rather than wait on its workers.

Handing an item over from a worker costs tens of microseconds on each side (a
wake-up; with threads the GIL changing hands several times, and worker threads
running Python take the GIL from a reader that runs Python too; with processes
a message each way and the item's pages in shared memory): with items that
cost about that much to compute, a loader makes a pipeline slower, not faster.
So a loader computes its first items in the reader to time them, keeps doing so
while an item costs less than ``inline_below`` seconds, and hands the work to
its workers as soon as items cost more than twice that (then timed in the
workers, so that it notices if they get cheap). A first item is often slow
for reasons of its own (cold caches, page faults, the copy-on-write that
follows starting worker processes with fork): it alone sends the work to the
workers only if it took ten times the threshold, and otherwise the lesser of
the first two timings counts. Worker threads need not wait for the first item
to end: :func:`start_if_slow` starts them on the next items as soon as it has
run that long.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["FIRST_ONLY_ABOVE", "RUN_FEWEST", "RUN_ITEMS", "RUN_SECONDS", "ItemCost", "TimedJob", "start_if_slow"]

SMOOTHING = 0.2  # weight of the newest timing in the running estimate
TIME_ONE_IN = 4  # after an untimed item found slow: the next timing within this many items, on average
UNTIMED_THRESHOLDS = 4  # items under half the threshold: one timed per this many thresholds' worth of them, about
TIME_AT_MOST_ONE_IN = 32  # and one in this many at least
# Where in its range each skip of untimed items falls: fractions spread evenly, in an order drawn once (not by the
# global generator: it is the user's). A draw at each timing took a few microseconds, with the caches cold after the item.
_FRACTIONS = [(k + 0.5) / 101 for k in range(101)]
random.Random(0).shuffle(_FRACTIONS)
_SKIPS = itertools.cycle(_FRACTIONS)
_TICK = 1e-9  # a timing of 0 seconds (a coarse clock) counts as this
FIRST_ONLY_ABOVE = 10  # the first timing alone sends items to the workers only above this many thresholds
RECENT = 16  # timings kept to tell slow items that come back regularly from hiccups
RECENT_FEWEST = 8  # timings needed to tell
SLOW_AMONG_RECENT = 3  # slow timings among them that make a pattern
RUN_SECONDS = 100e-6  # items this cheap are computed by the reader in runs of about this long, read in order
RUN_ITEMS = 64  # items in a run at most, however cheap
RUN_FEWEST = 4  # runs only for items that fit this many times in RUN_SECONDS


class ItemCost:
    """A running estimate of the seconds one item takes, and where items are computed now.

    From the third item on, the estimate follows the median of the last three
    timings: one item slowed by something else (the machine busy for a moment,
    a page fault, a collection) moves nothing, two slow items in a row do.
    Slow items that come back regularly among cheap ones (every third or
    fourth item loads a file, say) do too: where ``SLOW_AMONG_RECENT`` of the
    last ``RECENT`` timings (``RECENT_FEWEST`` at least) are slow and their
    mean is over twice the threshold, the workers take the items; they give
    them back once the estimate and the mean of the latest ``RECENT_FEWEST``
    timings are both under the threshold.
    While items cost less than half the threshold, the reader times only some
    (``untimed`` says how many it may skip): a timing costs a few microseconds
    (with the caches cold after the item), a few percent of an item this
    cheap. About one per ``UNTIMED_THRESHOLDS`` thresholds' worth of items, one
    in ``TIME_AT_MOST_ONE_IN`` at most. The seconds of an item left untimed
    are still looked at, not added (that would count slow items more often
    than others): one that turns out slow brings the next timing within one in
    ``TIME_ONE_IN``.

    >>> cost = ItemCost(inline_below=1e-3)
    >>> cost.inline  # the first items are computed by the reader, to time them
    True
    >>> cost.add(5e-3)  # a slow first item may just be a cold one: the reader times a second
    >>> cost.inline
    True
    >>> for seconds in (1e-4, 2e-4, 1e-4, 0.05):  # the last one slow: a hiccup, or a change?
    ...     cost.add(seconds)
    >>> cost.inline, round(cost.estimate * 1e6)  # microseconds
    (True, 133)
    >>> cost.add(0.05)  # slow again: the workers take over
    >>> cost.inline
    False
    >>> regular = ItemCost(inline_below=1e-3)
    >>> for seconds in (1e-4, 1e-4, 1e-4, 0.01) * 3:  # every fourth item slow: a pattern, not a hiccup
    ...     regular.add(seconds)
    >>> regular.inline, round(regular.estimate * 1e6)  # the median says cheap, the pattern says otherwise
    (False, 100)
    """

    def __init__(self, inline_below: float) -> None:
        self.inline_below = inline_below
        self.slow_above = 2 * inline_below  # items that cost more are slow
        self.estimate: float | None = None
        self.count = 0
        self.inline = inline_below > 0
        self.untimed = 0  # items the reader may compute next without timing them
        self._last = self._before_last = 0.0
        self._recent: deque[float] = deque(maxlen=RECENT)

    def add(self, seconds: float) -> None:
        estimate, last, before = self.estimate, self._last, self._before_last
        self._before_last, self._last = last, seconds
        self.count += 1
        if estimate is None:
            estimate = seconds
        elif self.count == 2:  # the first item also paid for cold caches and page faults: trust the lesser
            estimate = min(estimate, seconds)
        else:
            median = max(min(last, before), min(max(last, before), seconds))
            estimate += SMOOTHING * (median - estimate)
        self.estimate = estimate
        recent = self._recent
        recent.append(seconds)
        slow = seconds > self.slow_above
        if self.inline:
            # a pattern of slow items can only begin with a slow one: cheap items pay a comparison, not a look
            if estimate > (FIRST_ONLY_ABOVE if self.count == 1 else 2) * self.inline_below or (
                slow and self._slow_pattern()
            ):
                self.inline = False
            elif self.count > 2 and max(seconds, estimate) < self.inline_below / 2:  # far from the threshold
                self._leave_untimed(UNTIMED_THRESHOLDS * self.inline_below / max(seconds, estimate, _TICK))
        elif estimate < self.inline_below and self._latest_mean() < self.inline_below:
            self.inline = True

    def untimed_was_slow(self) -> None:
        """An item left untimed took over :attr:`slow_above`: the next timing comes as soon as one in ``TIME_ONE_IN``
        would bring it, or sooner (each slow item may bring it closer, none puts it off)."""
        untimed = self.untimed
        self._leave_untimed(TIME_ONE_IN)
        self.untimed = min(untimed, self.untimed)

    def _leave_untimed(self, between: float) -> None:
        """Let about one in ``between`` items (``TIME_AT_MOST_ONE_IN`` at most) be timed, at random, not every n-th:
        items slow one time in 2 or 4 are timed too."""
        self.untimed = int(next(_SKIPS) * (2 * min(between, TIME_AT_MOST_ONE_IN) - 1))

    # Worker threads add timings while the reader does: each reads a copy of the recent ones, taken in one call.

    def _slow_pattern(self) -> bool:
        """Whether slow items come back among the recent ones, costing more than twice the threshold on average."""
        recent, slow = tuple(self._recent), 2 * self.inline_below
        if len(recent) < RECENT_FEWEST or sum(recent) <= slow * len(recent):
            return False
        return sum(seconds > slow for seconds in recent) >= SLOW_AMONG_RECENT

    def _latest_mean(self) -> float:
        """The mean of the latest ``RECENT_FEWEST`` timings."""
        latest = tuple(self._recent)[-RECENT_FEWEST:]
        return sum(latest) / len(latest)

    @property
    def in_runs(self) -> bool:
        """Whether the reader computes items read in order a run at a time (up to ``RUN_SECONDS``), not one by one.

        Each read through a loader costs about a microsecond of bookkeeping,
        which for items of a few microseconds is most of their time: a run
        pays it once for many items.
        """
        estimate = self.estimate
        return self.inline and self.count > 2 and estimate is not None and estimate * RUN_FEWEST < RUN_SECONDS


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


@contextmanager
def start_if_slow(seconds: float, start: Callable[[], None]) -> Iterator[None]:
    """Call ``start()`` from another thread if the block is still running after ``seconds``.

    The block is done, and ``start()`` too if it was called, when the ``with``
    statement ends; an exception from ``start()`` is raised there. Where no
    thread can start (as the program exits, from Python 3.12 on), the block
    runs without one.

    >>> import time
    >>> started = []
    >>> with start_if_slow(0.001, lambda: started.append("workers")):
    ...     time.sleep(0.05)
    >>> started
    ['workers']
    >>> with start_if_slow(10.0, lambda: started.append("again")):
    ...     pass
    >>> started
    ['workers']
    """
    failures: list[BaseException] = []

    def run() -> None:
        try:
            start()
        except BaseException as error:  # raised in the reader's thread, below
            failures.append(error)

    timer = threading.Timer(seconds, run)
    timer.daemon = True
    timer.name = "lazyseq-start-if-slow"
    try:
        timer.start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown", say: the block runs on its own
        yield
        return
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
    if failures:
        raise failures[0]

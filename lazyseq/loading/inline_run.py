"""Items that a loader's reader computed several at a time, read in order: the reads that follow take them.

Items far cheaper than a read's bookkeeping (see
:attr:`~lazyseq.loading.item_cost.ItemCost.in_runs`) are computed a run at a
time when they are read in order; each of the next reads then takes its item
without a lock or any other step. A run is of the engine and of the epochs of
the shuffles below that it was computed with: once either changes, its items
are not used.
"""

from __future__ import annotations

from typing import Any

from ..views.shuffle import EPOCH_CHANGES

__all__ = ["MISSING", "InlineRun", "epoch_stamp"]

MISSING: Any = object()  # not in the run (or taken already): the read computes its item


class InlineRun:
    """Items ``start``, ``start + 1``, ... computed by ``engine``'s reader; ``error``, that of the item after them.

    Each item is taken once; a read of another item, or of one taken
    already, finds it ``MISSING``.

    >>> import lazyseq
    >>> data = lazyseq.arange(10)
    >>> run = InlineRun("engine", 5, [25, 36], ValueError("no item 7"), data, epoch_stamp(data))
    >>> run.take(6, "engine"), run.take(6, "engine") is MISSING, run.take(5, "another engine") is MISSING
    (36, True, True)
    >>> run.take(7, "engine", raising=False) is MISSING
    True
    >>> run.take(7, "engine")
    Traceback (most recent call last):
    ...
    ValueError: no item 7
    """

    __slots__ = ("_changes", "_engine", "_epochs", "_error", "_start", "_values", "_view")

    def __init__(
        self, engine: Any, start: int, values: list[Any], error: BaseException | None, view: Any, stamp: tuple[int, Any]
    ) -> None:
        self._engine = engine
        self._start = start
        self._values = values
        self._error = error
        self._view = view  # the pipeline the items were read from
        self._changes, self._epochs = stamp  # of the shuffles below, before the items were computed

    def take(self, i: int, engine: Any, raising: bool = True) -> Any:
        """Item ``i``, if the run holds it and ``engine`` is the one it was computed by; its error is raised.

        ``raising=False`` leaves the error in the run (``MISSING``): for a read
        that goes on through the view, to raise it there.
        """
        k = i - self._start
        if k < 0 or engine is not self._engine:
            return MISSING
        if self._changes != EPOCH_CHANGES[0]:  # an epoch was set somewhere: on a shuffle below?
            changes = EPOCH_CHANGES[0]
            if self._view._epochs() != self._epochs:
                return MISSING
            self._changes = changes
        values = self._values
        if k < len(values):
            value = values[k]
            values[k] = MISSING  # the run does not keep what was read
            return value
        error = self._error
        if k == len(values) and error is not None and raising:
            self._error = None
            raise error
        return MISSING


def epoch_stamp(view: Any) -> tuple[int, Any]:
    """What a run computed from ``view`` now is of: the count of epochs set anywhere, and those of its shuffles."""
    changes = EPOCH_CHANGES[0]  # first: an epoch set meanwhile makes the stamp look old, never new
    return changes, view._epochs()

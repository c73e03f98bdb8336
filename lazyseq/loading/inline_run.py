"""Items that a loader's reader computed several at a time, read in order: the reads that follow take them.

Items far cheaper than a read's bookkeeping (see
:attr:`~lazyseq.loading.item_cost.ItemCost.in_runs`) are computed a run at a
time when they are read in order; each of the next reads then takes its item
without a lock or any other step. A run is of the engine and of the shuffles'
epochs it was computed with: once either changes, its items are not used.
"""

from __future__ import annotations

from typing import Any

from ..views.shuffle import EPOCH_CHANGES

__all__ = ["MISSING", "InlineRun"]

MISSING: Any = object()  # not in the run (or taken already): the read computes its item


class InlineRun:
    """Items ``start``, ``start + 1``, ... computed by ``engine``'s reader; ``error``, that of the item after them.

    Each item is taken once; a read of another item, or of one taken
    already, finds it ``MISSING``.

    >>> run = InlineRun("engine", 5, [25, 36], ValueError("no item 7"))
    >>> run.take(6, "engine"), run.take(6, "engine") is MISSING, run.take(5, "another engine") is MISSING
    (36, True, True)
    >>> run.take(7, "engine", raising=False) is MISSING
    True
    >>> run.take(7, "engine")
    Traceback (most recent call last):
    ...
    ValueError: no item 7
    """

    __slots__ = ("_changes", "_engine", "_error", "_start", "_values")

    def __init__(self, engine: Any, start: int, values: list, error: Exception | None) -> None:
        self._engine = engine
        self._start = start
        self._values = values
        self._error = error
        self._changes = EPOCH_CHANGES[0]

    def take(self, i: int, engine: Any, raising: bool = True) -> Any:
        """Item ``i``, if the run holds it and ``engine`` is the one it was computed by; its error is raised.

        ``raising=False`` leaves the error in the run (``MISSING``): for a read
        that goes on through the view, to raise it there.
        """
        k = i - self._start
        if k < 0 or engine is not self._engine or self._changes != EPOCH_CHANGES[0]:
            return MISSING
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

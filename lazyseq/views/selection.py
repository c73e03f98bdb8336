"""Items chosen among several views: ``case`` and ``switch``."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from .base import View, lengths_must_match
from .itemtypes import Integer, S, SequenceLike, T
from .keys import Positions, positions_array
from .sources import as_view

__all__ = ["CaseView", "case", "switch"]


class CaseView(View[Any]):
    """Item ``i`` is ``values[selector[i]][i]``.

    ``switch`` is the two-branch form: branch 0 when the condition is true.
    """

    kind = "case"

    def __init__(self, selector: View, values: tuple[View, ...], kind: str = "case") -> None:
        if not values:
            raise ValueError(f"{kind} needs at least one sequence to choose from")
        self.kind = kind
        self._len = lengths_must_match(kind, (selector, *values))
        self._parents = (selector, *values)
        self._values = values

    def _branch(self, i: int) -> int:
        choice = self._parents[0]._get(i)
        if self.kind == "switch":
            return 0 if choice else 1
        try:
            branch = operator.index(choice)
        except TypeError:
            branch = None
        if branch is None or isinstance(choice, (bool, np.bool_)) or not 0 <= branch < len(self._values):
            raise ValueError(
                f"case: selector[{i}] is {choice!r}, but it must be the number of one of the "
                f"{len(self._values)} sequences, an integer from 0 to {len(self._values) - 1}"
            )
        return branch

    def _get(self, i: int) -> Any:
        return self._values[self._branch(i)]._get(i)

    def _set(self, i: int, value: Any) -> None:
        self._values[self._branch(i)]._set(i, value)

    def _check_writable(self, i: int) -> None:
        self._values[self._branch(i)]._check_writable(i)

    def _writes_many(self, idx: Positions, values: list | np.ndarray) -> Callable[[], None] | None:
        positions = positions_array(idx)
        branches = np.array([self._branch(i) for i in positions.tolist()], dtype=np.intp)
        return self._writes_to_parents(self._values, branches, positions, values)

    def _check_writable_somewhere(self) -> None:
        self._check_one_writable(self._values)  # (the selector is read, never written)

    # An item is one of a branch's: what is known of its elements (a batch's items, say) is that branch's.
    def _check_element_writable(self, i: int, r: int, *within: int) -> None:
        self._values[self._branch(i)]._check_element_writable(i, r, *within)

    def _set_element(self, i: int, r: int, value: Any) -> bool:
        return self._values[self._branch(i)]._set_element(i, r, value)

    def _element_count(self, i: int) -> int | None:
        return self._values[self._branch(i)]._element_count(i)

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return tuple((p, i) for p in self._parents)

    def _item_spec(self) -> tuple[Any, ...] | None:
        specs = {v._item_spec() for v in self._values}  # an item is one of theirs: what they all say, if they agree
        return specs.pop() if len(specs) == 1 else None


def case(selector: SequenceLike[Integer], *values: SequenceLike[T]) -> View[T]:
    """A view whose item ``i`` is item ``i`` of ``values[selector[i]]``.

    >>> import lazyseq
    >>> list(lazyseq.case([0, 1, 1, 0], 'abcd', 'ABCD'))
    ['a', 'B', 'C', 'd']
    """
    return CaseView(as_view(selector), tuple(as_view(v) for v in values))


def switch(condition: SequenceLike[bool | np.bool_], x: SequenceLike[T], y: SequenceLike[S]) -> View[T | S]:
    """A view whose item ``i`` is ``x[i]`` where ``condition[i]`` is true, else ``y[i]``.

    >>> import lazyseq
    >>> list(lazyseq.switch([True, False, True], [1, 2, 3], [-1, -2, -3]))
    [1, -2, 3]
    """
    return CaseView(as_view(condition), (as_view(x), as_view(y)), kind="switch")

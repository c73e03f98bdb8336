"""What type checkers know about items: type variables, and the sequences a view can be made of.

``View[T]`` is a view whose items are ``T``: ``view(list_of_str)`` is a
``View[str]``, ``smap(f, v)`` a ``View`` of what ``f`` returns, and the rows of
a numpy array are typed ``np.ndarray``. None of this is checked when the code
runs: it only lets editors and type checkers follow items through a pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias, TypeVar, TypeVarTuple

import numpy as np

__all__ = ["Indexes", "Integer", "R", "S", "SequenceLike", "T", "T_co", "Ts", "U"]

T = TypeVar("T")
S = TypeVar("S")
U = TypeVar("U")
R = TypeVar("R")  # what a function returns
T_co = TypeVar("T_co", covariant=True)
Ts = TypeVarTuple("Ts")  # the fields of tuple items, for starmap

# An integer argument (a count, a seed, an index): a Python int or a numpy integer, as ``operator.index`` reads
# them. Not SupportsIndex: numpy declares ``__index__`` on every integer array, which only a 0-d one has.
Integer: TypeAlias = int | np.integer[Any]
# Positions given as a sequence of integers: a list or tuple of ints or of numpy integers (a view of them too).
Indexes: TypeAlias = Sequence[Integer]


class SequenceLike(Protocol[T_co]):
    """Anything with a length and items by position (list, tuple, range, torch ``Dataset``, view, array, ...)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> T_co: ...

"""What type checkers know about items: type variables, and the sequences a view can be made of.

``View[T]`` is a view whose items are ``T``: ``view(list_of_str)`` is a
``View[str]``, ``smap(f, v)`` a ``View`` of what ``f`` returns, and the rows of
a numpy array are typed ``np.ndarray``. None of this is checked when the code
runs: it only lets editors and type checkers follow items through a pipeline.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

__all__ = ["R", "S", "SequenceLike", "T", "T_co"]

T = TypeVar("T")
S = TypeVar("S")
R = TypeVar("R")  # what a function returns
T_co = TypeVar("T_co", covariant=True)


class SequenceLike(Protocol[T_co]):
    """Anything with a length and items by position (list, tuple, range, torch ``Dataset``, view, array, ...)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> T_co: ...

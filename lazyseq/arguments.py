"""Integer arguments, checked where a function receives them: errors name the function and the argument.

``batch(data, 2.5)`` says ``batch: k must be a positive integer, got 2.5``
rather than Python's ``'float' object cannot be interpreted as an integer``,
which names neither.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = ["flag", "integer"]

_EXPECTED = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}


def integer(value: Any, what: str, low: int | None = None, expected: str | None = None) -> int:
    """``value`` as an ``int`` of at least ``low``, for the argument ``what`` (``"batch: k"``).

    Anything with ``__index__`` is an integer (numpy integers too; floats
    are not, and neither are ``True`` and ``False``, which are more likely
    an argument given in the wrong place than a count). Otherwise a
    ``TypeError``, and below ``low`` a ``ValueError``, both saying
    ``{what} must be {expected}, got {value!r}``.

    >>> integer(3, "batch: k", low=1)
    3
    >>> integer(2.5, "batch: k", low=1)
    Traceback (most recent call last):
    ...
    TypeError: batch: k must be a positive integer, got 2.5
    >>> integer(True, "batch: k", low=1)
    Traceback (most recent call last):
    ...
    TypeError: batch: k must be a positive integer, got True
    """
    if expected is None:
        expected = _EXPECTED.get(low, f"an integer >= {low}")
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        shown = repr(value)
        raise TypeError(f"{what} must be {expected}, got {shown if len(shown) <= 60 else shown[:57] + '...'}") from None
    if low is not None and n < low:
        raise ValueError(f"{what} must be {expected}, got {n}")
    return n


def flag(value: Any, what: str, or_none: bool = False) -> Any:
    """``value`` as a ``bool`` (numpy's too), or None where ``or_none``; else a ``TypeError`` naming ``what``.

    >>> flag(True, "batch: drop_last")
    True
    >>> flag("yes", "batch: drop_last")
    Traceback (most recent call last):
    ...
    TypeError: batch: drop_last must be True or False, got 'yes'
    """
    if or_none and value is None:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be True{', False or None' if or_none else ' or False'}, got {value!r}")
    return bool(value)

"""Integer, boolean and duration arguments, checked where a function receives them: errors name the function and
the argument.

``batch(data, 2.5)`` says ``batch: k must be a positive integer, got 2.5``
rather than Python's ``'float' object cannot be interpreted as an integer``,
which names neither.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["MAX_LENGTH", "flag", "function", "indexable_length", "integer", "seconds"]

_EXPECTED = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}
MAX_LENGTH = 2**63 - 1  # len() and slicing need the length to fit in an index-sized (signed 64-bit) integer


def indexable_length(n: int, owner: str) -> int:
    """``n``, the length of a view that ``owner`` makes, if it is at most :data:`MAX_LENGTH`; else ``ValueError``.

    >>> indexable_length(2**64, "cycle")
    Traceback (most recent call last):
    ...
    ValueError: cycle: 18446744073709551616 items, more than a view can index (2**63 - 1 at most)
    """
    if n > MAX_LENGTH:
        raise ValueError(f"{owner}: {n} items, more than a view can index (2**63 - 1 at most)")
    return n


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


def function(value: Any, what: str, if_a_sequence: str = "") -> Callable:
    """``value`` if it is callable; else a ``TypeError`` naming ``what``, and saying ``if_a_sequence`` for a sequence
    (an array, a view: most likely an argument given in the place of the function).

    >>> function(len, "smap: f")
    <built-in function len>
    >>> function([1, 2], "smap: f", "the function comes first: smap(f, sequence)")
    Traceback (most recent call last):
    ...
    TypeError: smap: f must be callable, got list; the function comes first: smap(f, sequence)
    """
    if callable(value):
        return value
    from .views.base import View  # (views check their arguments here: imported once one fails)

    described = "a view" if isinstance(value, View) else type(value).__name__
    message = f"{what} must be callable, got {described}"
    if if_a_sequence and hasattr(value, "__getitem__") and hasattr(value, "__len__") and not isinstance(value, str):
        message += f"; {if_a_sequence}"
    raise TypeError(message)


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


def seconds(value: Any, what: str, positive: bool = False, at_most: float = math.inf, or_none: bool = False) -> float:
    """``value`` as a finite ``float`` of seconds, ``>= 0`` (``> 0`` where ``positive``) and ``<= at_most``.

    Any real number counts (numpy's too), but not ``True`` and ``False``:
    else a ``TypeError``, and out of range a ``ValueError``, both naming
    ``what`` (``"connect: timeout"``). ``or_none``: the message says that
    None is accepted too (the caller takes it before).

    >>> seconds(2, "connect: timeout", positive=True)
    2.0
    >>> seconds("10", "connect: timeout", positive=True)
    Traceback (most recent call last):
    ...
    TypeError: connect: timeout must be a finite number of seconds > 0, got '10'
    """
    expected = f"a finite number of seconds {'>' if positive else '>='} 0"
    if at_most < math.inf:
        expected += f" and <= {at_most:g}"
    if or_none:
        expected += " or None"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{what} must be {expected}, got {value!r}")
    number = float(value)
    if not (math.isfinite(number) and (number > 0 if positive else number >= 0) and number <= at_most):
        raise ValueError(f"{what} must be {expected}, got {value!r}")
    return number

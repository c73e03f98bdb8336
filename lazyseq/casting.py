"""Casts that keep every value: what writing results into an array of another dtype may do without a change.

numpy's ``same_kind`` casting lets a string into a shorter string dtype (cut
short), an integer into a narrower integer dtype (wrapped around), and a
float into narrower floats (inf where it is too large): :func:`keeps_values`
tells whether the values at hand survive such a cast (and an integer cast to
bool: only 0 and 1 do; integers cast to floats: inf where too large, rounded
beyond the floats' precision, 2**53 for float64, which numpy calls safe; and,
for a cast numpy calls safe, datetimes and durations cast to a finer unit:
wrapped around outside its range, or an OverflowError from numpy 2.5 on).
Floats that lose precision to narrower ones are kept, as are times to a
coarser unit.

numpy also calls safe a cast from numbers to strings ("3", "True"):
:func:`same_kind_of_value` tells a cast that keeps numbers numbers, strings
strings, bytes bytes and times times.
"""

from __future__ import annotations

import numpy as np

__all__ = ["keeps_values", "same_kind_of_value"]

_NUMBERS = "biufc"  # bool, integers, floats, complex numbers: one widens into another


def keeps_values(values: np.ndarray, dtype: np.dtype) -> bool:
    """Whether casting ``values`` to ``dtype`` (of the same kind) cuts no string, wraps no integer, makes no inf,
    rounds no integer made a float.

    >>> keeps_values(np.array(["a", "giraffe"]), np.dtype("U3")), keeps_values(np.array([5, 200]), np.dtype("u1"))
    (False, True)
    >>> keeps_values(np.array([-1]), np.dtype("u1"))
    False
    >>> keeps_values(np.array([1e39, np.inf]), np.dtype("f4")), keeps_values(np.array([0.1, np.inf]), np.dtype("f4"))
    (False, True)
    >>> keeps_values(np.array([100_000]), np.dtype("f2")), keeps_values(np.array(["2900-01-01"], "M8[D]"), np.dtype("M8[ns]"))
    (False, False)
    >>> keeps_values(np.array([2**53, 2**60]), np.dtype("f8")), keeps_values(np.array([2**53 + 1]), np.dtype("f8"))
    (True, False)
    """
    if values.size == 0:
        return True
    if values.dtype.kind in "US" and dtype.kind in "US":
        chars = dtype.itemsize // (4 if dtype.kind == "U" else 1)
        return int(np.char.str_len(values).max()) <= chars
    if values.dtype.kind in "iub" and dtype.kind == "b":  # 0 and 1 are False and True
        return bool(((values == 0) | (values == 1)).all())
    if values.dtype.kind in "iub" and dtype.kind in "iu":
        limits = np.iinfo(dtype)
        return bool(values.min() >= limits.min and values.max() <= limits.max)
    if values.dtype.kind in "fc" and dtype.kind in "fc" and dtype.itemsize < values.dtype.itemsize:
        with np.errstate(over="ignore"):  # a finite number too large for the narrower floats becomes inf
            cast = values.astype(dtype)
        return bool((np.isfinite(cast) | ~np.isfinite(values)).all())
    if values.dtype.kind in "iu" and dtype.kind in "fc":  # too large for the floats: inf, or rounded
        exact = 2 ** (np.finfo(dtype).nmant + 1)  # every integer up to this one is held as it is
        low, high = int(values.min()), int(values.max())
        if -exact <= low and high <= exact:
            return True
        largest = float(np.finfo(dtype).max)
        if high > largest or low < -largest:  # inf: no need to cast them all to know
            return False
        with np.errstate(over="ignore"):  # (then float64, which holds any float16 or float32 as it is)
            cast = values.astype(dtype).real.astype(np.float64)
        if not np.isfinite(cast).all():
            return False
        # compared as integers where the floats are in the integers' range (converting others back is undefined:
        # platforms differ); a float out of it was rounded up, past the largest integer
        info = np.iinfo(values.dtype)
        if not ((cast >= float(info.min)) & (cast < float(int(info.max) + 1))).all():  # bounds held exactly
            return False
        return bool((cast.astype(values.dtype) == values).all())
    if values.dtype.kind in "mM" and dtype.kind == values.dtype.kind and np.can_cast(values.dtype, dtype, "safe"):
        try:
            with np.errstate(over="ignore"):  # a finer unit: a date outside its range wraps around
                back = values.astype(dtype).astype(values.dtype)
        except OverflowError:  # numpy 2.5 on raises it instead
            return False
        return bool(((back == values) | np.isnat(values)).all())
    return True


def same_kind_of_value(source: np.dtype, dtype: np.dtype) -> bool:
    """Whether ``source`` values cast to ``dtype`` stay the same kind of value: numbers, str, bytes, datetimes, durations.

    >>> same_kind_of_value(np.dtype("i1"), np.dtype("f4")), same_kind_of_value(np.dtype("?"), np.dtype("u8"))
    (True, True)
    >>> same_kind_of_value(np.dtype("i1"), np.dtype("U5")), same_kind_of_value(np.dtype("S3"), np.dtype("U3"))
    (False, False)
    >>> same_kind_of_value(np.dtype("M8[s]"), np.dtype("M8[ns]")), same_kind_of_value(np.dtype("m8"), np.dtype("M8"))
    (True, False)
    >>> same_kind_of_value(np.dtype("f8"), np.dtype("O")), same_kind_of_value(np.dtype("O"), np.dtype("f8"))
    (True, False)
    """
    if dtype.kind == "O":  # Python objects: any value, as it is
        return True
    if source.kind in _NUMBERS:
        return dtype.kind in _NUMBERS
    if source.kind in "USmM":
        return dtype.kind == source.kind
    return source == dtype  # records, objects: only as they are

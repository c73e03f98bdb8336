"""Index arithmetic shared by every view: keys to positions, and positions composed.

A set of positions is one of

- a ``range`` (slices stay ranges, however they are nested), with step 1
  whenever it holds at most one position (``range(0)`` when empty), so that
  a step no int64 can hold never reaches numpy;
- a read-only 1-D ``np.ndarray`` of ``intp``, the common case, read with
  vectorized numpy calls;
- a 1-D ``np.ndarray`` of Python ints (dtype ``object``), only when some
  position does not fit in an ``intp``. That happens only on infinite views,
  and every function here turns such an array back into ``intp`` as soon as
  its positions fit again, so finite views never see one.
"""

from __future__ import annotations

import operator
from typing import Any, overload

import numpy as np

__all__ = [
    "Positions",
    "array_key",
    "compose",
    "modulo",
    "out_of_range",
    "positions_array",
    "range_length",
    "shift",
    "tidy",
]

Positions = range | np.ndarray

_LOW, _HIGH = int(np.iinfo(np.intp).min), int(np.iinfo(np.intp).max)
_EMPTY = np.empty(0, dtype=np.intp)
_EMPTY.flags.writeable = False


def _fit(*values: int) -> bool:
    return _LOW <= min(values) and max(values) <= _HIGH


def _from_ints(values: list[int] | np.ndarray) -> np.ndarray:
    """Python ints as positions: ``intp`` if they all fit, Python ints otherwise."""
    if not len(values):
        return _EMPTY
    values = np.asarray(values, dtype=object)
    return values.astype(np.intp) if _fit(values.min(), values.max()) else values


def _narrow(positions: np.ndarray) -> np.ndarray:
    """``positions`` as ``intp`` again if they are Python ints that all fit."""
    return _from_ints(positions) if positions.dtype.hasobject else positions


def tidy(positions: range) -> range:
    """The same positions, with step 1 when there is at most one: that step means nothing and may not fit."""
    if len(positions) > 1:
        return positions
    return range(positions.start, positions.start + 1) if positions else range(0)


def range_length(positions: range) -> int:
    """``len(positions)``, however large: ``len`` raises ``OverflowError`` beyond ``sys.maxsize``.

    >>> range_length(range(5, 10**20)), range_length(range(3, -1, -2)), range_length(range(2, 2))
    (99999999999999999995, 2, 0)
    """
    return (positions[-1] - positions.start) // positions.step + 1 if positions else 0


@overload
def compose(outer: np.ndarray, inner: Positions) -> np.ndarray: ...


@overload
def compose(outer: Positions, inner: Positions) -> Positions: ...


def compose(outer: Positions, inner: Positions) -> Positions:
    """``outer[inner]``: the positions that ``inner`` selects among ``outer``."""
    if type(inner) is range:
        if type(outer) is range:
            return shift(outer.start, outer.step, inner)
        if len(inner) <= 1:
            inner = tidy(inner)
        # A plain slice with a negative stop would wrap around: slice by start then cut.
        positions = outer[inner.start :: inner.step][: len(inner)]
        return _from_ints(positions) if positions.dtype.hasobject else positions  # _narrow, inlined: the batch path
    if type(outer) is range:
        if not len(inner):
            return _EMPTY
        if outer.start == 0 and outer.step == 1 and not inner.dtype.hasobject:  # view[:n]: the same positions
            return inner
        # ``inner`` holds indexes of ``outer``, so every result lies between its ends.
        if not inner.dtype.hasobject and _fit(outer.start, outer.step, outer[-1]):
            return outer.start + outer.step * inner
        return _narrow(outer.start + outer.step * inner.astype(object))
    return _narrow(outer[inner])


def shift(start: int, step: int, idx: Positions) -> Positions:
    """``start + step * idx``: the positions of items ``idx`` of the view ``start, start + step, ...``."""
    if type(idx) is range:
        return tidy(range(start + step * idx.start, start + step * idx.stop, step * idx.step))
    if not len(idx):
        return _EMPTY
    ends = (start + step * int(idx.min()), start + step * int(idx.max()))
    if not idx.dtype.hasobject and _fit(start, step, *ends):
        # Exact even if ``step * idx`` overflows: intp arithmetic wraps modulo 2**64, and the results fit.
        return start + step * idx
    return _narrow(start + step * idx.astype(object))


def modulo(idx: Positions, period: int) -> np.ndarray:
    """``idx % period`` as ``intp`` positions, whatever the size of ``idx``."""
    positions = positions_array(idx) % period
    return positions.astype(np.intp) if positions.dtype.hasobject else positions


def positions_array(positions: Positions) -> np.ndarray:
    """The positions as an array: ``intp`` unless some do not fit."""
    if type(positions) is range:
        if not positions:
            return _EMPTY
        if _fit(positions.start, positions.step, positions[-1]):
            return np.arange(
                positions.start, positions.start + len(positions) * positions.step, positions.step, dtype=np.intp
            )
        return np.array(positions, dtype=object)
    return positions


def out_of_range(index: int, length: int | None, target: str) -> IndexError:
    """The error for an index outside ``target`` (``view batch(64)``, ``gather's sequence``), naming all three."""
    return IndexError(f"index {index} out of range for {target} of length {length}")


def array_key(
    key: list[Any] | np.ndarray,
    length: int | None,
    label: str,
    target: str | None = None,
    masks: bool = True,
    endless: str = "is infinite",
) -> np.ndarray:
    """Validate a list or array used as a key: integer positions (negative allowed) or, if ``masks``, a boolean mask.

    ``label`` names the view in errors about the key's type, ``target`` (default ``label``) what it indexes,
    ``endless`` why it has no length (``View.endless``) where ``length`` is None.
    """
    target = label if target is None else target
    try:
        keys = np.asarray(key)
    except ValueError:  # numpy's "inhomogeneous shape": lists in the list, of several lengths or beside numbers
        raise IndexError(f"{label}: an index array must be 1-D, got a list nested unevenly") from None
    if keys.ndim != 1:
        raise IndexError(f"{label}: an index array must be 1-D, got shape {keys.shape}")
    if keys.dtype == bool:
        if not masks:
            raise TypeError(
                f"{label}: indexes must be integer positions, got booleans; to keep the items where a mask is True, "
                "index with the mask (view[mask]) or give np.flatnonzero(mask)"
            )
        if length is None:
            raise TypeError(f"{label}: a boolean mask needs a length, but the view {endless}")
        if len(keys) != length:
            raise IndexError(f"{label}: boolean mask of length {len(keys)} does not match length {length}")
        positions = np.flatnonzero(keys)
    elif (
        keys.dtype.kind == "i"
        or (len(keys) == 0 and not isinstance(key, np.ndarray))  # np.asarray([]) is of float64
        or (keys.dtype.kind == "u" and (len(keys) == 0 or keys.max() <= _HIGH))
    ):
        positions = keys.astype(np.intp, copy=True)
        # One pass for the common case, every position in range: read as unsigned, a negative one is too large too
        if length is not None and not (positions.view(np.uintp) >= length).any():
            positions.flags.writeable = False
            return positions
        negative = positions < 0
        if negative.any():
            if length is None:
                raise TypeError(f"{label}: negative index {keys[negative][0]} needs a length, but the view {endless}")
            positions[negative] += length
        bad = (positions < 0) if length is None else (positions < 0) | (positions >= length)
        if bad.any():
            raise out_of_range(keys[bad][0], length, target)
    elif keys.dtype.kind == "u" or keys.dtype == object or isinstance(key, list):
        # Indices no int64 holds: numpy gives uint64, float64 or object arrays; read the Python values instead.
        values = keys.tolist() if isinstance(key, np.ndarray) else key
        positions = _python_positions(values, length, label, target, keys.dtype, endless)
    else:
        raise TypeError(f"{label} indices must be integers, slices or integer arrays, not an array of {keys.dtype}")
    positions.flags.writeable = False
    return positions


def _python_positions(
    values: list, length: int | None, label: str, target: str, dtype: np.dtype, endless: str
) -> np.ndarray:
    """``array_key`` for integers of any size, one at a time, with the same errors."""
    positions = []
    for value in values:
        try:
            j = operator.index(value)
        except TypeError:
            raise TypeError(
                f"{label} indices must be integers, slices or integer arrays, not an array of {dtype}"
            ) from None
        if j < 0:
            if length is None:
                raise TypeError(f"{label}: negative index {j} needs a length, but the view {endless}")
            j += length
        if j < 0 or (length is not None and j >= length):
            raise out_of_range(operator.index(value), length, target)
        positions.append(j)
    return _from_ints(positions)

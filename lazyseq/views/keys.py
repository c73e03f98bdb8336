"""Index arithmetic shared by every view: keys to positions, and positions composed.

A set of positions is either a ``range`` (slices stay ranges, however they are
nested) or a read-only 1-D ``np.ndarray`` of ``intp``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Positions", "compose", "positions_array", "array_key"]

Positions = range | np.ndarray


def compose(outer: Positions, inner: Positions) -> Positions:
    """``outer[inner]``: the positions that ``inner`` selects among ``outer``."""
    if type(inner) is range:
        if type(outer) is range:
            length = len(inner)
            step = outer.step * inner.step
            start = outer.start + outer.step * inner.start if length else 0
            return range(start, start + length * step, step) if length else range(0)
        # A plain slice with a negative stop would wrap around: slice by start then cut.
        return outer[inner.start :: inner.step][: len(inner)]
    if type(outer) is range:
        return outer.start + outer.step * inner
    return outer[inner]


def positions_array(positions: Positions) -> np.ndarray:
    """The positions as an ``intp`` array."""
    if type(positions) is range:
        return np.arange(positions.start, positions.stop, positions.step, dtype=np.intp)
    return positions


def array_key(key, length: int | None, label: str) -> np.ndarray:
    """Validate a list or array used as a key: integer positions (negative allowed) or a boolean mask."""
    keys = np.asarray(key)
    if keys.ndim != 1:
        raise IndexError(f"{label}: an index array must be 1-D, got shape {keys.shape}")
    if keys.dtype == bool:
        if length is None or len(keys) != length:
            raise IndexError(f"{label}: boolean mask of length {len(keys)} does not match length {length}")
        positions = np.flatnonzero(keys)
    elif keys.dtype.kind in "iu" or len(keys) == 0:
        positions = keys.astype(np.intp, copy=True)
        if len(positions):
            negative = positions < 0
            if negative.any():
                if length is None:
                    raise TypeError(
                        f"{label}: negative index {keys[negative][0]} needs a length, but the view is infinite"
                    )
                positions[negative] += length
            bad = (positions < 0) if length is None else (positions < 0) | (positions >= length)
            if bad.any():
                raise IndexError(f"{label} index {keys[bad][0]} out of range for length {length}")
    else:
        raise TypeError(f"{label} indices must be integers, slices or integer arrays, not an array of {keys.dtype}")
    positions.flags.writeable = False
    return positions

"""Pickling that keeps the dtype of every array, byte order included.

numpy pickles an array of the other byte order (``'>i4'`` on a little-endian
machine) as an array of this one, values equal, where the array is neither
C- nor Fortran-contiguous (``a[::2]``) or holds times (``'>M8[ns]'``): a
result or a pipeline sent to a worker process would come back, or be read
there, with another dtype than in the consumer. :func:`dumps` and
:func:`cloud_dumps` pickle such an array as its bytes (a ``void`` array, which
has no byte order) and the dtype they are seen as again; other arrays go as
numpy pickles them.

>>> import pickle
>>> a = np.arange(6, dtype=">i4")[::2]
>>> pickle.loads(pickle.dumps(a, protocol=5)).dtype.str, pickle.loads(dumps(a)).dtype.str
('<i4', '>i4')
"""

from __future__ import annotations

import copyreg
import functools
import io
import pickle
from collections import ChainMap
from typing import Any

import numpy as np

__all__ = ["cloud_dumps", "dumps", "reduce_array"]

PROTOCOL = 5


def reduce_array(a: np.ndarray) -> Any:
    """How a plain array (or a memory map's) is pickled: as numpy pickles it, but an array of the other byte order
    as its bytes (not one of Python objects: numpy pickles those one by one, byte order kept)."""
    if a.dtype.isnative or a.dtype.hasobject:
        return a.__reduce_ex__(PROTOCOL)
    return _viewed_as, (a.view(np.dtype((np.void, a.dtype.itemsize))), a.dtype)


def _viewed_as(raw: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return raw.view(dtype)


_ARRAYS = {np.ndarray: reduce_array, np.memmap: reduce_array}


def dumps(obj: Any) -> bytes:
    """``obj`` pickled (protocol 5), its arrays with their dtypes."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=PROTOCOL)
    # a dict, which the pickler reads without calling Python (a ChainMap made pickling twice as slow); made at each
    # call, so that what copyreg is told later counts too
    pickler.dispatch_table = {**copyreg.dispatch_table, **_ARRAYS}
    pickler.dump(obj)
    return out.getvalue()


def cloud_dumps(obj: Any) -> bytes:
    """``obj`` pickled with cloudpickle (lambdas and the main script's classes by value), its arrays with their
    dtypes; ``ImportError`` without cloudpickle."""
    out = io.BytesIO()
    _cloud_pickler()(out, protocol=PROTOCOL).dump(obj)
    return out.getvalue()


@functools.cache
def _cloud_pickler() -> type:
    import cloudpickle

    class CloudPickler(cloudpickle.Pickler):
        dispatch_table = ChainMap(_ARRAYS, cloudpickle.Pickler.dispatch_table)

    return CloudPickler

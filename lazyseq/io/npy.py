"""Memory-mapped ``.npy`` files as one view: ``open_npy``."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

import numpy as np

from ..views.base import View
from ..views.concatenate import ConcatenateView
from ..views.sources import ArraySource

__all__ = ["open_npy"]


def open_npy(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> View[np.ndarray]:
    """Memory-map ``.npy`` files (read-only) and view their rows one file after the other.

    ``paths`` is a list of files, or one glob pattern (matches are sorted by
    name). Every file must hold the same dtype and the same shape beyond the
    first axis; a file that does not is named in a ``ValueError``. Nothing is
    read into memory until items are accessed.

    >>> import os, tempfile
    >>> import numpy as np
    >>> import lazyseq
    >>> folder = tempfile.mkdtemp()
    >>> for k in range(3):
    ...     np.save(os.path.join(folder, f"part_{k}.npy"), np.full((2, 4), k, dtype=np.float32))
    >>> data = lazyseq.open_npy(os.path.join(folder, "part_*.npy"))
    >>> len(data), data[5]
    (6, array([2., 2., 2., 2.], dtype=float32))
    """
    if isinstance(paths, (str, os.PathLike)):
        pattern = os.fspath(paths)
        files = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not files:
            raise FileNotFoundError(f"open_npy: no file matches {pattern!r}")
    else:
        files = [os.fspath(p) for p in paths]
        if not files:
            raise ValueError("open_npy: no file given")
    parts: list[ArraySource] = []
    for path in files:
        try:
            array = np.load(path, mmap_mode="r")
        except ValueError as error:
            raise ValueError(f"open_npy: cannot memory-map {path}: {error}") from error
        if not isinstance(array, np.ndarray) or array.ndim == 0:
            raise ValueError(f"open_npy: {path} does not hold an array with at least one dimension")
        if parts:
            first = parts[0].source
            if array.dtype != first.dtype or array.shape[1:] != first.shape[1:]:
                raise ValueError(
                    f"open_npy: {path} holds {array.dtype} rows of shape {array.shape[1:]}, but "
                    f"{files[0]} holds {first.dtype} rows of shape {first.shape[1:]}"
                )
        parts.append(ArraySource(array))
    return parts[0] if len(parts) == 1 else ConcatenateView(parts)

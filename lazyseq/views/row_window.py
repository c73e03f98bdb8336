"""Rows of several arrays read with one numpy call and one copy: the fast path of ``concatenate``.

numpy gathers rows of *one* array in a single call, but the files of a
dataset are separate memory maps. Reading a random batch from them file by
file costs several numpy calls per file, and two copies of every row (a
``take`` into a temporary, then a scatter into the batch). A
:class:`RowWindow` reads the batch with one fancy index instead, straight
into the new array.

It does so through a read-only 1-D array of opaque rows (``np.void`` of the
row's size) whose stride is one byte: its element ``k`` is the row that starts
``k`` bytes after the first byte of the lowest array. Row ``j`` of array ``p``
is then element ``first[p] + j * row_bytes``.

The window spans the memory *between* the arrays too, which may not be mapped.
That is safe because only elements computed from valid positions are read:
positions outside every array are sent to an offset numpy rejects with an
``IndexError``. The window must never reach code that reads it whole: for
instance ``np.take`` first makes a non-contiguous array contiguous, which
would read the gaps. It stays private to this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from .chunks import new_rows, writing
from .file_window import FileWindow

__all__ = ["RowWindow"]

_OUTSIDE = -(1 << 62)  # an offset far below any window: numpy raises IndexError for it, whatever is added
# cast: numpy 2.5's stubs, read as for Python 3.11 (which numpy 2.5 does not run on), take no array alone here
_lowest = cast("Callable[[np.ndarray], Any]", np.minimum.reduce)


class _Interface:
    """An ``__array_interface__`` over raw memory, keeping alive the arrays that own it."""

    def __init__(self, interface: dict, owners: Sequence[np.ndarray]) -> None:
        self.__array_interface__ = interface
        self.owners = owners


class RowWindow:
    """Gathers rows of C-contiguous arrays of one dtype and row shape, by position in their concatenation."""

    def __init__(
        self,
        sources: Sequence[np.ndarray],
        window: np.ndarray,
        first: np.ndarray,
        starts: np.ndarray,
        row_bytes: int,
        item: np.dtype,
    ) -> None:
        self._sources = sources
        self._window = window
        self._first = first
        self._starts = starts
        self._row_bytes = row_bytes
        self._item = item  # dtype of one row: (dtype, row shape), so that the result views as (n, *row shape)
        self._files: tuple[np.ndarray, np.ndarray] | None = None  # see _file_window
        self._files_tried = False

    @classmethod
    def over(cls, arrays: Sequence[np.ndarray], sources: Sequence[np.ndarray] = ()) -> RowWindow | None:
        """A window over ``arrays`` (non-empty, end to end), or None where their layout does not allow one.

        ``sources``: the arrays as given, memory maps that remember their file (see :meth:`rows`).
        """
        first = arrays[0]
        if first.dtype.hasobject or not all(a.flags.c_contiguous and a.size for a in arrays):
            return None  # object arrays hold references: numpy must copy them item by item
        # Not strides[0]: a contiguous array of one row may have any stride.
        row_bytes = first.itemsize * int(np.prod(first.shape[1:]))
        if row_bytes <= 0:
            return None
        addresses = [a.__array_interface__["data"][0] for a in arrays]
        low = min(addresses)
        high = max(address + a.nbytes for address, a in zip(addresses, arrays))
        interface = {
            "data": (low, True),  # read-only
            "shape": (high - low - row_bytes + 1,),
            "strides": (1,),
            "typestr": f"|V{row_bytes}",
            "version": 3,
        }
        try:
            window = np.asarray(_Interface(interface, list(arrays)))
        except (ValueError, OverflowError):  # a span numpy cannot describe (rows of huge size, far apart)
            return None
        lengths = np.array([len(a) for a in arrays], dtype=np.intp)
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.intp)
        # first[p + 1]: where part p's row 0 would be if it held every position; first[0] and first[-1] are
        # for positions before and after all parts.
        offsets = np.array(addresses, dtype=np.intp) - low - starts[:-1] * row_bytes
        first_rows = np.concatenate([[_OUTSIDE], offsets, [_OUTSIDE]]).astype(np.intp)
        item = np.dtype((first.dtype, first.shape[1:])) if first.ndim > 1 else first.dtype
        return cls(sources, window, first_rows, starts, row_bytes, item)

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """A new array of the rows at ``positions`` (``intp``) of the arrays end to end.

        While a batch is being built in given memory (see
        :func:`~lazyseq.views.chunks.writing_into`), rows of memory-mapped
        files are gathered straight into it, through a
        :class:`~lazyseq.views.file_window.FileWindow`.
        """
        parts = self._starts.searchsorted(positions, side="right")
        if writing():
            files = self._file_window()
            if files is not None:
                rows, first = files
                where = first[parts]
                where += positions
                if len(where) and _lowest(where) < 0:  # a position outside every file (see _file_window)
                    raise IndexError(f"positions out of range for {self._starts[-1]} rows")
                out = new_rows((len(positions),), rows.dtype)
                # mode="clip" on positions checked above: mode="raise" would write into a copy of ``out``
                return rows.take(where, out=out, mode="clip").view(self._item)
        offsets = self._first[parts]
        offsets += positions * self._row_bytes
        return self._window[offsets].view(self._item)

    def prepare_writing(self) -> None:
        """Map the files side by side now (see :meth:`rows`), rather than at the first batch built in given memory.

        Finding which file each map shows reads this process's list of mappings:
        a few milliseconds where many libraries are loaded. Processes forked
        after this call inherit the window instead of each building its own.
        """
        self._file_window()

    def _file_window(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The files behind the arrays mapped side by side, made at the first call, or None where they cannot be.

        With, like ``_first`` for the strided window, the element where part ``p``'s row 0 would be at ``p + 1``;
        positions before and after all parts get an element below zero.
        """
        if not self._files_tried:
            window = FileWindow.over(self._sources) if self._sources else None
            if window is not None:
                shifted = np.array(window.first, dtype=np.intp) - self._starts[:-1]
                self._files = window.array, np.concatenate([[_OUTSIDE], shifted, [_OUTSIDE]]).astype(np.intp)
            self._files_tried = True
        return self._files

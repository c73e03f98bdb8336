"""Views over data that already exists: numpy arrays (memory maps included) and Python sequences."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain, islice
from typing import Any, overload

import numpy as np

from ..machine import this_machine
from ..sparse import is_sparse
from .arange import ArangeView
from .base import View, byte_bounds
from .chunks import is_tensor, new_rows
from .itemtypes import SequenceLike, T
from .keys import Positions, positions_array

__all__ = [
    "ArraySource",
    "SequenceSource",
    "TensorSource",
    "as_view",
    "is_sequence_like",
    "sized_view",
    "view",
    "views_of",
]

_BUILTIN_SEQUENCES = (list, tuple, str, bytes, bytearray)


def _as_rows(values: list | np.ndarray, dtype: np.dtype, shape: tuple) -> np.ndarray | None:
    """``values`` made rows of ``dtype`` as numpy would assign them; None where they are to be written one by one.

    Objects are kept each as it is. Numpy values of one dtype (most likely an
    array's rows, given as the values) are cast array to array, as numpy
    assigns an array (a list of them too: where numpy converts a list one
    value at a time, 300 into int8 or dates into short strings, the two
    differ). Other values are converted as numpy assigns a list: each on its
    own (numpy scalars of several dtypes too, which ``np.asarray`` would
    first promote to one, losing digits).
    """
    try:
        if dtype.hasobject:
            return np.asarray(values, dtype=dtype)
        if isinstance(values, np.ndarray):  # an array assigned: cast as a whole
            return values.astype(dtype, copy=False)
        first = values[0] if values else None
        if isinstance(first, (np.ndarray, np.generic)) and all(
            isinstance(v, (np.ndarray, np.generic)) and v.dtype == first.dtype for v in values
        ):
            # Cast here, not in the assignment: numpy's indexed assignment of some casts it refuses (bytes into
            # dates) returns with the error set, a SystemError. A cast refused otherwise raises as numpy's would.
            return np.asarray(values).astype(dtype, copy=False)
        rows = np.empty(shape, dtype)
        rows[...] = values
        return rows
    except (ValueError, TypeError):  # rows of several shapes, values numpy cannot convert: one by one
        return None


class ArraySource(View[Any]):
    """The rows of an ``np.ndarray`` (or memory map): item ``i`` is ``array[i]``.

    Reading many rows is one numpy call, which is what makes batches fast.
    """

    kind = "array"
    _reads_new_rows = True

    def __init__(self, array: np.ndarray) -> None:
        if array.ndim == 0:
            raise TypeError("view() needs an array with at least one dimension, got a 0-d array")
        if isinstance(array, np.ma.MaskedArray):  # its rows would be read as plain arrays: the masked values shown
            raise TypeError(
                "view() of a masked array would lose its mask; view its values and mask side by side, "
                "lazyseq.collate([array.data, np.ma.getmaskarray(array)]), or array.filled(value)"
            )
        self.source = array  # kept as given: a memory map remembers its file
        self._array = np.asarray(array)  # plain ndarray: indexing returns ndarrays, not memmaps
        self._len = len(array)

    def _get(self, i: int) -> Any:
        return self._array[i]

    def _get_many(self, idx: Positions) -> np.ndarray:
        array = self._array
        out = new_rows((len(idx),) + array.shape[1:], array.dtype)
        if type(idx) is range:
            rows = array[idx.start : idx.stop] if idx.step == 1 else array[idx.start :: idx.step][: len(idx)]
            np.copyto(out, rows)
            return out
        if len(idx) and (idx.min() < 0 or idx.max() >= len(array)):  # positions are checked before they get here
            raise IndexError(f"positions out of range for an array of length {len(array)}")
        # mode="clip" on positions known to be valid: with mode="raise", take() writes into a copy of ``out``
        # and copies that back, for fear of failing half-way
        return array.take(idx, axis=0, out=out, mode="clip")

    def _stored_rows(self, rows: range) -> np.ndarray:
        stored = self._array[rows.start : rows.stop].view()
        stored.flags.writeable = False
        return stored

    def _set(self, i: int, value: Any) -> None:
        self._array[i] = value

    def _check_writable(self, i: int) -> None:
        if not self._array.flags.writeable:
            hint = ""
            if isinstance(self.source, np.memmap) and self.source.mode == "r":
                hint = (
                    ": a memory map of a file opened for reading (open_npy opens them so); to write into the file, "
                    "view np.load(path, mmap_mode='r+')"
                )
            raise ValueError(f"assignment destination is read-only{hint}")  # what numpy says, and why

    def _check_writable_somewhere(self) -> None:
        self._check_writable(0)

    def _writes_many(self, idx: Positions, values: list | np.ndarray) -> Callable[[], None] | None:
        array = self._array
        if not array.flags.writeable:
            return None  # refused item by item, with numpy's message
        rows = _as_rows(values, array.dtype, (len(idx), *array.shape[1:]))
        if rows is None or rows.shape != (len(idx), *array.shape[1:]):
            return None
        return functools.partial(array.__setitem__, positions_array(idx), rows)  # of positions given twice, the last

    def _iter(self) -> Iterator[Any]:
        return iter(self._array)

    def _item_spec(self) -> tuple:
        return ("array", self._array.dtype, self._array.shape[1:])

    def _describe(self) -> str:
        name = "memmap" if isinstance(self.source, np.memmap) else "array"
        return f"{name} {self._array.dtype} {self._array.shape}"

    def __reduce__(self) -> tuple[Any, ...]:
        # A memory map travels to worker processes as where its bytes are in the file, not as its data, with the
        # file it maps: on this machine, a file replaced at that name since is refused, not read in its place.
        where = memmap_location(self.source)
        if where is None:
            return (ArraySource, (self.source,))
        return (_reopened_source, (*where, _mapped_file(self.source)))


def memmap_location(array: np.ndarray) -> tuple | None:
    """``(file name, mode, first byte, length, dtype, shape, strides, start)`` of a memory map's bytes, or None."""
    import mmap

    mapped = getattr(array, "_mmap", None)  # numpy's own mmap object
    if not isinstance(array, np.memmap) or array.filename is None or mapped is None:
        return None
    if array.mode == "c":  # copy-on-write: its changes are in this process's memory, not in the file
        return None
    if array.size == 0:
        return None
    mapping_address = np.frombuffer(mapped, dtype=np.uint8).ctypes.data
    mapping_offset = array.offset - array.offset % mmap.ALLOCATIONGRANULARITY  # what np.memmap mapped
    low, high = byte_bounds(array)
    mode = "r+" if array.mode == "w+" else array.mode
    first = mapping_offset + (low - mapping_address)
    return (array.filename, mode, first, high - low, array.dtype, array.shape, array.strides, array.ctypes.data - low)


def _mapped_file(array: np.ndarray) -> tuple | None:
    """``(machine, device, inode)`` of the file that ``array`` maps (a memory map that ``memmap_location`` places).

    The file mapped, which may no longer be the one at its name, where the
    system says (``/proc/self/map_files``, which needs privileges); else the
    file at its name now. ``machine`` says where that holds; None elsewhere.
    """
    import mmap

    machine = this_machine()
    if machine is None:
        return None
    mapped = array._mmap  # type: ignore[attr-defined]  # numpy's own mmap object (see memmap_location)
    start = np.frombuffer(mapped, dtype=np.uint8).ctypes.data
    end = start + -(-len(mapped) // mmap.PAGESIZE) * mmap.PAGESIZE
    try:
        stat = os.stat(f"/proc/self/map_files/{start:x}-{end:x}")
    except OSError:  # not permitted, or the map was merged with a neighbour (or split)
        try:
            stat = os.stat(array.filename)  # type: ignore[attr-defined]  # a memory map's
        except OSError:
            return None
    return (machine, stat.st_dev, stat.st_ino)


def _reopened_source(
    filename: str,
    mode: Any,
    first: int,
    length: int,
    dtype: np.dtype,
    shape: tuple,
    strides: tuple,
    start: int,
    mapped: tuple | None = None,
) -> ArraySource:
    with open(filename, "rb" if mode == "r" else "r+b") as file:  # closed once mapped: the map holds it
        if mapped is not None and mapped[0] == this_machine():
            stat = os.fstat(file.fileno())
            if (stat.st_dev, stat.st_ino) != mapped[1:]:
                raise OSError(
                    f"{filename} is not the file that the view's memory map showed: another file was put at that "
                    "name since (a memory map travels to other processes by file name); make the view again over "
                    "the new file, or keep the old one there while its loaders run"
                )
        raw: Any = np.memmap(file, dtype=np.uint8, mode=mode, offset=first, shape=(length,))
    array: Any = np.ndarray.__new__(np.memmap, shape, dtype, buffer=raw, offset=start, strides=strides)
    # what np.memmap sets on its views: the map remembers its file again (if sent on, or for a FileWindow); both Any
    # above: numpy's stubs leave out _mmap, and make the others read-only (numpy 2.5 on)
    array._mmap, array.filename = raw._mmap, raw.filename
    array.offset, array.mode = raw.offset, raw.mode
    return ArraySource(array)


class SequenceSource(View[Any]):
    """Any object with ``__len__`` and ``__getitem__`` (list, tuple, torch Dataset, ...): its length when made."""

    kind = "sequence"
    _len: int

    def __init__(self, data: Any) -> None:
        self.source = data
        self._len = len(data)
        self._builtin = type(data) in _BUILTIN_SEQUENCES  # (a subclass may read files, say, in its __getitem__)
        # torch's convention for reading many items in one call; None disables it, as in torch's DataLoader
        self._batched = not self._builtin and callable(getattr(data, "__getitems__", None))

    def _get(self, i: int) -> Any:
        return self.source[i]

    def _get_many(self, idx: Positions) -> list:
        if self._builtin:
            positions = idx.tolist() if type(idx) is not range else idx
            try:
                return list(map(self.source.__getitem__, positions))
            except Exception:
                pass  # read again one by one below, out of this handler (a list reads without side effects): the
                # chain of views then names the item that failed
        elif self._batched:
            positions = list(idx) if type(idx) is range else idx.tolist()
            items = self.source.__getitems__(positions)
            if len(items) != len(positions):
                raise ValueError(
                    f"{type(self.source).__name__}.__getitems__ returned {len(items)} items for {len(positions)} indices"
                )
            return items if type(items) is list else list(items)
        items = []
        source = self.source
        for i in idx.tolist() if type(idx) is not range else idx:
            items.append(source[i])
        return items

    def _set(self, i: int, value: Any) -> None:
        self.source[i] = value

    def _check_writable(self, i: int) -> None:
        if not hasattr(type(self.source), "__setitem__"):
            raise TypeError(f"'{type(self.source).__name__}' object does not support item assignment")  # as Python says

    def _check_writable_somewhere(self) -> None:
        self._check_writable(0)

    def _iter(self) -> Iterator[Any]:
        if not self._builtin:
            return super()._iter()
        # Its own iterator, for speed, but for len(self) items: a list may have grown or shrunk since the view was made.
        items = iter(self.source)
        return chain(islice(items, self._len - 1), self._last(items)) if self._len else iter(())

    def _last(self, items: Iterator[Any]) -> Iterator[Any]:
        """The view's last item from ``items``; if they ended before it (a list that got shorter), its read's error."""
        for last in items:
            yield last
            return  # once given, the iteration is over, whatever becomes of the list
        self._get(len(self.source))  # an index past the list's end: the error that reading it gives

    def _describe(self) -> str:
        return type(self.source).__name__


class TensorSource(SequenceSource):
    """The rows of a torch tensor: item ``i`` is ``tensor[i]``; many rows are read with one indexing call.

    A batch of them is the tensor of those rows (a copy, on the tensor's
    device), as a slice of an array is for an ``ArraySource``.
    """

    kind = "tensor"

    def __init__(self, tensor: Any) -> None:
        if tensor.ndim == 0:
            raise TypeError("view() needs a tensor with at least one dimension, got a 0-d tensor")
        super().__init__(tensor)

    def _get_many(self, idx: Positions) -> Any:
        torch = sys.modules["torch"]
        positions = np.array(positions_array(idx), dtype=np.int64)  # a copy torch may write to (it warns otherwise)
        return self.source[torch.from_numpy(positions)]

    def _describe(self) -> str:
        tensor = self.source
        device = "" if tensor.device.type == "cpu" else f" on {tensor.device}"
        return f"tensor {str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}{device}"


@overload
def as_view(obj: np.ndarray, sized_for: str | None = None) -> View[np.ndarray]: ...


@overload
def as_view(obj: SequenceLike[T], sized_for: str | None = None) -> View[T]: ...


def as_view(obj: SequenceLike[Any] | np.ndarray, sized_for: str | None = None) -> View[Any]:
    """``obj`` itself if it is a view, else a view over the existing sequence or array (see :func:`view`).

    ``sized_for`` names what reads it by position and needs its length (see :func:`sized_view`).
    """
    if isinstance(obj, View):
        return obj
    if isinstance(obj, np.ndarray):
        return ArraySource(obj)
    if isinstance(obj, range):
        return ArangeView(obj)
    if _indexable_tensor(obj):
        return TensorSource(obj)
    if is_sparse(obj):  # whose len() raises "sparse array length is ambiguous"
        raise TypeError(
            f"cannot make a view of a sparse {type(obj).__name__}: views read dense rows; view X.toarray() where it "
            "fits in memory, or batches of its rows: lazyseq.smap(lambda b: X[b * k : b * k + k], "
            "range(-(-X.shape[0] // k)))"
        )
    if not is_sequence_like(obj):
        raise _not_a_sequence(obj, sized_for)
    return SequenceSource(obj)


def _not_a_sequence(obj: Any, sized_for: str | None) -> TypeError:
    """The error for ``obj``, no sequence: where ``sized_for`` needs a length, how to give it one."""
    if sized_for is None:
        if isinstance(obj, Mapping):  # (uniter would give its keys)
            hint = "; for a dict of columns of one length, lazyseq.collate(d) gives its rows as dicts"
        elif isinstance(obj, Iterable):
            hint = "; use lazyseq.uniter() for an iterable"
        else:
            hint = ""
        return TypeError(
            f"cannot make a view of {type(obj).__name__}: a sequence (with __len__ and __getitem__ "
            f"by position) is needed{hint}"
        )
    if isinstance(obj, Mapping):
        hint = ": lazyseq.collate(d) for the rows of a dict of columns, list(d.values()) for its values"
    elif isinstance(obj, Iterable):
        hint = (
            ": lazyseq.uniter(iterable, size=n) where its length n is known, or list(iterable) where it ends and "
            "fits in memory"
        )
    else:
        hint = ""
    return TypeError(
        f"{sized_for} must be a sequence (with __len__ and __getitem__ by position), not {type(obj).__name__}{hint}"
    )


def sized_view(obj: Any, what: str) -> View[Any]:
    """``obj`` as a view (see :func:`as_view`) for ``what`` (``"evaluate: data"``), which reads it in batches by
    position and so needs its length: anything else is a ``TypeError`` naming ``what``.

    >>> len(sized_view([1, 2, 3], "evaluate: data"))
    3
    >>> sized_view(5, "evaluate: data")
    Traceback (most recent call last):
    ...
    TypeError: evaluate: data must be a sequence (with __len__ and __getitem__ by position), not int
    """
    return as_view(obj, what)


def _indexable_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a tensor whose rows are read with one indexing call (a sparse one is read row by row)."""
    return is_tensor(obj) and str(obj.layout) == "torch.strided" and not obj.is_nested


def is_sequence_like(obj: Any) -> bool:
    """Whether :func:`as_view` takes ``obj``: a view, an array, or anything with ``__len__`` and ``__getitem__``.

    Mappings have both but are read by key, not by position: they are not.

    >>> import numpy as np
    >>> is_sequence_like(np.zeros(3)), is_sequence_like([1, 2]), is_sequence_like({"a": 1}), is_sequence_like(iter([]))
    (True, True, False, False)
    """
    if isinstance(obj, (View, np.ndarray, range)):
        return True
    return not isinstance(obj, Mapping) and hasattr(obj, "__len__") and hasattr(obj, "__getitem__")


@overload
def view(obj: np.ndarray) -> View[np.ndarray]: ...


@overload
def view(obj: SequenceLike[T]) -> View[T]: ...


def view(obj: SequenceLike[Any] | np.ndarray) -> View[Any]:
    """Wrap a sequence or array into a lazy view, whose methods chain combinators left to right.

    Arrays (memory maps included) are read with vectorized numpy calls,
    torch tensors with one indexing call for many rows; any object with
    ``__len__`` and ``__getitem__`` works too. A view is
    returned unchanged. The view's length is the data's when it is made:
    items appended to a list later are not seen, and items removed are
    missing (reading them is an error).

    >>> import numpy as np
    >>> import lazyseq
    >>> v = lazyseq.view(np.arange(10) * 10)
    >>> v.gather([9, 0, 5]).batch(2)[0]
    array([90,  0])
    >>> list(lazyseq.view(['a', 'b', 'c'])[::-1])
    ['c', 'b', 'a']
    """
    return as_view(obj)


def views_of(sequences: Any, expected: str) -> list[View]:
    """Each of ``sequences`` as a view; a ``TypeError`` saying ``{expected}, got ...`` if it is not iterable.

    A mapping is refused too: its keys would be taken for the sequences.
    """
    if isinstance(sequences, Mapping):
        raise TypeError(f"{expected}, got a {type(sequences).__name__} (give list(d.values()) for its values)")
    try:
        parts = list(sequences)
    except TypeError:
        raise TypeError(f"{expected}, got {sequences!r:.60}") from None
    return [as_view(s) for s in parts]

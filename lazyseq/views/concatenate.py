"""One view after another: ``concatenate``."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any, overload

import numpy as np

from ..arguments import indexable_length
from .base import View
from .chunks import Columns, chunk_to_batch, new_rows, scatter
from .itemtypes import SequenceLike, T
from .keys import Positions, compose, positions_array
from .row_window import RowWindow
from .sources import views_of

__all__ = ["ConcatenateView", "concatenate"]


class ConcatenateView(View[Any]):
    """Item ``i`` is item ``i - starts[p]`` of part ``p``, the part whose span holds ``i``.

    Nested concatenations are flattened; empty parts are dropped. Only the
    last part may be infinite.
    """

    kind = "concatenate"
    _items_like_parents = True

    @property
    def _reads_new_rows(self) -> bool:
        return self._arrays is not None  # rows of same-kind arrays are gathered into new_rows

    def __init__(self, parts: Sequence[View]) -> None:
        flat: list[View] = []
        for part in parts:
            flat.extend(part._parents if type(part) is ConcatenateView else (part,))
        for k, part in enumerate(flat[:-1]):
            if part._len is None:
                raise ValueError(
                    f"concatenate: only the last sequence may have no length, but sequence {k} ({part._label()} view) "
                    f"{part.endless}"
                )
        flat = [p for p in flat[:-1] if p._len] + flat[-1:] if flat else []
        self._specs = [part._item_spec() for part in flat]  # what each part's items are, where known
        self._key_order = _key_order(flat, self._specs)
        self._parents = tuple(flat)
        starts = [0]
        for part in flat[:-1]:
            starts.append(starts[-1] + len(part))
        self._starts = starts
        self._bounds = starts[1:]  # where each part but the last ends
        self._bounds_array = np.asarray(self._bounds, dtype=np.intp)
        self._starts_array = np.asarray(starts, dtype=np.intp)
        last = flat[-1]._len if flat else 0
        self._len = None if last is None else indexable_length(starts[-1] + last, "concatenate")
        self._arrays = _same_kind_arrays(flat)
        self._window = None if self._arrays is None else RowWindow.over(self._arrays, _sources(flat))

    def _locate(self, i: int) -> tuple[int, int]:
        p = bisect_right(self._bounds, i)
        return p, i - self._starts[p]

    def _locate_all(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``_locate`` of every position: the parts that hold them, and their positions there."""
        which = self._bounds_array.searchsorted(positions, side="right")
        return which, positions - self._starts_array[which]

    def _get(self, i: int) -> Any:
        p = bisect_right(self._bounds, i)
        return self._parents[p]._get(i - self._starts[p])

    def _get_many(self, idx: Positions) -> Any:
        parts = self._parents
        if type(idx) is range and idx:
            first, last = self._locate(idx[0]), self._locate(idx[-1])
            if first[0] == last[0]:  # one part holds them all: a shifted range
                offset = self._starts[first[0]]
                chunk = parts[first[0]]._get_many(range(idx.start - offset, idx.stop - offset, idx.step))
                return _in_order(self._typed(chunk, first[0]), self._key_order)
        idx = positions_array(idx)
        if self._window is not None:  # rows of arrays alike (open_npy): one call, one copy
            return self._window.rows(idx)
        which, local = self._locate_all(idx)
        # With many parts, visit only those that hold requested items.
        present = range(len(parts)) if len(parts) <= 8 else np.unique(which).tolist()
        arrays = self._arrays
        if arrays is not None:  # arrays alike but not contiguous: fill one output, no intermediate chunks
            out = new_rows((len(idx),) + arrays[0].shape[1:], arrays[0].dtype)
            for p in present:
                where = (which == p).nonzero()[0]
                if len(where):
                    out[where] = arrays[p].take(local[where], axis=0)
            return out
        pieces, positions = [], []
        for p in present:
            where = (which == p).nonzero()[0]
            if len(where):
                chunk = parts[p]._get_many(compose(local, where))  # intp again where they fit
                pieces.append(_in_order(self._typed(chunk, p), self._key_order))
                positions.append(where)
        if not pieces:
            return parts[0]._get_many(idx) if parts else []
        return scatter(pieces, positions, len(idx))

    def _spec_of(self, idx: Positions) -> tuple | None:
        if not len(idx) or all(spec is None for spec in self._specs):  # (lists: nothing known of any part)
            return None
        if type(idx) is range:  # a batch: the parts of its ends, and those between
            (p, first), (last_part, _) = self._locate(idx[0]), self._locate(idx[-1])
            if p != last_part:
                return None  # items of several parts: stacked as they are
            return self._parents[p]._spec_of(range(first, first + idx.step * len(idx), idx.step))
        which, local = self._locate_all(positions_array(idx))
        if (which != which[0]).any():
            return None
        return self._parents[int(which[0])]._spec_of(local)

    def _typed(self, chunk: Any, p: int) -> Any:
        """``chunk`` of part ``p`` as an array of its items' dtype where it is a list of items that part says are
        arrays: what a part that is an array gives, next to the others'."""
        if type(chunk) is not list or not chunk:
            return chunk
        spec = self._specs[p]
        return chunk_to_batch(chunk, spec) if spec is not None and spec[0] == "array" else chunk

    def _before_fork(self) -> None:
        if self._window is not None:
            self._window.prepare_writing()

    def _stored_rows(self, rows: range) -> np.ndarray | None:
        if not rows:
            return None
        (part, first), (last_part, _) = self._locate(rows.start), self._locate(rows.stop - 1)
        if part != last_part:
            return None
        return self._parents[part]._stored_rows(range(first, first + len(rows)))

    def _set(self, i: int, value: Any) -> None:
        p, j = self._locate(i)
        self._parents[p]._set(j, value)

    def _writes_many(self, idx: Positions, values: list | np.ndarray) -> Callable[[], None] | None:
        which, local = self._locate_all(positions_array(idx))
        return self._writes_to_parents(self._parents, which, local, values)

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        p, j = self._locate(i)
        return ((self._parents[p], j),)

    def _describe(self) -> str:
        count = len(self._parents)
        return f"concatenate({count} part{'' if count == 1 else 's'})"

    def __reduce__(self) -> tuple[Any, ...]:  # the parts, not the arrays behind them (memory maps pickle small)
        return (ConcatenateView, (list(self._parents),))


def _key_order(parts: list[View], specs: list[tuple | None]) -> tuple | None:
    """The first part's item spec where other parts' items are dicts alike with their keys in another order.

    Batches follow that order. Parts whose items differ in shape are
    concatenated as lists are: a batch that stacks items of different shapes
    says then which parts they come from.
    """
    known = [spec for part, spec in zip(parts, specs) if part._len != 0 and spec is not None]
    if any(_shapes_differ(known[0], spec) for spec in known[1:]):
        return None
    return known[0] if any(spec != known[0] for spec in known[1:]) else None


def _shapes_differ(a: tuple | None, b: tuple | None) -> bool:
    if a is None or b is None:
        return False
    if a[0] != b[0]:
        return True
    if a[0] == "array":
        return a[2] != b[2]
    if a[0] == "dict":  # the same keys in any order: items are compared, and batches built, key by key
        theirs = dict(zip(b[2], b[1]))
        return set(a[2]) != set(theirs) or any(_shapes_differ(x, theirs[key]) for key, x in zip(a[2], a[1]))
    return len(a[1]) != len(b[1]) or any(_shapes_differ(x, y) for x, y in zip(a[1], b[1]))


def _in_order(chunk: Any, spec: tuple | None) -> Any:
    """``chunk`` with the fields of its dicts in the order of ``spec``'s keys (the first part's), where both say."""
    if not isinstance(chunk, Columns) or spec is None or spec[0] == "array":
        return chunk
    if spec[0] == "tuple":
        if chunk.keys is not None or len(chunk.fields) != len(spec[1]):
            return chunk
        return Columns(tuple(_in_order(field, s) for field, s in zip(chunk.fields, spec[1])))
    keys, specs = spec[2], spec[1]
    if chunk.keys is None or set(chunk.keys) != set(keys):
        return chunk
    fields = dict(zip(chunk.keys, chunk.fields))
    return Columns(tuple(_in_order(fields[key], s) for key, s in zip(keys, specs)), tuple(keys))


def _sources(parts: list[View]) -> list[np.ndarray]:
    """The arrays as given to the array views among ``parts``: memory maps that remember their file."""
    from .sources import ArraySource

    return [p.source for p in parts if isinstance(p, ArraySource)]


def _same_kind_arrays(parts: list[View]) -> list[np.ndarray] | None:
    """The arrays behind ``parts`` if they are all arrays with one dtype and row shape, else None."""
    from .sources import ArraySource

    if not parts or any(type(p) is not ArraySource for p in parts):
        return None
    arrays = [p._array for p in parts if isinstance(p, ArraySource)]
    first = arrays[0]
    if any(a.dtype != first.dtype or a.shape[1:] != first.shape[1:] for a in arrays):
        return None
    return arrays


@overload
def concatenate(sequences: Sequence[np.ndarray]) -> View[np.ndarray]: ...


@overload
def concatenate(sequences: Sequence[SequenceLike[T]]) -> View[T]: ...


# Views and arrays mixed: mypy infers no T above for such a list (it joins a view and an array to Collection), so
# the list comes here, although mypy, judging by the types alone, says it cannot.
@overload
def concatenate(  # type: ignore[overload-cannot-match]
    sequences: Sequence[np.ndarray | SequenceLike[np.ndarray]],
) -> View[np.ndarray]: ...


# Lists (or tuples, views) of several item types, ints and strings say: mypy infers no T for them either. (No
# arrays here: an array's Any would make every overload above match as well, and mypy would infer Any for them.)
@overload
def concatenate(sequences: Sequence[list[Any] | tuple[Any, ...] | View[Any]]) -> View[Any]: ...


def concatenate(sequences: Sequence[SequenceLike[Any] | np.ndarray]) -> View[Any]:
    """A view of the sequences one after the other.

    Over C-contiguous arrays (memory maps included) of one dtype and row
    shape, as :func:`open_npy` gives, a batch or gather of rows from any of
    them is read with one numpy call, copying each row once. Parts may hold
    items of different shapes, as lists may: a batch that would stack them
    says which parts they come from (``batch(..., collate_fn=list)`` keeps
    them apart).

    >>> import numpy as np
    >>> import lazyseq
    >>> v = lazyseq.concatenate([[1, 2], [], [3]])
    >>> list(v), v[-1]
    ([1, 2, 3], 3)
    >>> rows = lazyseq.concatenate([np.zeros((2, 3)), np.ones((1, 3))])
    >>> rows.gather([2, 0]).batch(2)[0]
    array([[1., 1., 1.],
           [0., 0., 0.]])
    """
    return ConcatenateView(views_of(sequences, "concatenate: sequences must be a list of sequences"))

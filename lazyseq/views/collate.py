"""Sequences side by side: ``collate``, whose item ``i`` is the tuple (or dict) of their items ``i``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

from .base import UNREADABLE, View, lengths_must_match, remembered_spec
from .chunks import Columns
from .itemtypes import SequenceLike
from .keys import Positions
from .sources import as_view, views_of

__all__ = ["CollateView", "collate"]


class CollateView(View[Any]):
    """Item ``i`` is ``(s0[i], s1[i], ...)``, or ``{k0: s0[i], ...}`` with ``keys``; batches keep each field vectorized."""

    kind = "collate"

    @property
    def _reads_new_rows(self) -> bool:
        return all(parent._reads_new_rows for parent in self._parents)

    def __init__(self, parents: tuple[View, ...], keys: tuple | None = None) -> None:
        if not parents:
            raise ValueError("collate needs at least one sequence")
        self._len = lengths_must_match("collate", parents)
        self._parents = parents
        self._keys = keys

    def _get(self, i: int) -> Any:
        values = [p._get(i) for p in self._parents]
        return tuple(values) if self._keys is None else dict(zip(self._keys, values))

    def _get_many(self, idx: Positions) -> Columns:
        return Columns(tuple([p._get_many(idx) for p in self._parents]), self._keys)

    def _check_writable_somewhere(self) -> None:
        for parent in self._parents:  # an item is written into every field
            parent._check_writable_somewhere()

    def _set(self, i: int, value: Any) -> None:
        if self._keys is not None:
            if not isinstance(value, Mapping) or set(value) != set(self._keys):
                raise ValueError(f"collate item {i} is a dict with keys {list(self._keys)}, cannot assign {value!r}")
            value = [value[key] for key in self._keys]
        if len(value) != len(self._parents):
            raise ValueError(f"collate item {i} has {len(self._parents)} fields, cannot assign {len(value)} values")
        # A field refused as it is written (a string into integers) puts back the fields written before it, and
        # its own (a field of several items may be written in part): a tuple is not half assigned. All are read
        # first, and put back last to first: fields may share their data.
        before = [parent._readable_copy(i) for parent in self._parents]
        written = 0
        try:
            for parent, field in zip(self._parents, value):
                written += 1
                parent._set(i, field)
        except BaseException:
            for parent, old in reversed(list(zip(self._parents[:written], before))):
                if old is not UNREADABLE:
                    parent._set(i, old)
            raise

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return tuple((p, i) for p in self._parents)

    @remembered_spec
    def _item_spec(self) -> tuple | None:
        return self._fields_spec(tuple(p._item_spec() for p in self._parents))

    def _item_spec_at_most(self) -> tuple | None:
        return self._fields_spec(tuple(p._item_spec_at_most() for p in self._parents))

    def _fields_spec(self, specs: tuple) -> tuple | None:
        """The spec of items whose fields are as ``specs`` say (None where none is known)."""
        if all(s is None for s in specs):
            return None
        return ("tuple", specs) if self._keys is None else ("dict", specs, tuple(self._keys))

    def _describe(self) -> str:
        return "collate" if self._keys is None else f"collate({', '.join(map(repr, self._keys))})"


@overload
def collate(sequences: Mapping[Any, SequenceLike[Any]]) -> View[dict[Any, Any]]: ...


# Tuples of unknown width, typed Any: from tuple[Any, ...], mypy infers no lambda's arguments (an error for
# collate([xs, ys]).starmap(lambda x, y: ...), correct as it is).
@overload
def collate(sequences: Sequence[SequenceLike[Any]]) -> View[Any]: ...


def collate(sequences: Sequence[SequenceLike[Any]] | Mapping[Any, SequenceLike[Any]]) -> View[Any]:
    """A view whose item ``i`` is the tuple of item ``i`` of each sequence (a lazy ``zip``).

    The sequences must have the same length (a ``ValueError`` otherwise).
    Given a dict of sequences, item ``i`` is a dict with the same keys
    (``collate({"x": xs, "y": ys})[i] == {"x": xs[i], "y": ys[i]}``), and
    batches are dicts of stacked fields.

    >>> import numpy as np
    >>> import lazyseq
    >>> samples = np.array([[0.5, 1.0], [1.5, 2.0], [2.5, 3.0]])
    >>> pairs = lazyseq.collate([samples, ['a', 'b', 'c']])
    >>> pairs[1]
    (array([1.5, 2. ]), 'b')
    >>> lazyseq.batch(pairs, 2)[0]
    (array([[0.5, 1. ],
           [1.5, 2. ]]), ['a', 'b'])
    >>> lazyseq.collate({"x": np.arange(4.0), "y": np.arange(4) % 2}).batch(2)[1]
    {'x': array([2., 3.]), 'y': array([0, 1])}
    """
    if isinstance(sequences, Mapping):
        return CollateView(tuple(as_view(s) for s in sequences.values()), tuple(sequences))
    return CollateView(tuple(views_of(sequences, "collate: sequences must be a list or a dict of sequences")))

"""Groups of consecutive items: ``batch``, and its inverse ``unbatch``."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any, overload

import numpy as np

from ..arguments import flag, function, indexable_length, integer
from .base import View
from .chunks import (
    Columns,
    MixedShapes,
    chunk_rows,
    chunk_to_batch,
    holds_objects,
    is_rows,
    pad_chunk,
    writing_into,
)
from .errors import EndOfData, describe_origin
from .itemtypes import Integer, R, SequenceLike, T
from .keys import Positions
from .sources import as_view

__all__ = ["BatchView", "UnbatchView", "batch", "unbatch"]


class BatchView(View[Any]):
    """Item ``b`` is items ``b*k`` to ``b*k + k - 1`` of the parent, collated into one batch."""

    kind = "batch"

    def __init__(self, parent: View, k: Integer, drop_last: bool, pad: Any, collate_fn: Callable | None) -> None:
        k = integer(k, "batch: k", low=1)
        drop_last = flag(drop_last, "batch: drop_last")
        if drop_last and pad is not None:
            raise ValueError("batch: drop_last and pad cannot be used together")
        if collate_fn is not None:
            function(collate_fn, "batch: collate_fn")
        self._parent = parent
        self._parents = (parent,)
        self._k = k
        self._drop_last = drop_last
        self._pad = pad
        self._collate_fn = collate_fn
        n = parent._len
        self._len = None if n is None else (n // k if drop_last else -(-n // k))
        # Data of unknown length may end inside a batch: such a batch is read item by item, to find where.
        self._may_stop = parent._may_end()
        self._spec: tuple | None | bool = False  # the items' dtypes, for batches of items read one by one (False:
        # not looked up yet; a value that survives pickling)

    def _span(self, i: int) -> range:
        start = i * self._k
        stop = start + self._k
        n = self._parent._len
        return range(start, stop if n is None or stop <= n else n)

    def _get(self, i: int) -> Any:
        span = self._span(i)
        chunk: Any
        if self._may_stop:
            chunk = self._read_until_end(i, span)
            span = span[: len(chunk)]
        else:
            chunk = self._parent._get_many(span)
        spec = None
        if type(chunk) is list or isinstance(chunk, Columns):  # read one by one: made as the view says its items are
            spec = self._items_spec()
            if spec is None:  # known of these items, if not of all (a loader over arrays of several dtypes)
                spec = self._parent._spec_of(span)
        missing = self._k - len(span)
        if missing and self._pad is not None:  # objects are padded as a slice of their array pads them: as they are
            collated = self._collate_fn is None and not holds_objects(spec)
            chunk = pad_chunk(chunk, self._pad, missing, collated=collated, spec=spec)
        if self._collate_fn is not None:
            return self._collate_fn(chunk_rows(chunk))
        try:
            return chunk_to_batch(chunk, spec)
        except MixedShapes as error:
            raise self._mixed_shapes(span, error) from None

    def _items_spec(self) -> tuple | None:
        """The parent's ``_item_spec_at_most()``, found once (the dtypes a batch takes; a short batch among the items
        makes a batch of mixed shapes, refused all the same)."""
        spec = self._spec
        if spec is False:
            spec = self._spec = self._parent._item_spec_at_most()
        return spec  # type: ignore[return-value]

    def _mixed_shapes(self, span: range, error: MixedShapes) -> ValueError:
        """The error of a batch whose arrays differ in shape, saying where each of the two items comes from."""
        (a, b), (shape_a, shape_b) = error.positions, error.shapes
        where = [describe_origin(self._parent, span[k]) if k < len(span) else "padding" for k in (a, b)]
        return ValueError(
            f"cannot stack items of different shapes into one array: item {a} ({where[0]}) has shape {shape_a}, "
            f"item {b} ({where[1]}) has shape {shape_b}; batch(..., collate_fn=list) gives such items as a list"
        )

    def _get_into(self, i: int, buffer: np.ndarray) -> Any:
        if self._collate_fn is None and self._pad is None and self._parent._reads_new_rows:
            with writing_into(buffer):  # the batch is the chunk the parent builds: build it in the buffer
                return self._get(i)
        return self._get(i)

    def _read_until_end(self, i: int, span: range) -> list:
        """The items of ``span`` up to the end of the data: the last batch may be short, or dropped."""
        items = []
        for j in span:
            try:
                items.append(self._parent._get(j))
            except EndOfData:
                if not items or self._drop_last:
                    raise EndOfData(f"batch index {i} out of range: the data ended before item {j}") from None
                break
        return items

    def _held(self, i: int) -> range:
        """The parent positions of the items batch ``i`` holds: over data that may end, found by reading them."""
        span = self._span(i)
        if self._may_stop:
            span = span[: len(self._read_until_end(i, span))]
        return span

    def _set(self, i: int, value: Any) -> None:
        span = self._held(i)
        size = self._k if self._pad is not None else len(span)
        collated = self._collate_fn is None
        given_as_fields = collated and span and isinstance(value, (tuple, list, Mapping))  # else no item read for it
        if given_as_fields and _fields_with_rows(value, self._parent._get(span[0]), size):
            # as the batch was read: its items' fields, each with a row per item
            count = _length_of(value, collated)
            if count is not None:  # (items with no fields: nothing to write)
                value = [_row(value, r, collated) for r in range(count)]
        if len(value) != size:
            raise ValueError(f"batch {i} has {size} items, cannot assign {len(value)} values")
        # Padding positions, if any, are not written. As for a slice assignment: over one array, one numpy write; a
        # value refused part way puts back what was written.
        from .gather import GatherView

        GatherView(self._parent, span)._assign_all([value[offset] for offset in range(len(span))])

    def _check_writable(self, i: int) -> None:
        for j in self._held(i):
            self._parent._check_writable(j)

    def _check_element_writable(self, i: int, r: int, *within: int) -> None:
        self._check_elements_are_items()
        span = self._held(i)
        if r < len(span):
            if within:  # an element of that item: padding of a batch below, perhaps
                self._parent._check_element_writable(span[r], *within)
            else:
                self._parent._check_writable(span[r])
        elif self._pad is not None:  # it would read as the padding still
            raise self._padding_written(i, r)

    def _set_element(self, i: int, r: int, value: Any) -> bool:
        self._check_elements_are_items()
        span = self._held(i)
        if r < len(span):
            self._parent._set(span[r], value)
            return True
        if self._pad is not None:
            raise self._padding_written(i, r)
        return False

    def _element_count(self, i: int) -> int | None:
        self._check_elements_are_items()
        return self._k if self._pad is not None else len(self._held(i))

    def _check_elements_are_items(self) -> None:
        """Element ``r`` of a batch is item ``r`` of its span, unless a ``collate_fn`` made it (other than ``list``)."""
        collate_fn = self._collate_fn
        if collate_fn is not None and collate_fn is not list:
            from .mapping import function_name

            raise TypeError(
                f"batch: an element of a batch that collate_fn={function_name(collate_fn)} made cannot be assigned "
                "to (what the function made of the items cannot be undone); assign to the batched sequence's items, "
                "or a whole batch as a sequence of items"
            )

    def _padding_written(self, i: int, r: int) -> TypeError:
        return TypeError(
            f"batch: element {r} of batch {i} is padding (pad={self._pad!r}), not an item of the data: it cannot be "
            "assigned to"
        )

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return tuple((self._parent, j) for j in self._span(i))

    def _item_spec(self) -> tuple | None:
        from .display import batched_spec

        if self._collate_fn is not None or self._short_last_batch():  # batches not all alike
            return None
        return batched_spec(self._parent._item_spec(), self._k)

    def _item_spec_at_most(self) -> tuple | None:
        from .display import batched_spec

        return None if self._collate_fn is not None else batched_spec(self._parent._item_spec_at_most(), self._k)

    def _items_description(self) -> str | None:
        """The batches' description where all but the last are alike: ``float64 (4, 3), the last of 3``."""
        from .display import describe_spec

        if not self._short_last_batch():
            return super()._items_description()
        spec = self._item_spec_at_most()
        if spec is None:
            return None
        n = self._parent._len
        last = f"the last of {n % self._k}" if n is not None else "the last maybe fewer"
        return f"{describe_spec(spec)}, {last}"

    def _short_last_batch(self) -> bool:
        """Whether the last batch may hold fewer than ``k`` items (neither dropped nor padded)."""
        if self._drop_last or self._pad is not None:
            return False
        n = self._parent._len
        return n % self._k != 0 if n is not None else self._parent._may_end()

    def _describe(self) -> str:
        options = [str(self._k)]
        if self._drop_last:
            options.append("drop_last=True")
        if self._pad is not None:
            options.append(f"pad={self._pad!r}")
        if self._collate_fn is not None:
            from .mapping import function_name

            options.append(f"collate_fn={function_name(self._collate_fn)}")
        return f"batch({', '.join(options)})"


class UnbatchView(View[Any]):
    """Item ``i`` is item ``i % size`` of batch ``i // size`` of the parent."""

    kind = "unbatch"

    def __init__(self, parent: View, batch_size: Integer, last_batch_size: Integer | None) -> None:
        batch_size = integer(batch_size, "unbatch: batch_size", low=1)
        last = 0 if last_batch_size is None else integer(last_batch_size, "unbatch: last_batch_size")
        if not 0 <= last <= batch_size:
            raise ValueError(f"unbatch: last_batch_size must be between 0 and {batch_size}, got {last_batch_size}")
        last = last or batch_size  # 0, like None: every batch is full
        self._last = last
        self._parent = parent
        self._parents = (parent,)
        self._size = batch_size
        # batches that batch() collated are read knowing how (lists of items and lists of fields look alike)
        self._collated = _collated_by_default(parent)
        m = parent._len
        self._len = None if m is None else indexable_length(0 if m == 0 else (m - 1) * batch_size + last, "unbatch")

    def _get(self, i: int) -> Any:
        b, r = divmod(i, self._size)
        batch = self._parent._get(b)
        if r >= self._checked(batch, b):
            raise _ended(i, b)
        return _row(batch, r, self._collated)

    def _get_many(self, idx: Positions) -> list:
        items, loaded, held = [], -1, 0
        current: Any = None
        for i in idx:
            b, r = divmod(int(i), self._size)
            if b != loaded:
                current, loaded = self._parent._get(b), b
                held = self._checked(current, b)
            if r >= held:
                raise _ended(int(i), b)
            items.append(_row(current, r, self._collated))
        return items

    def _iter(self) -> Iterator[Any]:
        size = self._size
        n = self._len
        i = 0  # the item being read: what an error in the parent names (the first of its batch)
        for b, current in enumerate(self._parent._iter()):
            count = min(self._checked(current, b), size if n is None else n - b * size)
            for r in range(count):
                yield _row(current, r, self._collated)
            i += count

    def _checked(self, batch: Any, b: int) -> int:
        """How many items ``batch`` (number ``b``) holds, checked once per batch read: items at the wrong places else."""
        try:
            held = _length_of(batch, self._collated)
        except TypeError:
            raise TypeError(f"unbatch: batch {b} is of type {type(batch).__name__}, not a batch of items") from None
        return self._checked_count(held, b)

    def _checked_count(self, held: int | None, b: int) -> int:
        """``held``, the number of items of batch ``b`` (None: its items do not say), checked as :meth:`_checked` says."""
        n, size = self._len, self._size
        if held is None:  # items with no fields: as many as expected, where that is known
            if n is None and self._may_end():
                raise ValueError(
                    f"unbatch: batch {b} holds items with no fields, which do not say how many they are, and the "
                    "data's length is unknown: give it a size (uniter(..., size=n))"
                )
            return size if n is None else min(size, n - b * size)
        if n is None:  # data of unknown length: its last batch may be short, and ends it
            if held > size or (held < size and not self._may_end()):
                raise ValueError(f"unbatch: batch {b} holds {_items(held)}, not {size} (batch_size={size})")
            return held
        last = (b + 1) * size >= n
        expected = n - b * size if last else size
        # Items read at the wrong places, silently, from a batch of another size; the last one may hold more
        # than it gives (a padded batch), not fewer.
        if held < expected or (held > expected and not last):
            where = " (the last: see last_batch_size)" if last else ""
            raise ValueError(f"unbatch: batch {b}{where} holds {_items(held)}, not {expected} (batch_size={size})")
        return held

    def _check_writable(self, i: int) -> None:
        b, r = divmod(i, self._size)
        self._parent._check_element_writable(b, r)

    def _check_element_writable(self, i: int, r: int, *within: int) -> None:
        # Item i, changed, is written back whole as element r of batch b (see _set): what that write reaches.
        b, q = divmod(i, self._size)
        self._parent._check_element_writable(b, q, r, *within)

    def _set(self, i: int, value: Any) -> None:
        b, r = divmod(i, self._size)
        count = self._parent._element_count(b)
        if count is not None:  # a batch that batch() makes: its item is written alone, no other read
            if r >= self._checked_count(count, b):
                raise _ended(i, b)
            if self._parent._set_element(b, r, value):
                return
        current = self._parent._get(b)
        if r >= self._checked(current, b):  # as a read: from batches of another size, items go to the wrong places
            raise _ended(i, b)
        if self._parent._set_element(b, r, value):  # a batch that batch() makes: its item, written as it is
            return
        if _is_by_field(current, self._collated):
            raise TypeError(
                f"unbatch: cannot assign item {i}: its batch holds tuples or dicts field by field; assign "
                "to the batched sequence's items instead"
            )
        current = copy.copy(current)  # not the object read: a cache below may hold it, and the write may be refused
        current[r] = value
        # A batch may be made anew at each read (batch of an array): the change goes back to where it came from.
        self._parent._set(b, current)

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return ((self._parent, i // self._size),)

    def _item_spec(self) -> tuple | None:
        from .display import unbatched_spec

        spec = self._parent._item_spec_at_most()  # (a short last batch holds rows like the others')
        if spec is not None and spec[0] != "array" and not self._collated:  # a tuple of items, perhaps
            return None
        return unbatched_spec(spec)

    def _describe(self) -> str:
        last = getattr(self, "_last", self._size)  # (an unbatch pickled before it was kept)
        return f"unbatch({self._size})" if last == self._size else f"unbatch({self._size}, {last})"


def _items(count: int) -> str:
    return "1 item" if count == 1 else f"{count} items"


def _ended(i: int, b: int) -> EndOfData:
    """The error for item ``i`` of an unbatch whose data, of unknown length, ended in batch ``b``."""
    return EndOfData(f"unbatch index {i} out of range: the data ended in batch {b}")


def _is_by_field(batch: Any, collated: bool) -> bool:
    """Whether ``batch`` holds its items field by field, as :func:`batch` collates tuples, lists and dicts.

    A dict or namedtuple always is. A batch that the default collation made
    (``collated``) is when it is a tuple, or a list of fields (each an array,
    a tensor, a list, a tuple or a dict: a list of items holds anything
    else). Of other batches, a tuple is when each of its parts is an array,
    a tensor or a list (a ``collate_fn=tuple`` of array or tensor items is
    read as fields); a list is a list of items.
    """
    if isinstance(batch, Mapping) or (isinstance(batch, tuple) and hasattr(batch, "_fields")):
        return True
    if collated:
        if type(batch) is tuple:
            return True
        # a list of no fields: the batch of empty lists (a batch holds one item at least)
        return type(batch) is list and all(is_rows(part) or isinstance(part, _FIELDS) for part in batch)
    return type(batch) is tuple and len(batch) > 0 and all(is_rows(part) or isinstance(part, list) for part in batch)


_FIELDS = (list, tuple, Mapping)  # what the default collation makes of a field of several items, but rows


def _fields_with_rows(value: Any, item: Any, count: int) -> bool:
    """Whether ``value`` is a batch of ``count`` items like ``item`` given field by field, as batches of them are read.

    A dict for dicts; for tuples, a tuple of as many fields, each an array,
    a list or fields like the item's (not a tuple of items); for lists, a
    list of as many fields, each an array, fields like the item's, or a list
    of ``count`` values (numbers collate to an array, strings to a list), with
    an array or such fields among them or ``count`` other than the item's
    length (else a list of items it is: lists as long as an item).

    >>> import numpy as np
    >>> fields = (np.arange(2), np.arange(2))
    >>> _fields_with_rows(fields, (1, 2), 2), _fields_with_rows(((1, 2), (3, 4)), (1, 2), 2)
    (True, False)
    >>> _fields_with_rows(({"x": 1}, {"x": 2}), {"x": 0}, 2), _fields_with_rows(list(fields), [1, 2], 2)
    (False, True)
    >>> _fields_with_rows((np.arange(2), (np.arange(2), ["a", "b"])), (0, (0.5, "a")), 2)
    True
    >>> _fields_with_rows([np.arange(2), ["a", "b"]], [1, "a"], 2), _fields_with_rows([[1, "a"], [2, "b"]], [1, "a"], 2)
    (True, False)
    >>> _fields_with_rows([np.arange(3), ["a", "b", "c"]], [1, "a"], 3), _fields_with_rows(fields, 1, 2)
    (True, False)
    >>> _fields_with_rows([np.arange(1), [np.arange(1), ["a"]]], [7, [1, "a"]], 1)
    True
    """
    if isinstance(item, Mapping):
        return isinstance(value, Mapping)
    if isinstance(item, tuple):
        return (
            isinstance(value, tuple)
            and len(value) == len(item)
            and all(
                is_rows(field) or isinstance(field, (list, Mapping)) or _fields_with_rows(field, part, count)
                for field, part in zip(value, item)
            )
        )
    if type(item) is list:
        if type(value) is not list or len(value) != len(item):
            return False
        by_field = len(item) != count  # (a list of items holds lists as long as an item)
        for field, part in zip(value, item):
            if is_rows(field) or (isinstance(part, (tuple, list, Mapping)) and _fields_with_rows(field, part, count)):
                by_field = True  # a field as batches hold it: no item is one
            elif not (type(field) is list and len(field) == count):  # a field of other values, one per item
                return False
        return by_field
    return False


def _row(batch: Any, r: int, collated: bool) -> Any:
    """Item ``r`` of ``batch``: ``batch[r]``, or, for a batch held field by field, row ``r`` of each field."""
    if not _is_by_field(batch, collated):
        return batch[r]
    if isinstance(batch, Mapping):
        return {key: _row(field, r, collated) for key, field in batch.items()}
    rows = [_row(field, r, collated) for field in batch]
    if hasattr(batch, "_fields"):
        return type(batch)(*rows)
    return tuple(rows) if isinstance(batch, tuple) else rows


def _length_of(batch: Any, collated: bool) -> int | None:
    """How many items ``batch`` holds (a batch held field by field: as many as its first field's rows).

    None for a batch of items with no fields (empty tuples, lists or dicts) anywhere: it does not say.
    """
    if not _is_by_field(batch, collated):
        return len(batch)
    for field in batch.values() if isinstance(batch, Mapping) else batch:
        held = _length_of(field, collated)
        if held is not None:
            return held
    return None


def _collated_by_default(view: View) -> bool:
    """Whether every item of ``view`` is a batch that :func:`batch` collated by default."""
    if isinstance(view, BatchView):
        return view._collate_fn is None
    return view._items_like_parents and bool(view._parents) and all(map(_collated_by_default, view._parents))


@overload
def batch(
    sequence: SequenceLike[T], k: Integer, drop_last: bool = ..., pad: Any = ..., *, collate_fn: Callable[[list[T]], R]
) -> View[R]: ...


@overload
def batch(
    sequence: SequenceLike[T], k: Integer, drop_last: bool, pad: Any, collate_fn: Callable[[list[T]], R]
) -> View[R]: ...


@overload
def batch(
    sequence: SequenceLike[np.ndarray | np.generic | complex] | np.ndarray,
    k: Integer,
    drop_last: bool = ...,
    pad: Any = ...,
    collate_fn: None = None,
) -> View[np.ndarray]: ...


@overload
def batch(  # only without collate_fn: an overload that matched with one too made mypy's answer Any (see Fluent.batch)
    sequence: SequenceLike[Any],
    k: Integer,
    drop_last: bool = ...,
    pad: Any = ...,
    collate_fn: None = None,
) -> View[Any]: ...


def batch(
    sequence: SequenceLike[Any],
    k: Integer,
    drop_last: bool = False,
    pad: Any = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> View[Any]:
    """A view of ``sequence`` in groups of ``k`` consecutive items.

    The last batch holds the remaining items (fewer than ``k``) unless
    ``drop_last`` drops it or ``pad`` fills it to exactly ``k`` items with
    copies of ``pad`` (the two options exclude each other). By default items
    are stacked: numbers and arrays into one ``ndarray``, tuples, lists,
    namedtuples and dicts field by field; ``collate_fn`` receives the list of
    items instead (``collate_fn=list`` gives plain lists). Over numpy data a
    batch is read with a few vectorized calls, not one call per item.

    >>> import numpy as np
    >>> import lazyseq
    >>> b = lazyseq.batch(np.arange(10), 4, pad=-1)
    >>> len(b), b[0], b[-1]
    (3, array([0, 1, 2, 3]), array([ 8,  9, -1, -1]))
    >>> lazyseq.batch(['a', 'b', 'c'], 2, collate_fn=list)[1]
    ['c']
    """
    return BatchView(as_view(sequence), k, drop_last, pad, collate_fn)


def unbatch(
    sequence: SequenceLike[SequenceLike[T]], batch_size: Integer, last_batch_size: Integer | None = None
) -> View[T]:
    """The items of a sequence of batches, one after the other (the inverse of :func:`batch`).

    Every batch holds ``batch_size`` items, except the last, which holds
    ``last_batch_size``; ``None`` or 0 (a full last batch) mean
    ``batch_size``, so ``unbatch(b, k, n % k)`` undoes ``batch`` of ``n``
    items whatever ``n`` is. Batches that :func:`batch` collated by default
    (also through views that only select or reorder them, such as slices or
    ``prefetch``) are taken apart as they were put together: tuples, lists and
    dicts field by field. Other batches are lists or arrays of items, or dicts,
    namedtuples and tuples of arrays or lists, one per field.

    >>> import lazyseq
    >>> list(lazyseq.unbatch([[1, 2], [3, 4], [5]], 2, last_batch_size=1))
    [1, 2, 3, 4, 5]
    >>> list(lazyseq.unbatch([[1, 2], [3, 4]], 2, 4 % 2))
    [1, 2, 3, 4]
    >>> pairs = lazyseq.batch([[0, 0], [1, 10], [2, 20]], 2)  # items that are lists: a list of fields
    >>> [[int(x) for x in item] for item in lazyseq.unbatch(pairs, 2, 3 % 2)]
    [[0, 0], [1, 10], [2, 20]]
    """
    return UnbatchView(as_view(sequence), batch_size, last_batch_size)

"""The one base class of all views: indexing, slicing, iteration, assignment and repr.

A combinator only says how to read item ``i`` (``_get``), optionally how to
read many items at once (``_get_many``, vectorized where it can be), how to
write one (``_set``) and where item ``i`` comes from (``_sources``). A view
whose items are batches it builds itself may also say how to build one in
memory it is given (``_get_into``; a loader's worker process passes the
shared-memory slot the item goes to, which saves a copy of every batch), and
a view whose consecutive items are rows of an array as they stand may give
them without a copy (``_stored_rows``; ``write_npy`` writes them from there).
Keys, bounds, negative indices, slices, index arrays, errors and ``repr`` are
handled here, once, for every view.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self, TypeVar, overload

import numpy as np

from . import errors
from .chunks import is_tensor
from .errors import EndOfData
from .fluent import Fluent
from .itemtypes import T_co
from .keys import Positions, array_key, out_of_range

__all__ = ["View", "lengths_must_match", "remembered_spec"]

# What a list used as a key holds: positions (ints or numpy integers) or a mask (bools or numpy booleans).
# A type variable, not a union: a list[np.int64] or a list[bool] is no list[int | np.integer] (lists are invariant).
_Key = TypeVar("_Key", bound=int | np.integer[Any] | np.bool_)


def remembered_spec(find: Callable[[Any], tuple | None]) -> Callable[[Any], tuple | None]:
    """``_item_spec`` found once, when known: what a view's items are follows from the views it was made over.

    A view made for each batch (``data.gather(picks).batch(64)[0]``) then asks its parent once, not the whole chain.
    """

    @functools.wraps(find)
    def item_spec(self: Any) -> tuple | None:
        spec = self.__dict__.get("_known_spec")
        if spec is None:
            spec = find(self)
            if spec is not None:
                self._known_spec = spec
        return spec

    return item_spec


class View(Fluent[T_co], Sequence[T_co]):
    """A lazy, random-access sequence: nothing is computed until an item is read.

    Every view is a ``collections.abc.Sequence``: ``len``, indexing with
    negative indices, slices and index arrays (which give views), iteration,
    ``in``, ``index`` and ``count``; its combinators are methods too
    (``view.smap(f)``, ``view.batch(k)``, ...). ``View[T]`` is a view whose
    items are ``T``, for type checkers. An infinite view has no ``len``.
    Views are made by :func:`lazyseq.view` and the combinators, not by
    calling ``View``.

    >>> import lazyseq
    >>> squares = lazyseq.view(range(10)).smap(lambda x: x * x)
    >>> isinstance(squares, lazyseq.View), len(squares), squares[-1], list(squares[2:5])
    (True, 10, 81, [4, 9, 16])
    >>> squares[[1, 3]].batch(2)[0]
    array([1, 9])
    """

    kind = "view"
    _length_unknown = False  # True for sources that end where their data ends, found by reading (uniter)
    _len: int | None
    _parents: tuple[View[Any], ...] = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        if cls is View:
            raise TypeError(
                "View is the base class of lazyseq's views, not one itself: make a view with lazyseq.view(data) "
                "or a combinator (lazyseq.smap, lazyseq.gather, ...)"
            )
        return super().__new__(cls)

    # -- what subclasses provide -------------------------------------------

    def _get(self, i: int) -> Any:
        """Item ``i``, with ``0 <= i < len(self)``."""
        raise NotImplementedError

    def _get_many(self, idx: Positions) -> Any:
        """Items at valid positions ``idx``, as a chunk (see :mod:`lazyseq.views.chunks`)."""
        items = []
        for i in idx:
            items.append(self._get(int(i)))
        return items

    def _set(self, i: int, value: Any) -> None:
        """Write item ``i``, with ``0 <= i < len(self)``: views that keep this default are read-only."""
        raise self._read_only()

    def _check_writable(self, i: int) -> None:
        """Raise what writing item ``i`` would raise because of where it goes, and write nothing.

        A read-only view or array, or an item past the end of the data: every
        assignment checks all the items it writes first, so that a refused
        one changes nothing. The default: a view that writes (it overrides
        ``_set``) checks the parent items that ``_sources(i)`` names.
        """
        if not self._writes():
            raise self._read_only()
        for parent, j in self._sources(i):
            parent._check_writable(j)

    def _check_writable_somewhere(self) -> None:
        """Raise what any write through this view would raise because of where it goes: an assignment of no
        items is refused where one of some would be, as Python refuses one to a tuple and numpy one to a read-only
        array. A view whose items each come from one of its parents passes if one of them takes writes (a view
        that writes an item into several parents, or reads its parents otherwise, says so itself)."""
        if not self._writes():
            raise self._read_only()
        self._check_one_writable(self._parents)

    @staticmethod
    def _check_one_writable(parents: Sequence[View[Any]]) -> None:
        """Raise what writing through the first of ``parents`` would raise if none of them takes writes."""
        refused: Exception | None = None
        for parent in parents:
            try:
                parent._check_writable_somewhere()
                return
            except (TypeError, ValueError) as error:
                refused = refused or error
        if refused is not None:
            raise refused

    def _check_element_writable(self, i: int, r: int, *within: int) -> None:
        """Raise what writing element ``r`` of item ``i`` alone would raise (see ``_set_element``), and write nothing.

        ``within``: the write goes deeper, to element ``within[0]`` of that
        element, and so on (an unbatch of an unbatch writes an element of a
        batch of batches). Where elements cannot be written alone, the whole
        item is rewritten: all of it is checked.
        """
        if self._items_like_parents and self._writes():
            ((parent, j),) = self._sources(i)
            parent._check_element_writable(j, r, *within)
        else:
            self._check_writable(i)

    def _set_element(self, i: int, r: int, value: Any) -> bool:
        """Write ``value`` as element ``r`` of item ``i`` (an item that holds several, as a batch does), and only it.

        True once written; False where this view cannot write one element
        alone: its caller then reads item ``i``, changes it and writes it back
        whole. A batch writes the item of its parent that element ``r`` is; a
        view that writes, and whose items are its parents' items, passes the
        write on to the one ``_sources(i)`` names.
        """
        if not (self._items_like_parents and self._writes()):
            return False
        ((parent, j),) = self._sources(i)
        return parent._set_element(j, r, value)

    def _element_count(self, i: int) -> int | None:
        """How many elements item ``i`` holds, where known without reading it (a batch: its items), else None.

        With it, element ``r`` of the item is written alone (``_set_element``), nothing of the item read.
        """
        if not (self._items_like_parents and self._writes()):
            return None
        ((parent, j),) = self._sources(i)
        return parent._element_count(j)

    def _writes(self) -> bool:
        """Whether items can be written through this view: it overrides ``_set``."""
        return type(self)._set is not View._set

    def _read_only(self) -> TypeError:
        return TypeError(f"{self.kind} views are read-only: they cannot be assigned to")

    @property
    def _reads_new_rows(self) -> bool:
        """Whether _get_many returns arrays made for that read (see chunks.new_rows) that nothing else refers to."""
        return False

    def _before_fork(self) -> None:
        """Make now what processes forked from this one would each make at their first read: they inherit it.

        Worker processes started with ``fork`` call it in the consumer, on every
        view of the pipeline, before forking. The default has nothing to make.
        """

    def _get_into(self, i: int, buffer: np.ndarray) -> Any:
        """Item ``i``, with the arrays this view builds for it placed in ``buffer`` (bytes) where they fit.

        The default builds nothing there: it is ``_get(i)``. Whoever calls it
        keeps ``buffer`` for the item, and copies whatever arrays are elsewhere.
        """
        return self._get(i)

    def _stored_rows(self, rows: range) -> np.ndarray | None:
        """Items ``rows`` (valid, in order, step 1) as the array that holds them, read-only and not copied.

        None (the default) where they are not rows of one array as they
        stand: only array sources, and views that pass their rows through
        unchanged, have them. A reader that only copies the items somewhere
        (``write_npy``) then reads them where they are.
        """
        return None

    def _sources(self, i: int) -> tuple[tuple[View[Any], int], ...]:
        """The (parent, index) pairs that item ``i`` is read from."""
        return ()

    def _iter(self) -> Iterator[Any]:
        get = self._get
        if self._len is None:
            i = 0
            while True:
                try:
                    item = get(i)
                except EndOfData:  # data of unknown length ended: iteration stops there, as for a list
                    return
                yield item
                i += 1
        for i in range(self._len):
            yield get(i)

    def _label(self) -> str:
        """Short name used in error chains and repr, e.g. ``smap(normalize)``."""
        return self.kind

    def _describe(self) -> str:
        """One line for repr: the label plus whatever parameters matter."""
        return self._label()

    _items_like_parents = False  # True for views that only select or reorder their parents' items

    @remembered_spec
    def _item_spec(self) -> tuple[Any, ...] | None:
        """What an item is, where that is known without reading one (see :mod:`lazyseq.views.display`).

        ``("array", dtype, shape)``, ``("tuple", specs)``, ``("dict", specs, keys)``
        (a field's spec for each key) or ``None`` (unknown).
        """
        if not self._items_like_parents or not self._parents:
            return None
        specs = {p._item_spec() for p in self._parents}
        return specs.pop() if len(specs) == 1 else None

    def _item_spec_at_most(self) -> tuple[Any, ...] | None:
        """An ``_item_spec()`` whose arrays are at least as large as any item's, to size buffers by: the same, but
        for batches whose last one is short (described as full ones), and views of their items."""
        if not self._items_like_parents or not self._parents:
            return self._item_spec()
        specs = {p._item_spec_at_most() for p in self._parents}
        return specs.pop() if len(specs) == 1 else None

    def _spec_of(self, idx: Positions) -> tuple[Any, ...] | None:
        """What the items at positions ``idx`` are, where known: ``_item_spec_at_most()``, or what is known of
        these alone where the view knows more of some items than of all (a concatenation of arrays of several
        dtypes: the dtype of the part that holds them). Asked where the spec of all items is unknown."""
        return self._item_spec_at_most()

    # -- length ---------------------------------------------------------------

    def __len__(self) -> int:
        if self._len is None:
            raise TypeError(f"{self._label()} view {self.endless}: it has no len()")
        return self._len

    def __bool__(self) -> bool:
        """Whether the view has items: of a view of unknown length that may end, whether it has a first one."""
        if self._len is not None:
            return self._len > 0
        if not self._may_end():
            return True
        try:
            self._get(0)
        except EndOfData:
            return False
        except Exception as error:  # its first item failed: as reading it would say
            errors.reraise(error)
        return True

    @property
    def is_infinite(self) -> bool:
        """Whether the view has no end (one of unknown length, ``uniter``, ends where its data does)."""
        return self._len is None and not self._may_end()

    @property
    def endless(self) -> str:
        """Why this view has no length, for error messages: it "is infinite" or "has no known length"."""
        return "has no known length" if self._may_end() else "is infinite"

    def _may_end(self) -> bool:
        """Whether this view without a length reads data whose end is only found by reading past it.

        Reading past that end raises :class:`~lazyseq.views.errors.EndOfData`.
        """
        if self._len is not None:
            return False
        return any(view._length_unknown for view in self._views_below(lambda view: view._len is None))

    def _epochs(self) -> tuple[int, ...]:
        """How many times an epoch was set on each shuffle this view reads from, wherever ``set_epoch`` was called.

        Counts, not epochs: items computed between ``set_epoch(1)`` and
        ``set_epoch(0)`` are of epoch 1, though the epoch is 0 again.
        """
        sets = (getattr(view, "_epoch_sets", None) for view in self._views_below())  # a shuffle's
        return tuple(count for count in sets if count is not None)

    def _views_below(self, through: Callable[[View[Any]], bool] | None = None) -> Iterator[View[Any]]:
        """This view and the views it reads from, each once, going on only through those for which ``through`` holds.

        One walk, not a call per path: parents may be shared (``collate([d, d])``), and pipelines deep.
        """
        seen: set[int] = set()
        stack: list[View[Any]] = [self]
        while stack:
            view = stack.pop()
            if id(view) not in seen and (through is None or through(view)):
                seen.add(id(view))
                yield view
                stack.extend(view._parents)

    def _need_length(self, what: str) -> int:
        if self._len is None:
            hint = "; uniter(iterable, size=n) gives an iterable of n items its length" if self._may_end() else ""
            raise TypeError(f"{what} needs a length, but {self._label()} view {self.endless}{hint}")
        return self._len

    # -- reading ---------------------------------------------------------------

    @overload
    def __getitem__(self, key: int | np.integer[Any]) -> T_co: ...

    @overload
    def __getitem__(self, key: slice | list[_Key] | np.ndarray) -> View[T_co]: ...

    def __getitem__(self, key: int | np.integer[Any] | slice | list[_Key] | np.ndarray) -> Any:
        if type(key) is not int:
            if isinstance(key, slice):
                return self._slice(key)
            key = self._coerce_key(key)
            if not isinstance(key, int):  # an index array (operator.index gives exact ints)
                from .gather import GatherView

                return GatherView(
                    self, array_key(key, self._len, self._label(), self._error_name(), endless=self.endless)
                )
        i = self._check_index(key)
        try:
            return self._get(i)
        except Exception as error:
            errors.reraise(error)

    def _check_index(self, key: int) -> int:
        n = self._len
        if key < 0:
            if n is None:
                raise TypeError(f"negative index {key} needs a length, but {self._label()} view {self.endless}")
            if key + n < 0:
                raise out_of_range(key, n, self._error_name())
            return key + n
        if n is not None and key >= n:
            raise out_of_range(key, n, self._error_name())
        return key

    def _error_name(self) -> str:
        """The view as errors about its indexes name it: ``view slice(0, 8000, 1)``, as its repr shows it."""
        return f"view {self._describe()}"

    def _coerce_key(self, key: Any) -> int | list[Any] | np.ndarray:
        """An ``int`` for integer-like keys, the key itself for index arrays and lists.

        Other arrays (a torch tensor, a pandas Series: anything with
        ``__array__``) index as the numpy array they make.
        """
        if isinstance(key, list) or (isinstance(key, np.ndarray) and key.ndim):
            return key
        given = key
        if not isinstance(key, (int, np.ndarray, np.generic)) and hasattr(key, "__array__"):
            key = _index_array(key)  # before __index__, which a tensor of one integer has too
            if key.ndim:
                return key
        try:  # a 0-d integer array is an integer, as for a list and numpy
            if type(key) is np.bool_ or (type(key) is np.ndarray and key.dtype.kind == "b"):
                raise TypeError  # numpy before 2.3 reads a numpy boolean as 0 or 1, with a warning; later, refuses it
            return operator.index(key)
        except TypeError:
            raise TypeError(
                f"{self._label()} indices must be integers, slices or integer arrays, not {_type_name(given)}"
            ) from None

    def _slice(self, key: slice) -> View[T_co]:
        from .gather import GatherView, StridedView

        if self._len is not None:
            return GatherView(self, range(self._len)[key])
        start, stop, step = key.start, key.stop, key.step
        start = 0 if start is None else operator.index(start)
        step = 1 if step is None else operator.index(step)
        if step == 0:
            raise ValueError("slice step cannot be zero")
        if start < 0 or step < 0 or (stop is not None and operator.index(stop) < 0):
            raise TypeError(f"slice {key} needs a length, but {self._label()} view {self.endless}")
        if stop is None:
            return StridedView(self, start, step)
        if self._may_end():  # it may end before stop: so does the slice, found by reading, as a list's would
            return StridedView(self, start, step, max(start, operator.index(stop)))
        return GatherView(self, range(start, operator.index(stop), step))

    def __iter__(self) -> Iterator[T_co]:
        try:
            yield from self._iter()
        except Exception as error:
            errors.reraise(error)

    def __reversed__(self) -> Iterator[T_co]:
        return self._reversed(self._need_length("reversed()"))  # an infinite view: TypeError now, as len() does

    def _reversed(self, n: int) -> Iterator[T_co]:
        get = self._get
        try:
            for i in range(n - 1, -1, -1):
                yield get(i)
        except Exception as error:
            errors.reraise(error)

    def __delitem__(self, key: object) -> None:
        raise TypeError(f"{self._label()} view does not support item deletion: its length is that of what it reads")

    def __contains__(self, value: object) -> bool:
        self._need_length("'in'")
        return any(item is value or item == value for item in self)

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        """Position of the first item equal to ``value`` (``ValueError`` if absent), like ``list.index``."""
        n = self._need_length("index()")
        for i in range(n)[slice(start, stop)]:
            item = self[i]
            if item is value or item == value:
                return i
        raise ValueError(f"{value!r} is not in {self._label()} view")

    def count(self, value: Any) -> int:
        """Number of items equal to ``value``, like ``list.count``."""
        self._need_length("count()")
        return sum(1 for item in self if item is value or item == value)

    # -- writing --------------------------------------------------------------

    def __setitem__(self, key: int | np.integer[Any] | slice | list[_Key] | np.ndarray, value: Any) -> None:
        if type(key) is not int:
            target: View[T_co]
            if isinstance(key, slice):
                target = self._slice(key)
            else:
                key = self._coerce_key(key)
                if isinstance(key, int):  # an exact int: operator.index gives no subclass
                    self._set_checked(self._check_index(key), value)
                    return
                target = self[key]
            target._assign_all(value)
            return
        self._set_checked(self._check_index(key), value)

    def _set_checked(self, i: int, value: Any) -> None:
        self._check_writable(i)
        self._set(i, value)

    def _assign_all(self, values: Any) -> None:
        n = self._need_length("assignment")
        values = self._values_to_assign(values, n)
        if len(values) != n:
            raise ValueError(
                f"cannot assign {len(values)} values to a {self._label()} of {n} items: views cannot change length"
            )
        if n == 0:
            self._check_writable_somewhere()
            return
        write = self._writes_many(range(n), values)
        if write is not None:  # arrays below: one vectorized write each, the values cast as numpy casts an array
            write()
            return
        for i in range(n):  # all of them before any is written: a refused assignment changes nothing
            self._check_writable(i)
        # A value may still be refused as it is written (a string into integers): what was there goes back.
        # An item that cannot be read (a batch of items that do not stack) is written all the same, as
        # an item assignment would, and is not put back.
        before = [self._readable_copy(i) for i in range(n)]
        for i, value in enumerate(values):
            try:
                self._set(i, value)
            except BaseException:
                for j in range(i + 1):  # item i too: it may hold several, written in part
                    if before[j] is not UNREADABLE:
                        self._set(j, before[j])
                raise

    def _readable_copy(self, i: int) -> Any:
        """Item ``i`` with its arrays copied, or ``UNREADABLE`` if reading it fails."""
        try:
            return _own_arrays(self._get(i))
        except Exception:
            return UNREADABLE

    def _writes_many(self, idx: Positions, values: list[Any] | np.ndarray) -> Callable[[], None] | None:
        """The write of ``values`` as items ``idx`` at once, as ``_set`` would one by one, ready to run; None where
        this view cannot write them so. Nothing is written before it runs, and it cannot be refused then.

        An array source writes them with one numpy assignment (cast first);
        views that take each item from one parent pass the write on; other
        views cannot (their items are then checked and written one by one).
        """
        return None

    @staticmethod
    def _writes_to_parents(
        parents: Sequence[View[Any]], which: np.ndarray, local: np.ndarray, values: list[Any] | np.ndarray
    ) -> Callable[[], None] | None:
        """The write of each ``values[k]`` as item ``local[k]`` of ``parents[which[k]]``, every parent's at once,
        or None where one of them cannot, or where two of them may show the same data: then which value stays
        is the one written last, as item by item (a parent's own write keeps that order among its items)."""
        touched = np.unique(which).tolist()
        if len(touched) > 1 and _may_share_data([parents[p] for p in touched]):
            return None
        writes = []
        for p in touched:
            where = (which == p).nonzero()[0]
            part = values[where] if isinstance(values, np.ndarray) else [values[k] for k in where.tolist()]
            write = parents[p]._writes_many(local[where], part)
            if write is None:
                return None
            writes.append(write)
        return functools.partial(_run_all, writes)

    def _values_to_assign(self, values: Any, n: int) -> list[Any] | np.ndarray:
        """All the values, read before any is written (they may be a view of the same data), like list and numpy:
        a list, or a copy of an array; ``TypeError`` for one value (``n``: how many items it was given to)."""
        if isinstance(values, np.ndarray) and values.ndim:
            return values.copy()  # (its rows would be views of memory that the writes may change)
        try:
            iterator = iter(values)
        except TypeError:
            raise TypeError(  # (a numpy user expects it broadcast; a list refuses it, and a view is read as one)
                f"can only assign an iterable of values to the {n} items that a slice, mask or index list selects "
                f"(one value per item, as to a slice of a list), not {_type_name(values)}; for one value in all, assign "
                f"[value] * {n}"
            ) from None
        # Items read from arrays (a view of the same data, say) are rows of their memory: copied before any write.
        return [_own_arrays(item) for item in iterator]

    # -- display ------------------------------------------------------------

    def __repr__(self) -> str:
        return "\n".join(self._repr_lines(prefix="", child_prefix=""))

    def _repr_html_(self) -> str:
        """The same tree for Jupyter, with the top line (what the view gives) in bold."""
        from .display import html_tree

        return html_tree(self._repr_lines(prefix="", child_prefix=""))

    def _items_description(self) -> str | None:
        """What ``repr`` says the items are (``float64 (64, 248)``); None where that is not known."""
        from .display import describe_spec

        spec = self._item_spec()
        return None if spec is None else describe_spec(spec)

    def _repr_lines(self, prefix: str, child_prefix: str, depth: int = 0) -> list[str]:
        length = f"len {self._len}" if self._len is not None else "length unknown" if self._may_end() else "infinite"
        if depth == 0:
            items = self._items_description()
            if items is not None:
                length += f", items {items}"
        lines = [f"{prefix}{self._describe()}  [{length}]"]
        parents = self._parents
        if depth > 12:
            return lines + [child_prefix + "└─ ..."] if parents else lines
        shown = parents if len(parents) <= 6 else parents[:5]
        for k, parent in enumerate(shown):
            last = k == len(shown) - 1 and len(shown) == len(parents)
            branch, cont = ("└─ ", "   ") if last else ("├─ ", "│  ")
            lines += parent._repr_lines(child_prefix + branch, child_prefix + cont, depth + 1)
        if len(shown) < len(parents):
            lines.append(f"{child_prefix}└─ ... {len(parents) - len(shown)} more")
        return lines


def _index_array(key: Any) -> np.ndarray:
    """An index that is no numpy array (a torch tensor, a pandas Series) as the numpy array it makes.

    A tensor on any device, with or without a gradient; not one of uint8,
    which torch reads as a mask and numpy as positions.
    """
    if is_tensor(key):
        if str(key.dtype) == "torch.uint8" and key.ndim:  # (one uint8: a position, to torch too)
            raise TypeError(
                "a uint8 tensor as an index is positions to numpy and a mask to torch: give .bool() for a mask, "
                ".long() for positions"
            )
        return key.numpy(force=True)
    return np.asarray(key)


def lengths_must_match(kind: str, views: Sequence[View[Any]]) -> int | None:
    """The common length of ``views``; a ``ValueError`` naming the lengths if they differ."""
    lengths = [v._len for v in views]
    if any(length != lengths[0] for length in lengths):
        shown = ", ".join(
            str(v._len) if v._len is not None else "unknown" if v._may_end() else "infinite" for v in views
        )
        raise ValueError(f"{kind}: all sequences must have the same length, got lengths {shown}")
    return lengths[0]


def _may_share_data(views: list[View[Any]]) -> bool:
    """Whether two of ``views`` may write into the same memory: arrays below them whose bytes' bounds overlap
    (only arrays are written at once, see ``View._writes_many``). One sweep over the bounds in order: thousands of
    parts (files) cost no pairs."""
    spans = sorted(
        (*byte_bounds(array), k) for k, view in enumerate(views) for array in _arrays_below(view) if array.size
    )
    # the furthest reach so far, and the furthest of the other views than its own
    first_high, first_owner, other_high = -1, -1, -1
    for low, high, k in spans:
        if (first_owner != k and first_high > low) or (first_owner == k and other_high > low):
            return True
        if k == first_owner:
            first_high = max(first_high, high)
        elif high > first_high:
            first_high, first_owner, other_high = high, k, first_high
        else:
            other_high = max(other_high, high)
    return False


def byte_bounds(array: np.ndarray) -> tuple[int, int]:
    """The addresses of an array's first byte and of the byte after its last (numpy's ``byte_bounds``)."""
    bounds = getattr(getattr(np.lib, "array_utils", None), "byte_bounds", None) or np.byte_bounds  # type: ignore[attr-defined, unused-ignore]  # numpy 1.x
    low, high = bounds(array)
    return low, high


def _type_name(value: object) -> str:
    """The name of ``value``'s type as its user knows it: numpy's with ``numpy.`` (its bool is named "bool" too:
    "not bool" beside True taken would be a riddle)."""
    kind = type(value)
    return f"numpy.{kind.__name__}" if kind.__module__.startswith("numpy") else kind.__name__


def _arrays_below(view: View[Any]) -> list[np.ndarray]:
    found, seen, waiting = [], set(), [view]
    while waiting:
        v = waiting.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        array = getattr(v, "_array", None)
        if isinstance(array, np.ndarray):
            found.append(array)
        waiting.extend(v._parents)
    return found


def _run_all(writes: list[Callable[[], None]]) -> None:
    for write in writes:
        write()


def _own_arrays(item: Any) -> Any:
    """``item`` with its arrays copied: as it is unless it is an array or a container holding some.

    A view (a piece of a split, say) is read into a list, and a structured row (``np.void``, which points into
    its array) copied: both would show the writes.
    """
    if isinstance(item, np.ndarray):
        return item.copy()  # a subclass's copy keeps what it adds (a mask)
    if isinstance(item, np.void):
        return item.copy()
    if isinstance(item, View):
        return [_own_arrays(x) for x in item]
    if isinstance(item, (tuple, list, dict)):
        from ..nested import flatten, rebuild

        arrays: list = []
        skeleton = flatten(item, arrays, is_leaf=lambda x: isinstance(x, (np.ndarray, np.void, View)))
        if arrays:  # else the item itself, as a list's slice assignment keeps the same objects
            return rebuild(skeleton, [_own_arrays(a) for a in arrays])
    return item


UNREADABLE = object()  # an item whose value before an assignment could not be read

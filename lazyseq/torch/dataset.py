"""Views as torch Datasets and back: ``as_dataset``, ``from_dataset`` and the ``collate`` that goes with them.

``DataLoader`` asks a map-style dataset for a whole batch of indices at once
through ``__getitems__`` when it has one, and hands what it returns to
``collate_fn``. A view's dataset answers with a :class:`LazyBatch`: to
:func:`collate` it is one stacked batch, read with one vectorized gather; to
torch's ``default_collate`` it is the list of samples it expects.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast, overload

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset, default_collate

from ..views.base import View
from ..views.chunks import default_collate as stack_items
from ..views.collate import collate as lazyseq_collate
from ..views.itemtypes import SequenceLike, T, T_co
from ..views.sources import as_view
from .tensors import to_tensors

__all__ = ["LazyBatch", "ViewDataset", "as_dataset", "collate", "from_dataset"]


_UNREAD = object()


class LazyBatch(list[Any]):
    """The samples at some indices of a view, for a ``collate_fn``: as a list of samples, or as one stacked batch.

    ``value`` is the batch as ``view.batch`` builds it (arrays stacked,
    tuples and dicts collated field by field): that is what :func:`collate`
    uses. As a list, item ``k`` is the sample ``view[indices[k]]``: that is
    what torch's ``default_collate`` reads (and may hand back as it is, for
    strings). Either is read with one vectorized gather, the first time it
    is asked for, and then kept. Code that reads a list's storage directly,
    without a Python call first (torch's functions that take a list of
    tensors, ``torch.stack(batch)``; ``array.array``), finds it empty until
    then: where the items are tensors (``read_now``, or a ``value`` read
    already: what :class:`ViewDataset` decides from its first batch), the
    samples are read at once (the rows of the stacked tensor). Its repr
    reads them (or says how many there are, if one fails to read). It pickles as the plain list of its samples, without the
    view.

    >>> import numpy as np, lazyseq
    >>> from lazyseq.torch.dataset import LazyBatch
    >>> batch = LazyBatch(lazyseq.view(np.arange(12).reshape(6, 2)), [4, 1])
    >>> batch.value.tolist(), len(batch), batch[1].tolist()
    ([[8, 9], [2, 3]], 2, [2, 3])
    """

    __slots__ = ("_view", "_indices", "_value", "_read")

    def __init__(
        self,
        view: View[Any],
        indices: list[int] | np.ndarray,
        *,
        read_now: bool = False,
        value: Any = _UNREAD,
        stacks: bool = True,
    ) -> None:
        super().__init__()
        self._view = view
        self._indices = indices
        self._value: Any = value
        self._read = False  # the samples, in the list itself (where torch's C code reads a list)
        if isinstance(value, torch.Tensor):  # items that are tensors, stacked: its rows are the samples
            list.extend(self, value.unbind(0))
            self._read = True
        elif read_now:  # read once, and stacked from the samples where they stack (tensors of one shape)
            self._samples()
            if stacks and value is _UNREAD and len(self):
                with contextlib.suppress(ValueError, TypeError):  # of several shapes: they stay samples
                    self._value = stack_items(list(list.__iter__(self)))

    @property
    def value(self) -> Any:
        """The samples as one batch (read once)."""
        if self._value is _UNREAD:
            self._value = _stacked(self._view, self._indices)
        return self._value

    def _samples(self) -> None:
        if not self._read:
            count = len(self._indices)
            list.extend(self, self._view[self._indices].batch(count, collate_fn=list)[0] if count else [])
            self._read = True

    def __len__(self) -> int:
        return list.__len__(self) if self._read else len(self._indices)

    def __radd__(self, other: Any) -> Any:  # [1] + batch: Python asks a subclass first
        self._samples()
        return other + list(list.__iter__(self)) if isinstance(other, list) else NotImplemented

    __hash__ = None  # a list

    def __reduce__(self) -> tuple[Any, ...]:
        self._samples()
        return (list, (list(list.__iter__(self)),))

    def __repr__(self) -> str:
        try:
            self._samples()
        except Exception:  # an item that fails to read: a repr (a debugger's, a log's) says what it is, not why
            return f"LazyBatch({len(self._indices)} samples)"
        return list.__repr__(self)


def _reading_first(name: str) -> Any:
    """``list.<name>``, called once the samples are in the list."""
    method = getattr(list, name)

    def call(self: LazyBatch, *args: Any) -> Any:
        self._samples()
        return method(self, *args)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = method.__doc__
    return call


# Every list method reads the list itself (C code), which holds the samples only once read.
for _name in (
    *("__getitem__", "__iter__", "__reversed__", "__contains__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__"),
    *("__ge__", "__add__", "__mul__", "__rmul__", "__iadd__", "__imul__", "__setitem__", "__delitem__", "append"),
    *("extend", "insert", "pop", "remove", "clear", "index", "count", "copy", "sort", "reverse"),
):
    setattr(LazyBatch, _name, _reading_first(_name))


def _stacked(view: View, indices: Any) -> Any:
    """The items of ``view`` at ``indices`` (a list, an array, a slice, a mask) as one batch."""
    selected = view[indices]
    count = len(selected)
    return selected.batch(count)[0] if count else []


class ViewDataset(Dataset[T_co]):
    """A map-style torch Dataset over a lazyseq view (see :func:`as_dataset`).

    >>> import numpy as np, lazyseq
    >>> from lazyseq.torch import ViewDataset
    >>> dataset = ViewDataset(lazyseq.view(np.arange(12).reshape(6, 2)))
    >>> len(dataset), dataset[5].tolist(), dataset[[0, 2]].tolist()
    (6, [10, 11], [[0, 1], [4, 5]])
    """

    def __init__(self, view: View[T_co]) -> None:
        self.view: View[T_co] = view
        self._len = view._need_length("as_dataset()")
        self._tensor_items: bool | None = None  # whether items are tensors: known from the first batch read
        self._stacks = True  # whether they stack into one tensor (not of several shapes): known from it too

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int | np.integer[Any]) -> T_co: ...

    @overload
    def __getitem__(self, index: slice | list[int] | np.ndarray) -> Any: ...

    def __getitem__(self, index: Any) -> Any:
        """``view[index]`` for an integer; for a list, array or slice of indices, their items as one stacked batch."""
        if isinstance(index, slice) or np.ndim(index) > 0:
            return _stacked(self.view, index)
        return self.view[index]

    def __getitems__(self, indices: list[int]) -> LazyBatch:
        """The samples at ``indices``, for ``collate_fn`` (see :class:`LazyBatch`)."""
        if self._tensor_items is None and len(indices):  # the first batch says what the items are
            try:
                value = _stacked(self.view, indices)
            except Exception:  # items that do not stack (of several shapes), or one that failed to read
                batch = LazyBatch(self.view, indices)
                batch._samples()  # read one by one: an item's error is raised here, and decides nothing
                samples = list(list.__iter__(batch))
                self._tensor_items = all(isinstance(sample, torch.Tensor) for sample in samples)
                self._stacks = not self._tensor_items or len({sample.shape for sample in samples}) == 1
                return batch
            self._tensor_items = isinstance(value, torch.Tensor)
            return LazyBatch(self.view, indices, value=value)
        return LazyBatch(self.view, indices, read_now=bool(self._tensor_items), stacks=self._stacks)

    def __repr__(self) -> str:
        return f"as_dataset(\n{self.view!r}\n)"


@overload
def as_dataset(view: np.ndarray) -> ViewDataset[np.ndarray]: ...


@overload
def as_dataset(view: SequenceLike[T]) -> ViewDataset[T]: ...


def as_dataset(view: SequenceLike[Any] | np.ndarray) -> ViewDataset[Any]:
    """A map-style ``torch.utils.data.Dataset`` over a view (or any sequence or array).

    ``dataset[i]`` is ``view[i]``, unchanged. ``DataLoader`` asks for a
    batch of indices at once (``dataset.__getitems__``); with
    ``collate_fn=lazyseq.torch.collate`` the batch is gathered and stacked
    by one vectorized read (one numpy call per array over memory maps) and
    turned into tensors as it is, instead of one call per sample. Torch's
    default collation works too: it reads the samples one by one, as from
    any dataset, and gives the same values (as lists where lazyseq's
    batches are tuples; it refuses arrays not in the machine's byte order,
    which ``lazyseq.torch.collate`` converts). ``dataset[indices]`` with a list or array of
    indices is one stacked batch, for a loader with ``batch_size=None``
    and a ``BatchSampler`` as its sampler. The dataset pickles as its view,
    so ``num_workers > 0`` works wherever the view pickles (memory maps
    travel as file names).

    >>> import numpy as np
    >>> import lazyseq
    >>> from torch.utils.data import DataLoader
    >>> from lazyseq.torch import as_dataset, collate
    >>> samples = lazyseq.collate([np.arange(10.0).reshape(5, 2), np.arange(5)])
    >>> loader = DataLoader(as_dataset(samples), batch_size=2, collate_fn=collate)
    >>> x, y = next(iter(loader))
    >>> x
    tensor([[0., 1.],
            [2., 3.]], dtype=torch.float64)
    >>> y
    tensor([0, 1])
    """
    return ViewDataset(as_view(view))


def collate(batch: Any) -> Any:
    """``collate_fn`` for a ``DataLoader`` over :func:`as_dataset`: the stacked batch as tensors, without restacking.

    A :class:`LazyBatch` (what a view's dataset returns for a batch of
    indices) becomes its batch with every array turned into a tensor that
    shares its memory (see :func:`~lazyseq.torch.to_tensors`); structure is
    kept, tuples stay tuples, and items (or fields) that are tensors are
    stacked, as ``view.batch`` stacks them. A list (the samples of
    another dataset) goes to torch's ``default_collate``. Anything else is
    a batch already (``dataset[indices]``, which a loader with
    ``batch_size=None`` and a ``BatchSampler`` hands over) or a single
    sample (the same loader with a plain sampler): its arrays become tensors,
    as :func:`~lazyseq.torch.to_tensors` makes them, and nothing is stacked again.

    >>> import numpy as np
    >>> import lazyseq
    >>> from lazyseq.torch import as_dataset, collate
    >>> dataset = as_dataset(lazyseq.collate([np.eye(3), ["a", "b", "c"]]))
    >>> collate(dataset.__getitems__([2, 0]))
    (tensor([[0., 0., 1.],
            [1., 0., 0.]], dtype=torch.float64), ['c', 'a'])
    >>> collate([(1, 2.0), (3, 4.0)])  # samples: torch's default_collate
    [tensor([1, 3]), tensor([2., 4.], dtype=torch.float64)]
    >>> collate(dataset[[2, 0]])  # a batch already
    (tensor([[0., 0., 1.],
            [1., 0., 0.]], dtype=torch.float64), ['c', 'a'])
    """
    if isinstance(batch, LazyBatch):
        return to_tensors(batch.value)
    if isinstance(batch, list):
        return default_collate(batch)
    return to_tensors(batch)


def from_dataset(dataset: Dataset[T]) -> View[T]:
    """A lazy view of a map-style torch Dataset: item ``i`` is ``dataset[i]``.

    Batches, gathers and the other combinators that read several items at
    once ask the dataset through its ``__getitems__`` when it has one (one
    call for the whole batch), else item by item. Items are what the
    dataset returns: tensors stay tensors, and a batch stacks tensor items
    (or fields) into one tensor, as torch's ``default_collate`` does; a
    ``TensorDataset`` is viewed as the collation of its tensors' rows, read
    with one indexing call per tensor for a batch. A
    dataset made by :func:`as_dataset` gives back its
    view. An ``IterableDataset`` has no random access: wrap it with
    ``lazyseq.uniter`` instead.

    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> from lazyseq.torch import from_dataset
    >>> pairs = from_dataset(TensorDataset(torch.arange(6.0), torch.arange(6) % 2))
    >>> pairs[4]
    (tensor(4.), tensor(0))
    >>> pairs[::2].batch(3)[0]
    (tensor([0., 2., 4.]), tensor([0, 0, 0]))
    """
    if isinstance(dataset, ViewDataset):
        return dataset.view
    if type(dataset) is TensorDataset:  # its tensors' rows, side by side: batches read with one call per tensor
        return cast("View[T]", lazyseq_collate(list(dataset.tensors)))
    if isinstance(dataset, IterableDataset):
        raise TypeError(
            f"from_dataset: {type(dataset).__name__} is an IterableDataset, which has no random access; "
            "use lazyseq.uniter(dataset) to view it"
        )
    return as_view(cast("SequenceLike[T]", dataset))  # map-style: as_view checks that it has a length

"""What a batch holds for scikit-learn: ``(X, y)``, ``(X, y, sample_weight)`` or ``X`` alone."""

from __future__ import annotations

import contextlib
import numbers
import sys
from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any

import numpy as np

from ..evaluate import EMPTY_SHARD
from ..sparse import is_sparse
from ..views.chunks import default_collate, is_tensor
from ..views.sources import sized_view

__all__ = ["ITEM_SHAPES", "FeatureLayout", "ItemReading", "fields", "rows_explained", "rows_of"]

ITEM_SHAPES = "(X, y), (X, y, sample_weight) or X alone"


def fields(batch: Any, where: str, layout: FeatureLayout | None = None) -> tuple[Any, Any, Any]:
    """``(X, y, sample_weight)`` of a batch, ``None`` for what it does not hold (X read as ``layout`` says)."""
    if _tensor_rows(batch):  # tensor items, batched: X alone
        return rows_of(batch), None, None
    if isinstance(batch, (tuple, list)):
        layout = layout if layout is not None else FeatureLayout()
        if len(batch) == 2:
            y = rows_of(batch[1])
            return layout.features(batch[0], y, where), y, None
        if len(batch) == 3:
            y = rows_of(batch[1])
            return layout.features(batch[0], y, where), y, rows_of(batch[2])
        raise ValueError(f"{where} is a {type(batch).__name__} of {len(batch)} items; it must be {ITEM_SHAPES}")
    if batch is None or isinstance(batch, (Mapping, str, bytes, numbers.Number)) or getattr(batch, "ndim", None) == 0:
        raise TypeError(f"{where} is of type {type(batch).__name__}; it must be {ITEM_SHAPES}")
    return rows_of(batch), None, None


@contextlib.contextmanager
def rows_explained(X: Any) -> Iterator[None]:
    """Where scikit-learn refuses ``X`` for holding one value per item (not 2-D), say why (a note).

    >>> import numpy as np
    >>> try:
    ...     with rows_explained(np.array([1.0, 2.0])):
    ...         raise ValueError("Expected 2D array, got 1D array instead")
    ... except ValueError as error:
    ...     print(error.__notes__[0])  # doctest: +ELLIPSIS
    X holds one value per item (shape (2,)): an item is a row of X (an array or a list of its features), ...
    """
    try:
        yield
    except ValueError as error:  # scikit-learn's refusal of a 1-D X (others take one: IsotonicRegression)
        if getattr(X, "ndim", None) == 1 and "Expected 2D array" in str(error):
            error.add_note(
                f"X holds one value per item (shape {tuple(X.shape)}): an item is a row of X (an array or a list of its "
                "features), or a tuple (X, y, ...) whose X is a row, so a tuple of numbers is read as (X, y, ...); "
                "one feature makes rows of one value (x[:, None])"
            )
        raise


class FeatureLayout:
    """Whether an X that is a list of 1-D arrays or tensors holds its rows or its columns: decided once, then kept.

    A batch collates items that are lists position by position (lazyseq's
    ``batch`` and torch's ``default_collate`` alike): X given as a Python
    list of 5 numbers becomes a list of 5 arrays, one per feature, which
    scikit-learn would read as 5 rows; a list of tensor items (a batch made
    with ``collate_fn=list``) is a list of rows, where their number is not
    the targets'. The first batch that has such an X says which, by the
    targets' length (one call of ``fit``, ``score`` or ``predict`` reads
    its batches one way: a short last batch, as many rows as features, is
    read as the others were).

    >>> import numpy as np
    >>> layout = FeatureLayout()
    >>> layout.features([np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])], np.arange(3), "batch 0").tolist()
    [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]
    >>> layout.features([np.array([7.0, 8.0]), np.array([9.0, 0.0])], np.arange(2), "batch 1").tolist()  # as before
    [[7.0, 9.0], [8.0, 0.0]]
    """

    def __init__(self) -> None:
        self.columns: bool | None = None

    def features(self, X: Any, y: Any, where: str) -> Any:
        """``rows_of(X)``, or its columns stacked."""
        if type(X) is not list or not X or not all(_is_vector(x) for x in X):
            return rows_of(X)
        if self.columns is None:
            self.columns = _holds_columns(X, y, where)
        if not self.columns:
            return rows_of(X)
        return np.column_stack([x if isinstance(x, np.ndarray) else x.numpy(force=True) for x in X])


class ItemReading:
    """How ``predict`` and ``score`` read the items of ``data``: told from its first item, as scikit-learn reads rows.

    An item is ``(X, y)`` or ``(X, y, sample_weight)`` if it is a tuple (or
    a list whose first entry is not a value a row of X holds: an array, say),
    and a row of X otherwise: an array, a tensor, a text, a dict of
    features, a list of values. An X that is no array reaches the estimator
    as the list of the batch's X, as ``estimator.predict(docs)`` would take
    them (a batch would collate dicts and lists field by field); arrays,
    tensors and numbers are stacked. Where the pipeline says what its items
    are without reading one (arrays, and tuples or dicts of them), batches
    are made as usual (``collate`` is None); otherwise the first batch's
    items tell, and no item is read twice (a pipeline over a one-shot
    iterable reads each once).

    >>> import numpy as np
    >>> texts = ItemReading.of(["good film", "bad plot", "good plot"], "predict")
    >>> texts.collate(["good film", "bad plot"]), texts.x_alone
    (['good film', 'bad plot'], True)
    >>> pairs = ItemReading.of([({"a": 1.0}, 0), ({"b": 2.0}, 1)], "score")
    >>> pairs.collate([({"a": 1.0}, 0), ({"b": 2.0}, 1)]), pairs.x_alone
    (([{'a': 1.0}, {'b': 2.0}], array([0, 1])), False)
    >>> rows = ItemReading.of(np.zeros((3, 2)), "predict")  # arrays: batched as usual
    >>> rows.collate is None, rows.x_alone
    (True, True)
    """

    def __init__(self, spec: tuple[Any, ...] | None = None, caller: str = "lazyseq.sklearn") -> None:
        self._caller = caller
        self.layout = FeatureLayout()  # the batches of one call are read one way
        self._python_rows = False
        self._told = False  # whether the items were seen (a first batch made)
        self.x_alone = True  # items are rows of X, not (X, y, ...)
        self.collate: Callable[[list[Any]], Any] | None = self._collate
        if spec is not None:
            self.x_alone = spec[0] != "tuple"
            x_spec = spec if self.x_alone else spec[1][0]
            if x_spec is not None and x_spec[0] == "array":
                self.collate = None

    @classmethod
    def of(cls, data: Any, caller: str) -> ItemReading:
        """The reading of ``data``'s items (told from its first batch unless known); a ValueError if it has none."""
        items = sized_view(data, f"{caller}: data")
        if items._need_length(f"{caller}()") == 0:
            raise ValueError(f"{caller}: data is empty, so there is nothing to {caller}; {EMPTY_SHARD}")
        return cls(spec=items._item_spec(), caller=caller)

    def fields(self, batch: Any, where: str) -> tuple[Any, Any, Any]:
        """``(X, y, sample_weight)`` of a batch, ``None`` for what it does not hold."""
        if self.x_alone:
            return rows_of(batch), None, None
        return fields(batch, where, self.layout)

    def features(self, batch: Any, where: str) -> Any:
        """X of a batch: the batch itself, or its first field (of however many)."""
        if self.x_alone:
            return rows_of(batch)
        return self.layout.features(batch[0], batch[1] if len(batch) > 1 else None, where)

    def _collate(self, items: list[Any]) -> Any:
        """A batch whose X is the list of the items' X if they are no arrays; arrays and numbers stacked.

        The first item of the first batch tells how every item is read.
        """
        if not self._told:
            first = items[0]
            self.x_alone = not (isinstance(first, tuple) or type(first) is list and first and not _is_value(first[0]))
            x = first[0] if not self.x_alone and len(first) else first
            if is_sparse(x):  # (scikit-learn would be given a list of them, and say it wants a 2-D array)
                raise TypeError(
                    f"{self._caller}: the items' X are sparse rows ({type(x).__name__}), and items are read as dense "
                    "rows: make each item's X dense (row.toarray()[0]), or call the estimator on the sparse matrix "
                    "itself"
                )
            self._python_rows = not _array_like(x)
            self._told = True
        if not self._python_rows:
            return default_collate(items)
        if self.x_alone:
            return list(items)
        columns = list(zip(*items, strict=True))
        return (list(columns[0]), *(default_collate(list(column)) for column in columns[1:]))


def _is_value(x: Any) -> bool:
    """Whether ``x`` is what a row of X holds: a number, a string, ``None``."""
    return x is None or isinstance(x, (str, bytes, numbers.Number, np.generic)) or getattr(x, "ndim", None) == 0


def _array_like(x: Any) -> bool:
    """Whether ``x`` is an array, a tensor or a number: stacked into X, rather than listed as it is."""
    if isinstance(x, (str, bytes, Mapping, list, tuple)):
        return False
    return isinstance(x, (np.ndarray, np.generic, numbers.Number)) or hasattr(x, "__array__")


def _holds_columns(X: list, y: Any, where: str) -> bool:
    """Whether ``X``, a list of 1-D arrays or tensors, holds columns, told by the targets' length."""
    rows = len(y) if isinstance(y, Sized) else None
    if rows is None or any(len(x) != rows for x in X):  # rows (or what scikit-learn will refuse)
        return False
    if len(X) != rows:
        return True
    kind = "arrays" if isinstance(X[0], np.ndarray) else "tensors"
    raise ValueError(
        f"{where}: X is a list of {rows} {kind} of {rows} values, as many as the targets: the columns of items "
        "whose X is a list (a batch collates them position by position), or rows; make X one array (each "
        "item's X a numpy array, or np.stack the rows)"
    )


def _is_vector(x: Any) -> bool:
    """Whether ``x`` is a 1-D numpy array or torch tensor."""
    return (isinstance(x, np.ndarray) or is_tensor(x)) and x.ndim == 1


def _tensor_rows(batch: Any) -> bool:
    """Whether ``batch`` is a list of tensor items, rows of X (``collate_fn=list`` makes one), rather than of fields.

    The rows are tensors of one shape, each a row of X (at most one
    dimension); fields are a 2-D X and its targets (and weights).
    """
    if not _tensors(batch):
        return False
    shape = batch[0].shape
    return len(shape) <= 1 and all(x.shape == shape for x in batch)


def rows_of(field: Any) -> Any:
    """``field``, or as a numpy array if it is a torch tensor (on any device, with a gradient or not) or lists them.

    A list of tensors is what tensor items or fields batched with
    ``collate_fn=list`` are.

    >>> import numpy as np
    >>> rows_of([np.zeros(2), np.ones(2)])  # not tensors: as it is
    [array([0., 0.]), array([1., 1.])]
    """
    if _tensors(field):
        return sys.modules["torch"].stack(field).numpy(force=True)
    if is_tensor(field):  # (what scikit-learn's np.asarray refuses: one on a GPU, or with a gradient)
        return field.numpy(force=True)
    return field


def _tensors(values: Any) -> bool:
    """Whether ``values`` is a non-empty list of torch tensors (only where torch was imported)."""
    return type(values) is list and bool(values) and all(map(is_tensor, values))

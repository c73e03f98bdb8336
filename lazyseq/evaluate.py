"""Chunked evaluation: run a model over a view in batches and concatenate what it returns.

Memory stays bounded by one batch of inputs (plus the outputs, which can go
straight to a ``.npy`` file on disk), however large the view is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .arguments import function, integer
from .loading.buffering import BATCHES_AHEAD, Buffering
from .loading.failures import WorkerDied
from .loading.options import LoaderOptions, Method
from .nested import describe, flatten, in_order_of, leaf_paths, rebuild, skeleton_key
from .output_arrays import Output, check_distinct, check_out, match_out, new_output
from .progress import progress_bar
from .sparse import is_sparse, stack_rows
from .views.itemtypes import SequenceLike
from .views.sources import sized_view

if TYPE_CHECKING:
    from .loading.prefetch import PrefetchView

__all__ = ["EMPTY_SHARD", "evaluate"]

EMPTY_SHARD = "a shard (lazyseq.shard) of fewer items than ranks is empty: skip the call where len(data) == 0"


def evaluate(
    fn: Callable[[Any], Any],
    data: SequenceLike[Any],
    batch_size: int = 64,
    *,
    out: Any = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    nworkers: int = 0,
    method: Method = "thread",
    max_buffered: int | None = None,
    progress: bool | None = None,
    description: str = "evaluate",
) -> Any:
    """Call ``fn`` on ``data`` in batches of ``batch_size`` and concatenate its results along the first axis.

    ``fn`` gets each batch as :func:`~lazyseq.batch` builds it (for items
    ``(x, y)``, a tuple of two stacked arrays; ``collate_fn`` as there: it
    receives the list of a batch's items instead) and returns an array with
    one row per item, or a tuple, list, namedtuple or dict of such arrays
    (torch tensors and other array-likes are converted to numpy, bfloat16
    tensors to float32; a masked array is refused, its mask would be lost; a
    dict may give its keys in any order). A SciPy sparse matrix (or array)
    as the whole of ``fn``'s result is gathered into one, stacked in the
    first batch's format (with ``out=None``: ``out`` holds dense rows). A list is read like a tuple, as
    several results: a list with a value per item is one result once made
    ``np.asarray(...)`` in ``fn``. The result has the
    same structure, each array with ``len(data)`` rows; its containers are
    rebuilt by the rule of :mod:`lazyseq.nested` (an ``OrderedDict`` stays
    one, another mapping becomes a dict). Only one batch of inputs is in
    memory at a time, so ``data`` can be far larger than memory: with
    ``nworkers`` background workers (``method``, see :func:`~lazyseq.prefetch`),
    ``max_buffered`` batches more are computed ahead (``None``: 4, and with
    ``method="ray"`` room for three runs of batches per worker, each run
    about 50 ms of work: for batches of 50 ms or more, ``3 * nworkers``).

    ``out`` receives the rows instead of new arrays: an array (or memory map)
    of the right shape, the path of a ``.npy`` file to create (the result is
    then a memory map of it; the file is written under a hidden name beside
    the path and takes the path once every batch is in, so a call that fails
    leaves what was there before, and the next call to that path removes what
    a process killed mid-way left; its room on the disk is claimed as it is
    made: a disk without it is an ``OSError``), or a tuple or dict of those matching what
    ``fn`` returns. Before ``fn`` runs, a read-only array is refused, and so
    is a path in a directory that is missing or that this process may not
    write in, or of a file it may not read and write (a read-only file is
    not replaced, except by root, whom file modes do not stop). A ``.npy`` file cannot hold Python objects (an array of
    dtype object): return those in memory. Arrays that evaluate makes (in
    memory, or a file at a path) take the dtype of the first batch and widen
    when a later one needs it (longer strings, floats after integers: a file
    is then written anew),
    but never into another kind of value (numbers into strings: a
    ``TypeError``; nor int64 results mixed with uint64 ones, which only
    floats would hold), nor where a value would change (an
    integer beyond 2**53 made a float64); an array you give keeps its dtype,
    takes casts of the same kind (float64 results into float32), and refuses
    results that would not survive them (a string cut short, an integer out
    of range or rounded, a number too large for its floats) with a ``TypeError`` naming
    the batch and the output. Every output of a batch is checked before any
    is written: when a batch fails, the arrays you gave hold the rows of the
    batches before it and none of its own. Two
    outputs may not be the same file or share memory. An exception raised by
    ``fn`` is raised as it is, with a note naming the batch and its items,
    except ``StopIteration``, which would silently end a loop around the
    call: it becomes a ``RuntimeError`` (as in a generator); a worker process
    that dies raises :class:`~lazyseq.WorkerDied` naming the batch it was
    computing (its ``suspects`` are batch numbers), with a note giving its
    items. To split the work across processes or machines, give
    each one ``lazyseq.shard(data, rank, world_size)``: every item is
    evaluated exactly once. ``progress`` shows a bar (see
    :mod:`lazyseq.progress`) labelled ``description``, which also names
    where an exception from ``fn`` was raised. Empty ``data`` is a
    ``ValueError``: there is no first batch to take the results' form from
    (a rank whose shard is empty skips the call).

    >>> import numpy as np
    >>> import lazyseq
    >>> x = lazyseq.view(np.arange(10.0))
    >>> y = lazyseq.view(np.arange(10) % 2)
    >>> test = lazyseq.collate([x, y])
    >>> predictions, targets = lazyseq.evaluate(lambda b: (b[0] > 4, b[1]), test, batch_size=4)
    >>> predictions
    array([False, False, False, False, False,  True,  True,  True,  True,  True])
    >>> targets
    array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1])
    >>> lazyseq.evaluate(lambda b: np.array([len(w) for w in b]), ["a", "bb", "ccc"], collate_fn=list)
    array([1, 2, 3])
    """
    function(fn, "evaluate: fn", "the function comes first: evaluate(fn, sequence)")
    if collate_fn is not None:
        function(collate_fn, "evaluate: collate_fn")
    batch_size = integer(batch_size, "evaluate: batch_size", low=1)
    options = LoaderOptions.check("evaluate", nworkers, method)  # checked whether workers are asked for or not
    ahead = Buffering.resolve(max_buffered, options, BATCHES_AHEAD)
    items = sized_view(data, "evaluate: data")
    n = items._need_length("evaluate()")
    if n == 0:
        raise ValueError(f"evaluate: data is empty, so there is nothing to call fn on; {EMPTY_SHARD}")
    batches = items.batch(batch_size, collate_fn=collate_fn)
    outputs = _Outputs(out, n)
    loader: PrefetchView[Any] | None = None
    if options.nworkers:
        from .loading.prefetch import PrefetchView  # here: the loading machinery only when used

        batches = loader = PrefetchView(batches, options, ahead, shm_size=0, task_name="batch")
    try:
        with progress_bar(len(batches), description, progress) as bar:
            reader = iter(batches)
            start = 0
            for k in range(len(batches)):
                rows = min(batch_size, n - start)
                try:
                    batch = next(reader)
                except WorkerDied as error:  # it names the batch (its task): which items those are
                    for suspect in error.suspects:
                        if isinstance(suspect, int):
                            error.add_note(f"computing {_batch_and_items(suspect, batch_size, n)} in {description}")
                    raise
                try:
                    result = fn(batch)
                except StopIteration as error:  # as it is, it would end the caller's loop (map, a generator) silently
                    raise RuntimeError(
                        f"evaluate: fn raised StopIteration on {_batch_and_items(k, batch_size, n)} in {description}"
                    ) from error
                except Exception as error:  # raised as it is, with where it happened
                    error.add_note(f"raised on {_batch_and_items(k, batch_size, n)} in {description}")
                    raise
                outputs.write(result, start, rows, k)
                del result
                del batch  # a batch from a shared slot can be reused as soon as it is dropped
                start += rows
                bar.update()
    except BaseException:  # no file at an out path: what was there before stays
        outputs.discard()
        raise
    finally:
        if loader is not None:
            loader.close()
    return outputs.result()


def _batch_and_items(k: int, batch_size: int, total: int) -> str:
    """``batch 9 (items 144 to 159)``."""
    start = k * batch_size
    return f"batch {k} (items {start} to {min(start + batch_size, total) - 1})"


class _Outputs:
    """Where the rows that ``fn`` returns go: arrays of ``total`` rows, created at the first batch."""

    def __init__(self, out: Any, total: int) -> None:
        check_out(out)  # before fn runs on a first batch, which may take long
        self.out = out
        self.total = total
        self.skeleton: tuple | None = None
        self.row_shapes: tuple | None = None  # what every batch's results must match, from the first
        self.outputs: list[Output] = []
        # results that are one array: a batch of the first one's shape and of the output's dtype is copied unchecked
        self.lone: Output | None = None
        self.lone_shape: tuple[int, ...] = ()
        self.sparse: list | None = None  # results that are one sparse matrix: each batch's, stacked at the end

    def write(self, result: Any, start: int, rows: int, batch_index: int) -> None:
        if self.sparse is not None or (self.skeleton is None and is_sparse(result)):
            self._write_sparse(result, rows, batch_index)
            return
        lone = self.lone
        if (
            lone is not None
            and type(result) is np.ndarray
            and result.shape == self.lone_shape
            and rows == self.lone_shape[0]
            and result.dtype == lone.array.dtype
        ):  # the common case, a plain array like the batch before: nothing to convert, check or widen
            lone.array[start : start + rows] = result
            return
        leaves: list = []
        if self.skeleton is not None:  # dicts with the same keys in another order are the same results
            result = in_order_of(self.skeleton, result)
        skeleton = flatten(result, leaves, is_leaf=_anything)
        try:
            leaves = [_rows_of(leaf, rows, batch_index) for leaf in leaves]
        except (TypeError, ValueError):
            listed = _per_item_list(result, rows)
            if listed is None:
                raise
            raise TypeError(
                f"evaluate: fn returned {listed} for batch {batch_index} of {rows} items, but a list is read like a "
                "tuple, as several results, each with one row per item: return np.asarray(...) of the list to make "
                "it one result"
            ) from None
        row_shapes = skeleton_key(skeleton, [leaf.shape[1:] for leaf in leaves])
        if self.skeleton is None:
            self._create(skeleton, row_shapes, leaves, batch_index)
        elif row_shapes != self.row_shapes:
            now, before = _describe(skeleton, leaves), _describe(self.skeleton, [o.array for o in self.outputs])
            raise ValueError(
                f"evaluate: fn returned {now} for batch {batch_index}, but {before} before: the structure and row "
                "shapes must not change"
                + (
                    " (namedtuples of two classes of one name: define the class once, outside fn)"
                    if now == before
                    else ""
                )
            )
        # every output checked (and widened) before any is written: a batch refused writes none of its rows
        targets = [output.array_for(leaf, start, batch_index) for output, leaf in zip(self.outputs, leaves)]
        for target, leaf in zip(targets, leaves):
            target[start : start + rows] = leaf

    def _write_sparse(self, result: Any, rows: int, batch_index: int) -> None:
        """Keep a batch's results, a sparse matrix (as the first batch's were), for the stack at the end."""
        if self.out is not None:
            raise TypeError(
                f"evaluate: fn returned a sparse {type(result).__name__} for batch {batch_index}, but out= holds "
                "dense rows: with out=None its results are stacked into one sparse matrix"
            )
        first = self.sparse[0] if self.sparse else None
        if first is not None and (type(result) is not type(first) or result.dtype != first.dtype):
            raise TypeError(
                f"evaluate: fn returned {_kind_of(result)} for batch {batch_index}, but {_kind_of(first)} results "
                "before: return one kind of result, of one dtype (stacked, others would be converted)"
            )
        if result.ndim != 2 or result.shape[0] != rows or (first is not None and result.shape[1] != first.shape[1]):
            expected = f"({rows}, {first.shape[1]})" if first is not None else f"({rows}, columns)"
            raise ValueError(
                f"evaluate: fn returned a sparse {type(result).__name__} of shape {result.shape} for batch "
                f"{batch_index}, where {expected} was expected: a row per item, as many columns in every batch"
            )
        if self.sparse is None:
            self.sparse = []
        self.sparse.append(result)

    def _create(self, skeleton: tuple, row_shapes: tuple, leaves: list[np.ndarray], batch_index: int) -> None:
        """The outputs, from the first batch's results: ``out``'s, or new arrays (or files) like them."""
        self.skeleton, self.row_shapes = skeleton, row_shapes
        targets = match_out(self.out, skeleton, len(leaves))
        check_distinct(targets)
        for leaf, target, key in zip(leaves, targets, leaf_paths(skeleton)):
            self.outputs.append(new_output(target, leaf, self.total, batch_index, f" {key}" if key else ""))
        if skeleton == ("a", 0):
            self.lone, self.lone_shape = self.outputs[0], leaves[0].shape

    def result(self) -> Any:
        if self.sparse is not None:
            parts, self.sparse = self.sparse, None
            return stack_rows(parts)
        assert self.skeleton is not None, "no batch was written"
        for output in self.outputs:
            output.flush()
        try:
            for output in self.outputs:
                output.complete()
        except BaseException:  # the files not renamed yet are removed; those renamed are complete
            self.discard()
            raise
        return rebuild(self.skeleton, [output.array for output in self.outputs])

    def discard(self) -> None:
        """After a failure: the files made for out paths are removed (their paths keep what they held)."""
        for output in self.outputs:
            output.discard()
        self.outputs.clear()
        self.lone = None
        self.sparse = None


def _kind_of(value: Any) -> str:
    """``a sparse csr_matrix of int64``, for messages."""
    if is_sparse(value):
        return f"a sparse {type(value).__name__} of {value.dtype}"
    return type(value).__name__


def _anything(value: Any) -> bool:
    """Every part of fn's results that is not a container is a leaf: :func:`_rows_of` says if it may be."""
    return True


def _rows_of(value: Any, rows: int, batch_index: int) -> np.ndarray:
    """``value`` as a numpy array of ``rows`` rows: tensors (anything with ``detach``) and array-likes are converted."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensors, without importing torch
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":  # numpy has no bfloat16: float32 holds every value
            value = value.float()
        value = value.resolve_conj().resolve_neg().numpy()  # lazy conjugates and negations made real first
    elif isinstance(value, np.ma.MaskedArray):
        raise TypeError(
            f"evaluate: fn returned a masked array for batch {batch_index}, whose mask would be lost in the "
            "output: return np.ma.filled(...) and the mask (np.ma.getmaskarray) as two results"
        )
    elif is_sparse(value):  # (a lone sparse result is gathered as one: see _Outputs.write)
        raise TypeError(
            f"evaluate: fn returned a sparse {type(value).__name__} for batch {batch_index} where evaluate gathers "
            "dense arrays (sparse results are stacked into one sparse matrix when they are the whole of fn's "
            "results, from the first batch on): return dense rows (.toarray()), or the sparse results alone"
        )
    elif isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        value = np.asarray(value)
    else:
        raise TypeError(
            f"evaluate: fn returned a {type(value).__name__} for batch {batch_index}: "
            "it must return arrays (or tuples, lists, dicts of arrays) with one row per item"
        )
    if value.ndim == 0 or len(value) != rows:
        raise ValueError(
            f"evaluate: fn returned an array of shape {value.shape} for batch {batch_index} of {rows} items: "
            "it must have one row per item"
        )
    return value


def _per_item_list(result: Any, rows: int) -> str | None:
    """The first list in ``result`` that looks like one value per item, described; a likely slip for one array.

    A list of numbers, of ``rows`` strings, or of ``rows`` arrays (or lists) of one shape.

    >>> _per_item_list((np.zeros(3), ["a", "b", "c"]), 3), _per_item_list([np.zeros(2), np.ones(2)], 2)
    ('a list of 3 str values', 'a list of 2 values of shape (2,)')
    >>> _per_item_list([np.zeros(2), np.ones(3)], 2) is None  # results of their own, of other lengths
    True
    """
    if isinstance(result, list) and result:
        if all(np.ndim(x) == 0 for x in result):
            if len(result) == rows or not any(isinstance(x, (str, bytes)) for x in result):
                return f"a list of {len(result)} {type(result[0]).__name__} values"
            return None  # a label or two, not one per item
        shapes = {_shape(x) for x in result}
        if len(result) == rows and len(shapes) == 1 and None not in shapes:
            return f"a list of {rows} values of shape {shapes.pop()}"
    children = result.values() if isinstance(result, Mapping) else result if isinstance(result, (tuple, list)) else ()
    for child in children:
        found = _per_item_list(child, rows)
        if found is not None:
            return found
    return None


def _shape(value: Any) -> tuple | None:
    """``np.shape(value)``, or ``None`` for a ragged list, which has none."""
    try:
        return tuple(np.shape(value))
    except ValueError:
        return None


def _describe(skeleton: tuple, arrays: list[np.ndarray]) -> str:
    return describe(skeleton, [f"rows of shape {a.shape[1:]}" for a in arrays])

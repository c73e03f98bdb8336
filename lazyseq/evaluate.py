"""Chunked evaluation: run a model over a view in batches and concatenate what it returns.

Memory stays bounded by one batch of inputs (plus the outputs, which can go
straight to a ``.npy`` file on disk), however large the view is.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .arguments import integer
from .casting import keeps_values, same_kind_of_value
from .io.shard_files import temporary_name
from .loading.buffering import BATCHES_AHEAD, Buffering
from .loading.options import LoaderOptions, Method
from .nested import describe, flatten, in_order_of, rebuild, skeleton_key
from .progress import progress_bar
from .views.itemtypes import SequenceLike
from .views.sources import as_view

if TYPE_CHECKING:
    from .loading.prefetch import PrefetchView

__all__ = ["evaluate"]

SHARED_MEMORY_WORK = 100_000  # steps np.shares_memory may take to tell whether two outputs overlap


def evaluate(
    fn: Callable[[Any], Any],
    data: SequenceLike[Any],
    batch_size: int = 64,
    *,
    out: Any = None,
    nworkers: int = 0,
    method: Method = "thread",
    max_buffered: int | None = None,
    progress: bool | None = None,
    description: str = "evaluate",
) -> Any:
    """Call ``fn`` on ``data`` in batches of ``batch_size`` and concatenate its results along the first axis.

    ``fn`` gets each batch as :func:`~lazyseq.batch` builds it (for items
    ``(x, y)``, a tuple of two stacked arrays) and returns an array with one
    row per item, or a tuple, list, namedtuple or dict of such arrays (torch
    tensors and other array-likes are converted to numpy, bfloat16 tensors to
    float32; a masked array is refused, its mask would be lost; a dict may
    give its keys in any order). The result has the
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
    leaves what was there before), or a tuple or dict of those matching what
    ``fn`` returns. Arrays that evaluate makes (in memory, or a file at a
    path) take the dtype of the first batch and widen when a later one needs
    it (longer strings, floats after integers: a file is then written anew),
    but never into another kind of value (numbers into strings, int64 and
    uint64 into floats: a ``TypeError``); an array you give keeps its dtype,
    takes casts of the same kind (float64 results into float32), and refuses
    results that would not survive them (a string cut short, an integer out
    of range, a number too large for its floats) with a ``TypeError``. Two
    outputs may not be the same file or share memory. An exception raised by
    ``fn`` is raised as it is, with a note naming the batch and its items,
    except ``StopIteration``, which would silently end a loop around the
    call: it becomes a ``RuntimeError`` (as in a generator). To split the work across processes or machines, give
    each one ``lazyseq.shard(data, rank, world_size)``: every item is
    evaluated exactly once. ``progress`` shows a bar (see
    :mod:`lazyseq.progress`) labelled ``description``, which also names
    where an exception from ``fn`` was raised. Empty ``data`` is a
    ``ValueError``: there is no first batch to take the results' form from.

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
    """
    if not callable(fn):
        raise TypeError(f"evaluate: fn must be callable, got {type(fn).__name__}")
    batch_size = integer(batch_size, "evaluate: batch_size", low=1)
    options = LoaderOptions.check("evaluate", nworkers, method)  # checked whether workers are asked for or not
    ahead = Buffering.resolve(max_buffered, options, BATCHES_AHEAD)
    items = as_view(data)
    n = items._need_length("evaluate()")
    if n == 0:
        raise ValueError("evaluate: data is empty, so there is nothing to call fn on")
    batches = items.batch(batch_size)
    outputs = _Outputs(out, n)
    start = 0
    loader: PrefetchView[Any] | None = None
    if options.nworkers:
        from .loading.prefetch import PrefetchView  # here: the loading machinery only when used

        batches = loader = PrefetchView(batches, options, ahead, shm_size=0)
    try:
        with progress_bar(len(batches), description, progress) as bar:
            for k, batch in enumerate(batches):
                rows = min(batch_size, n - start)
                try:
                    result = fn(batch)
                except StopIteration as error:  # as it is, it would end the caller's loop (map, a generator) silently
                    raise RuntimeError(
                        f"evaluate: fn raised StopIteration on batch {k} (items {start} to {start + rows - 1}) "
                        f"in {description}"
                    ) from error
                except Exception as error:  # raised as it is, with where it happened
                    error.add_note(f"raised on batch {k} (items {start} to {start + rows - 1}) in {description}")
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


class _Outputs:
    """Where the rows that ``fn`` returns go: arrays of ``total`` rows, created at the first batch."""

    def __init__(self, out: Any, total: int) -> None:
        _check_writable(out)  # before fn runs on a first batch, which may take long
        self.out = out
        self.total = total
        self.skeleton: tuple | None = None
        self.row_shapes: tuple | None = None  # what every batch's results must match, from the first
        self.arrays: list[np.ndarray] = []
        self.owned: list[bool] = []  # whether evaluate made the array (in memory or as a file): it may widen it
        self.paths: list[str | None] = []  # the file of an array evaluate made for a path: a hidden one until done
        self.finals: list[str | None] = []  # that path

    def write(self, result: Any, start: int, rows: int, batch_index: int) -> None:
        leaves: list = []
        if self.skeleton is not None:  # dicts with the same keys in another order are the same results
            result = in_order_of(self.skeleton, result)
        skeleton = flatten(result, leaves, is_leaf=_anything)
        try:
            leaves = [_rows_of(leaf, rows, batch_index) for leaf in leaves]
        except (TypeError, ValueError):
            numbers = _list_of_numbers(result)
            if numbers is None:
                raise
            raise TypeError(
                f"evaluate: fn returned a list of {len(numbers)} {type(numbers[0]).__name__} values for batch "
                f"{batch_index} of {rows} items, but a list is read like a tuple, as several results, each with one "
                "row per item: return np.asarray(...) of the list to make it one result"
            ) from None
        row_shapes = skeleton_key(skeleton, [leaf.shape[1:] for leaf in leaves])
        if self.skeleton is None:
            self.skeleton, self.row_shapes = skeleton, row_shapes
            targets = _match_out(self.out, skeleton, len(leaves))
            _check_distinct(targets)
            for leaf, target in zip(leaves, targets):
                array, owned, working = _destination(target, leaf, self.total)
                self.arrays.append(array)
                self.owned.append(owned)
                self.paths.append(working)
                self.finals.append(os.path.realpath(target) if working is not None else None)
        elif row_shapes != self.row_shapes:
            raise ValueError(
                f"evaluate: fn returned {_describe(skeleton, leaves)} for batch {batch_index}, "
                f"but {_describe(self.skeleton, self.arrays)} before: the structure and row shapes must not change"
            )
        for k, leaf in enumerate(leaves):
            self._copy(k, leaf, start, rows, batch_index)

    def _copy(self, k: int, leaf: np.ndarray, start: int, rows: int, batch_index: int) -> None:
        target = self.arrays[k]
        if not (np.can_cast(leaf.dtype, target.dtype, "safe") and same_kind_of_value(leaf.dtype, target.dtype)):
            if self.owned[k]:  # our own array or file: widen it (a longer string, floats after ints)
                wider = _wider(target.dtype, leaf.dtype, batch_index)
                if not keeps_values(target[:start], wider):
                    raise TypeError(
                        f"evaluate: fn returned {leaf.dtype} results for batch {batch_index}, but {target.dtype} ones "
                        f"before, some of which {wider} cannot hold (times outside the range of its unit): return "
                        "one dtype, with .astype in fn"
                    )
                target = self.arrays[k] = self._widened(k, wider, start)
            elif not (
                np.can_cast(leaf.dtype, target.dtype, "same_kind") and same_kind_of_value(leaf.dtype, target.dtype)
            ):
                raise TypeError(f"evaluate: cannot write {leaf.dtype} results into the {target.dtype} output")
            elif not keeps_values(leaf, target.dtype):
                raise TypeError(_do_not_fit(leaf, target, batch_index))
        elif leaf.dtype.kind in "mM" and leaf.dtype != target.dtype and not keeps_values(leaf, target.dtype):
            raise TypeError(_do_not_fit(leaf, target, batch_index))  # a cast numpy calls safe: to a finer unit
        target[start : start + rows] = leaf

    def _widened(self, k: int, dtype: np.dtype, filled: int) -> np.ndarray:
        """Array ``k`` as ``dtype``: in memory, a copy; at a path, the file written anew (its first ``filled`` rows)."""
        array, path, final = self.arrays[k], self.paths[k], self.finals[k]
        if path is None or final is None:
            return array.astype(dtype)
        wider, temporary = _hidden_npy(final, dtype, array.shape)
        wider[:filled] = array[:filled]
        wider.flush()
        del wider
        os.replace(temporary, path)
        return np.load(path, mmap_mode="r+")  # a memory map of the file by its own name (workers reopen it by name)

    def result(self) -> Any:
        assert self.skeleton is not None, "no batch was written"
        for array in self.arrays:
            if isinstance(array, np.memmap):
                array.flush()
        try:
            for k, (working, final) in enumerate(zip(self.paths, self.finals)):
                if working is not None and final is not None:  # complete: under its name now, in one step
                    os.replace(working, final)
                    self.paths[k] = None
                    self.arrays[k] = np.load(final, mmap_mode="r+")
        except BaseException:  # the files not renamed yet are removed; those renamed are complete
            self.discard()
            raise
        return rebuild(self.skeleton, self.arrays)

    def discard(self) -> None:
        """After a failure: the files made for out paths are removed (their paths keep what they held)."""
        self.arrays.clear()
        for working in self.paths:
            if working is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(working)


def _do_not_fit(leaf: np.ndarray, target: np.ndarray, batch_index: int) -> str:
    return (
        f"evaluate: the {leaf.dtype} results of batch {batch_index} do not fit the {target.dtype} output "
        "(strings longer than it holds, integers outside its range, numbers too large for its floats, or times "
        "outside the range of its unit): give an output of a wider dtype"
    )


def _wider(old: np.dtype, new: np.dtype, batch_index: int) -> np.dtype:
    """The dtype that holds the results so far and those of batch ``batch_index``, without changing any value's kind.

    >>> _wider(np.dtype("i8"), np.dtype("f4"), 1), _wider(np.dtype("U2"), np.dtype("U5"), 1)
    (dtype('float64'), dtype('<U5'))
    >>> _wider(np.dtype("i8"), np.dtype("U1"), 3)
    Traceback (most recent call last):
    ...
    TypeError: evaluate: fn returned <U1 results for batch 3, but int64 ones before, and no dtype holds both as they are (numbers, strings and bytes do not mix, and int64 with uint64 would be floats): return one dtype, with .astype in fn
    """
    try:
        wider = np.promote_types(old, new)
    except TypeError:
        wider = None
    # numbers widen (not int64 with uint64 into floats), strings lengthen, times take a finer unit
    if wider is not None and same_kind_of_value(old, new):
        if not (old.kind in "iu" and new.kind in "iu" and wider.kind not in "iu"):
            return wider
    raise TypeError(
        f"evaluate: fn returned {new.str} results for batch {batch_index}, but {old} ones before, and no dtype holds "
        "both as they are (numbers, strings and bytes do not mix, and int64 with uint64 would be floats): return one "
        "dtype, with .astype in fn"
    )


def _check_distinct(targets: list) -> None:
    """A ``ValueError`` if two of the outputs are one file or share memory: each result would overwrite the other."""
    for a in range(len(targets)):
        for b in range(a):
            first, second = targets[b], targets[a]
            if isinstance(first, (str, os.PathLike)) and isinstance(second, (str, os.PathLike)):
                same = os.path.abspath(first) == os.path.abspath(second)
            else:
                same = isinstance(first, np.ndarray) and isinstance(second, np.ndarray) and _overlap(first, second)
            if same:
                raise ValueError(
                    f"evaluate: out gives the same {'file' if isinstance(first, (str, os.PathLike)) else 'memory'} "
                    f"for results {b} and {a}: each would overwrite the other; give each result its own"
                )


def _overlap(first: np.ndarray, second: np.ndarray) -> bool:
    """Whether two arrays share an element (the columns of one table do not); where that is too long to tell, yes.

    >>> table = np.zeros((4, 2))
    >>> _overlap(table[:, 0], table[:, 1]), _overlap(table[:, 0], table[1:, 0])
    (False, True)
    """
    try:
        return bool(np.shares_memory(first, second, max_work=SHARED_MEMORY_WORK))  # type: ignore[arg-type]  # stubs: -1, 0
    except np.exceptions.TooHardError:
        return True


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


def _list_of_numbers(result: Any) -> list | None:
    """The first non-empty list of numbers (or 0-d arrays) in ``result``, a likely slip for one array of rows."""
    if isinstance(result, list) and result and all(np.ndim(x) == 0 and not isinstance(x, str) for x in result):
        return result
    children = result.values() if isinstance(result, Mapping) else result if isinstance(result, (tuple, list)) else ()
    for child in children:
        found = _list_of_numbers(child)
        if found is not None:
            return found
    return None


def _describe(skeleton: tuple, arrays: list[np.ndarray]) -> str:
    return describe(skeleton, [f"rows of shape {a.shape[1:]}" for a in arrays])


def _check_writable(out: Any) -> None:
    """``ValueError`` for an array in ``out`` that cannot be written (a memory map opened read-only, say)."""
    arrays: list[np.ndarray] = []
    flatten(out, arrays, is_leaf=lambda value: isinstance(value, np.ndarray))
    for array in arrays:
        if not array.flags.writeable:
            kind = "a memory map opened read-only" if isinstance(array, np.memmap) else "a read-only array"
            raise ValueError(f"evaluate: out is {kind}; give one it can write into (a memory map: mode='r+')")


def _match_out(out: Any, skeleton: tuple, count: int) -> list:
    """One ``out`` entry per array of the result, in the order of :func:`flatten`."""
    if out is None:
        return [None] * count
    targets: list = []

    def walk(node: tuple, spec: Any) -> None:
        tag = node[0]
        if tag == "a":
            targets.append(spec)
        elif tag in ("d", "o"):
            if not isinstance(spec, Mapping) or set(spec) != set(node[1]):
                raise ValueError(f"evaluate: out must be a dict with keys {list(node[1])}, like fn's results")
            for key, child in zip(node[1], node[2]):
                walk(child, spec[key])
        else:
            children = node[-1]
            if not isinstance(spec, (tuple, list)) or len(spec) != len(children):
                raise ValueError(f"evaluate: out must be a tuple of {len(children)} entries, like fn's results")
            for child, part in zip(children, spec):
                walk(child, part)

    walk(skeleton, out)
    return targets


def _hidden_npy(final: str, dtype: np.dtype, shape: tuple) -> tuple[np.memmap, str]:
    """A new ``.npy`` file beside ``final`` under a hidden name, with the permissions of the file at ``final``, if any."""
    hidden = temporary_name(final)
    array = np.lib.format.open_memmap(hidden, mode="w+", dtype=dtype, shape=shape)
    with contextlib.suppress(OSError):  # none there: the default ones
        os.chmod(hidden, stat.S_IMODE(os.stat(final).st_mode))
    return array, hidden


def _destination(target: Any, leaf: np.ndarray, total: int) -> tuple[np.ndarray, bool, str | None]:
    """The array that receives the rows like ``leaf``, whether evaluate created it, and its file if it made one.

    For a path, the file is made beside it under a hidden name, given the
    path once every row is written (see :meth:`_Outputs.result`).
    """
    shape = (total, *leaf.shape[1:])
    if target is None:
        return np.empty(shape, leaf.dtype), True, None
    if isinstance(target, (str, os.PathLike)) and os.path.isdir(target):
        raise IsADirectoryError(f"evaluate: out {os.fspath(target)!r} is a directory: give the path of a .npy file")
    if isinstance(target, (str, os.PathLike)):  # made here from the first batch: widened as later ones need
        # a link's target is what is written, as when writing through the link
        final = os.path.realpath(target)
        if not os.path.isdir(os.path.dirname(final)):  # else the error names the hidden file made beside it
            raise FileNotFoundError(
                f"evaluate: out {os.fspath(target)!r} is in a directory that does not exist: make it first"
            )
        array, working = _hidden_npy(final, leaf.dtype, shape)
        return array, True, working
    if not isinstance(target, np.ndarray):
        raise TypeError(
            f"evaluate: out must be an array, a .npy path or a structure of them, not {type(target).__name__}"
        )
    if target.shape != shape:
        raise ValueError(f"evaluate: out has shape {target.shape}, but the results need {shape}")
    return target, False, None

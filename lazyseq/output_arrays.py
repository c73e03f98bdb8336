"""The arrays that :func:`~lazyseq.evaluate` writes results into: given, or made in memory or as ``.npy`` files.

``out`` is checked before ``fn`` runs on a first batch, which may take long:
a read-only array, or a path where the file could not be made (a missing
directory, one this process may not write in, a file there it may not read
and write), is refused at once. The rest is known from the first batch's
results: each array of them gets an :class:`Output`, the array given for it
or one made like it. A file for a path is made beside it under a hidden name
and takes the path once every batch is in, so a call that fails leaves what
was there before. An array evaluate makes widens when a later batch needs
it (a longer string, floats after integers); one given keeps its dtype and
refuses values a cast would change.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .casting import keeps_values, same_kind_of_value
from .io.held_files import hold_new, let_go, remove_unheld
from .io.shard_files import temporary_name
from .nested import flatten

__all__ = ["Output", "check_distinct", "check_out", "match_out", "new_output"]

SHARED_MEMORY_WORK = 100_000  # steps np.shares_memory may take to tell whether two outputs overlap
TOO_HARD = getattr(np, "exceptions", np).TooHardError  # what it raises beyond them (numpy < 1.25: np.TooHardError)


@dataclass
class Output:
    """One array of the results: where its rows go, and how messages name it."""

    array: np.ndarray
    owned: bool  # made by evaluate (in memory or as a file): it may widen
    key: str  # where it sits in the results, as messages name it: "" for a lone array, " ['label']" in a dict
    working: str | None = None  # the file an out path is written in: a hidden one until every batch is in
    final: str | None = None  # that path (of a link, its target)
    given: str | None = None  # that path as given, for messages
    lock: int | None = None  # what holds the working file while it is written (see lazyseq.io.held_files)

    def array_for(self, leaf: np.ndarray, start: int, batch_index: int) -> np.ndarray:
        """The array to write ``leaf`` into, widened if it must be; a TypeError if it cannot take ``leaf``."""
        target = self.array
        if not (np.can_cast(leaf.dtype, target.dtype, "safe") and same_kind_of_value(leaf.dtype, target.dtype)):
            if self.owned:  # our own array or file: widen it (a longer string, floats after ints)
                wider = _widest(target.dtype, leaf.dtype, batch_index, self.key)
                if not keeps_values(target[:start], wider):
                    raise TypeError(
                        f"evaluate: fn returned {leaf.dtype} results for batch {batch_index}{_in_output(self.key)}, "
                        f"but {target.dtype} ones before, some of which {wider} cannot hold as they are "
                        f"({_lost(target.dtype)}): return one dtype, with .astype in fn"
                    )
                self.array = self._widened(wider, start, batch_index)
                return self.array
            if not (
                np.can_cast(leaf.dtype, target.dtype, "same_kind") and same_kind_of_value(leaf.dtype, target.dtype)
            ):
                raise TypeError(
                    f"evaluate: cannot write the {leaf.dtype} results of batch {batch_index} into the {target.dtype} "
                    f"output{self.key}: return {target.dtype} results (with .astype in fn), or give an output of a "
                    "dtype that holds them"
                )
            if not keeps_values(leaf, target.dtype):
                raise TypeError(self._do_not_fit(leaf, batch_index))
        elif _may_change(leaf.dtype, target.dtype) and not keeps_values(leaf, target.dtype):
            if self.owned:  # no wider dtype to make: the outputs evaluate makes are fn's to keep in one dtype
                raise TypeError(
                    f"evaluate: fn returned {leaf.dtype} results for batch {batch_index}{_in_output(self.key)}, but "
                    f"{target.dtype} ones before, which cannot hold some of them as they are ({_lost(leaf.dtype)}): "
                    "return one dtype, with .astype in fn"
                )
            raise TypeError(self._do_not_fit(leaf, batch_index))  # a cast numpy calls safe: to a finer unit, to floats
        return target

    def _widened(self, dtype: np.dtype, filled: int, batch_index: int) -> np.ndarray:
        """The array as ``dtype``, its first ``filled`` rows copied: in memory, a new array; at a path, the file anew."""
        if self.working is None or self.final is None:
            # not .astype of it all: the rows not yet written hold whatever np.empty left there, which numpy 2.5 on
            # refuses to cast to a finer unit of time where it is out of that unit's range
            wider = np.empty(self.array.shape, dtype)
            wider[:filled] = self.array[:filled]
            return wider
        if dtype.hasobject:
            raise TypeError(_objects_in_a_file(self.given, self.key, batch_index))
        wider, temporary, lock = _hidden_npy(self.final, dtype, self.array.shape)
        try:
            wider[:filled] = self.array[:filled]
            wider.flush()
            del wider
            os.replace(temporary, self.working)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            let_go(lock)
            raise
        let_go(self.lock)  # (the file it held is gone: replaced)
        self.lock = lock
        return np.load(self.working, mmap_mode="r+")  # a memory map of the file by its own name (workers reopen it)

    def _do_not_fit(self, leaf: np.ndarray, batch_index: int) -> str:
        return (
            f"evaluate: the {leaf.dtype} results of batch {batch_index} do not fit the {self.array.dtype} "
            f"output{self.key} (strings longer than it holds, integers outside its range, numbers too large for its "
            "floats, integers beyond their precision, or times outside the range of its unit): give an output of a "
            "wider dtype"
        )

    def flush(self) -> None:
        """Every row written to a memory map reaches its file."""
        if isinstance(self.array, np.memmap):
            self.array.flush()

    def complete(self) -> None:
        """Every batch is in: a file made for a path takes the path, in one step."""
        if self.working is not None and self.final is not None:
            os.replace(self.working, self.final)
            self.working = None
            let_go(self.lock)
            self.lock = None
            self.array = np.load(self.final, mmap_mode="r+")

    def discard(self) -> None:
        """After a failure: a file made for a path is removed (the path keeps what it held)."""
        if self.working is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.working)
            self.working = None
        let_go(self.lock)
        self.lock = None


def _may_change(source: np.dtype, target: np.dtype) -> bool:
    """Whether a cast that numpy calls safe may change a value: times to a finer unit, integers to floats."""
    if source.kind in "mM":
        return source != target
    return source.kind in "iu" and target.kind in "fc"


def _lost(dtype: np.dtype) -> str:
    """What results of ``dtype`` may not survive in a wider dtype, for messages."""
    if dtype.kind in "mM":
        return "times outside the range of its unit"
    return "integers beyond the precision of its floats"


def _in_output(key: str) -> str:
    """`` in output ['label']``, or nothing for a lone array."""
    return f" in output{key}" if key else ""


def _objects_in_a_file(given: str | None, key: str, batch_index: int) -> str:
    return (
        f"evaluate: fn returned Python objects (dtype object) for batch {batch_index}, but the output{key} is the "
        f".npy file {given!r}, which cannot hold them: return them in memory (out=None for this result), or as "
        "numbers or strings (.astype in fn)"
    )


def _widest(old: np.dtype, new: np.dtype, batch_index: int, key: str = "") -> np.dtype:
    """The dtype that holds the results so far and those of batch ``batch_index``, without changing any value's kind.

    >>> _widest(np.dtype("i8"), np.dtype("f4"), 1), _widest(np.dtype("U2"), np.dtype("U5"), 1)
    (dtype('float64'), dtype('<U5'))
    >>> _widest(np.dtype("i8"), np.dtype("U1"), 3, " ['label']")
    Traceback (most recent call last):
    ...
    TypeError: evaluate: fn returned <U1 results for batch 3 in output ['label'], but int64 ones before, and no dtype holds both as they are (numbers, strings and bytes do not mix, and int64 with uint64 would be floats): return one dtype, with .astype in fn
    """
    try:
        wider = np.promote_types(old, new)
    except TypeError:
        wider = None
    # numbers widen (not int64 with uint64 into floats), strings lengthen, times take a finer unit
    if wider is not None and same_kind_of_value(old, new):
        if not (old.kind in "iu" and new.kind in "iu" and wider.kind not in "iu"):
            return wider
    if old.fields is not None or new.fields is not None:
        why = "records convert neither to plain values nor to records of other fields"
    else:
        why = "numbers, strings and bytes do not mix, and int64 with uint64 would be floats"
    raise TypeError(
        f"evaluate: fn returned {new} results for batch {batch_index}{_in_output(key)}, but {old} ones before, "
        f"and no dtype holds both as they are ({why}): return one dtype, with .astype in fn"
    )


# -- before fn runs -------------------------------------------------------------------------------


def check_out(out: Any) -> None:
    """An error for an array in ``out`` that cannot be written, or a path where evaluate could not make its file."""
    targets: list = []
    flatten(out, targets, is_leaf=lambda value: isinstance(value, (np.ndarray, str, os.PathLike)))
    for target in targets:
        if isinstance(target, np.ndarray):
            _check_writable(target)
        else:
            _check_path(target)


def _check_writable(array: np.ndarray) -> None:
    """``ValueError`` for an array that cannot be written (a memory map opened read-only, say)."""
    if not array.flags.writeable:
        kind = "a memory map opened read-only" if isinstance(array, np.memmap) else "a read-only array"
        raise ValueError(f"evaluate: out is {kind}; give one it can write into (a memory map: mode='r+')")


def _check_path(path: str | os.PathLike) -> None:
    """An error for an out path where evaluate could not make its file, or may not replace the one there."""
    given = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"evaluate: out {given!r} is a directory: give the path of a .npy file")
    final = os.path.realpath(path)  # a link's target is what is written, as when writing through the link
    folder = os.path.dirname(final)
    if not os.path.isdir(folder):  # else the error would name the hidden file made beside it
        raise FileNotFoundError(f"evaluate: out {given!r} is in a directory that does not exist: make it first")
    if not os.access(folder, os.W_OK | os.X_OK):  # the file is made there under a hidden name
        raise PermissionError(
            f"evaluate: out {given!r} is in a directory this process may not write in ({folder!r}): give a path "
            "in another one"
        )
    if os.path.exists(final) and not os.access(final, os.R_OK | os.W_OK):  # protected: not replaced behind its back
        mode = stat.S_IMODE(os.stat(final).st_mode)
        raise PermissionError(
            f"evaluate: out {given!r} is a file this process may not read and write (mode {mode:#o}), which "
            "evaluate would replace: make it writable, or give another path"
        )


# -- at the first batch ---------------------------------------------------------------------------


def match_out(out: Any, skeleton: tuple, count: int) -> list:
    """One ``out`` entry per array of the result, in the order of :func:`~lazyseq.nested.flatten`."""
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


def check_distinct(targets: list) -> None:
    """A ``ValueError`` if two of the outputs are one file or share memory: each result would overwrite the other."""
    for a in range(len(targets)):
        for b in range(a):
            first, second = targets[b], targets[a]
            if isinstance(first, (str, os.PathLike)) and isinstance(second, (str, os.PathLike)):
                same = os.path.realpath(first) == os.path.realpath(second)  # the file written, through any link
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
        # Any: the stubs of numpy before 2.5 take only -1 and 0
        return bool(np.shares_memory(first, second, max_work=cast(Any, SHARED_MEMORY_WORK)))
    except TOO_HARD:
        return True


def new_output(target: Any, leaf: np.ndarray, total: int, batch_index: int, key: str) -> Output:
    """The output that receives the rows like ``leaf``: ``target``, or an array or file evaluate makes.

    For a path (checked before fn ran, see :func:`check_out`), the file is
    made beside it under a hidden name, and takes the path once every row is
    written (:meth:`Output.complete`).
    """
    shape = (total, *leaf.shape[1:])
    if target is None:
        return Output(np.empty(shape, leaf.dtype), True, key)
    if isinstance(target, (str, os.PathLike)):  # made here from the first batch: widened as later ones need
        given = os.fspath(target)
        if leaf.dtype.hasobject:
            raise TypeError(_objects_in_a_file(given, key, batch_index))
        final = os.path.realpath(target)
        remove_unheld(final)  # what runs killed mid-way left beside it
        array, working, lock = _hidden_npy(final, leaf.dtype, shape)
        return Output(array, True, key, working, final, given, lock)
    if not isinstance(target, np.ndarray):
        raise TypeError(
            f"evaluate: out must be an array, a .npy path or a structure of them, not {type(target).__name__}"
        )
    if target.shape != shape:
        raise ValueError(f"evaluate: out has shape {target.shape}, but the results need {shape}")
    return Output(target, False, key)


_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _claim_room(path: str, final: str) -> None:
    """Reserve the disk space of the file at ``path`` (created sparse): an output written through a memory map
    into room the disk does not have ends the process with SIGBUS, no exception; here it is an ``OSError``."""
    if not hasattr(os, "posix_fallocate"):  # (macOS: none; there the writes find out)
        return
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in _NO_ROOM:  # a file system that cannot reserve: the writes find out
            return
        raise OSError(
            error.errno,
            f"evaluate: no room for out {final!r} on its disk: it takes {size:,} bytes ({os.strerror(error.errno)})",
        ) from None
    finally:
        os.close(fd)


def _hidden_npy(final: str, dtype: np.dtype, shape: tuple) -> tuple[np.memmap, str, int | None]:
    """A new ``.npy`` file beside ``final`` under a hidden name, with the permissions of the file at ``final``, if any;
    held while it is written (see :mod:`lazyseq.io.held_files`): what holds it is returned too."""
    hidden = temporary_name(final)
    lock = hold_new(hidden)
    array = None
    try:
        array = np.lib.format.open_memmap(hidden, mode="w+", dtype=dtype, shape=shape)
        _claim_room(hidden, final)
    except BaseException:
        array = None  # its map let go now, not with the traceback: the room claimed in part goes back to the disk
        with contextlib.suppress(FileNotFoundError):
            os.unlink(hidden)
        let_go(lock)
        raise
    with contextlib.suppress(OSError):  # none there: the default ones
        os.chmod(hidden, stat.S_IMODE(os.stat(final).st_mode))
    return array, hidden, lock

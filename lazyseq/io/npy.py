"""Memory-mapped ``.npy`` files as one view: ``open_npy``, of files or of a directory ``write_npy`` wrote."""

from __future__ import annotations

import glob
import math
import os
import zipfile
from collections.abc import Sequence
from tokenize import TokenError
from typing import Any, BinaryIO, Literal

import numpy as np

from ..views.base import View
from ..views.collate import CollateView
from ..views.concatenate import ConcatenateView
from ..views.sources import ArraySource
from .shard_directory import MANIFEST, read_manifest
from .shard_files import npy_header
from .shard_layout import Field, ShardFile

__all__ = ["open_npy"]

_NPY_VERSIONS = ((1, 0), (2, 0), (3, 0))  # the .npy formats numpy reads
_NPY_MAGIC = b"\x93NUMPY"  # how every .npy file starts
_ZIP_MAGIC = b"PK\x03\x04"  # an .npz archive is a zip file


def open_npy(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> View[Any]:
    """Memory-map ``.npy`` files (read-only) and view their rows one file after the other.

    ``paths`` is a list of files, or one glob pattern (matches are sorted by
    name, as strings: ``10.npy`` comes before ``2.npy``, so number files with
    leading zeros or list them; a path that names an existing file is that file, whatever
    characters it holds). Every file must hold the same dtype and the same shape beyond the
    first axis; a file that does not is named in a ``ValueError``. Nothing is
    read into memory until items are accessed.

    ``paths`` may also be a directory that :func:`~lazyseq.write_npy` wrote:
    it is opened through its manifest, and its items are what was written
    (arrays, tuples, or dicts with the same keys; each field memory-mapped,
    and batches of them stacked field by field). A shard whose size or
    header disagrees with the manifest is an error naming the file (its
    checksum is checked when ``write_npy`` resumes, which redoes it).

    Its items are what the files hold, and so are typed ``Any``: rows of
    the files' arrays (numpy scalars for 1-D files), or the tuples or dicts
    that ``write_npy`` wrote.

    A file that numpy would not map, or would map at great cost, is refused
    with a ``ValueError`` naming it and saying why: Python objects (pickled),
    values of no bytes (``|V0``: they hold nothing to read), a header that
    cannot be parsed, or a shape larger than the file.

    Each file mapped keeps one open file descriptor while the view lives
    (numpy's memory maps do): where the files outnumber what the process may
    open, its soft limit (``ulimit -n``) is raised towards its hard limit,
    and beyond that an ``OSError`` says how many files are needed.

    >>> import os, shutil, tempfile
    >>> import numpy as np
    >>> import lazyseq
    >>> folder = tempfile.mkdtemp()
    >>> for k in range(3):
    ...     np.save(os.path.join(folder, f"part_{k}.npy"), np.full((2, 4), k, dtype=np.float32))
    >>> data = lazyseq.open_npy(os.path.join(folder, "part_*.npy"))
    >>> len(data), data[5]
    (6, array([2., 2., 2., 2.], dtype=float32))
    >>> shutil.rmtree(folder)
    """
    if isinstance(paths, bytes):  # as os functions take them, and write_npy
        paths = os.fsdecode(paths)
    if isinstance(paths, (str, os.PathLike)) and os.path.isdir(paths):
        return _open_written(os.fsdecode(os.fspath(paths)))
    if isinstance(paths, (str, os.PathLike)):
        pattern = os.fsdecode(os.fspath(paths))
        literal = not glob.has_magic(pattern) or os.path.isfile(pattern)  # a file named "a[1].npy" is that file
        files = [pattern] if literal else sorted(glob.glob(pattern))
        if not files:
            raise FileNotFoundError(f"open_npy: no file matches {pattern!r}")
    else:
        try:
            files = [os.fspath(p) for p in paths]
        except TypeError:
            raise TypeError(
                f"open_npy: paths must be a directory, a file, a glob pattern or a list of files, got {paths!r:.60}"
            ) from None
        if not files:
            raise ValueError("open_npy: no file given")
    make_room_for_files(len(files), "open_npy")
    parts: list[ArraySource] = []
    for path in files:
        try:
            array = _mapped(path)
        except _HeaderError as error:
            raise ValueError(f"open_npy: cannot memory-map {path}: {error}") from None
        if not isinstance(array, np.ndarray) or array.ndim == 0:
            raise ValueError(f"open_npy: {path} does not hold an array with at least one dimension")
        if parts:
            first = parts[0].source
            if array.dtype != first.dtype or array.shape[1:] != first.shape[1:]:
                raise ValueError(
                    f"open_npy: {path} holds {array.dtype} rows of shape {array.shape[1:]}, but "
                    f"{files[0]} holds {first.dtype} rows of shape {first.shape[1:]}"
                )
        parts.append(ArraySource(array))
    return parts[0] if len(parts) == 1 else ConcatenateView(parts)


def _open_written(directory: str) -> View[Any]:
    """The items of a directory that ``write_npy`` wrote, each field's shards memory-mapped one after the other."""
    try:
        written = read_manifest(directory)
    except (FileNotFoundError, ValueError) as error:
        raise type(error)(f"open_npy: {error}") from None
    layout = written.layout
    manifest = os.path.join(directory, MANIFEST)
    shards = range(layout.shard_count)
    damaged = ": the manifest was edited or damaged; call write_npy again with overwrite=True to rewrite the directory"
    extra = sorted(k for k in written.records if k not in shards)
    wrong = [k for k, record in written.records.items() if k in shards and record.rows != layout.row_count(k)]
    if extra or wrong:
        k = (extra or wrong)[0]
        raise ValueError(
            f"open_npy: {manifest} records shard {k} with {written.records[k].rows} rows, but its length "
            f"({layout.length}) and rows_per_shard ({layout.rows_per_shard}) make {layout.shard_count} shards"
            + (f" and give shard {k} {layout.row_count(k)} rows" if k in shards else "")
            + damaged
        )
    if len(written.records) < layout.shard_count:  # found before making room for every shard's files
        k = next(k for k in shards if k not in written.records)
        raise ValueError(
            f"open_npy: {manifest} has no record of shard {k}, of the {layout.shard_count} shards that its length "
            f"({layout.length}) and rows_per_shard ({layout.rows_per_shard}) make" + damaged
        )
    make_room_for_files(layout.shard_count * len(layout.fields), f"open_npy: {directory}")
    fields: list[View] = []
    for j, field in enumerate(layout.fields):
        parts: list[ArraySource] = []
        for shard in range(layout.shard_count):
            record = written.records.get(shard)
            if record is None or len(record.files) != len(layout.fields):
                raise ValueError(f"open_npy: {manifest} has no record of shard {shard} for field {field.name!r}")
            file = record.files[j]
            if file.name != layout.file_name(field, shard):  # another shard's file: its rows in the wrong place
                raise ValueError(
                    f"open_npy: {manifest} names {file.name!r} as shard {shard} of field {field.name!r}, whose file is "
                    f"{layout.file_name(field, shard)!r}: the manifest was edited or damaged; call write_npy again "
                    "with overwrite=True to rewrite the directory"
                )
            parts.append(ArraySource(_open_shard(directory, file, field, record.rows, manifest)))
        fields.append(parts[0] if len(parts) == 1 else ConcatenateView(parts))
    if layout.kind == "array":
        return fields[0]
    keys = tuple(f.name for f in layout.fields) if layout.kind == "dict" else None
    return CollateView(tuple(fields), keys)


def _open_shard(directory: str, file: ShardFile, field: Field, rows: int, manifest: str) -> np.ndarray:
    """Shard ``file`` memory-mapped, after checking its size and header against what ``manifest`` says."""
    path = os.path.join(directory, file.name)
    redo = "call write_npy again with the same arguments to redo it"
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"open_npy: {path} is missing, but {manifest} lists it: {redo}") from None
    if size != file.size:
        raise ValueError(
            f"open_npy: {path} holds {size} bytes, but {manifest} says {file.size}: the shard is truncated or was "
            f"replaced; {redo}"
        )
    shape = (rows, *field.row_shape)
    header = npy_header(field, rows)
    data_bytes = rows * field.row_bytes
    if size == len(header) + data_bytes and data_bytes:  # np.memmap maps no empty array
        with open(path, "rb") as opened:
            if opened.read(len(header)) == header:  # as write_npy writes it: nothing left to check
                return np.memmap(opened, field.dtype, "r", offset=len(header), shape=shape)
    try:
        array = _mapped(path)
    except ValueError as error:
        detail = str(error).removeprefix("open_npy: ")
        raise ValueError(f"open_npy: {path} has a header that cannot be read ({detail}); {redo}") from None
    if array.dtype != field.dtype or array.shape != shape or not array.flags.c_contiguous:
        order = "" if array.flags.c_contiguous else " in Fortran order"
        raise ValueError(
            f"open_npy: {path} holds {array.dtype} values of shape {array.shape}{order}, but {manifest} says "
            f"{field.dtype} of shape {shape}: {redo} (with overwrite=True if {manifest} is what was changed)"
        )
    start = getattr(array, "offset", None)  # where its header says the values begin (a memory map's)
    if start is not None and start + array.nbytes != size:
        raise ValueError(
            f"open_npy: {path} has a header of {start} bytes, but its {size} bytes hold {array.nbytes} bytes of "
            f"values after a header of {size - array.nbytes}: its values would be read from the wrong place; {redo}"
        )
    return array


def _mapped(path: str) -> np.ndarray:
    """The ``.npy`` file ``path`` memory-mapped (read-only), opened once; a ``ValueError`` if it is not a ``.npy``
    file (the whole message) or if its header cannot be read or mapped (what is wrong, for the caller to word)."""
    with open(path, "rb") as file:
        _check_npy_magic(path, file.read(len(_NPY_MAGIC)))
        file.seek(0)
        try:
            version, shape, fortran_order, dtype = _read_header(file)
        except (SyntaxError, TokenError, TypeError, IndexError, KeyError, OverflowError) as error:
            # What numpy's reading of a damaged header may raise: its values read as Python literals, then used as
            # they are
            raise _HeaderError(f"its header cannot be parsed: {type(error).__name__}: {error}") from None
        except ValueError as error:
            # numpy's "Cannot parse header: <all of it>", raised from the SyntaxError of a header that Python's
            # tokenize reads but its parser does not (an unclosed "{" too, from Python 3.12 on, where tokenize raises
            # no TokenError)
            if isinstance(error.__cause__, SyntaxError):
                raise _HeaderError(f"its header cannot be parsed: SyntaxError: {error.__cause__}") from None
            raise _HeaderError(str(error)) from None
        if version == (3, 0) or not math.prod(shape):  # a header in UTF-8, or no values: np.memmap maps none
            try:
                return np.load(path, mmap_mode="r")
            except ValueError as error:
                raise _HeaderError(str(error)) from None
        order: Literal["C", "F"] = "F" if fortran_order else "C"
        try:
            return np.memmap(file, dtype, "r", offset=file.tell(), shape=shape, order=order)
        except ValueError as error:  # what np.memmap refuses that the header's checks let through
            raise _HeaderError(str(error)) from None


class _HeaderError(ValueError):
    """A header that cannot be read, or values it describes that cannot be mapped: what is wrong, without the file."""


def _read_header(file: BinaryIO) -> tuple[tuple[int, int], tuple[int, ...], bool, np.dtype]:
    """The format version, shape, order and dtype of the ``.npy`` file open at its start. A ``ValueError`` for a
    header that numpy would read at great cost or map at its peril: one longer than the file (numpy reads as many
    bytes as it says first), or with a negative length (values of no bytes, "V0", in as many rows kill the process:
    numpy divides by their size), or values that cannot be mapped: Python objects, values of no bytes (numpy maps
    them, then spends as long copying nothing as it would that many values), more values than the file holds."""
    file_format = np.lib.format
    version = file_format.read_magic(file)
    if version not in _NPY_VERSIONS:
        shown = ", ".join(f"{major}.{minor}" for major, minor in _NPY_VERSIONS)
        raise ValueError(f"its format version is {version[0]}.{version[1]}; numpy reads {shown}")
    size_bytes = 2 if version == (1, 0) else 4
    announced = int.from_bytes(file.read(size_bytes), "little")
    if announced > os.fstat(file.fileno()).st_size - file.tell():
        raise ValueError(f"its header says it is {announced} bytes long, more than the file holds")
    file.seek(-size_bytes, os.SEEK_CUR)
    read = file_format.read_array_header_1_0 if version == (1, 0) else file_format.read_array_header_2_0
    shape, fortran_order, dtype = read(file)
    if any(n < 0 for n in shape):
        raise ValueError(f"its header gives a negative length: shape {shape}")
    if dtype.hasobject:
        raise ValueError(f"it holds Python objects (dtype {dtype}), pickled: they cannot be memory-mapped")
    # as the header gives it: "<f8", and the fields of a structured dtype (whose .str is "|V10", say)
    shown = dtype.str if dtype.names is None and dtype.subdtype is None else str(dtype)
    if not dtype.itemsize:
        raise ValueError(f"its values have no bytes (dtype {shown}): there is nothing in them to read")
    needed, held = math.prod(shape) * dtype.itemsize, os.fstat(file.fileno()).st_size - file.tell()
    if needed > held:
        raise ValueError(f"its header gives {shown} values of shape {shape}, {needed} bytes, but {held} follow it")
    return version, shape, fortran_order, dtype


def _check_npy_magic(path: str, start: bytes) -> None:
    """A ``ValueError`` saying what ``path`` is if it is not a ``.npy`` file (numpy would try to unpickle it):
    ``start``, its first bytes, tell."""
    if start == _NPY_MAGIC:
        return
    if start.startswith(_ZIP_MAGIC):
        try:
            with zipfile.ZipFile(path) as archive:
                names = [name.removesuffix(".npy") for name in archive.namelist()]
        except (zipfile.BadZipFile, EOFError) as error:
            raise ValueError(
                f"open_npy: {path} is not a .npy file (it starts like a zip archive, an .npz file, but is not a "
                f"readable one: {error})"
            ) from None
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        example = names[0] if names else "name"
        raise ValueError(
            f"open_npy: {path} is an .npz archive, which holds several arrays ({shown}); open_npy memory-maps "
            f".npy files: extract the archive (it holds one .npy file per array) and open those, or load one "
            f"array into memory with np.load({path!r})[{example!r}] and view it with lazyseq.view()"
        )
    what = "it is empty" if not start else f"bad magic: it starts with {start!r}, a .npy file with {_NPY_MAGIC!r}"
    if os.path.basename(path) == "manifest.json":  # of a directory write_npy wrote
        what += f"; to read what write_npy wrote, open its directory: open_npy({os.path.dirname(path) or '.'!r})"
    raise ValueError(f"open_npy: {path} is not a .npy file ({what})")


SPARE_DESCRIPTORS = 256  # left for everything else the process opens (sockets, pipes, other files)


def make_room_for_files(count: int, owner: str) -> None:
    """Make sure ``count`` more files can stay open: raise the soft limit on open files if needed (POSIX).

    ``OSError`` if even the hard limit is too low, saying how many are needed.
    """
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = SPARE_DESCRIPTORS
    needed = open_now + count + SPARE_DESCRIPTORS  # room for the rest of the program too, where the limit allows
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    if hard != resource.RLIM_INFINITY and open_now + count > hard:
        raise OSError(
            f"{owner}: mapping {count} files keeps {count} files open, and this process may have {hard} open at "
            f"most (its hard limit; {open_now} are open): raise it (ulimit -Hn), or write fewer, larger shards"
        )
    try:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else min(hard, needed), hard)
        )
    except (ValueError, OSError):  # refused (macOS caps an infinite hard limit lower): mapping says if it is short
        pass

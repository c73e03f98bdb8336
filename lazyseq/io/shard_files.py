"""Files that appear whole or not at all: a shard's ``.npy`` files, the manifest, checksums.

Every file is written under a temporary name in its directory (hidden,
ending in ``.tmp``), then renamed to its final name once complete. A process
killed at any moment leaves a final name holding a complete file, or nothing
but a temporary file, which the next run removes (:func:`remove_temporaries`),
as does the end of a run that finished after losing a worker. What lasts
through a power loss is what was synced to disk (see :mod:`.shard_sync`): a
file synced before its rename, or after it (a shard's files are synced in the
background, while the next shards are computed), and the renames before a
sync of the directory; the manifest is synced before its own rename, after
everything it lists.

A file's checksum (:mod:`.checksum`) is computed by the thread that writes
it, buffer by buffer, just before each buffer is written: numpy sums it at
memory speed, while it is still in the processor's caches.
"""

from __future__ import annotations

import functools
import io
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack

import numpy as np

from .checksum import Sum64, file_crc32, file_sum64
from .shard_layout import MANIFEST, PROGRESS, SHARD_FILE_NAME, Field, ShardFile
from .shard_sync import sync_directory

__all__ = [
    "matches",
    "npy_header",
    "remove_temporaries",
    "replace_atomically",
    "temporary_name",
    "temporary_names",
    "write_npy_files",
    "write_npy_piece",
]


def temporary_names(name_pattern: str) -> re.Pattern[str]:
    """What :func:`temporary_name` makes of the names ``name_pattern`` (a regular expression) matches.

    >>> bool(temporary_names("out[.]npy").fullmatch(".out.npy.1a2b3c4d.tmp"))
    True
    """
    return re.compile(rf"\.(?:{name_pattern})\.[0-9a-f]{{8}}\.tmp")


# what temporary_name makes of the files write_npy writes: other hidden files are not ours to remove
_TEMPORARY = temporary_names(f"{SHARD_FILE_NAME.pattern}|{re.escape(MANIFEST)}|{re.escape(PROGRESS)}")


@functools.lru_cache(maxsize=256)  # most shards of a directory hold as many rows: one header for all of them
def npy_header(field: Field, rows: int) -> bytes:
    """The ``.npy`` header of ``rows`` rows of ``field``, as ``np.save`` writes it (version 1.0 where it fits)."""
    header = {
        "descr": np.lib.format.dtype_to_descr(field.dtype),
        "fortran_order": False,
        "shape": (rows, *field.row_shape),
    }
    out = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(out, header)
    except ValueError:  # a header longer than 64 KiB
        out = io.BytesIO()
        np.lib.format.write_array_header_2_0(out, header)
    return out.getvalue()


def temporary_name(path: str, token: str | None = None) -> str:
    """A hidden name next to ``path``, which :func:`remove_temporaries` recognizes.

    Fresh, or the one that ``token`` (8 hexadecimal digits) makes: the writers
    of the pieces of one file share it (see :func:`write_npy_piece`).
    """
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.{token or os.urandom(4).hex()}.tmp")


def remove_temporaries(directory: str) -> None:
    """Remove what writers killed mid-file left behind in ``directory`` (gone, perhaps: then nothing)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:  # removed while a run wrote into it: its own error says so
        return
    for name in names:
        if _TEMPORARY.fullmatch(name):
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def replace_atomically(path: str, data: bytes, *, sync: bool = True) -> None:
    """Write ``data`` as the file ``path``, which holds its old contents or the new ones, never a mix.

    ``sync``: the file and its directory are synced to disk, so that the new
    contents last through a power loss; without, through the end of the process.
    """
    temporary = temporary_name(path)
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            if sync:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        _remove_quietly(temporary)
        raise
    if sync:
        sync_directory(os.path.dirname(path) or ".")


def write_npy_files(
    directory: str,
    names: Sequence[str],
    headers: Sequence[bytes],
    blocks: Iterator[list[np.ndarray]],
    *,
    sync: bool,
) -> tuple[ShardFile, ...]:
    """Write one ``.npy`` file per field, each ``headers[j]`` then the rows of field ``j`` of every block.

    The files get their final ``names`` together, once all of them are
    complete (``sync``: and on disk, else the caller syncs them later, or not
    at all); an exception on the way removes every temporary file. The
    directory is not synced here (once per file would cost as much as the
    files): whoever relies on the renames lasting syncs it once, after all of
    them (the manifest is written so).
    """
    paths = [os.path.join(directory, name) for name in names]
    temporaries = [temporary_name(path) for path in paths]
    try:
        with ExitStack() as stack:
            files = [stack.enter_context(open(t, "wb")) for t in temporaries]
            sums, sizes = _write_fields([file.write for file in files], headers, blocks)
            if sync:
                for file in files:
                    file.flush()
                    os.fsync(file.fileno())
        for temporary, path in zip(temporaries, paths):
            os.replace(temporary, path)
    except BaseException:
        for temporary in temporaries:
            _remove_quietly(temporary)
        raise
    return tuple(ShardFile(name, size, summed.hexdigest()) for name, size, summed in zip(names, sizes, sums))


def write_npy_piece(
    directory: str,
    names: Sequence[str],
    starts: Sequence[bytes],
    offsets: Sequence[int],
    blocks: Iterator[list[np.ndarray]],
    token: str,
) -> tuple[tuple[tuple[int, int, int], ...], tuple[int, ...]]:
    """Write a piece of each of the files ``names``: ``starts[j]``, then field ``j`` of every block, at ``offsets[j]``.

    The files are the temporary ones that ``token`` names (see
    :func:`temporary_name`), made by the first piece to arrive and shared by
    every piece of them, each writing its own bytes at its own place; whoever
    collects the pieces renames the files once all are written. Gives each
    file's checksum state of the bytes written (:meth:`~.checksum.Sum64.state`)
    and how many there are. An exception on the way removes the temporary
    files: the other pieces are of no use then.
    """
    temporaries = [temporary_name(os.path.join(directory, name), token) for name in names]
    try:
        with ExitStack() as stack:
            writes = []
            for temporary, offset in zip(temporaries, offsets):
                descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
                stack.callback(os.close, descriptor)
                writes.append(_WriteAt(descriptor, offset))
            sums, sizes = _write_fields(writes, starts, blocks)
    except BaseException:
        for temporary in temporaries:
            _remove_quietly(temporary)
        raise
    return tuple(summed.state() for summed in sums), tuple(sizes)


def _write_fields(
    writes: Sequence[Callable[[bytes | memoryview], object]],
    starts: Sequence[bytes],
    blocks: Iterator[list[np.ndarray]],
) -> tuple[list[Sum64], list[int]]:
    """``writes[j]`` gets ``starts[j]``, then field ``j`` of every block; the checksum and size of what each got."""
    sums = [Sum64(start) for start in starts]
    sizes = [len(start) for start in starts]
    for write, start in zip(writes, starts):
        write(start)
    for arrays in blocks:
        for j, array in enumerate(arrays):
            data = _bytes_of(array)
            sums[j].add(data)  # while the bytes are in the processor's caches
            sizes[j] += len(data)
            writes[j](data)
    return sums, sizes


class _WriteAt:
    """Writes what it is given to a file, one piece after the other from ``offset``, wherever the file ends."""

    def __init__(self, descriptor: int, offset: int) -> None:
        self._descriptor, self._offset = descriptor, offset

    def __call__(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            written = os.pwrite(self._descriptor, view, self._offset)
            view, self._offset = view[written:], self._offset + written


def matches(directory: str, expected: ShardFile) -> bool:
    """Whether ``expected.name`` in ``directory`` has the size and checksum recorded for it."""
    path = os.path.join(directory, expected.name)
    try:
        if os.stat(path).st_size != expected.size:
            return False
        summed = file_crc32 if expected.kind == "crc32" else file_sum64  # CRC-32: recorded by version 1
        return summed(path) == (expected.size, expected.checksum)
    except FileNotFoundError:
        return False


def _bytes_of(array: np.ndarray) -> memoryview:
    """The bytes of ``array`` in C order, without a copy where it is already laid out so.

    The padding of x87 extended-precision numbers (``np.longdouble`` on x86:
    10 bytes of value in 16) holds whatever memory held: it is written as
    zeros, so that the same values always make the same file.

    >>> import numpy as np
    >>> values = np.array([1.5, -2.0], np.longdouble)
    >>> bytes(_bytes_of(values)) == bytes(_bytes_of(values.copy())), np.array_equal(
    ...     np.frombuffer(_bytes_of(values), np.longdouble), values)
    (True, True)
    """
    contiguous = np.ascontiguousarray(array)
    padding = _padding(contiguous.dtype)
    if padding:
        contiguous = contiguous.copy()  # never the caller's array, which may be the source's
        numbers = contiguous.reshape(-1).view(np.uint8).reshape(-1, contiguous.dtype.itemsize)
        for unused in padding:
            numbers[:, unused] = 0
    return contiguous.reshape(-1).view(np.uint8).data


_X87_BYTES = 10  # an x87 extended-precision number, stored in 12 or 16 bytes
_X87 = np.finfo(np.longdouble).nmant == 63 and np.dtype(np.longdouble).itemsize > _X87_BYTES


def _padding(dtype: np.dtype) -> list[slice]:
    """The bytes of each element of ``dtype`` that hold no value: those after each x87 number's 10 bytes."""
    if not _X87 or dtype.kind not in "fc" or not dtype.isnative:
        return []
    size = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    if size != np.dtype(np.longdouble).itemsize:
        return []
    return [slice(start + _X87_BYTES, start + size) for start in range(0, dtype.itemsize, size)]


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass

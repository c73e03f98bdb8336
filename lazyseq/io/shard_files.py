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

A shard's CRC-32 is computed in a thread of its own while the shard is
written: ``zlib.crc32`` and a file's ``write`` both release the GIL on large
buffers, so on two cores the checksum costs little more than the write.
"""

from __future__ import annotations

import io
import os
import re
import threading
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import BinaryIO

import numpy as np

from .shard_layout import Field, ShardFile
from .shard_sync import sync_directory

__all__ = [
    "ChecksumThreads",
    "checksum",
    "matches",
    "npy_header",
    "remove_temporaries",
    "replace_atomically",
    "temporary_name",
    "write_npy_files",
]

_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{8}\.tmp")
_READ_SIZE = 8 * 2**20
_CHECKSUM_APART_ABOVE = 256 * 2**10  # bytes: smaller buffers cost more to hand over than to sum here


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


def temporary_name(path: str) -> str:
    """A fresh hidden name next to ``path``, which :func:`remove_temporaries` recognizes."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.{os.urandom(4).hex()}.tmp")


def remove_temporaries(directory: str) -> None:
    """Remove what writers killed mid-file left behind in ``directory``."""
    for name in os.listdir(directory):
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
    checksums: ChecksumThreads | None = None,
) -> tuple[ShardFile, ...]:
    """Write one ``.npy`` file per field, each ``headers[j]`` then the rows of field ``j`` of every block.

    The files get their final ``names`` together, once all of them are
    complete (``sync``: and on disk, else the caller syncs them later, or not
    at all); an exception on the way removes every temporary file. The
    directory is not synced here (once per file would cost as much as the
    files): whoever relies on the renames lasting syncs it once, after all of
    them (the manifest is written so). CRC-32s of large buffers are computed
    by a thread of ``checksums`` (default: one started for these files).
    """
    paths = [os.path.join(directory, name) for name in names]
    temporaries = [temporary_name(path) for path in paths]
    try:
        with ExitStack() as stack:
            files = [stack.enter_context(open(t, "wb")) for t in temporaries]
            summed = _Checksums(files, stack, checksums)
            for j, header in enumerate(headers):
                summed.write(j, header)
            for arrays in blocks:
                for j, array in enumerate(arrays):
                    summed.write(j, _bytes_of(array))
            summed.wait()
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
    return tuple(ShardFile(name, size, crc) for name, size, crc in zip(names, summed.sizes, summed.crcs))


def checksum(path: str) -> tuple[int, int]:
    """The size and CRC-32 of the file ``path``."""
    crc, size = 0, 0
    buffer = bytearray(_READ_SIZE)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as file:
        while count := file.readinto(buffer):
            crc = zlib.crc32(view[:count], crc)
            size += count
    return size, crc


def matches(directory: str, expected: ShardFile) -> bool:
    """Whether ``expected.name`` in ``directory`` has the size and checksum recorded for it."""
    path = os.path.join(directory, expected.name)
    try:
        if os.stat(path).st_size != expected.size:
            return False
        return checksum(path) == (expected.size, expected.crc32)
    except FileNotFoundError:
        return False


class ChecksumThreads:
    """Threads that compute the CRC-32s of the shards this process writes, kept from one shard to the next.

    Started at first use, up to ``size`` (one per thread writing shards at
    once), and stopped by :meth:`close`. Starting a thread for each shard
    instead costs about 0.3 ms, a tenth of writing a 4 MiB shard. Only the
    process that made this object, which closes it, keeps threads: in a
    forked child, or in a worker process that unpickled it (a Ray worker may
    unpickle one per task, and nobody would close them), :meth:`pool` is
    None, and each shard starts and joins a thread of its own.
    """

    def __init__(self, size: int, owner: bool = True) -> None:
        self.size = size
        self._owner = os.getpid() if owner else -1
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def pool(self) -> ThreadPoolExecutor | None:
        if os.getpid() != self._owner:
            return None
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.size, thread_name_prefix="lazyseq-crc32")
            return self._pool

    def __reduce__(self) -> tuple:  # to another process: no threads kept there
        return (ChecksumThreads, (self.size, False))

    def close(self) -> None:
        """Stop the threads (once they have finished what they were given)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and os.getpid() == self._owner:
            pool.shutdown()


class _Checksums:
    """Writes to ``files``, keeping the size and CRC-32 of everything written to each.

    From the first large buffer on, the CRC-32s are computed by another
    thread (one of ``threads``, or one started for these files and joined
    when ``stack`` closes), each buffer's while this thread writes it and
    makes the next; at most one buffer waits for its own. :meth:`wait`
    before reading :attr:`crcs`.
    """

    def __init__(self, files: Sequence[BinaryIO], stack: ExitStack, threads: ChecksumThreads | None = None) -> None:
        self._files = files
        self._stack = stack
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self.sizes = [0] * len(files)
        self.crcs = [0] * len(files)

    def write(self, j: int, data: bytes | memoryview) -> None:
        """Write ``data`` to file ``j``."""
        self.sizes[j] += len(data)
        if self._pool is None:
            if len(data) < _CHECKSUM_APART_ABOVE:
                self._add(j, data)
                self._files[j].write(data)
                return
            shared = self._threads.pool() if self._threads is not None else None
            if shared is not None:
                self._pool = shared
            else:
                self._pool = self._stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="lazyseq-crc32"))
        self.wait()
        self._pending = self._pool.submit(self._add, j, data)  # which holds on to the buffer until it is summed
        self._files[j].write(data)

    def _add(self, j: int, data: bytes | memoryview) -> None:
        self.crcs[j] = zlib.crc32(data, self.crcs[j])

    def wait(self) -> None:
        """Wait until every buffer written so far is summed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()


def _bytes_of(array: np.ndarray) -> memoryview:
    """The bytes of ``array`` in C order, without a copy where it is already laid out so."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass

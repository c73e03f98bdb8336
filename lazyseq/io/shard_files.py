"""Files that appear whole or not at all: a shard's ``.npy`` files, the manifest, checksums.

Every file is written under a temporary name in its directory (hidden,
ending in ``.tmp``), flushed and synced to disk, then renamed to its final
name. A process killed at any moment leaves a final name holding a complete
file, or nothing but a temporary file, which the next run removes
(:func:`remove_temporaries`), as does the end of a run that finished after
losing a worker. Syncing the directory makes the renames before
it last through a power loss: the manifest does so before its own.
"""

from __future__ import annotations

import io
import os
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from typing import BinaryIO

import numpy as np

from .shard_layout import Field, ShardFile

__all__ = [
    "checksum",
    "matches",
    "npy_header",
    "remove_temporaries",
    "replace_atomically",
    "sync_directory",
    "temporary_name",
    "write_npy_files",
]

_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{8}\.tmp")
_READ_SIZE = 8 * 2**20


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


def sync_directory(directory: str) -> None:
    """Make the renames and removals in ``directory`` durable (POSIX; elsewhere a rename is all there is)."""
    if os.name != "posix":
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def replace_atomically(path: str, data: bytes) -> None:
    """Write ``data`` as the file ``path``, which holds its old contents or the new ones, never a mix."""
    temporary = temporary_name(path)
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        _remove_quietly(temporary)
        raise
    sync_directory(os.path.dirname(path) or ".")


def write_npy_files(
    directory: str, names: Sequence[str], headers: Sequence[bytes], blocks: Iterator[list[np.ndarray]]
) -> tuple[ShardFile, ...]:
    """Write one ``.npy`` file per field, each ``headers[j]`` then the rows of field ``j`` of every block.

    The files get their final ``names`` together, once all of them are complete
    and on disk; an exception on the way removes every temporary file. The
    directory is not synced here (once per file would cost as much as the
    files): whoever relies on the renames lasting syncs it once, after all of
    them (the manifest is written so).
    """
    paths = [os.path.join(directory, name) for name in names]
    temporaries = [temporary_name(path) for path in paths]
    try:
        with ExitStack() as stack:
            files = [stack.enter_context(open(t, "wb")) for t in temporaries]
            sums = [_Checksum(file) for file in files]
            for summed, header in zip(sums, headers):
                summed.write(header)
            for arrays in blocks:
                for summed, array in zip(sums, arrays):
                    summed.write(_bytes_of(array))
            for file in files:
                file.flush()
                os.fsync(file.fileno())
        for temporary, path in zip(temporaries, paths):
            os.replace(temporary, path)
    except BaseException:
        for temporary in temporaries:
            _remove_quietly(temporary)
        raise
    return tuple(ShardFile(name, s.size, s.crc32) for name, s in zip(names, sums))


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


class _Checksum:
    """Writes to ``file``, keeping the size and CRC-32 of everything written."""

    def __init__(self, file: BinaryIO) -> None:
        self.write_through: Callable[[bytes | memoryview], object] = file.write
        self.size = 0
        self.crc32 = 0

    def write(self, data: bytes | memoryview) -> None:
        self.crc32 = zlib.crc32(data, self.crc32)
        self.size += len(data)
        self.write_through(data)


def _bytes_of(array: np.ndarray) -> memoryview:
    """The bytes of ``array`` in C order, without a copy where it is already laid out so."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass

"""The rows of several memory-mapped files as one C-contiguous array: the files mapped again, side by side.

numpy's ``take`` gathers rows into memory it is given (``out=``) only from a
C-contiguous array; a fancy index always makes a new array. The strided window
of :mod:`.row_window` is not contiguous, so a batch gathered through it is
made in new memory, then copied where it is wanted (a worker process's shared
slot): for a 0.5 MiB batch that copy costs about as much as the gather.

This module maps the files behind memory-mapped arrays a second time, into one
reserved range of addresses, each at a page boundary chosen so that every row
of every file starts a whole number of rows after the first row of the first
file. Over that range, one ``np.void`` element per row, the rows of all the
files are elements of one C-contiguous array, and ``np.take`` writes a batch
straight into its destination. The pages are the page cache's, shared with
the first mapping: no data is read or copied to build it.

The range between the files stays reserved and unreadable (``PROT_NONE``):
code that read the whole array would crash, not read garbage, so the array
stays private to :class:`~lazyseq.views.row_window.RowWindow`, which reads
only elements computed from valid positions. Linux on x86-64 and ARM64 only
(the flags are Linux's). Each file is opened by name, and must be the very
file mapped first (same device and inode, from ``/proc/self/maps``): one
replaced since is not used. Elsewhere, and where the files cannot be aligned,
are shorter than their maps, are not the files mapped first, or are too many
(each takes two of the mappings a process may have, and the windows of a
process take an eighth of them at most, together), there is no such window
and batches are gathered as before.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import weakref
from collections.abc import Sequence

import numpy as np

from ..fixed_maps import FAILED, LIBC, MAP_FIXED
from .sources import memmap_location

__all__ = ["FileWindow"]

PAGE = mmap.PAGESIZE
MAX_SLACK = 1 << 26  # address space given up per file to align it (lcm of page and row size): 64 MiB at most
_PROT_NONE = 0

# The mappings that the windows alive in this process may take (each file: one, and one for the gap after it),
# one entry per window. A list, whose append and remove are atomic: windows are made and dropped by any thread, and
# a process forked meanwhile inherits no lock held by another.
_mappings_held: list[int] = []


def _room_for(mappings: int) -> bool:
    """Whether windows may take ``mappings`` more: all of them, an eighth at most of what the process may have."""
    return sum(_mappings_held) + mappings <= _max_map_count() // 8


class _Reservation:
    """A range of addresses for ``mappings`` mappings, unmapped (with them) when this object goes away."""

    def __init__(self, libc: ctypes.CDLL, size: int, mappings: int) -> None:
        address = libc.mmap(None, size, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if address in (None, FAILED):
            raise OSError(ctypes.get_errno(), "cannot reserve address space")
        self.address, self.size = address, size
        _mappings_held.append(mappings)
        self._finalizer = weakref.finalize(self, _release, libc, address, size, mappings)

    def map_file(self, libc: ctypes.CDLL, address: int, length: int, path: str, offset: int, identity: tuple) -> None:
        """Map ``length`` bytes of the file at ``path`` from ``offset`` (a page boundary) read-only at ``address``.

        ``identity``: the ``(major, minor, inode)`` the file must have, that of the file mapped first.
        """
        if address < self.address or address + -(-length // PAGE) * PAGE > self.address + self.size:
            raise OSError(f"{path} would be mapped outside the reserved range")  # never: the range is sized for it
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            stat = os.fstat(fd)
            if (os.major(stat.st_dev), os.minor(stat.st_dev), stat.st_ino) != identity:
                raise OSError(f"{path} is not the file mapped first: it was replaced since")
            if stat.st_size < offset + length:  # shorter now: reading past its end would crash (SIGBUS)
                raise OSError(f"{path} is shorter than its memory map")
            got = libc.mmap(address, length, mmap.PROT_READ, mmap.MAP_SHARED | MAP_FIXED, fd, offset)
        finally:
            os.close(fd)
        if got != address:
            raise OSError(ctypes.get_errno(), f"cannot map {path}")


class _Interface:
    """An ``__array_interface__`` over the reserved range, keeping the reservation alive."""

    def __init__(self, interface: dict, reservation: _Reservation) -> None:
        self.__array_interface__ = interface
        self.reservation = reservation


class FileWindow:
    """``array``: one ``np.void`` element per row of the files; ``first[p]``: the element of part ``p``'s row 0."""

    def __init__(self, array: np.ndarray, first: list[int]) -> None:
        self.array = array
        self.first = first

    @classmethod
    def over(cls, arrays: Sequence[np.ndarray]) -> FileWindow | None:
        """A window over the files behind ``arrays`` (C-contiguous memory maps, one row size), or None."""
        if LIBC is None or not _room_for(2 * len(arrays)):  # a mapping per file and per gap
            return None
        row_bytes = arrays[0].itemsize * math.prod(arrays[0].shape[1:])
        mapped_files = _MappedFiles()
        places = []
        for a in arrays:
            where = memmap_location(a) if a.flags.c_contiguous else None
            if where is None or where[1] not in ("r", "r+"):  # copy-on-write maps may differ from their file
                return None
            filename, _, first_byte, length = where[:4]
            identity = mapped_files.get(a.__array_interface__["data"][0])
            if length != a.nbytes or identity is None:
                return None
            places.append((os.fspath(filename), first_byte, length, identity))
        slack = math.lcm(PAGE, row_bytes)
        if row_bytes <= 0 or slack > MAX_SLACK:
            return None
        # each file: up to a page to reach a boundary, the slack to align it, its pages (the last one whole)
        size = sum(first % PAGE + length + slack + 2 * PAGE for _, first, length, _ in places)
        try:
            window = cls._map(places, row_bytes, size)
        except OSError:  # a file gone or unreadable, or no room: the strided window serves
            return None
        if window is None:
            return None
        for a, first in zip(arrays, window.first):  # the files hold what the maps show: same bytes at both ends
            ends = window.array[[first, first + len(a) - 1]]
            if ends.tobytes() != a[[0, -1]].tobytes():
                return None
        return window

    @classmethod
    def _map(cls, places: list, row_bytes: int, size: int) -> FileWindow | None:
        libc = LIBC
        assert libc is not None
        reservation = _Reservation(libc, size, 2 * len(places))
        free = -(-reservation.address // PAGE) * PAGE  # the first address not used yet
        origin = -1  # address of the first file's row 0
        first_rows = []
        for path, first_byte, length, identity in places:
            lead = first_byte % PAGE  # the file is mapped from the page its rows start in
            if origin < 0:
                address = free
                origin = address + lead
            else:
                address = _aligned_page(free, origin - lead, row_bytes)
                if address is None:
                    return None
            reservation.map_file(libc, address, lead + length, path, first_byte - lead, identity)
            first_rows.append((address + lead - origin) // row_bytes)
            free = address + lead + length
        interface = {
            "data": (origin, True),  # read-only
            "shape": ((free - origin) // row_bytes,),
            "typestr": f"|V{row_bytes}",
            "version": 3,
        }
        return cls(np.asarray(_Interface(interface, reservation)), first_rows)


def _release(libc: ctypes.CDLL, address: int, size: int, mappings: int) -> None:
    libc.munmap(address, size)
    _mappings_held.remove(mappings)


def _max_map_count() -> int:
    """How many mappings a process may have: a window leaves most of them to everything else."""
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return 65530  # Linux's default


class _MappedFiles:
    """Which file is mapped at an address of this process: ``(major, minor, inode)``, from ``/proc/self/maps``."""

    def __init__(self) -> None:
        self._maps: list[tuple[int, int, tuple[int, int, int]]] | None = None

    def get(self, address: int) -> tuple[int, int, int] | None:
        if self._maps is None:
            self._maps = []
            try:
                with open("/proc/self/maps") as maps:
                    lines = maps.read().splitlines()
            except OSError:
                return None
            for line in lines:  # "start-end perms offset major:minor inode path"
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or fields[4] == "0":
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                self._maps.append((start, end, (major, minor, int(fields[4]))))
        for start, end, identity in self._maps:
            if start <= address < end:
                return identity
        return None


def _aligned_page(low: int, target: int, row_bytes: int) -> int | None:
    """The first page boundary ``x >= low`` with ``x = target`` modulo ``row_bytes``, or None if there is none."""
    g = math.gcd(PAGE, row_bytes)
    if target % g:  # a page boundary is a multiple of g: so is anything it is congruent to
        return None
    base = -(-low // PAGE) * PAGE
    # base + PAGE * k = target (mod row_bytes): solve for k modulo row_bytes / g
    m = row_bytes // g
    k = ((target - base) // g * pow(PAGE // g, -1, m)) % m if m > 1 else 0
    return base + PAGE * k

"""Memory maps placed at chosen addresses: the C library's ``mmap`` with ``MAP_FIXED``, which Python's lacks.

Linux on x86-64 and ARM64 only (the flags are Linux's); elsewhere ``LIBC`` is
None and callers do without. Two uses: mapping files side by side
(:mod:`lazyseq.views.file_window`), and turning shared pages into private
copies in place, at the same addresses, so that arrays over them stay valid
(:func:`copy_in_place`: a forked child's copy of shared-memory slots).

>>> import mmap, numpy as np
>>> shared = mmap.mmap(-1, mmap.PAGESIZE)  # anonymous and shared: a forked child would see the parent's writes
>>> array = np.frombuffer(shared, dtype=np.uint8)
>>> array[:3] = [1, 2, 3]
>>> copy_in_place(array.ctypes.data, mmap.PAGESIZE) if LIBC is not None else True
True
>>> array[:4].tolist()
[1, 2, 3, 0]
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import sys

__all__ = ["FAILED", "LIBC", "MAP_FIXED", "copy_in_place"]

MAP_FIXED = 0x10  # Linux's value on the machines below (Python's mmap module does not name it)
FAILED = ctypes.c_void_p(-1).value  # what mmap returns when it fails
_MACHINES = ("x86_64", "aarch64")


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or platform.machine() not in _MACHINES:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return libc


LIBC = _libc()


def copy_in_place(address: int, length: int) -> bool:
    """Replace the pages at ``address`` (``length`` bytes, whole pages) with private ones holding the same bytes.

    What other processes write there afterwards is no longer seen here, nor
    the other way round. False where it cannot be done: no ``LIBC``, or the
    system refused the new pages (out of memory; Linux may have dropped the
    old ones already, as ``MAP_FIXED`` replaces them).
    """
    if LIBC is None:
        return False
    data = ctypes.string_at(address, length)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED
    got = LIBC.mmap(address, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
    if got != address:
        return False
    ctypes.memmove(address, data, length)
    return True

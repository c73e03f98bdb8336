"""A fixed pool of shared-memory slots that process workers write results into.

The pool is one anonymous shared mapping: on Linux a ``memfd`` (it has no name,
so nothing can be left behind in ``/dev/shm``, and Docker's small ``/dev/shm``
does not limit it); elsewhere a file in the shared-memory folder (or the
temporary folder), unlinked the moment it is created. Workers receive its file
descriptor over their connection. The memory is freed by the kernel when the
last process that maps it lets go, however that process ends.

A slot delivered to the consumer is *leased*: its arrays are views of one fresh
``uint8`` array per delivery, and the slot returns to the pool only when that
array (hence every view of it) has been garbage collected. A batch is thus
never overwritten while anything still refers to it.

A pool's descriptor is closed by :meth:`SharedSlots.close`, or when the pool
is garbage collected. A process forked from one with pools (a worker process,
say) lets go of its copies of them at once: it closes the descriptors and
unmaps each pool that nothing in it refers to. The slots of the arrays it
inherited become private copies first, as a fork promises (Linux, through
:mod:`lazyseq.fixed_maps`): once the parent lets go of such an array, its slot
takes other batches there, which the child must not see change under it; and
what the child writes into its copy stays its own. The parent's ``fork``
returns once the child has made its copies (or ended; ``COPY_SECONDS`` at
most), so that no batch takes those slots before. The memory of the free
slots is left alone, since in the parent those slots may hold batches again.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import signal
import socket
import tempfile
import threading
import weakref
from collections import deque

import numpy as np

from ..fixed_maps import copy_in_place
from .closing import interrupt_later
from .failures import NoSharedMemory
from .weak_list import WeakList

__all__ = ["SharedSlots", "WorkerSlots", "available_shared_memory", "slot_bytes_for"]

PAGE = mmap.PAGESIZE


def slot_bytes_for(needed: int) -> int:
    """Slot size for results of ``needed`` bytes: whole pages, with room for slightly larger ones."""
    padded = needed + needed // 8
    return max(PAGE, -(-padded // PAGE) * PAGE)


def _shared_folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def available_shared_memory() -> int:
    """Bytes that a new shared pool can use on this machine."""
    if hasattr(os, "memfd_create"):
        try:  # memfd pages are ordinary shared memory: what the kernel says is available
            with open("/proc/meminfo") as info:
                for line in info:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
    stats = os.statvfs(_shared_folder())
    return stats.f_bavail * stats.f_frsize


def anonymous_file(size: int, name: str) -> int:
    """A new file of ``size`` zero bytes that only descriptors reach (named ``name`` in ``/proc/<pid>/fd``).

    A ``memfd``'s size is sealed: no process that opens it can shrink it
    under another that maps it (whose reads there would end it with
    ``SIGBUS``), see :func:`size_sealed`.
    """
    memfd = hasattr(os, "memfd_create")  # (Linux, which has fcntl)
    if memfd:
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    else:
        fd, path = tempfile.mkstemp(prefix="lazyseq-", dir=_shared_folder())
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
        if memfd:
            import fcntl

            try:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            except OSError:  # a kernel (a sandbox) without seals: a consumer of a server reads through the socket
                pass
    except BaseException:
        os.close(fd)
        raise
    return fd


def size_sealed(fd: int) -> bool:
    """Whether the size of the file ``fd`` (a pool another process made) is sealed, as :func:`anonymous_file` seals
    it: mapped, it cannot shrink."""
    if not hasattr(os, "memfd_create"):
        return False
    import fcntl

    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:  # not a memfd
        return False
    return seals & (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) == fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def close_quietly(fd: int) -> None:
    """Close ``fd`` unless it is closed already."""
    try:
        os.close(fd)
    except OSError:
        pass


class SharedSlots:
    """``count`` slots of ``slot_bytes`` each, in the consumer's process.

    The pool is made anew (named ``name``: what ``/proc/<pid>/fd`` shows of
    a ``memfd``), or, given ``fd``, the one that descriptor holds (a pool
    another process made): then the pool takes the descriptor over.
    """

    def __init__(
        self, count: int, slot_bytes: int, owner: str, *, fd: int | None = None, name: str = "lazyseq-slots"
    ) -> None:
        total = count * slot_bytes
        if fd is None:
            free = available_shared_memory()
            if total > free:
                raise NoSharedMemory(
                    f"{owner}: the shared-memory pool needs {total / 2**20:.1f} MiB ({count} slots of "
                    f"{slot_bytes / 2**20:.2f} MiB) but only {free / 2**20:.1f} MiB are available; "
                    "lower the number of buffered items or the item size"
                )
            fd = anonymous_file(total, name)
        self.count = count
        self.slot_bytes = slot_bytes
        self.fd = fd
        self._close_fd = weakref.finalize(self, close_quietly, fd)  # on close(), or when the pool is collected
        try:
            self._map: mmap.mmap | None = mmap.mmap(self.fd, total)
        except BaseException:
            self._close_fd()
            raise
        self._memory: memoryview | None = memoryview(self._map)
        self._slot_memory = [self._memory[k * slot_bytes : (k + 1) * slot_bytes] for k in range(count)]
        self._free = list(range(count))
        self._leases: dict[int, weakref.ref] = {}  # slot -> the lease of the array last made of it
        self._slot_of: dict[int, int] = {}  # id of a lease -> its slot
        # The leases whose arrays are gone, appended by the garbage collector from any thread. Its callback is a
        # method of C, which no Ctrl-C can cut short (one in a callback of Python's is printed and lost), and is
        # not bound to the pool (a pool dropped unclosed goes with its last reference, not with a collection).
        self._returned: deque[weakref.ref] = deque()
        self._lock = threading.Lock()
        self.closed = False
        _pools.add(self)

    def free_count(self) -> int:
        returned, leases = self._returned, self._leases
        while returned:
            lease = returned.popleft()
            slot = self._slot_of.pop(id(lease))
            if leases.get(slot) is lease:
                del leases[slot]
            self._free.append(slot)
        return len(self._free)

    def take(self) -> int:
        """A free slot, or -1 if every slot is in use."""
        return self.take_many(1)[0]

    def take_many(self, count: int) -> list[int]:
        """``count`` slots: free ones first, then -1 for each that has none."""
        free = self._free
        if len(free) < count:
            self.free_count()
        if len(free) >= count:
            taken = free[len(free) - count :]
            del free[len(free) - count :]
            taken.reverse()  # in the order take() would give them
            return taken
        taken = free[::-1]
        free.clear()
        return taken + [-1] * (count - len(taken))

    def give_back(self, slot: int) -> None:
        """Return a slot that was taken but not delivered."""
        self._free.append(slot)

    def memory(self, slot: int) -> memoryview:
        """The bytes of ``slot``, to write a result into (the side that fills the slots)."""
        assert self._memory is not None, "slots written after close()"
        return self._slot_memory[slot]

    def lease(self, slot: int) -> np.ndarray:
        """The bytes of ``slot`` as a fresh array; the slot is free again once that array is gone."""
        assert self._memory is not None, "slots leased after close()"
        # Built on a memoryview, not on another array: numpy then makes ``holder`` the base of
        # every view taken of it, so its lifetime is the lifetime of the delivered data.
        holder = np.frombuffer(self._slot_memory[slot], dtype=np.uint8)
        lease = self._leases[slot] = weakref.ref(holder, self._returned.append)
        self._slot_of[id(lease)] = slot
        return holder

    def leased(self, slot: int) -> bool:
        """Whether an array leased for ``slot`` is still in use."""
        lease = self._leases.get(slot)
        return lease is not None and lease() is not None

    def close(self, *, free_unleased: bool = True) -> None:
        """Stop handing out slots. The memory lives on while delivered arrays still use it.

        ``free_unleased=False``: the memory of the slots no array uses is left
        as it is (a forked child's copy of a pool that its parent uses on).
        """
        if self.closed:
            return
        self.closed = True
        self._close_fd()
        self._memory = None
        for view in self._slot_memory:  # exported views would keep the map from closing
            view.release()
        self._slot_memory = []
        assert self._map is not None  # closed once: see self.closed
        try:
            self._map.close()
        except BufferError:  # delivered arrays still point into it: it goes with the last of them
            if free_unleased:
                self._free_unleased(self._map)
        self._map = None

    def has_leases(self) -> bool:
        """Whether arrays still use slots of this pool."""
        return self._memory is not None and any(self.leased(slot) for slot in list(self._leases))

    def copy_leased(self) -> None:
        """In a forked child: the pages of the slots that inherited arrays use become private copies."""
        if self._memory is None:
            return
        held = sorted(slot for slot in list(self._leases) if self.leased(slot))
        if not held:
            return
        base = np.frombuffer(self._memory, dtype=np.uint8).ctypes.data  # page-aligned: the start of the map
        ranges: list[list[int]] = []  # [first page, end] of the slots held, merged where they share pages
        for slot in held:
            first = slot * self.slot_bytes // PAGE * PAGE
            end = -(-(slot + 1) * self.slot_bytes // PAGE) * PAGE
            if ranges and first <= ranges[-1][1]:
                ranges[-1][1] = max(ranges[-1][1], end)
            else:
                ranges.append([first, end])
        for first, end in ranges:
            copy_in_place(base + first, end - first)

    def _free_unleased(self, mapped: mmap.mmap) -> None:
        """Give the memory of every slot that no delivered array uses back to the system (Linux), now.

        A kept item, however small (a slice of one), keeps the whole mapping,
        and without this the memory of every slot, until it goes.
        """
        if not hasattr(mmap, "MADV_REMOVE"):
            return
        held = {slot for slot in list(self._leases) if self.leased(slot)}
        for slot in range(self.count):
            if slot not in held:
                try:
                    mapped.madvise(mmap.MADV_REMOVE, slot * self.slot_bytes, self.slot_bytes)
                except OSError:  # not a shared-memory file (the fallback of other systems): it stays until then
                    return


class WorkerSlots:
    """The same pool as seen from a worker process, from the descriptor it was sent."""

    def __init__(self, fd: int, count: int, slot_bytes: int) -> None:
        self.count = count
        self.slot_bytes = slot_bytes
        self._map = mmap.mmap(fd, count * slot_bytes)
        os.close(fd)
        memory = np.frombuffer(self._map, dtype=np.uint8)
        self._slots = [memory[k * slot_bytes : (k + 1) * slot_bytes] for k in range(count)]
        self._address = memory.ctypes.data

    def slot(self, slot: int) -> np.ndarray:
        """The bytes of ``slot``."""
        return self._slots[slot]

    def address(self, slot: int) -> int:
        """Where ``slot`` begins in this process's memory."""
        return self._address + slot * self.slot_bytes


_pools: WeakList[SharedSlots] = WeakList()  # the pools of this process (closing one twice: no-op)
_forking = threading.local()  # the sockets of a fork under way in this thread, whose child copies leased slots
COPY_SECONDS = 5.0  # how long a parent waits for its forked child to copy the slots it inherited arrays in


def _before_fork() -> None:
    """Arrays here use slots: the child will say on a socket when it has copied them (see the module)."""
    _forking.ends = None
    try:
        if any(pool.has_leases() for pool in _pools):
            _forking.ends = socket.socketpair()
    except KeyboardInterrupt:
        interrupt_later()


def _after_fork_in_parent() -> None:
    """Wait for the child to copy the slots it inherited arrays in: until then, no other batch may take them.

    A Ctrl-C meanwhile ends the wait, and is raised once ``fork`` returns
    (an exception here would be printed and dropped).
    """
    ends = getattr(_forking, "ends", None)
    if ends is None:
        return
    _forking.ends = None
    waiting, told = ends
    try:
        told.close()
        done = select.poll()
        done.register(waiting, select.POLLIN)
        done.poll(COPY_SECONDS * 1000)  # a byte, or the end: a child that ended before
    except KeyboardInterrupt:
        interrupt_later()
    finally:
        waiting.close()


def _let_go_of_inherited_pools() -> None:
    """In a forked child: the parent's pools are the parent's (see the module).

    A Ctrl-C is held back meanwhile: one in the middle of a copy would leave
    the slot's pages empty.
    """
    ends = getattr(_forking, "ends", None)
    _forking.ends = None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
    try:
        for pool in list(_pools):
            pool.copy_leased()
            pool.close(free_unleased=False)
    finally:
        if ends is not None:
            waiting, told = ends
            waiting.close()
            with contextlib.suppress(OSError):  # a parent that stopped waiting: nobody to tell (no SIGPIPE)
                told.send(b"c", getattr(socket, "MSG_NOSIGNAL", 0))
            told.close()
        try:
            if mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C held back is raised here
        except KeyboardInterrupt:
            interrupt_later()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_let_go_of_inherited_pools
)

"""The worker processes of a run, told apart from those of a run killed before: none writes after its run.

A run holds its directory's lock (see
:func:`~.shard_directory.writing_alone`), which goes with its process, and
a run killed (``SIGKILL``) lets go of it at once. Its worker processes end
only once they notice (within a quarter of a second, see
:mod:`lazyseq.loading.parent_watch`), and a shard they finish meanwhile would
land in the directory of the run that followed: temporary files left there,
or a shard of the old run in place of one the new run had written and
recorded. So each worker process of a run holds a shared lock on the run's
progress log (:data:`~.shard_layout.PROGRESS`) while it writes a shard or a
piece of one, and goes on only if its consumer is still there once it holds
it; a new run, holding the directory's lock, waits until no worker holds the
log's before it replaces it (``BlockingIOError`` after
:data:`STALE_WAIT_SECONDS`). The
locks are ``flock``\\ s (POSIX), gone with the processes; on a system without
them, runs are not told apart. Ray's workers outlive runs, and take no lock: a
run killed leaves its Ray tasks to end on their own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..loading.parent_watch import consumer_gone, watched
from .parent_locks import parents_only
from .shard_layout import PROGRESS

__all__ = ["STALE_WAIT_SECONDS", "no_stale_writers", "writing_for"]

STALE_WAIT_SECONDS = 2.0  # how long a new run waits for the worker processes of one killed to end
_held: set[int] = parents_only(set())  # the descriptors of the progress logs this process holds locked now


@contextmanager
def writing_for(directory: str, consumer: int) -> Iterator[None]:
    """Within the block, a worker process of lazyseq's that writes into ``directory`` for the run of process
    ``consumer`` holds the shared lock of the run's progress log; it ends at once if that run was killed."""
    if os.getpid() == consumer or not watched():  # the run's own process, or not a worker of it (Ray's)
        yield
        return
    try:
        import fcntl

        fd = os.open(os.path.join(directory, PROGRESS), os.O_RDONLY)
    except (ImportError, OSError):  # no locks here; or no progress log: nothing to tell apart
        yield
        return
    _held.add(fd)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # (a new run looks at it a moment, with the directory's lock held)
        except OSError:  # a file system without locks
            pass
        if consumer_gone():  # killed before this process held the lock: a new run may write there now
            os._exit(1)
        yield
    finally:
        _held.discard(fd)
        os.close(fd)  # (and the lock with it)


def no_stale_writers(directory: str) -> None:
    """With ``directory``'s lock held, before a run replaces its progress log: wait until no worker process of an
    earlier run holds the log's lock (``BlockingIOError`` if one still does after ``STALE_WAIT_SECONDS``)."""
    try:
        import fcntl

        fd = _open(os.path.join(directory, PROGRESS))
    except (ImportError, OSError):  # no progress log: no run left workers
        return
    try:
        deadline = time.monotonic() + STALE_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BlockingIOError(
                        f"write_npy: worker processes of an earlier run into {directory}, which was killed, still "
                        f"write there {STALE_WAIT_SECONDS:g} s later: wait until they end (kill them if they hang), "
                        "then call again"
                    ) from None
                time.sleep(0.01)  # they end within a quarter of a second of their consumer
            except OSError:  # a file system without locks
                return
    finally:
        os.close(fd)  # (and the lock with it)


def _open(path: str) -> int:
    """``path`` opened to be locked exclusively: for writing where allowed (NFS locks need it), else for reading."""
    try:
        return os.open(path, os.O_RDWR)
    except PermissionError:
        return os.open(path, os.O_RDONLY)

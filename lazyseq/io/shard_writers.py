"""The worker processes of a run, told apart from those of a run killed before: none writes after its run.

A run holds its directory's lock (see
:func:`~.shard_directory.writing_alone`), which goes with its process, and
a run killed (``SIGKILL``) lets go of it at once. Its worker processes end
only once they notice (within a quarter of a second, see
:mod:`lazyseq.loading.parent_watch`), and a shard they finish meanwhile would
land in the directory of the run that followed: temporary files left there,
or a shard of the old run in place of one the new run had written and
recorded. So each worker process of a run holds a shared lock on the run's
progress log (:data:`~.shard_layout.PROGRESS`) for as long as it lives, and
goes on only if its consumer is still there once it holds it; a new run,
holding the directory's lock, waits until no worker holds the log's before
it replaces it (``BlockingIOError`` after :data:`STALE_WAIT_SECONDS`). The
locks are ``flock``\\ s (POSIX), gone with the processes; on a system without
them, runs are not told apart.
"""

from __future__ import annotations

import contextlib
import os
import time

from ..loading.parent_watch import consumer_gone, watched
from .shard_layout import PROGRESS

__all__ = ["STALE_WAIT_SECONDS", "hold_while_writing", "no_stale_writers"]

STALE_WAIT_SECONDS = 2.0  # how long a new run waits for the worker processes of one killed to end
_held: dict[str, int] = {}  # directory -> the descriptor of its progress log, locked by this worker process


def hold_while_writing(directory: str) -> None:
    """In a worker process of lazyseq's, before it writes into ``directory``: the shared lock of the run's progress
    log, held until the process ends; the process ends at once if its consumer is gone already."""
    if directory in _held or not watched():  # (a Ray worker outlives runs: it holds nothing)
        return
    try:
        import fcntl

        fd = os.open(os.path.join(directory, PROGRESS), os.O_RDONLY)
    except (ImportError, OSError):  # no locks here; or no progress log: nothing to tell apart
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # (a new run looks at it a moment, with the directory's lock held)
    except OSError:  # a file system without locks
        os.close(fd)
        return
    _held[directory] = fd
    if consumer_gone():  # killed before this process held the lock: a new run may write there now
        os._exit(1)


def no_stale_writers(directory: str) -> None:
    """With ``directory``'s lock held, before a run replaces its progress log: wait until no worker process of an
    earlier run holds the log's lock (``BlockingIOError`` if one still does after ``STALE_WAIT_SECONDS``)."""
    try:
        import fcntl

        fd = os.open(os.path.join(directory, PROGRESS), os.O_RDONLY)
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


def _let_go_in_child() -> None:
    """In a process forked by a worker (by the user's code): the locks are the worker's, to end with it."""
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_let_go_in_child)

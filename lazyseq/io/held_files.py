"""Hidden files held by the process that writes them: one killed mid-way leaves its file unheld, to be removed.

``evaluate`` writes an output path under a hidden name beside it
(:func:`~.shard_files.temporary_name`) and renames it once every row is in;
an error removes it. A process killed (``SIGKILL``, the out-of-memory
killer, a preempted machine) cannot: it leaves a file as large as the
output. So the writer holds an ``flock`` on each such file while it writes
it (:func:`hold_new`), which goes with its process, and the next writer of
the same path removes the hidden files beside it that nobody holds
(:func:`remove_unheld`): those of a live writer stay. On a system without
locks, none is removed. A forked child closes the descriptors it inherited
(see :mod:`.parent_locks`): the lock stays its parent's.

>>> import os, tempfile
>>> from lazyseq.io.shard_files import temporary_name
>>> folder = tempfile.mkdtemp()
>>> target = os.path.join(folder, "out.npy")
>>> left = temporary_name(target)
>>> open(left, "wb").close()  # what a writer killed mid-way left
>>> held = temporary_name(target)
>>> lock = hold_new(held)  # a writer at work
>>> remove_unheld(target)
>>> os.path.exists(left), os.path.exists(held)
(False, True)
>>> let_go(lock); os.remove(held); os.rmdir(folder)
"""

from __future__ import annotations

import contextlib
import os
import re

from .parent_locks import parents_only
from .shard_files import temporary_names

__all__ = ["hold_new", "let_go", "remove_unheld"]

_held: set[int] = parents_only(set())  # the descriptors of the hidden files this process holds


def hold_new(path: str) -> int | None:
    """Make the file ``path`` (``FileExistsError`` if there is one) and hold it: its descriptor, which holds the lock,
    or None on a system without locks."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (ImportError, OSError):  # no locks here
        os.close(fd)
        return None
    _held.add(fd)
    return fd


def let_go(fd: int | None) -> None:
    """Stop holding the file that :func:`hold_new` made (the file stays)."""
    if fd is not None and fd in _held:
        _held.discard(fd)
        os.close(fd)


def remove_unheld(target: str) -> None:
    """Remove the hidden files beside ``target`` (``temporary_name``'s) that no process holds: left by one killed."""
    folder, name = os.path.split(target)
    hidden = temporary_names(re.escape(name))
    try:
        import fcntl

        names = os.listdir(folder or ".")
    except (ImportError, OSError):  # no locks here, or no folder to look in
        return
    for entry in names:
        if not hidden.fullmatch(entry):
            continue
        path = os.path.join(folder, entry)
        try:
            fd = os.open(path, os.O_RDWR)  # (for writing: an exclusive lock on NFS needs it)
        except OSError:  # gone meanwhile, or not ours to open
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a writer at work (or a system without locks)
            continue
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        finally:
            os.close(fd)

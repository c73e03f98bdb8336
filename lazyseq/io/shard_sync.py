"""Files made durable: a file or a directory synced to disk, and :class:`Syncer`, which syncs shards in the background.

A file's data survives the end of the process that wrote it as soon as it is
written (the kernel's page cache keeps it); only a power loss or a crash of
the machine can lose what was not synced. Syncing a file by name, from any
process of the machine that wrote it, flushes every write to it: the page
cache belongs to the file, not to the descriptor that wrote (a database's
checkpointer relies on the same).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable

__all__ = ["Syncer", "sync_directory", "sync_file"]


def sync_file(path: str) -> None:
    """Flush ``path``'s data to disk, whoever wrote it on this machine."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_directory(directory: str) -> None:
    """Make the renames and removals in ``directory`` durable (POSIX; elsewhere a rename is all there is)."""
    if os.name == "posix":
        sync_file(directory)


class Syncer:
    """Syncs files to disk in a thread of its own, while the caller goes on; :meth:`wait` until all are.

    The thread starts with the first file and ends at :meth:`wait` or at the
    end of the ``with`` block, whatever ends it (an exception, an interrupt).
    A failed sync is raised by :meth:`wait`, with a note naming the file; the files after it are not synced.

    >>> import os, shutil, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "a.txt"), "w") as file:
    ...     _ = file.write("data")
    >>> with Syncer(folder) as syncer:
    ...     syncer.add(["a.txt"])
    ...     syncer.wait()
    >>> shutil.rmtree(folder)
    """

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._names: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stop = False

    def add(self, names: Iterable[str]) -> None:
        """Sync the files ``names`` of the directory, soon."""
        for name in names:
            self._names.put(name)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lazyseq-write_npy-sync", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while (name := self._names.get()) is not None:
            if self._error is None and not self._stop:
                path = os.path.join(self._directory, name)
                try:
                    sync_file(path)
                except BaseException as error:  # raised by wait(), in the caller's thread
                    error.add_note(f"while syncing {path} to disk")
                    self._error = error

    def wait(self) -> None:
        """Return once every file added is synced (and the thread has ended); raise a sync's failure."""
        self._join()
        if self._error is not None:
            raise self._error

    def _join(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._names.put(None)
            thread.join()

    def __enter__(self) -> Syncer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop = True  # what is left is of no use now: the run failed, or everything was synced
        self._join()

"""A pipe that becomes readable when a result is ready: the ``fds()`` of backends whose results arrive in memory.

Worker threads, and the thread that watches Ray tasks (see
:mod:`.ray_watch`), hand results over without a file descriptor of their
own; a reader that waits on sockets too (a data server) needs one. The pipe
is made at the first :meth:`ResultSignal.fds` call, so loaders that never
ask pay one attribute check per result.

>>> import select
>>> signal = ResultSignal()
>>> fds = signal.fds()
>>> signal.notify()
>>> bool(select.select(fds, [], [], 0)[0])
True
>>> signal.clear()
>>> select.select(fds, [], [], 0)[0]
[]
>>> signal.close()
"""

from __future__ import annotations

import os
import threading

__all__ = ["ResultSignal"]


class ResultSignal:
    """Written to by :meth:`notify` (any thread), emptied by :meth:`clear` before the reader looks for results."""

    def __init__(self) -> None:
        self._read_fd = self._write_fd = -1
        self._lock = threading.Lock()  # no byte is ever written to a descriptor closed (and perhaps reused)
        self._written = False  # a byte is in the pipe, not read yet: one is enough (each costs both sides a call)

    def fds(self) -> list[int]:
        if self._read_fd < 0:
            read_fd, write_fd = os.pipe()
            for fd in (read_fd, write_fd):
                os.set_blocking(fd, False)
            with self._lock:
                self._read_fd, self._write_fd, self._written = read_fd, write_fd, False
        return [self._read_fd]

    def notify(self) -> None:
        if self._write_fd < 0 or self._written:  # nobody asked for the pipe, or it is readable already
            return
        with self._lock:
            if self._write_fd >= 0:
                self._written = True
                try:
                    os.write(self._write_fd, b"r")
                except OSError:  # full: the reader will look anyway
                    pass

    def clear(self) -> None:
        """Empty the pipe; call it before looking for results (one that arrives after it writes again)."""
        if not self._written:  # nothing notified since the last clear (a notify under way wakes the reader next)
            return
        with self._lock:  # not between a notify's flag and its byte: a byte left unread with the flag down would
            if self._read_fd >= 0:  # wake the reader at once, again and again
                try:
                    os.read(self._read_fd, 1 << 16)
                except BlockingIOError:
                    pass
            # (after the read: a result notified meanwhile wrote nothing, and is in the queue the caller looks at)
            self._written = False

    def close(self) -> None:
        with self._lock:
            fds, self._read_fd, self._write_fd = (self._read_fd, self._write_fd), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)

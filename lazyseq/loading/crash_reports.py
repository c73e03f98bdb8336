"""What a worker process's Python says as it crashes, for the error that reports its death.

A worker ended by a fatal signal (a segfault in an extension module, say)
tells the consumer nothing but the signal: Python prints where it crashed
only with :mod:`faulthandler` on, and then to the worker's standard error,
which may be a terminal nobody watches (a notebook's kernel, a job's log).
So the consumer makes each worker a file of its own, anonymous and in
memory (nothing is left behind, whatever ends the processes), and hands it
over as the worker starts; the worker turns :mod:`faulthandler` on into it
(its Python stack at a SIGSEGV, SIGBUS, SIGFPE, SIGABRT or SIGILL); and
:class:`~lazyseq.WorkerDied`'s message quotes what is there when the worker
dies.

>>> import ctypes, multiprocessing
>>> mine, theirs = multiprocessing.Pipe()
>>> def crash(conn):
...     report_crashes(conn)
...     ctypes.string_at(0)  # a segfault
>>> worker = multiprocessing.get_context("fork").Process(target=crash, args=(theirs,))
>>> worker.start()
>>> report = CrashReport()
>>> report.send(mine, worker.pid)
>>> worker.join()
>>> print(report.text().splitlines()[0])
Fatal Python error: Segmentation fault
>>> report.close(); mine.close(); theirs.close()
"""

from __future__ import annotations

import faulthandler
import os
import tempfile
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle

__all__ = ["CrashReport", "report_crashes"]

MOST_READ = 1 << 16  # bytes read of a report: the fatal error and the stack of the thread that crashed come first
MOST_LINES = 40  # lines quoted in an error


class CrashReport:
    """The file where one worker process reports its crash (see the module)."""

    def __init__(self) -> None:
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("lazyseq-crash-report", os.MFD_CLOEXEC)
        else:  # unlinked at once: gone with its last descriptor, as a memfd is
            with tempfile.TemporaryFile(prefix="lazyseq-crash-report-") as file:
                self.fd = os.dup(file.fileno())

    def send(self, conn: Connection, pid: int) -> None:
        """Hand the file over to the worker process ``pid`` at the other end of ``conn``, the first message it reads
        (see :func:`report_crashes`); nothing if it has ended already.

        Where the system wants each descriptor acknowledged (macOS), this
        waits for the worker to take it: workers started first, then sent
        theirs, start side by side.
        """
        try:
            send_handle(conn, self.fd, pid)
        except OSError:  # its end is closed: its death is reported as that end is read
            pass

    def text(self) -> str:
        """What the worker reported: its fatal error and stack, at most ``MOST_LINES`` lines ('' if nothing)."""
        if self.fd < 0:
            return ""
        try:
            data = os.pread(self.fd, MOST_READ, 0)
        except OSError:
            return ""
        lines = _up_to_the_worker(data.decode("utf-8", "replace").strip().splitlines())
        if len(lines) > MOST_LINES:
            lines = lines[:MOST_LINES] + [f"  ({len(lines) - MOST_LINES} more lines)"]
        return "\n".join(lines)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _up_to_the_worker(lines: list[str]) -> list[str]:
    """The lines of a report down to the frames of the worker's own loop (they, and those of multiprocessing and of
    the consumer before a fork, are the same at every crash), without the list of extension modules; all of them if
    the crash came in the worker's own code (sending a result, say).

    >>> _up_to_the_worker([
    ...     "Fatal Python error: Segmentation fault", "", "Stack (most recent call first):",
    ...     '  File "/home/me/train.py", line 4 in f', f'  File "{_LOADING}/jobs.py", line 49 in __call__',
    ...     '  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run', "",
    ...     "Extension modules: numpy._core._multiarray_umath (total: 1)"])
    ['Fatal Python error: Segmentation fault', '', 'Stack (most recent call first):', '  File "/home/me/train.py", \
line 4 in f']
    >>> _up_to_the_worker(["Fatal Python error: Bus error", "", "Stack (most recent call first):",
    ...     f'  File "{_LOADING}/messages.py", line 9 in encode', f'  File "{_LOADING}/worker.py", line 9 in run'])[-2:]
    ['  File ".../messages.py", line 9 in encode', '  File ".../worker.py", line 9 in run']
    """
    kept: list[str] = []
    others = False  # whether a frame outside the worker's code came first
    for line in lines:
        if line.startswith("Extension modules:"):
            break
        if line.startswith('  File "'):
            ours = line.startswith(f'  File "{_LOADING}{os.sep}')
            if ours and others:
                break
            others = others or not ours
        kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    return kept


_LOADING = os.path.dirname(os.path.abspath(__file__))  # the frames of the worker's loop: from here down


def report_crashes(conn: Connection) -> None:
    """In a worker process, as it starts: take the file that the consumer sent over ``conn`` and report a crash of
    this process's Python there (the stack of the thread that crashed)."""
    fd = recv_handle(conn)
    faulthandler.enable(file=fd, all_threads=False)

"""Workers stopped all the way, even when Ctrl-C is pressed again while they stop.

A Ctrl-C (``KeyboardInterrupt``) while a loader reads closes it: worker
processes are asked to stop and get ``STOP_SECONDS`` to do so before they are
terminated, worker threads get ``JOIN_SECONDS`` to finish their item. Users
press Ctrl-C again meanwhile; raised in the middle of closing, that second
interrupt would leave worker processes running and descriptors open, with the
loader marked closed. So while workers close in the main thread (where Python
raises ``KeyboardInterrupt``), an interrupt is noted rather than raised
(:func:`interrupts_deferred`): the waits of the close end early
(:func:`wait_unless_hurried`: worker processes are terminated at once, worker
threads are left to end their item on their own), and ``KeyboardInterrupt``
is raised once everything is released. A program that installed its own
SIGINT handler keeps it: the close is then interrupted as the handler says.

>>> with interrupts_deferred():
...     wait_unless_hurried(lambda seconds: True, 1.0)  # a wait that ends at once
True
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["interrupts_deferred", "wait_unless_hurried"]

SLICE_SECONDS = 0.05  # a wait looks for a second Ctrl-C this often

_hurry = threading.Event()  # set by a Ctrl-C while workers close


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Within the block, a Ctrl-C hurries the waits and is raised at its end (main thread, default handler only)."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield  # no interrupt to defer here, or one within a deferral already, or the program's own handler
        return
    interrupted = []

    def note(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        _hurry.set()

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _hurry.clear()
    if interrupted:
        raise KeyboardInterrupt


@contextmanager
def ignored_by_children() -> Iterator[None]:
    """Processes spawned in the block ignore Ctrl-C from their first instruction (main thread, POSIX).

    SIGINT is ignored here meanwhile: a spawned process inherits that through
    ``exec``, and Python then leaves it ignored, so a Ctrl-C sent to the whole
    process group prints no traceback from a worker still importing. The
    signal is also blocked in this thread meanwhile: one sent to it waits,
    and is handled at the end of the block (Linux; one that another thread
    takes in is lost, as is any during the block on other systems).
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def wait_unless_hurried(wait: Callable[[float], bool], seconds: float) -> bool:
    """``wait(timeout)`` until it says it is done (True), for ``seconds`` at most, or until a Ctrl-C hurries it (False)."""
    deadline = time.monotonic() + seconds
    while not _hurry.is_set():
        left = deadline - time.monotonic()
        if wait(max(0.0, min(left, SLICE_SECONDS))):
            return True
        if left <= SLICE_SECONDS:
            return False
    return False

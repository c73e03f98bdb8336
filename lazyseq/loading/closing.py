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
Where Python would print and drop that ``KeyboardInterrupt`` (a close run by
the garbage collector, a fork hook), it is raised again in the main thread a
moment later (:class:`Finalizer`, :func:`interrupt_later`).

>>> with interrupts_deferred():
...     wait_unless_hurried(lambda seconds: True, 1.0)  # a wait that ends at once
True
"""

from __future__ import annotations

import _thread
import multiprocessing
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "Finalizer",
    "blocked_for_children",
    "closing_for_collector",
    "collected_while_running",
    "daemon_thread_at_exit",
    "hurried",
    "ignore_interrupts",
    "interrupts_deferred",
    "interrupt_later",
    "interrupts_held",
    "wait_unless_hurried",
]

SLICE_SECONDS = 0.05  # a wait looks for a second Ctrl-C this often
INTERRUPT_AGAIN_SECONDS = 0.2  # a Ctrl-C caught where it would be dropped is raised again this long after

# True once a Ctrl-C came while workers close: a plain flag, not an Event, whose lock a second Ctrl-C could find
# held by the handler it interrupts (or by the clear() it lands in), and wait on for ever
_hurry = [False]


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Within the block, a Ctrl-C hurries the waits and is raised at its end (main thread, default handler only)."""
    if threading.current_thread() is not threading.main_thread() or not _python_takes_sigint():
        yield  # no interrupt to defer here, or one within a deferral already, or the program's own handler
        return
    interrupted = []

    def note(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        _hurry[0] = True

    note.raises_later = True  # type: ignore[attr-defined]  # what _interrupt_main looks for
    _hurry[0] = False  # not hurried by a Ctrl-C that came at the very end of an earlier deferral
    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    except Exception as error:
        if interrupted:  # the interrupt came first, and most likely caused this (a process it ended): it is raised
            raise _interrupt_that_ended(error) from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        _hurry[0] = False
    if interrupted:
        raise KeyboardInterrupt


def _interrupt_that_ended(error: Exception) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` to raise for ``error``, which followed a Ctrl-C: one line says what failed.

    A Ctrl-C pressed in a terminal reaches every process of the group: a
    forkserver that multiprocessing is starting ends, and the start fails with
    an error of its own (``EOFError``, ``ConnectionRefusedError``), whose
    traceback says nothing the user needs.

    >>> _interrupt_that_ended(EOFError("unexpected EOF")).__notes__
    ['while this stopped: EOFError: unexpected EOF']
    """
    interrupt = KeyboardInterrupt()
    interrupt.add_note(f"while this stopped: {type(error).__name__}: {error}")
    return interrupt


@contextmanager
def blocked_for_children() -> Iterator[None]:
    """Processes spawned in the block hold Ctrl-C back from their first instruction (POSIX).

    SIGINT is blocked in this thread meanwhile: a process started from it
    inherits the blocked signal through ``exec``, so a Ctrl-C sent to the whole
    process group waits in a worker still importing, rather than print its
    traceback, until the worker ignores SIGINT and unblocks it (see
    :func:`ignore_interrupts`). Here, how SIGINT is handled does not change: one
    that another thread takes in is handled as usual (raised in the main
    thread, or noted by :func:`interrupts_deferred`), and one sent to this
    thread waits for the end of the block. Any thread (a data server's starts
    its workers) may start them so.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # as a process starting needs it; started in the block, it would unblock SIGINT
    with interrupts_held():
        yield


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Within the block, a SIGINT sent to this thread waits, and is handled as usual once the block ends (POSIX).

    For blocking calls that a signal cuts short for good: ZeroMQ's
    ``context.term()`` gives up when a signal interrupts it, and leaves the
    context's threads running.

    >>> import signal, threading
    >>> try:
    ...     with interrupts_held():
    ...         signal.pthread_kill(threading.get_ident(), signal.SIGINT)
    ...         print("not interrupted here")
    ... except KeyboardInterrupt:
    ...     print("but here")
    not interrupted here
    but here
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def ignore_interrupts() -> None:
    """In a worker process: ignore SIGINT (the consumer decides what a Ctrl-C means), and drop one held back;
    SIGTERM ends it (a handler inherited from a forking program, which may take it as Ctrl-C, does not).

    A worker started with SIGINT blocked (:func:`blocked_for_children`) may
    hold one sent while it started: ignored first, it is dropped when unblocked.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def hurried() -> bool:
    """Whether a Ctrl-C came within an :func:`interrupts_deferred` block still going on (to be raised at its end)."""
    return _hurry[0]


def wait_unless_hurried(wait: Callable[[float], bool], seconds: float) -> bool:
    """``wait(timeout)`` until it says it is done (True), for ``seconds`` at most, or until a Ctrl-C hurries it (False)."""
    deadline = time.monotonic() + seconds
    while not _hurry[0]:
        left = deadline - time.monotonic()
        if wait(max(0.0, min(left, SLICE_SECONDS))):
            return True
        if left <= SLICE_SECONDS:
            return False
    return False


def daemon_thread_at_exit() -> bool:
    """Whether this is a daemon thread, and the main thread has ended (the program exits once it returns).

    At exit, the finalizers close workers that a daemon thread may still be
    using: what fails there then is no error to report.
    """
    return threading.current_thread().daemon and not threading.main_thread().is_alive()


class Finalizer:
    """``close(*args)`` run once: when called, or when ``owner`` is garbage collected or the program exits.

    Called, it raises what ``close`` raises. Run by the garbage collector, a
    ``KeyboardInterrupt`` that ``close`` raises (a Ctrl-C that came as it
    waited, deferred until everything was released) would be printed as
    "Exception ignored" and dropped: it is raised again in the main thread
    once the collection has returned (:func:`interrupt_later`).

    >>> class Owner:
    ...     pass
    >>> owner = Owner()
    >>> release = Finalizer(owner, print, "released")
    >>> del owner
    released
    >>> release.alive
    False
    """

    __slots__ = ("_finalize", "__weakref__")

    def __init__(self, owner: object, close: Callable[..., None], *args: Any) -> None:
        self._finalize = weakref.finalize(owner, _close_when_collected, close, *args)

    def __call__(self) -> None:
        """Run the close now, if it has not run; its errors, a ``KeyboardInterrupt`` included, are raised here."""
        with interrupts_deferred():  # counted as run from the next line on: it runs to its end, whatever Ctrl-C says
            detached = self._finalize.detach()
            if detached is not None:
                _, _, (close, *args), _ = detached
                close(*args)

    @property
    def alive(self) -> bool:
        """Whether the close has yet to run."""
        return self._finalize.alive

    def also_as_a_child_ends(self, owner: object) -> None:
        """In a process that multiprocessing started (a loader's worker, a worker of torch's ``DataLoader``), run the
        close as the process ends too, unless ``owner`` has gone before.

        Such a process ends with ``os._exit``, and neither :mod:`atexit` nor
        the finalizers of :mod:`weakref` run then: only multiprocessing's own.
        """
        if multiprocessing.parent_process() is not None:
            from multiprocessing.util import Finalize  # (here: imported, it registers a function to run at exit)

            Finalize(owner, self._finalize, exitpriority=0)


def _close_when_collected(close: Callable[..., None], *args: Any) -> None:
    """``close(*args)`` for the garbage collector (or the program's exit): a Ctrl-C is raised again afterwards.

    Only where Python's own handler takes SIGINT: a handler of the program's
    has seen that Ctrl-C already, and whatever it raised goes as Python says.
    """
    with closing_for_collector():
        if not _python_takes_sigint():
            close(*args)
            return
        try:
            with interrupts_deferred():  # counted as run as it starts: it runs to its end, whatever Ctrl-C says
                close(*args)
        except KeyboardInterrupt:
            interrupt_later()


_collecting = threading.local()  # on: this thread runs a close that the garbage collector started


@contextmanager
def closing_for_collector() -> Iterator[None]:
    """Within the block, this thread runs a close that the garbage collector started (in this thread, or in the
    one that asked this one to close: a server's); see :func:`collected_while_running`."""
    before = getattr(_collecting, "on", False)
    _collecting.on = True
    try:
        yield
    finally:
        _collecting.on = before


def collected_while_running() -> bool:
    """Whether this thread runs a close that the garbage collector started while the program runs (not at its exit).

    Nobody waits for such a close's results, and it may run in any statement
    (an assignment that drops the last reference): it waits for nothing that
    may take long, such as worker threads busy in an item.
    """
    return getattr(_collecting, "on", False) and threading.main_thread().is_alive()


def interrupt_later() -> None:
    """Raise a ``KeyboardInterrupt`` caught where it would be printed and dropped (a finalizer, a fork hook) again.

    It is raised in the main thread ``INTERRUPT_AGAIN_SECONDS`` later, once
    the code that caught it has returned, as a Ctrl-C pressed then would be:
    SIGINT is sent to the main thread (which ends a wait it is in, and is
    handled as its handler then says). Nothing is raised if the program is
    already ending, if a handler of the program's takes SIGINT (it has
    seen that Ctrl-C, and raised what was caught), or, in IPython or Jupyter,
    if the cell it was pressed for has ended meanwhile (it would stop the next
    one).
    """
    if not _python_takes_sigint():
        return
    again = threading.Timer(INTERRUPT_AGAIN_SECONDS, _interrupt_main, args=(_ipython_cell(),))
    again.daemon = True
    try:
        with interrupts_deferred():  # a second Ctrl-C as the thread starts (it waits for it) would be printed here
            again.start()
    except RuntimeError:  # no thread can start as the interpreter ends: nobody left to interrupt
        pass
    except KeyboardInterrupt:  # that second Ctrl-C: the one raised again stands for both
        pass


def _interrupt_main(cell: tuple | None = None) -> None:
    """A SIGINT for the main thread, if it still runs the program (where threads cannot be signalled, a flag).

    ``cell``: the IPython cell that ran when the Ctrl-C came (None: not
    IPython); if another runs now, or none, nothing is sent.
    """
    main = threading.main_thread()
    handler = signal.getsignal(signal.SIGINT)
    # ending; or SIGINT no longer Python's to raise (a deferral of lazyseq's, another close, raises it at its end)
    if not main.is_alive() or not (handler is signal.default_int_handler or getattr(handler, "raises_later", False)):
        return
    if cell is not None and _ipython_cell() != cell:
        return
    if hasattr(signal, "pthread_kill") and main.ident is not None:
        signal.pthread_kill(main.ident, signal.SIGINT)  # what a Ctrl-C does: a blocking call returns (EINTR)
    else:
        _thread.interrupt_main()  # raised at the main thread's next Python instruction, not during a wait


def _ipython_cell() -> tuple | None:
    """What tells the IPython (or Jupyter) cell running now from the next one; None outside IPython.

    The number IPython counts cells with, which a cell run without history
    (``silent``, a frontend's own code) leaves as it is; in a kernel, the id
    of the request that runs the cell too.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    count = getattr(shell, "execution_count", None)
    if not isinstance(count, int):
        return None
    header = getattr(shell, "parent_header", None)  # ipykernel's: the request being run
    request = header.get("msg_id") or header.get("header", {}).get("msg_id") if isinstance(header, dict) else None
    return (count, request)


def _python_takes_sigint() -> bool:
    """Whether Python's own handler takes SIGINT (raising ``KeyboardInterrupt``), not the program's or none."""
    return signal.getsignal(signal.SIGINT) is signal.default_int_handler

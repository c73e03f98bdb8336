"""What a fork must not carry over: locks held by other threads into a worker, workers into a forked child.

A forked child is a copy of the process with one thread, the one that forked:
a lock another thread held at that moment is held in the child forever, and
the worker waits on it alive, so that nothing reports it. Two such locks are
taken by every worker process, before any of the user's code runs:

- ``sys.stdin``'s, which multiprocessing closes in each new worker (opening
  it again on ``os.devnull``), and which a thread blocked reading standard
  input holds (``input()``, a script waiting for Enter while a server or a
  loader runs in another thread). The child leaves the parent's stream
  object alone (it is kept, never closed) and gets its own on ``os.devnull``.
- the locks of numpy's global random generator and, if it is imported,
  torch's default one, which each worker takes to seed them, and which a
  thread drawing from them (``np.random.standard_normal``, ``torch.randn``)
  holds. The thread that forks takes numpy's first (waiting for a draw in
  progress to end), and both processes release it after the fork. Torch's
  lock cannot be held from Python: the thread that forks reads the
  generator's state, which waits for a draw in progress to end, and keeps the
  GIL from then until the fork, so that a thread drawing in a Python loop
  cannot start its next draw before it. A draw that begins in between (torch
  lets go of the GIL before it takes its lock) is not covered: that worker
  is then ended by a timer (see :mod:`.seeding`), and the loader raises
  ``WorkerDied``, saying why, rather than hang.

(The standard streams' own locks need nothing: multiprocessing flushes them
in the forking thread before it forks.) Only processes that
:func:`forking_workers` forks are concerned; workers started with ``spawn``
or ``forkserver`` begin in a new interpreter, with nothing locked.

The other way round, a process forked from one with worker processes (by
``os.fork()``, by another library) inherits multiprocessing's list of the
children it must stop when it exits: a child that ended with ``sys.exit``
terminated its parent's workers. Workers noted by :func:`started_worker` are
struck from that list in every forked child: they are its parent's. And a
loader's own lock, held by a thread of the parent waiting for an item, would
be held forever in the child: loaders take a :class:`ForkLocalLock`, which a
forked child makes anew (:func:`fork_generation` counts the forks that led
to this process; what a loader made before one belongs to the parent).
Multiprocessing's forkserver is the parent's too: a forked child forgets it
(closing its copy of the descriptor that keeps it alive) and starts its own
when it first needs one, where multiprocessing would fail waiting for a
process that is not its child.

>>> with forking_workers():
...     pass  # start worker processes here
"""

from __future__ import annotations

import multiprocessing.process
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .weak_list import WeakList

__all__ = ["ForkLocalLock", "fork_generation", "forked_worker", "forking_workers", "started_worker"]

_local = threading.local()  # in a forked child, the thread that forked lives on with its values
_kept: list[Any] = []  # a forked worker's inherited stdin: closing or collecting it would take its lock
_workers: WeakList[Any] = WeakList()  # the worker processes this process started (see .weak_list)
_forks = [0]  # how many forks led to this process


def fork_generation() -> int:
    """How many forks led to this process (a number to compare, not to count with)."""
    return _forks[0]


class ForkLocalLock:
    """A reentrant lock, made anew in a forked child (where the parent's may be held by a thread it lacks).

    >>> lock = ForkLocalLock()
    >>> with lock, lock:
    ...     pass
    >>> lock.here().acquire(blocking=False)
    True
    """

    __slots__ = ("_generation", "_lock")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._generation = _forks[0]

    def here(self) -> Any:
        """The lock of this process (a ``threading.RLock``), to hold without ``with``: good until the next fork."""
        if self._generation != _forks[0]:
            self._lock, self._generation = threading.RLock(), _forks[0]
        return self._lock

    def __enter__(self) -> None:
        self.here().acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


@contextmanager
def forking_workers() -> Iterator[None]:
    """Within the block, processes forked by this thread inherit no lock held by another thread (see above)."""
    _local.forking = True
    try:
        yield
    finally:
        _local.forking = False


def forked_worker() -> bool:
    """Whether this process was forked by :func:`forking_workers` (the thread that forked lives on in it)."""
    return bool(getattr(_local, "forking", False)) and _forks[0] > 0


def started_worker(process: multiprocessing.process.BaseProcess) -> None:
    """Note a worker process this process started (see above)."""
    _workers.add(process)


def _random_lock() -> Any:
    return np.random.mtrand._rand._bit_generator.lock  # what np.random.seed, randint, ... hold while they run


def _before_fork() -> None:
    if getattr(_local, "forking", False):
        _random_lock().acquire()
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "default_generator"):
            torch.default_generator.get_state()  # waits for a draw in progress (see above)


def _in_parent() -> None:
    if getattr(_local, "forking", False):
        _random_lock().release()


def _in_child() -> None:
    _forks[0] += 1
    children = getattr(multiprocessing.process, "_children", None)  # what multiprocessing stops at exit
    if isinstance(children, set):
        children.difference_update(_workers)
    _workers.clear()
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is not None:
        _forget_forkserver(forkserver._forkserver)
    tracker = getattr(sys.modules.get("multiprocessing.resource_tracker"), "_resource_tracker", None)
    if tracker is not None and hasattr(tracker, "_lock"):  # held by another thread of the parent, perhaps
        tracker._lock = threading.RLock() if isinstance(tracker._lock, type(threading.RLock())) else threading.Lock()
    if getattr(_local, "forking", False):
        _random_lock().release()
        if sys.stdin is not None:
            _kept.append(sys.stdin)
            sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115  # multiprocessing closes it next


def _forget_forkserver(server: Any) -> None:
    """Make ``server`` (multiprocessing's) start a forkserver anew when next asked for one."""
    if getattr(server, "_forkserver_pid", None) is None:
        return  # none started: nothing to forget
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        try:
            os.close(alive)
        except OSError:
            pass
    for name in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_forkserver_authkey"):
        if hasattr(server, name):
            setattr(server, name, None)
    server._lock = threading.Lock()  # held by another thread of the parent, perhaps
    # Its socket goes in multiprocessing's temporary folder, the parent's until then: removed when the parent ends.
    config = getattr(multiprocessing.process.current_process(), "_config", None)
    if isinstance(config, dict):
        config.pop("tempdir", None)  # the child makes its own, removed when it ends


os.register_at_fork(before=_before_fork, after_in_parent=_in_parent, after_in_child=_in_child)

"""A thread that makes a :class:`~.result_signal.ResultSignal` readable as Ray tasks complete.

A reader that waits on sockets too (a data server) needs a file descriptor
that becomes readable when a Ray task's results arrive. Ray could call a
Python function as each task completes (``ObjectRef.future()``), but it
would call it in the thread that handles the task's reply, which then waits
for the GIL halfway through: ``ray.cancel`` of that task meanwhile (a loader
closed while its consumer's thread holds the GIL) aborts the whole process in
Ray 2.60 ("Tried to complete task that was not pending"). So nothing of
lazyseq runs in Ray's threads: this thread asks Ray with ``ray.wait``, which
needs no GIL from them, and writes to the signal. It is started by the first
``fds()`` call, so loaders that never ask have no such thread.

It looks every ``WAIT_SECONDS``, and at once when a task is sent, without
waiting in Ray: a ``ray.wait`` under way when Ray shuts down never returns.
It stops looking once the Ray session of its tasks has ended (a ``ray.wait``
without Ray starts a new one).

>>> import ray
>>> signal = ResultSignal()
>>> watch = CompletionWatch(signal, "lazyseq-example-ray-watch", ray.is_initialized)  # waits for references
>>> watch.close()
>>> signal.close()
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import ray

from .result_signal import ResultSignal

__all__ = ["CompletionWatch", "completed"]

WAIT_SECONDS = 0.005  # the longest a completed task goes unnoticed
JOIN_SECONDS = 1.0  # how long close() waits for the thread: one stuck in Ray (shut down under it) is left behind


class CompletionWatch:
    """Writes to ``signal`` as each of the references given to :meth:`watch` becomes ready."""

    def __init__(self, signal: ResultSignal, name: str, session_lasts: Callable[[], bool]) -> None:
        self._signal = signal
        self._session_lasts = session_lasts  # False once the Ray session of the references ended
        self._refs: dict[ray.ObjectRef, None] = {}  # watched, in the order given
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def watch(self, refs: list[ray.ObjectRef]) -> None:
        with self._changed:
            self._refs.update(dict.fromkeys(refs))
            self._changed.notify()

    def forget(self, ref: ray.ObjectRef) -> None:
        """Stop watching ``ref`` (its results were taken)."""
        with self._changed:
            self._refs.pop(ref, None)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._refs.clear()  # the results of the tasks go once nothing else refers to them
            self._changed.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(JOIN_SECONDS)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._refs and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                refs = list(self._refs)
            try:
                if not self._session_lasts():  # ray.wait would start a new Ray: the reader looks, and says so
                    raise RuntimeError("the Ray session ended")
                ready = completed(refs, here=True)
            except Exception:  # Ray shut down under it
                self._signal.notify()
                return
            with self._changed:
                for ref in ready:
                    self._refs.pop(ref, None)
                if not ready and not self._closed:
                    self._changed.wait(WAIT_SECONDS)  # or until a task is sent, or close()
            if ready:
                self._signal.notify()


def completed(refs: list[ray.ObjectRef], timeout: float = 0.0, *, here: bool = False) -> set[ray.ObjectRef]:
    """Those of ``refs`` whose Ray task has completed, waiting up to ``timeout`` seconds for all of them.

    ``here``: only those whose results are in this node's object store (the
    others are fetched meanwhile, by Ray's threads).
    """
    return set(ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=here)[0])

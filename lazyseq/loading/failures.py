"""How a failure in a worker reaches the consumer.

An exception raised in a thread worker is handed over as it is. One raised in a
process worker is pickled with its traceback text and the chain of views it
went through; an exception that cannot be pickled (or unpickled) arrives as a
:class:`RemoteError` with its type name, message and traceback text. Either way
the consumer raises it when it reads that item, and the usual
:class:`~lazyseq.EvaluationError` wrapping names the item and the whole chain.
"""

from __future__ import annotations

import pickle
import signal
import traceback
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from ..views import errors
from ..views.errors import REMOTE_CHAIN, EvaluationError, message_of, named, traced_chain
from .messages import CapturedError

__all__ = [
    "LoaderClosed",
    "LoaderError",
    "NoSharedMemory",
    "RemoteError",
    "SessionEnded",
    "WorkerDied",
    "capture",
    "describe_items",
    "exit_description",
    "restore",
]


class LoaderError(errors.LoaderFailure, RuntimeError):
    """A background loader cannot go on (a worker died, or its start hook failed); raised as it is.

    >>> import lazyseq
    >>> def failing_hook(worker_index):
    ...     raise OSError("no such device")
    >>> ahead = lazyseq.prefetch(range(10), nworkers=1, start_hook=failing_hook)
    >>> ahead[0]
    Traceback (most recent call last):
    ...
    lazyseq.LoaderError: prefetch: start_hook failed in worker thread 0: OSError: no such device
    """


class WorkerDied(LoaderError):
    """A worker process ended while the loader was running.

    The message names the worker, its exit code or signal and what it was
    doing; after a crash (a segfault in an extension module, say), it quotes
    the fatal error and the stack of the code that crashed, as Python's
    ``faulthandler`` reported them in the worker.

    ``tasks`` are the loader's tasks that the worker held (sent to it and
    not answered). ``suspects`` are those that may have ended it: the one it
    was computing, where the loader knows it (worker processes; none if it
    died between two tasks, killed from outside say: no item is to blame,
    and an iteration of a ``prefetch`` view that goes on reads the item
    whose read raised this again), else all of them. ``while_starting``: it died
    before it could compute anything (new workers would die the same way).

    >>> import lazyseq
    >>> issubclass(lazyseq.WorkerDied, RuntimeError)
    True
    >>> died = lazyseq.WorkerDied("worker process 1 died", tasks=[4, 6], suspects=[6])
    >>> died.tasks, died.suspects, died.while_starting
    ((4, 6), (6,), False)
    """

    def __init__(
        self,
        message: str,
        tasks: Iterable[Hashable] = (),
        suspects: Iterable[Hashable] | None = None,
        while_starting: bool = False,
    ) -> None:
        super().__init__(message)
        self.tasks: tuple[Hashable, ...] = tuple(tasks)
        self.suspects: tuple[Hashable, ...] = self.tasks if suspects is None else tuple(suspects)
        self.while_starting = while_starting


class SessionEnded(LoaderError):
    """The Ray session a loader's tasks ran in has ended: its workers are gone, and an iterator that reads on starts
    new ones in the current session.

    >>> issubclass(SessionEnded, LoaderError)
    True
    """


class LoaderClosed(LoaderError):
    """A loader closed by another thread while this one waited for a result (``load_buffers``: its iteration ends).

    An iteration of a ``prefetch`` view that goes on after it reads that item
    again, with new workers.

    >>> import lazyseq
    >>> issubclass(lazyseq.LoaderClosed, lazyseq.LoaderError)
    True
    """


class NoSharedMemory(LoaderError, MemoryError):
    """The shared-memory slots of a process loader need more memory than the system has for them.

    A ``LoaderError`` (the loader's settings, not an item, are at fault) and a ``MemoryError``.

    >>> import lazyseq
    >>> issubclass(lazyseq.NoSharedMemory, MemoryError)
    True
    """


class RemoteError(EvaluationError):
    """Stands for an exception raised in a worker process that could not be sent as itself.

    ``type_name`` is the original exception's class name; the message is its
    ``str``; the worker's traceback is attached as a note. Like every error
    raised while computing an item, it is an :class:`~lazyseq.EvaluationError`
    (also with ``seterr("passthrough")``, which raises it as it is); a
    loader's own failures (:class:`LoaderError`, :class:`WorkerDied`) are not.

    >>> import lazyseq
    >>> error = lazyseq.RemoteError("Unpicklable", "no way")
    >>> error.type_name, str(error), isinstance(error, lazyseq.EvaluationError)
    ('Unpicklable', 'Unpicklable: no way', True)
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:  # to another process as itself, its notes and chain too
        return (type(self), (self.type_name, self.message), self.__dict__)


for _public in (LoaderError, WorkerDied, LoaderClosed, NoSharedMemory, RemoteError):
    _public.__module__ = "lazyseq"  # where users import them from


def capture(error: BaseException, dumps: Callable[[Any], bytes] = pickle.dumps) -> CapturedError:
    """What a process worker sends for ``error``: picklable whatever ``error`` is."""
    text = "".join(traceback.format_exception(error))
    chain = traced_chain(error)  # (a served view's error has the chain on the server too)
    try:
        payload = dumps(error)
        pickle.loads(payload)  # an exception that pickles may still fail to unpickle
    except Exception:
        payload = None
    return CapturedError(type(error).__qualname__, message_of(error), text, chain, payload)


def could_not_start(what: str, error: BaseException) -> LoaderError:
    """The loader's error for a worker that could not start: ``what``, then ``error`` in one line, its type first
    (a message printed or logged on its own still says why); raise it ``from error``.

    >>> could_not_start("prefetch: start_hook failed in worker thread 0", OSError("no such device"))
    LoaderError('prefetch: start_hook failed in worker thread 0: OSError: no such device')
    """
    return LoaderError(f"{what}: {named(error)}")


def restore(captured: CapturedError, where: str) -> BaseException:
    """The exception that ``capture`` described, ready to be raised in the consumer."""
    error = None
    if captured.pickled is not None:
        try:
            error = pickle.loads(captured.pickled)
        except Exception:
            error = None
    if error is None:
        error = RemoteError(captured.type_name, captured.message)
    error.add_note(f"raised in {where}; its traceback there:\n{captured.traceback.rstrip()}")
    setattr(error, REMOTE_CHAIN, captured.chain)
    return error


def raised_by_an_item(error: BaseException) -> BaseException:
    """``error`` (an item's outcome), marked as the item's own: an iterator that meets it goes on past the item.

    Only a ``KeyboardInterrupt`` needs it: one raised while an item is
    awaited (Ctrl-C) leaves the item to read again, one raised by the item's
    code is its failure, and read again it would fail again, for ever.
    """
    if isinstance(error, KeyboardInterrupt):
        error.lazyseq_item_failure = True  # type: ignore[attr-defined]  # an exception's own attribute
    return error


def is_an_items_own(error: BaseException) -> bool:
    """Whether ``error`` came from an item's code (see :func:`raised_by_an_item`)."""
    return getattr(error, "lazyseq_item_failure", False) is True


def describe_items(noun: str, tasks: Iterable[tuple[Hashable, Any]]) -> str:
    """The items of ``(task, argument)`` pairs that a failure concerns, after ``noun`` (plural for several), in order
    where they can be ordered.

    An item is named by its argument, as the loader's caller numbers it (a
    served view's task is a consumer and an index; its argument the index, or
    the positions of the items it reads at once), or by its task where it has
    no argument (``load_buffers``' batches).

    >>> describe_items("item", [((b"consumer", 12), 12), ((b"consumer", 3), 3)])
    'items 3, 12'
    >>> describe_items("batch", [(4, None)])
    'batch 4'
    """
    pairs = list(tasks)
    listed = [task if arg is None else arg for task, arg in pairs]
    try:
        listed.sort()
    except TypeError:  # items that cannot be compared: as they came
        pass
    several = len(listed) > 1 or any(len(getattr(arg, "positions", ())) > 1 for _, arg in pairs)  # (ItemsAt)
    return f"{_plural(noun) if several else noun} {', '.join(map(str, listed))}"


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith(("s", "sh", "ch", "x")) else "s")


def exit_description(code: int | None) -> str:
    """``exit code 3``, ``signal SIGKILL``..."""
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"

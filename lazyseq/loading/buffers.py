"""Batches from a function called over and over by background workers: ``load_buffers``."""

from __future__ import annotations

import inspect
import itertools
import types
from collections.abc import Callable, Iterator
from typing import Any, Generic, NoReturn

import numpy as np

from ..arguments import flag, function
from ..nested import in_order_of, map_leaves
from ..views.errors import REMOTE_CHAIN, EvaluationError, seterr
from ..views.itemtypes import T
from .backends import Done
from .buffering import BATCHES_CACHED, Buffering
from .engine import Engine
from .failures import SessionEnded
from .fork_safety import ForkLocalLock
from .jobs import CallFunction
from .options import LoaderOptions, Method, StartHook, StartMethod
from .structure import flatten, layout_of, shape_key, signature

__all__ = ["BufferLoader", "load_buffers"]


class BufferLoader(Iterator[T], Generic[T]):
    """An endless iterator over the batches that ``func()`` returns, computed by background workers.

    It is a context manager; ``close()`` stops the workers (iteration then
    ends), and so does garbage collection.
    """

    def __init__(self, func: Callable[[], T], max_cached: int | None, options: LoaderOptions, copy: bool) -> None:
        if isinstance(func, types.GeneratorType) or inspect.isgeneratorfunction(func):
            raise TypeError(
                "load_buffers: func must be a function that returns a batch each call, got a generator"
                f"{'' if isinstance(func, types.GeneratorType) else ' function'}; for the batches a generator "
                "yields, lazyseq.prefetch(lazyseq.uniter(batches())) computes them in the background"
            )
        function(
            func, "load_buffers: func", "load_buffers calls a function that returns a batch; prefetch loads a sequence"
        )
        # by default, one batch in progress per worker besides the one being read: every worker busy
        default = max(BATCHES_CACHED, options.nworkers + 1)
        self._max_cached = Buffering.resolve(max_cached, options, default, "max_cached")
        if options.nworkers < 1:
            raise ValueError("load_buffers: nworkers must be at least 1 (or negative: all cores but -nworkers)")
        self._func = func
        self._copy = copy
        self._signature: tuple | None = None
        self._skeleton: tuple | None = None  # of the first batch (its arrays not kept)
        self._first = ""
        self._delivered = 0  # batches handed out so far: numbers them in messages
        self._tasks = itertools.count()
        self._lock = ForkLocalLock()  # a forked child reads with its own
        self.closed = False
        self._holding = False  # whether the consumer holds the batch it got last (one of max_cached): between reads
        self._options = options
        self._starts = 0  # each start of the workers gets new random seeds
        self._start_again = False  # whether the next read starts new workers (the Ray session of the last ones ended)
        self._engine = self._start()

    def _start(self) -> Engine:
        engine = self._engine = Engine(
            CallFunction(self._func),
            self._options,
            self._max_cached,
            start=self._starts,
            slot_count=self._max_cached.size or 0,  # processes: one shared-memory slot per batch
            task_name="batch",
        )
        self._starts += 1
        self._refill()
        return engine

    def _refill(self) -> None:
        self._engine.refill(self._next_batches)

    def _next_batches(self, room: int) -> list[tuple[int, None]]:
        """Up to ``room`` more batches to make (one less while the consumer holds one), each into a free slot of its
        own where slots exist."""
        engine, count = self._engine, 0
        room -= self._holding
        # A consumer that keeps every slot alive still gets batches (pickled) while nothing else is on its way.
        while count < room and (not (engine.pending or count) or engine.workers.has_room(count + 1)):
            count += 1
        return [(next(self._tasks), None) for _ in range(count)]

    def _upcoming(self) -> list[tuple[int, None]]:
        """The batches for the workers to start on while the reader makes a slow first one."""
        return [(next(self._tasks), None) for _ in range(self._engine.capacity)]

    def __next__(self) -> T:
        with self._lock:
            self._holding = False  # asking for the next one: done with the last one (a slot still held is not free)
            if self.closed:
                raise StopIteration
            engine = self._engine
            # in a process forked from the one that started the workers, or after a Ray session ended: new workers
            if engine.inherited or self._start_again:
                self._start_again = False
                engine = self._start()
            try:
                if engine.inline and not engine.ready and not engine.pending:
                    task = next(self._tasks)
                    ahead = None if engine.cost.count else self._upcoming  # type: ignore[union-attr]  # inline: a cost
                    try:
                        done = Done(task, "ok", engine.compute_here(None, ahead))
                    except Exception as error:
                        done = Done(task, "error", error)
                    engine.check_open()  # closed by another thread while this one computed: the iteration ends
                else:
                    if not engine.ready and not engine.pending:
                        self._refill()
                    done = engine.next_done(self._refill)
                self._holding = True
                self._refill()
            except BaseException as error:
                if isinstance(error, Exception) and self._closed_meanwhile():
                    raise StopIteration from None
                engine.failed(error)
                if isinstance(error, SessionEnded):  # its workers are gone, not for good: the next read starts anew
                    self._start_again = True
                elif engine.closed:
                    self.close()
                raise
            number = self._delivered
            self._delivered += 1
        if done.status == "error":
            if not isinstance(done.value, Exception):  # KeyboardInterrupt, SystemExit: as a Ctrl-C, the iteration ends
                self.close()
                raise done.value
            _raise_failure(done.value, number)
        value = done.value
        self._check_shape(value, number)
        if self._copy:
            value = map_leaves(np.copy, value)
        return value

    def _check_shape(self, batch: Any, number: int) -> None:
        if batch is None:
            raise TypeError(
                f"load_buffers: func returned None for batch {number}; it must return a batch: an array, or a tuple, "
                "list, namedtuple or dict of arrays (a return statement missing?)"
            )
        arrays: list = []
        skeleton = flatten(batch, arrays)
        found = shape_key(skeleton, arrays)
        if self._skeleton is not None and found != self._signature:  # dicts alike but for their keys' order?
            arrays = []
            skeleton = flatten(in_order_of(self._skeleton, batch), arrays)
            found = shape_key(skeleton, arrays)
        if self._signature is None:
            # described now, once: keeping the batch itself would keep its slot from being reused
            self._signature, self._first = found, signature(skeleton, layout_of(arrays)[0])
            self._skeleton = skeleton
        elif found != self._signature:
            raise ValueError(
                f"load_buffers: batch {number} is {signature(skeleton, layout_of(arrays)[0])}, but the first "
                f"batch was {self._first}; func must return batches of fixed shapes and dtypes"
            )

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(
            "a load_buffers iterator cannot be pickled: it runs workers of its own; send func, and call "
            "load_buffers where the batches are read"
        )

    def _closed_meanwhile(self) -> bool:
        """Whether another thread closed the iterator while this one waited in it (its iteration ends then)."""
        return self.closed

    def close(self) -> None:
        """Stop the workers. Idempotent; iteration ends afterwards."""
        self.closed = True
        self._engine.close()

    def __enter__(self) -> BufferLoader[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        count = self._delivered
        state = "closed" if self.closed else f"{count} batch{'' if count == 1 else 'es'} delivered"
        name = getattr(self._func, "__qualname__", type(self._func).__name__)
        return f"load_buffers({name}, max_cached={self._max_cached})  [{state}]"


def _raise_failure(error: BaseException, number: int) -> NoReturn:
    chain = getattr(error, REMOTE_CHAIN, "")
    where = f"load_buffers batch {number}" + (f" -> {chain}" if chain else "")
    if seterr() == "passthrough":
        error.add_note(f"while computing {where}")
        raise error
    raise EvaluationError(f"failed to compute {where}: {type(error).__name__}: {error}") from error


def load_buffers(
    func: Callable[[], T],
    max_cached: int | None = None,
    nworkers: int = 1,
    method: Method = "thread",
    start_hook: StartHook | None = None,
    copy: bool = False,
    start_method: StartMethod | None = None,
    blas_threads: int | None = None,
    inline_below: float | None = None,
    seed: int | None = None,
) -> BufferLoader[T]:
    """An endless iterator over batches made by calling ``func()`` again and again in background workers.

    ``func()`` returns a batch: an array, or a tuple, list, namedtuple or
    dict of arrays, with the same shapes and dtypes every time (a batch that
    differs from the first is a ``ValueError``). Batches are yielded as they
    complete, in no set order; up to ``max_cached`` of them exist at once,
    the one being read included (``None``: one more than ``nworkers``, at
    least 2, so that every worker has one to make; for Ray see below).

    With ``method="process"`` workers write each batch in place into one of
    ``max_cached`` shared-memory slots, sized from the first batch and reused
    cyclically; the batch you get is a view of its slot, not a copy. A slot
    is reused only once nothing refers to its batch any more, so a batch
    stays valid at least until the next ``max_cached - 1`` batches have been
    fetched, and for as long as you keep a reference to it. ``copy=True``
    yields arrays of their own instead. With threads, the arrays that
    ``func()`` returned are handed over as they are.

    ``start_hook(worker_index)`` runs once in each worker (a hook that
    takes no argument is called without it); ``start_method`` and
    ``blas_threads`` are as for :func:`~lazyseq.prefetch`. Each worker
    process seeds Python's ``random``, numpy's global generator and torch's
    (if imported) from ``seed`` and its index (``seed=None``: fresh entropy),
    so ``func()`` drawing ``np.random.randint`` gives different batches in
    every worker. An exception in ``func`` is raised, as ``EvaluationError``
    naming the batch, by the ``next()`` that would have returned that batch;
    the iterator then goes on. A worker process that dies, or an interrupt
    (a Ctrl-C, or ``KeyboardInterrupt`` or ``SystemExit`` raised by ``func``),
    closes the iterator (that exception is raised once, then iteration ends): make a new one to go on. ``close()``, a
    ``with`` block or garbage collection stop the workers; in a process
    forked from yours, the iterator starts workers of its own.

    ``method="ray"`` makes batches as Ray tasks on a cluster, as for
    :func:`~lazyseq.prefetch`, where ``max_cached=None`` leaves room for
    three runs of batches per worker (each run about 50 ms of work, at most
    256 batches): for batches of 50 ms or more, ``3 * nworkers`` batches at
    once.
    An explicit ``max_cached`` is always obeyed (up to 65,536: more is a
    ``ValueError``).

    Where batches are made follows the same rule as for
    :func:`~lazyseq.prefetch`: with processes, always in the worker
    processes; with threads, batches that take less than ``inline_below``
    seconds (default 0.25 ms) are made by the reader itself (then they are
    ``func()``'s own arrays), unless a ``start_hook`` is given. An explicit
    ``inline_below`` sets the threshold for either method (``0``: always the
    workers).

    >>> import numpy as np
    >>> import lazyseq
    >>> data = np.arange(100.0)
    >>> def sample():
    ...     picks = np.random.randint(len(data), size=8)
    ...     return data[picks], picks
    >>> with lazyseq.load_buffers(sample, max_cached=4, nworkers=2) as batches:
    ...     x, i = next(batches)
    ...     bool((x == i).all()), x.shape
    (True, (8,))
    """
    options = LoaderOptions.check(
        "load_buffers", nworkers, method, start_hook, start_method, blas_threads, inline_below, seed
    )
    return BufferLoader(func, max_cached, options, flag(copy, "load_buffers: copy"))

"""Batches from a function called over and over by background workers: ``load_buffers``."""

from __future__ import annotations

import functools
import itertools
import operator
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..views.errors import REMOTE_CHAIN, EvaluationError, seterr
from .deferred_workers import DeferredWorkers, make_workers
from .item_cost import FIRST_ONLY_ABOVE, INLINE_BELOW, ItemCost, start_if_slow
from .jobs import CallFunction
from .options import blas_threads_for, check_method, resolve_workers
from .structure import flatten, layout_of, shape_key, signature

__all__ = ["BufferLoader", "load_buffers"]

POLL_SECONDS = 0.5


class BufferLoader(Iterator):
    """An endless iterator over the batches that ``func()`` returns, computed by background workers.

    It is a context manager; ``close()`` stops the workers (iteration then
    ends), and so does garbage collection.
    """

    def __init__(
        self,
        func: Callable[[], Any],
        max_cached: int,
        nworkers: int,
        method: str,
        start_hook: Callable[[int], Any] | None,
        copy: bool,
        start_method: str | None,
        blas_threads: int | None,
        inline_below: float = INLINE_BELOW,
    ) -> None:
        if not callable(func):
            raise TypeError(f"load_buffers: func must be callable, got {type(func).__name__}")
        check_method(method, start_method, "load_buffers")
        self._max_cached = operator.index(max_cached)
        if self._max_cached < 1:
            raise ValueError(f"load_buffers: max_cached must be a positive integer, got {max_cached}")
        count = resolve_workers(nworkers)
        if count < 1:
            raise ValueError("load_buffers: nworkers must be at least 1 (or negative: all cores but -nworkers)")
        if not inline_below >= 0:
            raise ValueError(f"load_buffers: inline_below must be a number of seconds >= 0, got {inline_below!r}")
        self._func = func
        self._copy = copy
        self._signature: tuple | None = None
        self._first = ""
        self._delivered = 0  # batches handed out so far: numbers them in messages
        self._waiting: deque = deque()  # results that arrived before they were asked for
        self._in_flight = 0
        self._tasks = itertools.count()
        self._lock = threading.Lock()
        self.closed = False
        self._cost: ItemCost | None = None  # whether batches are cheap enough to make here (None: never)
        if inline_below and start_hook is None:  # a start_hook may prepare state only workers have
            self._cost = ItemCost(inline_below)
        # With threads the consumer holds the last batch it got; with processes its slot counts among max_cached.
        self._threads = method == "thread"
        self._ahead = max(1, self._max_cached - 1) if self._threads else self._max_cached
        self._sent = 0  # batches that _send_ahead gave the workers
        make = functools.partial(
            make_workers,
            CallFunction(func),
            method,
            count,
            start_hook,
            "load_buffers",
            start_method,
            blas_threads_for(blas_threads, count),
            self._max_cached,
            0,  # slots sized from the first batch
            "batch",
            self._cost,
        )
        self._workers = make() if self._cost is None else DeferredWorkers(make)  # started for the first batch sent
        self._refill = max(1, self._ahead // 2)
        self._finalizer = weakref.finalize(self, self._workers.close)
        self._fill()

    def _fill(self) -> None:
        if self._cost is not None and self._cost.inline:
            return  # batches this cheap are made by the reader (see lazyseq.loading.item_cost)
        queued = self._in_flight + len(self._waiting)
        if self._in_flight and queued > self._ahead - self._refill:
            return  # refill in bulk: an idle worker is woken once for several batches, not for each
        free_slots = getattr(self._workers, "free_slots", None)  # processes, or workers not started yet
        batch = []
        while queued < self._ahead:
            # With processes a batch is sent only into a free slot, unless nothing at all is on its way:
            # a consumer that keeps every slot alive still gets batches, pickled.
            if free_slots is not None and (self._in_flight or batch) and not free_slots(len(batch) + 1):
                break
            batch.append((next(self._tasks), None))
            queued += 1
        if batch:
            self._workers.submit_many(batch)
            self._in_flight += len(batch)

    def __next__(self) -> Any:
        with self._lock:
            if self.closed:
                raise StopIteration
            try:
                if not self._waiting and not self._in_flight:
                    if self._cost is not None and self._cost.inline:
                        self._waiting.append(self._make_here())
                    else:
                        self._fill()
                # Process workers get their next tasks as results are collected; threads take theirs themselves.
                timeout = 0.0 if self._waiting else POLL_SECONDS
                while self._in_flight and (timeout or not self._threads):
                    for _, status, value in self._workers.poll(timeout):
                        self._in_flight -= 1
                        self._waiting.append((status, value))
                    self._fill()
                    if self._waiting:
                        break
                status, value = self._waiting.popleft()
                self._fill()
            except Exception:
                if self._workers.closed:
                    self.close()
                raise
            except BaseException:
                self.close()
                raise
            number = self._delivered
            self._delivered += 1
        if status == "error":
            _raise_failure(value, number)
        self._check_shape(value, number)
        if self._copy:
            value = _copied(value)
        return value

    def _make_here(self) -> tuple[str, Any]:
        """A batch made in the reader's thread, timed: batches this cheap are not worth a worker."""
        cost = self._cost
        if cost.count == 0 and self._threads:  # the first batch: threads start on the next if it is slow
            with start_if_slow(FIRST_ONLY_ABOVE * cost.inline_below, self._send_ahead):
                made = self._timed_call()
            self._in_flight, self._sent = self._in_flight + self._sent, 0
            return made
        return self._timed_call()

    def _timed_call(self) -> tuple[str, Any]:
        start = time.perf_counter()
        try:
            batch = self._func()
        except Exception as error:
            return "error", error
        self._cost.add(time.perf_counter() - start)
        return "ok", batch

    def _send_ahead(self) -> None:
        """From another thread, while the reader makes the first batch: give the workers the next ones."""
        self._workers.submit_many([(next(self._tasks), None) for _ in range(self._ahead)])
        self._sent = self._ahead  # counted as in flight by the reader, once the batch is made

    def _check_shape(self, batch: Any, number: int) -> None:
        arrays: list = []
        skeleton = flatten(batch, arrays)
        found = shape_key(skeleton, arrays)
        if self._signature is None:
            # described now, once: keeping the batch itself would keep its slot from being reused
            self._signature, self._first = found, signature(skeleton, layout_of(arrays)[0])
        elif found != self._signature:
            raise ValueError(
                f"load_buffers: batch {number} is {signature(skeleton, layout_of(arrays)[0])}, but the first "
                f"batch was {self._first}; func must return batches of fixed shapes and dtypes"
            )

    def close(self) -> None:
        """Stop the workers. Idempotent; iteration ends afterwards."""
        self.closed = True
        self._waiting.clear()
        self._finalizer()

    def __enter__(self) -> BufferLoader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._delivered} batches delivered"
        name = getattr(self._func, "__qualname__", type(self._func).__name__)
        return f"load_buffers({name}, max_cached={self._max_cached})  [{state}]"


def _raise_failure(error: BaseException, number: int):
    chain = getattr(error, REMOTE_CHAIN, "")
    where = f"load_buffers batch {number}" + (f" -> {chain}" if chain else "")
    if seterr() == "passthrough":
        error.add_note(f"while computing {where}")
        raise error
    raise EvaluationError(f"failed to compute {where}: {type(error).__name__}: {error}") from error


def _copied(batch: Any) -> Any:
    if type(batch) is np.ndarray:
        return batch.copy()
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_copied(x) for x in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_copied(x) for x in batch)
    if isinstance(batch, dict):
        return {k: _copied(v) for k, v in batch.items()}
    return batch


def load_buffers(
    func: Callable[[], Any],
    max_cached: int = 2,
    nworkers: int = 1,
    method: str = "thread",
    start_hook: Callable[[int], Any] | None = None,
    copy: bool = False,
    start_method: str | None = None,
    blas_threads: int | None = None,
    inline_below: float = INLINE_BELOW,
) -> BufferLoader:
    """An endless iterator over batches made by calling ``func()`` again and again in background workers.

    ``func()`` returns a batch: an array, or a tuple, list, namedtuple or
    dict of arrays, with the same shapes and dtypes every time (a batch that
    differs from the first is a ``ValueError``). Batches are yielded as they
    complete, in no set order; up to ``max_cached`` of them exist at once,
    the one being read included.

    With ``method="process"`` workers write each batch in place into one of
    ``max_cached`` shared-memory slots, sized from the first batch and reused
    cyclically; the batch you get is a view of its slot, not a copy. A slot
    is reused only once nothing refers to its batch any more, so a batch
    stays valid at least until the next ``max_cached - 1`` batches have been
    fetched, and for as long as you keep a reference to it. ``copy=True``
    yields arrays of their own instead. With threads, the arrays that
    ``func()`` returned are handed over as they are.

    ``start_hook(worker_index)`` runs once in each worker (seed a random
    generator there). An exception in ``func`` is raised, as
    ``EvaluationError`` naming the batch, by the ``next()`` that would have
    returned that batch; the iterator then goes on. ``close()``, a ``with``
    block or garbage collection stop the workers.

    Batches that take less than ``inline_below`` seconds to make (default
    0.25 ms) are made by the reader itself (then they are ``func()``'s own
    arrays, not slot contents), with threads and processes alike, as
    ``prefetch`` does and for the same reasons (see
    :mod:`lazyseq.loading.item_cost`); the workers start with the first batch
    worth handing over. ``inline_below=0`` or a ``start_hook`` always use the
    workers.

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
    return BufferLoader(func, max_cached, nworkers, method, start_hook, copy, start_method, blas_threads, inline_below)

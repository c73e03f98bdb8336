"""Items computed ahead by background workers, delivered in order: ``prefetch``."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any, cast, overload

import numpy as np

from ..arguments import integer
from ..views.base import View
from ..views.chunks import batches_as_its_rows, chunk_rows
from ..views.itemtypes import SequenceLike, T, T_co
from ..views.keys import Positions
from ..views.shuffle import EpochWatch
from ..views.sources import as_view
from .backends import Done
from .buffering import ITEMS_AHEAD, SLOT_BUDGET, Buffering
from .closing import interrupts_deferred
from .engine import Engine
from .failures import LoaderClosed, LoaderError, WorkerDied, raised_by_an_item
from .fork_safety import ForkLocalLock
from .inline_run import MISSING, InlineReads, InlineRun, epoch_stamp
from .item_cost import RUN_ITEMS, ItemCost
from .jobs import ReadItem
from .options import LoaderOptions, Method, StartHook, StartMethod
from .prefetch_iterator import PrefetchIterator
from .read_order import ReadOrder
from .shared_slots import slot_bytes_for
from .structure import bytes_of_spec

__all__ = ["PrefetchIterator", "PrefetchView", "prefetch"]


class PrefetchView(View[T_co]):
    """Item ``i`` is ``parent[i]``, computed ahead by workers in the order the items are being read.

    The view guesses the next items from the last two reads (ascending by
    default, or any constant step) and keeps up to ``max_buffered`` of them
    computed or in progress (see :mod:`~lazyseq.loading.buffering`). Reads
    that follow no step fetch only what is asked; a read of many items at
    once (``_get_many``: a batch of a gather above this view) sends them all,
    in their order, as room allows.
    """

    kind = "prefetch"
    _items_like_parents = True

    def __init__(
        self, parent: View, options: LoaderOptions, max_buffered: Buffering, shm_size: int, task_name: str = "item"
    ) -> None:
        self._max_buffered = max_buffered
        self._task_name = task_name  # what an item is called in messages (write_npy's items are its shards)
        self._shm_size = integer(shm_size, "prefetch: shm_size", low=0)
        self._parent = parent
        self._parents = (parent,)
        self._len = parent._len
        self._options = options
        # Worker processes (and Ray) take every item asked for, to run the user's code there alone; reading only data,
        # the reader takes many items at once itself (each would be handed over alone: 80 times the time).
        self._data_only = options.method != "thread" and reads_only_data(parent)
        if options.nworkers and options.method != "thread" and any(v.kind == "uniter" for v in parent._views_below()):
            warnings.warn(
                f"{options.owner}: the pipeline reads an iterable (uniter): each worker process gets a copy of it, and "
                "iterates over every item before those it computes, so that the workers do the work several times "
                "over; use method='thread', or read the iterable with load_buffers",
                stacklevel=3,
            )
        options.check_sendable(ReadItem(parent))
        self._lock = ForkLocalLock()  # a forked child reads with its own
        self._engine: Engine | None = None
        self._order = ReadOrder(self._len, max_buffered.capacity(None))  # each start of the workers begins a new one
        self._send_ahead: Callable[[], None] = _nothing  # sends the next expected items (see _start)
        self._starts = 0  # how many times workers were started: each start gets new random seeds
        self._cost: ItemCost | None = None  # what items cost, timed by the first engine
        self._run: InlineRun | InlineReads | None = None  # cheap items the reader computes, read in order
        self._epoch_watch = EpochWatch(parent)  # of the pipeline's shuffles when the workers started
        # items ahead of the reader that a worker died computing: reported when read, and not computed ahead again
        self._deaths: dict[int, WorkerDied] = {}

    # -- lifetime ---------------------------------------------------------------

    def _start(self) -> Engine:
        engine = Engine(
            ReadItem(self._parent),
            self._options,
            self._max_buffered,
            start=self._starts,
            slot_count=self._slots_ahead() + 2,  # the items being read hold one or two (processes)
            slot_bytes=self._shm_size or slot_bytes_for_spec(self._parent._item_spec_at_most()),
            slot_budget=0 if self._max_buffered.size is not None else SLOT_BUDGET,
            task_name=self._task_name,
            cost=self._cost,
        )
        self._cost = engine.cost  # restarted (after close(), an epoch, an item's interrupt), it knows what items cost
        self._starts += 1
        self._epoch_watch.reset()
        deaths = self._deaths
        holds = engine.holds if not deaths else lambda j: j in deaths or engine.holds(j)
        self._engine, self._order = engine, ReadOrder(self._len, engine.capacity, holds)
        self._send_ahead = functools.partial(engine.refill, self._order.advance)
        return engine

    def _slots_ahead(self) -> int:
        """Items that may be computed ahead at most: ``max_buffered``'s, within the view's length."""
        most = self._max_buffered.most
        return most if self._len is None else min(most, self._len)

    def close(self) -> None:
        """Stop the workers and drop the items computed ahead; reading again starts them anew.

        From another thread, while a read waits for its item (a watchdog
        stopping a stuck loader), that read raises :class:`~lazyseq.LoaderError`
        (``LoaderClosed``): closing does not wait for it.
        """
        with interrupts_deferred():  # a Ctrl-C meanwhile is raised once the engine is closed (see .closing)
            engine, self._engine = self._engine, None  # not under the lock: a read may hold it while it waits
            self._deaths = {}
            self._run = None
            # Nothing keeps the stopped engine (and what it had read ahead) while the view lives on.
            self._send_ahead, self._order = _nothing, ReadOrder(self._len, self._order.capacity)
            if engine is not None:
                engine.close()

    def set_epoch(self, epoch: int) -> None:
        """Give the pipeline's shuffles ``epoch``; the workers stop, and start again on it at the next read.

        Items computed ahead are of the old epoch, and worker processes hold
        their own copy of the pipeline: both are dropped.
        """
        super().set_epoch(epoch)
        self.close()

    def __enter__(self) -> PrefetchView[T_co]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def workers_running(self) -> bool:
        """Whether background workers are up: from the first item handed to them until ``close()``."""
        engine = self._engine
        return engine is not None and not engine.inherited and engine.started

    # -- reading ----------------------------------------------------------------

    def _spec_of(self, idx: Positions) -> tuple | None:
        return self._parent._spec_of(idx)  # a batch above the loader is the batch read without it

    def _get(self, i: int) -> Any:
        if not self._options.nworkers:
            return self._parent._get(i)
        run = self._run
        if run is not None:
            value = run.take(i, self._engine)
            if value is not MISSING:
                return value
        self._follow_epochs()  # an epoch set on a view below since the workers started
        with self._lock:
            if self._deaths and i in self._deaths:
                died = self._deaths.pop(i)
                self._order.read(i)  # read, as far as guessing the next reads goes: what was read ahead is kept
                raise WorkerDied(str(died), died.tasks, died.suspects, died.while_starting) from died.__cause__
            while True:
                engine = self._running_engine()
                order = self._order
                cost = engine.cost  # engine.inline, without a call at every read
                if cost is not None and cost.inline and i not in engine.pending and i not in engine.ready:
                    in_order = order.read(i) and order.step == 1 and not (engine.pending or engine.ready)
                    if in_order and cost.in_runs:
                        value = self._compute_run(engine, order, i)
                    else:
                        value = engine.compute_here(i) if cost.count else self._compute_first(engine, order, i)
                        if in_order:
                            self._compute_next_reads(engine, order, i)
                    engine.check_open()  # closed by another thread while this one computed: see close()
                    return value
                self._run = None  # the workers compute ahead now, up to max_buffered: not the reader
                try:
                    done = _again_if_closed_below(engine, i, self._read(engine, order, i))
                    break
                except BaseException as error:
                    _read_failed(engine, error)
                    if not self._died_ahead(error, i):
                        raise
        if done.status == "error":
            failure = raised_by_an_item(done.value)
            engine.failed(failure)  # an item's own KeyboardInterrupt or SystemExit stops the workers, as a Ctrl-C
            raise failure
        return done.value

    def _get_many(self, idx: Positions) -> Any:
        if not self._options.nworkers or not len(idx):
            return self._parent._get_many(idx)
        if len(idx) == 1:
            return [self._get(int(idx[0]))]
        self._follow_epochs()  # as in _get
        with self._lock:
            engine = self._running_engine()
            cost = engine.cost
            if cost is not None and cost.inline and not (engine.pending or engine.ready):
                if cost.count < 2:  # the first two items, timed alone, say whether items are worth the workers
                    first = self._get(int(idx[0]))
                    return [first, *chunk_rows(self._get_many(idx[1:]))]
                chunk = engine.compute_with(self._parent._get_many, idx, len(idx))
                self._order.read_many(idx)
                engine.check_open()  # closed by another thread while this one computed: see close()
                # A batch must not depend on who computed its items: as a list of them, unless it is the same.
                return chunk if batches_as_its_rows(chunk) else chunk_rows(chunk)
            if self._data_only:  # no code of the user's: read with one vectorized call, as without a loader
                chunk = self._parent._get_many(idx)
                return chunk if batches_as_its_rows(chunk) else chunk_rows(chunk)
            if type(idx) is range and idx.step == 1 and engine.started:
                return [self._get(i) for i in idx]  # in order, the reads ahead follow
            try:
                values: list = []
                # ``i``, a local of this frame, names the failing item in the chain of views (views/errors.py)
                for i, outcome in self._read_many(engine, self._order, [int(k) for k in idx]):  # noqa: B007
                    done = _again_if_closed_below(engine, i, outcome)
                    if done.status == "error":
                        values.clear()  # the traceback keeps this frame: not the items read (their slots)
                        raise raised_by_an_item(done.value)
                    values.append(done.value)
                return values
            except BaseException as error:
                _read_failed(engine, error)
                raise

    def _died_ahead(self, error: BaseException, i: int) -> bool:
        """Whether ``error`` is a worker that died computing other items than ``i`` (ahead): the read of ``i`` goes on.

        The workers start again, and the death is reported when one of those
        items is read (an iteration skips it, as an item that failed); they
        are not computed ahead again meanwhile, which would end the new
        workers as it ended the old one.
        """
        if not isinstance(error, WorkerDied) or not error.suspects or i in error.suspects:
            return False
        if not all(type(task) is int and task not in self._deaths for task in error.suspects):
            return False  # a task that is not an item, or one that ended workers before: no new start for it
        self._deaths.update(dict.fromkeys(cast("tuple[int, ...]", error.suspects), error))
        return True

    def _running_engine(self) -> Engine:
        """The engine to read with (under the lock): a new one if none was started, or it failed, or was forked."""
        engine = self._engine
        if engine is None or engine.closed or engine.inherited:
            engine = self._start()
        return engine

    def _read_many(self, engine: Engine, order: ReadOrder, positions: list[int]) -> Iterator[tuple[int, Done]]:
        """Each of ``positions`` with its outcome; the workers get them in that order, as room allows.

        An item wanted twice is computed twice, as a view reads it: its next
        occurrence goes to the workers when its turn in that order comes.
        """
        engine.keep_only(positions, positions[0])  # what was read ahead for other items is dropped
        order.frontier = None  # nothing is guessed while these are read, nor after: their order was given
        order.read_many(positions)
        following = _next_occurrences(positions)
        sent: set[int] = set()  # the items given to the workers (or read) and not read since
        scanned = 0  # the positions before this one were sent, or held already

        def send_next() -> None:
            nonlocal scanned
            room = engine.room()
            tasks = []
            while room and scanned < len(positions):
                i = positions[scanned]
                scanned += 1
                if i not in sent and not engine.holds(i):
                    sent.add(i)
                    tasks.append((i, i))
                    room -= 1
            engine.submit(tasks)

        send_next()
        for k, i in enumerate(positions):
            sent.add(i)  # a read may come before the workers got it (when they have no room): sent by wait_for
            done = engine.wait_for(i, i, send_next)
            again = following[k]
            if again is not None:  # wanted again: sent when the scan reaches it, or now if it went past
                if again < scanned:
                    engine.submit([(i, i)])
                else:
                    sent.discard(i)
            yield i, done
            send_next()

    def _compute_run(self, engine: Engine, order: ReadOrder, i: int) -> Any:
        """Item ``i`` and the next ones, computed by the reader at once: the next reads take them from ``_run``.

        No more are computed ahead of ``i`` than the workers would (``max_buffered``).
        """
        stop = i + 1 + min(RUN_ITEMS - 1, engine.capacity)
        if self._len is not None:
            stop = min(self._len, stop)
        stamp = epoch_stamp(self._parent)  # before: an epoch set while the items are computed makes them old
        values, error = engine.compute_run_here(range(i, stop))
        if not values:  # item i failed
            raise cast("BaseException", error)
        order.last = i + len(values) - 1  # as if read: the read after the run is the next in order
        value, values[0] = values[0], MISSING
        more = len(values) > 1 or error is not None
        closed = self._engine is not engine  # by another thread, meanwhile: what it computed is not kept
        self._run = InlineRun(engine, i, values, error, self._parent, stamp) if more and not closed else None
        return value

    def _compute_next_reads(self, engine: Engine, order: ReadOrder, i: int) -> None:
        """After item ``i``, read in order and computed by the reader: the next reads in order compute their items at
        once, with less to do than a read through the loader (:class:`InlineReads`), while items are not for runs."""
        cost: ItemCost = engine.cost  # type: ignore[assignment]  # items are computed here only with a cost
        if cost.inline and cost.count > 2 and not cost.in_runs and not self._deaths and self._engine is engine:
            self._run = InlineReads(engine, i + 1, self._parent._get, order, self._lock.here())

    @staticmethod
    def _compute_first(engine: Engine, order: ReadOrder, i: int) -> Any:
        try:
            return engine.compute_here(i, functools.partial(order.upcoming, i))
        finally:
            if engine.pending:  # the first item ran long: the workers took the next ones
                order.frontier = max(cast("set[int]", engine.pending)) + 1

    def _read(self, engine: Engine, order: ReadOrder, i: int) -> Done:
        """Item ``i`` from the workers; the next expected items are sent, up to ``max_buffered`` in all."""
        if engine.buffering.size is None:  # by default for Ray and processes, the capacity follows the items' timings
            order.capacity = engine.capacity
        send_ahead = self._send_ahead
        frontier, last = order.frontier, order.last
        if order.step == 1 and i != last + 1 and frontier is not None and last < frontier and i < frontier:
            if i in engine.ready or i in engine.pending:
                # An item on its way, read out of turn (threads reading in turn, the second one first): the reads
                # still go in order, and what was read ahead is kept.
                order.last = max(last, i)
                done = engine.wait_for(i, i, None)
                send_ahead()
                return done
        steady = order.read(i)
        sent = steady and order.frontier is not None  # what was expected went out after the last read
        if not sent:
            ahead = order.expected(i) if steady else range(0)
            engine.keep_only(ahead, i)
            order.frontier = i + order.step if len(ahead) else None
        if i not in engine.ready and i not in engine.pending:  # engine.holds(i), without a call at every read
            engine.submit([(i, i)])  # before the items expected next, so that it is computed first
            sent = False
        done = engine.wait_for(i, i, None if sent else send_ahead)
        send_ahead()
        return done

    def _sources(self, i: int) -> tuple[tuple[View, int], ...]:
        return ((self._parent, i),)

    def __iter__(self) -> PrefetchIterator[T_co]:
        self._follow_epochs(look=True)
        return PrefetchIterator(self)

    def _follow_epochs(self, look: bool = False) -> None:
        """Workers started before ``set_epoch`` was called on a view below stop (with what they computed ahead), to
        restart on it: at a read after an epoch was set anywhere, and (``look``) at the start of a pass."""
        self._epoch_watch.follow(self._stop_workers, look)

    def _stop_workers(self) -> None:
        if self._engine is not None:
            self.close()

    def _iter(self) -> Iterator[T_co]:
        self._follow_epochs(look=True)
        return PrefetchIterator(self, wrapping=False)  # read by a view above, which says what failed

    def _describe(self) -> str:
        options = self._options
        if not options.nworkers:
            return "prefetch(synchronous)"
        one, many = {
            "thread": ("thread", "threads"),
            "process": ("process", "processes"),
            "ray": ("Ray task", "Ray tasks"),
        }[options.method]
        return (
            f"prefetch({options.nworkers} {one if options.nworkers == 1 else many}, max_buffered={self._max_buffered})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (PrefetchView, (self._parent, self._options, self._max_buffered, self._shm_size, self._task_name))


READS_AFTER_A_CLOSE_BELOW = 2  # times an item is read again after a loader below closed while a worker read it


def _again_if_closed_below(engine: Engine, i: int, done: Done) -> Done:
    """``done``, the outcome of item ``i``; read again if a loader below it was closed while a worker waited on it.

    That item was not read (closing a loader that this one reads, say), and a
    closed loader starts again when read.
    """
    for _ in range(READS_AFTER_A_CLOSE_BELOW):
        if done.status != "error" or type(done.value) is not LoaderClosed:
            break
        done = engine.wait_for(i, i)
    return done


def reads_only_data(view: View) -> bool:
    """Whether ``view`` only reads arrays, ranges and built-in sequences: no function or object of the user's runs.

    >>> import numpy as np, lazyseq
    >>> data = lazyseq.view(np.zeros((10, 3)))
    >>> reads_only_data(lazyseq.collate([data, range(10)]).shuffle(seed=0)), reads_only_data(data.smap(abs))
    (True, False)
    """
    for v in view._views_below():
        kind = type(v).__name__
        if kind not in _DATA_VIEWS or getattr(v, "_collate_fn", None) is not None:  # a batch's own collate_fn
            return False
        if kind == "SequenceSource" and not getattr(v, "_builtin", False):  # a Dataset's __getitem__, say
            return False
    return True


# Views that only select, reorder, repeat or stack what they read (by name: some are in modules that import this one)
_DATA_VIEWS = frozenset(
    {
        "ArangeView", "ArraySource", "BatchView", "CacheView", "CaseView", "CollateView", "ConcatenateView",
        "CycleView", "GatherView", "InterleaveView", "RepeatView", "SequenceSource", "ShuffleView", "SplitView",
        "StridedView", "UnbatchView",
    }
)  # fmt: skip


def slot_bytes_for_spec(spec: tuple | None) -> int:
    """Slots for items that ``spec`` describes, made before the first one (0: sized from the first result)."""
    needed = bytes_of_spec(spec)
    return slot_bytes_for(needed) if needed else 0


def _nothing() -> None:
    pass


def _read_failed(engine: Engine, error: BaseException) -> None:
    """A read through ``engine`` raised ``error``: an interrupt between two steps of the engine stops it too.

    An error while another thread closed the engine is reported as that
    (``LoaderClosed``): whatever broke, that is why.
    """
    if isinstance(error, Exception) and not isinstance(error, LoaderError):
        engine.check_open()
    engine.failed(error)


def _next_occurrences(positions: list[int]) -> list[int | None]:
    """For each position, where the same item comes next in ``positions`` (None: it does not).

    >>> _next_occurrences([3, 1, 3, 3])
    [2, None, 3, None]
    """
    following: list[int | None] = [None] * len(positions)
    last: dict[int, int] = {}
    for k in range(len(positions) - 1, -1, -1):
        following[k] = last.get(positions[k])
        last[positions[k]] = k
    return following


@overload
def prefetch(
    sequence: np.ndarray,
    nworkers: int = 0,
    method: Method = "thread",
    max_buffered: int | None = None,
    start_hook: StartHook | None = None,
    shm_size: int = 0,
    start_method: StartMethod | None = None,
    blas_threads: int | None = None,
    inline_below: float | None = None,
    seed: int | None = None,
) -> PrefetchView[np.ndarray]: ...


@overload
def prefetch(
    sequence: SequenceLike[T],
    nworkers: int = 0,
    method: Method = "thread",
    max_buffered: int | None = None,
    start_hook: StartHook | None = None,
    shm_size: int = 0,
    start_method: StartMethod | None = None,
    blas_threads: int | None = None,
    inline_below: float | None = None,
    seed: int | None = None,
) -> PrefetchView[T]: ...


def prefetch(
    sequence: SequenceLike[Any] | np.ndarray,
    nworkers: int = 0,
    method: Method = "thread",
    max_buffered: int | None = None,
    start_hook: StartHook | None = None,
    shm_size: int = 0,
    start_method: StartMethod | None = None,
    blas_threads: int | None = None,
    inline_below: float | None = None,
    seed: int | None = None,
) -> PrefetchView[Any]:
    """A view of ``sequence`` whose next items are computed ahead by background workers.

    ``nworkers`` threads or processes (``method``) compute up to
    ``max_buffered`` items ahead of the reader, delivered in order
    (``None``: 10 with threads; with processes 10, or more for quick items:
    enough for about 2 ms of the workers' work, at most 32 items and 64 MiB
    of shared memory; for Ray see below; an explicit ``max_buffered`` is
    obeyed up to 65,536, or any number from the view's length up, which
    means all of its items where it has no more than that). It is a
    view like any other (``len``, negative indices, slices and gathers that
    read through it, errors naming the item); reading in order is the fast
    path, and any other order still gets the right items. A read of many
    items at once (a batch of a gather or a shuffle of it) hands them to the
    workers together, ``max_buffered`` at a time. ``nworkers=0``
    computes each item when it is read, in the reader's thread, whatever
    ``method`` says (no worker is started: a way to debug a pipeline); a negative
    ``nworkers`` means all available cores but ``-nworkers``.

    Workers start at the first item handed to them and stop with ``close()``
    (or ``with``, or when the view is garbage collected); reading again
    starts them again. ``start_hook(worker_index)`` runs once in each worker
    when it starts (a hook that takes no argument is called without it).

    With processes, the pipeline is sent to each worker once (with
    cloudpickle where installed; memory-mapped arrays travel as their file
    name and offset), and arrays in the results come back through a fixed
    pool of shared-memory slots of ``shm_size`` bytes each (``0``: sized
    from the first result). An item read from a slot is not copied; the slot
    is reused only once nothing refers to that item any more. Results that
    do not fit, or are not arrays, are pickled. ``start_method`` picks
    ``"fork"``, ``"forkserver"`` or ``"spawn"`` (``None``: the platform's
    default); ``blas_threads`` caps BLAS threads in each worker process
    (default: the available cores divided among the workers; a forked worker
    sets the cap once its BLAS has started threads, so its first BLAS call
    may run with the consumer's threads: setting it before starts OpenBLAS's
    busy-waiting pool in every worker). Each worker
    process seeds Python's ``random``, numpy's global generator and torch's
    (if imported) from ``seed`` and its index (``seed=None``: fresh entropy),
    so no two workers draw the same numbers; :func:`lazyseq.rng` gives
    results that do not depend on the workers at all.

    ``method="ray"`` computes items as Ray tasks on the nodes of the cluster
    that ``ray.init`` connected to (a local one is started if none is), at
    most ``nworkers`` in flight, each a run of items sized from their
    timings (about 50 ms of work, at most 256 items). There
    ``max_buffered=None`` leaves room for three runs per worker (one
    running, the next ready to go, one being read), so up to
    ``3 * nworkers`` runs of items are computed or held: for items of 1 ms,
    ``150 * nworkers`` items; for items of 0.2 ms or less, up to
    ``768 * nworkers`` (see the loading guide). An
    explicit ``max_buffered`` is always obeyed. The pipeline travels as it
    does to spawned processes; a memory map by its file name, which every
    node must see.

    Where items are computed: with ``method="process"``, always in the
    worker processes (isolation is why one asks for processes: a crash
    there raises :class:`~lazyseq.WorkerDied`, and never takes the reader
    down). With threads, items that take less than ``inline_below`` seconds
    (default 0.25 ms) are computed by the reader itself, since handing them
    over costs about as much and worker threads running Python take the GIL
    from a reader running Python too; the first items are timed in the
    reader, the workers start once items cost more than twice the threshold
    (a first item alone counts only above ten times) or slow items come back
    regularly among cheap ones, and the reader takes the work back if items
    get cheap again (see
    :mod:`lazyseq.loading.item_cost`). A ``start_hook`` keeps every item in
    the workers, where it ran. Giving ``inline_below`` explicitly sets that
    threshold for either method: ``0`` sends every item to the workers,
    ``inline_below=0.00025`` with processes opts into computing cheap items
    in the reader.

    >>> import lazyseq
    >>> squares = lazyseq.smap(lambda x: x * x, range(1000))
    >>> with lazyseq.prefetch(squares, nworkers=2) as ahead:
    ...     total = sum(ahead)
    ...     last = ahead[-1]
    >>> total, last
    (332833500, 998001)
    """
    options = LoaderOptions.check(
        "prefetch", nworkers, method, start_hook, start_method, blas_threads, inline_below, seed
    )
    source = as_view(sequence)
    buffering = Buffering.resolve(max_buffered, options, ITEMS_AHEAD, deepen=True, items=source._len)
    return PrefetchView(source, options, buffering, shm_size)

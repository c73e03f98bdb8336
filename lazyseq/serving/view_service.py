"""Serving a view by index: each consumer gets the items it asks for, and the next ones are computed ahead.

The server's thread owns a :class:`ViewService`. Items are computed
by one :class:`~lazyseq.loading.engine.Engine` shared by every consumer (the
same workers as ``prefetch``), as tasks named ``(consumer, index)``. While a
consumer reads in order, up to ``max_buffered`` of its next items are computed
ahead of its requests (of its next items at its step, for a consumer whose
requests say that it reads every ``k``-th item); a consumer that jumps
elsewhere drops those. A
consumer may also ask for several items at once (a batch's): they are read
as one chunk, by one task, and sent as one message (see :mod:`.chunk_wire`).

Worker threads compute an item for a consumer on this machine into a slot of
its pool that the server holds (see :mod:`.shared_items`): the slot goes with
the item, or back to the server's free ones if the item goes unsent; a slot
whose task was cancelled is free once that task has ended. When the workers
fail or close, the slots of the items that a thread is still computing (busy
past the close) are never used again.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from ..loading.backends import Done
from ..loading.buffering import SLOT_BUDGET, Buffering, refill_size
from ..loading.closing import daemon_thread_at_exit
from ..loading.engine import Engine
from ..loading.failures import WorkerDied
from ..loading.jobs import IntoSlot, ReadItemOrChunk
from ..loading.options import LoaderOptions
from ..loading.structure import bytes_of_spec
from ..loading.thread_workers import ThreadWorkers
from ..views.base import View
from ..views.errors import LoaderFailure, named
from . import wire
from .chunk_requests import ChunkPart, ChunkRequest, Splitting
from .failures import failure_header, unsendable_header
from .shared_items import MAX_SLOTS, ServedPool, item_bytes, same_machine

log = logging.getLogger("lazyseq.serve")
START_DEATHS = 2  # workers that died as they started, in a row: the requests waiting then hear why (not for ever)

__all__ = ["ViewService"]

Send = Callable[[bytes, bytes, Any, list], None]  # (consumer, kind, header, buffers)
Key = tuple[bytes, int]  # a task computing an item for a consumer: (consumer, index)


class _Reads:
    """What one consumer asked for and what is computed for it."""

    __slots__ = ("waiting", "held", "suspects", "last", "frontier", "steady", "step", "chunks")

    def __init__(self) -> None:
        self.waiting: dict[int, list[int]] = {}  # index -> the request numbers waiting for it
        self.held: set[int] = set()  # indices computed or in progress for this consumer
        self.suspects: set[int] = set()  # may have ended a worker that died: computed only when asked for
        self.last = -1  # the index asked for last: reads are assumed to start in order
        self.frontier = 0  # the next index to compute ahead while reads go in order
        self.steady = True  # whether the last read followed the one before: only then are items computed ahead
        self.step = 1  # how far each read in order goes beyond the one before (a strided shard: its step)
        self.chunks: dict[int, ChunkRequest] = {}  # request number -> the items it asks for at once, until answered


class ViewService:
    """Answers ``get`` requests for items of ``view``; see the module's description."""

    kind = "view"

    def __init__(self, view: View, options: LoaderOptions, max_buffered: Buffering, send: Send | None = None) -> None:
        self.view = view
        if not options.nworkers:  # one thread computes, so that the server's own thread goes on answering
            options = dataclasses.replace(options, nworkers=1, method="thread")
        options.check_sendable(ReadItemOrChunk(view))  # refused by serve(), not by every read
        self.options = options
        self.max_buffered = max_buffered
        self.send: Send = send if send is not None else _not_connected
        self.token = ""  # this server instance (set by the server; items by index need no more)
        self._reads: dict[bytes, _Reads] = {}
        self._engine: Engine | None = None
        self._starts = 0
        self._ask_again = False  # whether requests wait that failed workers left unanswered
        self._start_deaths = 0  # workers that died as they started, in a row (since the last result)
        self._pools: dict[bytes, ServedPool | None] = {}  # consumers on this machine -> their pool (None: not made yet)
        self._pool_slots: dict[bytes, int] = {}  # ... and the slots they asked for (the server adds its own)
        self._splitting = Splitting(options.nworkers)  # how many workers read a request for items at once
        # Worker threads compute items into slots of the consumer's pool (worker processes have their own pool)
        self._into_slots = options.method == "thread"
        self._into: dict[Key, tuple[ServedPool, int]] = {}  # a task's slot, until its item is sent or let go
        self._cancelled_into: set[Key] = set()  # tasks with a slot cancelled, until they end
        self._serials = itertools.count()  # one per request for items at once (see ChunkPart)

    def info(self) -> dict[str, Any]:
        view = self.view
        return {
            "kind": self.kind,
            "length": view._len,
            "may_end": view._may_end(),
            "label": view._describe(),
            "items": wire.encode_spec(view._item_spec()),  # a consumer's batches take their dtypes
            "items_at_most": wire.encode_spec(view._item_spec_at_most()),  # (all alike but a short last batch)
            "at_once": True,  # items are also asked for several at once, with 'positions' (see .chunk_requests)
        }

    @property
    def consumers(self) -> list[bytes]:
        return list(self._reads.keys() | self._pools.keys())  # one that said hello and no more may hold a pool

    # -- requests --------------------------------------------------------------------

    def sync(self, consumer: bytes, header: Any) -> dict[str, Any] | None:
        """What ``synced`` tells ``consumer`` (None: ``forgotten``): nothing more, whoever asks (a read names what
        it wants)."""
        return {}

    def hello(self, consumer: bytes, header: Any, local: bool) -> dict[str, Any]:
        """A consumer (new, or back) said hello; what the welcome says besides what is served.

        A consumer on this machine (``local``) gets a pool of slots: made now,
        and announced in the welcome, where the view says how large its items
        are; else with the first item that has arrays.
        """
        self._close_pool(consumer)
        reads = self._reads.get(consumer)
        if reads is not None:  # those computed ahead into it go; those asked for are computed again (see _deliver)
            self._drop_ahead(consumer, reads)
            reads.frontier = reads.last + 1
        slots = same_machine(header) if local else 0
        if not slots:
            return {}
        self._pools[consumer], self._pool_slots[consumer] = None, slots
        item_bytes = bytes_of_spec(self.view._item_spec_at_most())
        pool = self._make_pool(consumer, item_bytes) if item_bytes else None
        return {} if pool is None else {"pool": pool.announcement()}

    def _make_pool(self, consumer: bytes, item_bytes: int) -> ServedPool | None:
        """The pool of ``consumer``, for items of ``item_bytes``; None (and the socket) if there is no room for it."""
        made = [pool for pool in self._pools.values() if pool is not None]
        slots = self._pool_slots[consumer]  # the consumer's, and the server's for items computed ahead where room
        pool = self._pools[consumer] = ServedPool.sized(
            min(slots + self.max_buffered.most, MAX_SLOTS), item_bytes, sum(e.size for e in made), len(made), slots
        )
        if pool is None:
            self._pools.pop(consumer)
            self._pool_slots.pop(consumer)
        return pool

    def handle(self, consumer: bytes, kind: bytes, header: Any) -> None:
        """A ``get``: item ``index`` as request ``req``, or ``count`` items from there, requests ``req`` onwards;
        or the items at ``positions``, as one chunk, in one answer to request ``req``. ``again``: the first item is
        the one the consumer read last, read again, not a jump. ``step``: the consumer reads every ``step``-th item
        (1 if not said), and the items computed ahead follow it.

        ``in`` names the consumer's pool, once it opened it; ``free`` hands slots of it back (see
        :mod:`.shared_items`).
        """
        self.check(kind, header)
        if "positions" in header:
            self._get_chunk(consumer, header)
            return
        count = header.get("count", 1)
        pool = self._pools.get(consumer)
        if pool is not None and header.get("in") == pool.name:  # (a pool let go since: its slots are nobody's)
            pool.confirmed = True
            if "free" in header:
                pool.handed_back(header["free"])
        req, i, read_again, step = header["req"], header["index"], header.get("again") is True, header.get("step", 1)
        for k in range(count):
            self._get(consumer, req + k, i + k, read_again and k == 0, step)

    @staticmethod
    def check(kind: bytes, header: Any) -> None:
        """:class:`~lazyseq.serving.wire.ProtocolError` unless ``kind`` and ``header`` make a well-formed ``get``."""
        if kind != b"get":
            raise wire.ProtocolError(f"a served view answers 'get', not {kind!r}")
        if type(header) is dict and "positions" in header:
            req, positions = header.get("req"), header["positions"]
            if type(req) is not int or type(positions) is not list or not 1 <= len(positions) <= wire.MAX_POSITIONS:
                raise wire.ProtocolError(f"'get' needs an integer 'req' and from 1 to {wire.MAX_POSITIONS} 'positions'")
            if not all(type(i) is int for i in positions):
                raise wire.ProtocolError("'get' needs 'positions' to be integers")
            return
        if type(header) is not dict or type(header.get("req")) is not int or type(header.get("index")) is not int:
            raise wire.ProtocolError("'get' needs integers 'req' and 'index'")
        count = header.get("count", 1)
        if type(count) is not int or not 1 <= count <= wire.MAX_COUNT:
            raise wire.ProtocolError(f"'get' needs a 'count' from 1 to {wire.MAX_COUNT}, if any")
        step = header.get("step", 1)
        if type(step) is not int or not 1 <= step <= wire.MAX_STEP or (step > 1 and count > 1):
            raise wire.ProtocolError(f"'get' needs a 'step' from 1 to {wire.MAX_STEP}, if any, and 1 with a 'count'")

    def _get(self, consumer: bytes, req: int, i: int, read_again: bool = False, step: int = 1) -> None:
        n = self.view._len
        if i < 0 or (n is not None and i >= n):
            self._answer(consumer, b"error", req, i, _index_error(i, n))
            return
        pool = self._pools.get(consumer)
        again = None if pool is None else pool.answer_again(req, i)
        if again is not None:  # its answer handed a slot over, and was lost: the item is still there
            self._answer(consumer, b"item", req, i, again)
            return
        reads = self._reads.get(consumer)
        if reads is None:
            reads = self._reads[consumer] = _Reads()
        waiting = reads.waiting.setdefault(i, [])
        if req in waiting:  # asked again after a silence: answered once
            return
        waiting.append(req)
        if not read_again:  # (the item the consumer read last, read again: what was computed ahead is still wanted)
            reads.steady = i == reads.last + step
            if not reads.steady or step != reads.step:  # a jump, or another step: what was computed ahead is not
                self._drop_ahead(consumer, reads)  # wanted any more
                reads.frontier, reads.step = i + step, step
            reads.last = i
        engine = self._running_engine()
        key = (consumer, i)
        if key in engine.ready:
            self._deliver(consumer, reads, i, engine.ready.pop(key))
        else:
            self._submit(engine, self._hold(engine, consumer, reads, [i]))
        if reads.steady:
            self._compute_ahead(consumer, reads)

    def _get_chunk(self, consumer: bytes, header: dict) -> None:
        req, positions = header["req"], header["positions"]  # (checked)
        n = self.view._len
        wrong = positions[0] if n is None else next((i for i in positions if not 0 <= i < n), None)
        if wrong is not None:  # (a consumer reads a view of unknown length one item at a time)
            self._answer(consumer, b"error", req, positions[0], _index_error(wrong, n))
            return
        reads = self._reads.get(consumer)
        if reads is None:
            reads = self._reads[consumer] = _Reads()
        if req in reads.chunks:  # asked again after a silence: answered once
            return
        parts = self._splitting.parts(len(positions))
        request = reads.chunks[req] = ChunkRequest(positions, parts, self.view._label(), next(self._serials))
        self._submit(self._running_engine(), request.tasks(consumer, req))

    def forget(self, consumer: bytes) -> None:
        """Drop what is held for a consumer that left or died: its tasks not started are cancelled, those in progress
        end unread."""
        self._close_pool(consumer)
        reads = self._reads.pop(consumer, None)
        if reads is not None:
            self._let_go([(consumer, i) for i in reads.held])
            self._let_go([key for req, request in reads.chunks.items() for key, _ in request.tasks(consumer, req)])

    def idle(self, consumer: bytes) -> None:
        """``consumer`` went quiet (no heartbeat for a while): the items computed ahead for it go (not the ones it
        asked for), computed again if it reads on."""
        reads = self._reads.get(consumer)
        if reads is not None and any(i not in reads.waiting for i in reads.held):
            self._drop_ahead(consumer, reads)
            reads.frontier = reads.last + 1
            reads.steady = False  # nothing more ahead as what it waits for comes: its next read in order says

    def _close_pool(self, consumer: bytes) -> None:
        self._pool_slots.pop(consumer, None)
        pool = self._pools.pop(consumer, None)
        if pool is not None:
            pool.close()

    # -- computing -------------------------------------------------------------------

    def _running_engine(self) -> Engine:
        engine = self._engine
        if engine is None or engine.closed:
            engine = self._engine = Engine(
                ReadItemOrChunk(self.view),
                self.options,
                self.max_buffered,
                start=self._starts,
                slot_count=2 * self.max_buffered.most + 4,
                slot_budget=0 if self.max_buffered.size is not None else SLOT_BUDGET,
                task_name="item",
            )
            self._starts += 1
        return engine

    def _submit(self, engine: Engine, tasks: list) -> None:
        try:
            engine.submit(tasks)
        except LoaderFailure as error:  # workers that died, or that could not start
            self._engine_failed(error)

    def _hold(self, engine: Engine, consumer: bytes, reads: _Reads, indices: list[int]) -> list:
        """Mark ``indices`` as computed for ``consumer``; the tasks to send (others are on their way, or resumed)."""
        tasks = []
        pool = self._pools.get(consumer) if self._into_slots else None
        if pool is not None and not pool.confirmed:  # (the consumer may not have opened it)
            pool = None
        for i in indices:
            reads.held.add(i)
            key = (consumer, i)
            if key in engine.cancelled:  # wanted again before it was skipped
                engine.workers.resume(key)
                engine.cancelled.discard(key)
                self._cancelled_into.discard(key)
            elif key not in engine.pending and key not in engine.ready:
                tasks.append((key, i if pool is None else self._into_slot(key, i, pool)))
        return tasks

    def _into_slot(self, key: Key, i: int, pool: ServedPool) -> int | IntoSlot:
        """The task's argument: item ``i`` computed into a slot of ``pool``, if the server holds one free."""
        into = self._into.get(key)
        if into is not None and into[0] is pool:  # the slot of its last task, which ended unread
            slot = into[1]
            self._cancelled_into.discard(key)
        else:
            slot = pool.take()
            if slot < 0:
                return i
            self._into[key] = (pool, slot)
        return IntoSlot(i, pool.array(slot))

    def _let_go_of_slot(self, key: Any) -> None:
        """The item of task ``key`` goes unsent: the slot it was computed into is free again."""
        into = self._into.pop(key, None)
        if into is not None:
            into[0].let_go(into[1])

    def _compute_ahead(self, consumer: bytes, reads: _Reads) -> None:
        n = self.view._len
        ahead = len(reads.held) - len(reads.waiting)
        wanted, step = [], reads.step
        j = max(reads.frontier, reads.last + step)  # (the frontier is on the step: set with it, moved by it)
        engine = self._engine
        # Ray, processes: the capacity follows the timings, which the engine has
        limit = self.max_buffered.capacity(None) if engine is None else engine.capacity
        if not refill_size(limit, ahead, 0 if engine is None else len(engine.pending), self.options.nworkers):
            return  # more once half the room is free, while every worker has a task: one wake-up for several
        while ahead < limit and (n is None or j < n):
            if j not in reads.held and j not in reads.suspects:
                wanted.append(j)
                ahead += 1
            j += step
        reads.frontier = j
        if wanted:
            engine = self._running_engine()
            self._submit(engine, self._hold(engine, consumer, reads, wanted))

    def _drop_ahead(self, consumer: bytes, reads: _Reads) -> None:
        """Forget the items computed ahead that were not asked for; cancel those not started."""
        dropped = [i for i in reads.held if i not in reads.waiting]
        reads.held.difference_update(dropped)
        self._let_go([(consumer, i) for i in dropped])

    def _let_go(self, keys: list) -> None:
        """Forget the results of tasks ``keys``; cancel those not started (those in progress end unread)."""
        engine = self._engine
        if engine is None:
            return
        for key in keys:
            if engine.ready.pop(key, None) is not None or key not in engine.pending:  # (a task skipped, resumed late)
                self._let_go_of_slot(key)
            elif key not in engine.cancelled:
                engine.workers.cancel(key)
                engine.cancelled.add(key)
                if key in self._into:  # its slot is free once the task has ended
                    self._cancelled_into.add(key)

    def work(self) -> None:
        """Take the results that have arrived, and send those that consumers asked for."""
        if self._ask_again:  # the last workers failed: new ones compute what is still waited for
            self._resubmit_waiting()
        engine = self._engine
        if engine is None or not engine.pending:
            return
        try:
            engine.collect(0.0)
        except LoaderFailure as error:
            self._engine_failed(error)
            if self._ask_again:
                self._resubmit_waiting()
            return
        if self._cancelled_into:
            self._free_slots_of_ended_tasks(engine)
        if engine.ready:  # (a worker started)
            self._start_deaths = 0
        for key in list(engine.ready):
            if type(key) is ChunkPart:
                self._chunk_done(key)
                continue
            consumer, i = cast(tuple[bytes, int], key)
            reads = self._reads.get(consumer)
            if reads is None or i not in reads.held:  # its consumer left, or jumped elsewhere
                del engine.ready[key]
                self._let_go_of_slot(key)
            elif i in reads.waiting:
                self._deliver(consumer, reads, i, engine.ready.pop(key))
                if reads.steady:
                    self._compute_ahead(consumer, reads)
        for consumer, reads in list(self._reads.items()):  # a task skipped after a cancel that came too late
            lost = [
                i for i in reads.waiting if (consumer, i) not in engine.pending and (consumer, i) not in engine.ready
            ]
            if lost:
                self._submit(engine, self._hold(engine, consumer, reads, lost))
            for req, request in list(reads.chunks.items()):  # (a task skipped: Ray skips the rest of a run)
                self._submit_parts(engine, consumer, req, request)

    def _free_slots_of_ended_tasks(self, engine: Engine) -> None:
        """The slots of cancelled tasks that have ended (skipped, or done and dropped) are free again."""
        for key in list(self._cancelled_into):
            if key not in engine.pending:
                self._cancelled_into.discard(key)
                if key not in engine.ready:
                    self._let_go_of_slot(key)

    def _chunk_done(self, key: ChunkPart) -> None:
        engine = cast(Engine, self._engine)
        done = engine.ready.pop(key)
        reads = self._reads.get(key.consumer)
        request = None if reads is None else reads.chunks.get(key.req)
        if reads is None or request is None or request.serial != key.serial:  # its consumer left (or asks anew)
            return
        request.take(key.part, done)
        if request.complete:
            del reads.chunks[key.req]
            self._splitting.timed(len(request.positions), request.parts, time.monotonic() - request.asked)
            kind, fields, buffers = request.answer()
            self._answer(key.consumer, kind, key.req, int(request.positions[0]), fields, buffers)

    def _deliver(self, consumer: bytes, reads: _Reads, i: int, done: Done) -> None:
        into = self._into.pop((consumer, i), None)
        pool = self._pools.get(consumer)
        if into is not None and into[0] is not pool:  # computed into a pool let go since (which its consumer may
            engine = self._running_engine()  # have emptied as it let go too): computed again
            self._submit(engine, self._hold(engine, consumer, reads, [i]))
            return
        reqs = reads.waiting.pop(i)
        reads.held.discard(i)
        reads.suspects.discard(i)
        slot = -1 if into is None else into[1]
        if done.status == "error":
            header = failure_header(done.value)
            for req in reqs:
                self._answer(consumer, b"error", req, i, header)
        else:
            slot = self._send_item(consumer, reqs, i, done.value, slot)
        if slot >= 0:  # computed into a slot of the consumer's pool, and not sent in it
            cast(ServedPool, pool).let_go(slot)

    def _send_item(self, consumer: bytes, reqs: list[int], i: int, value: Any, slot: int) -> int:
        """Send item ``i``, computed into ``slot`` of the consumer's pool (-1: elsewhere); the slot if it does not go
        with the item (else -1)."""
        try:
            tree, buffers = wire.encode(value)
        except TypeError as error:
            header = unsendable_header(f"item {i}", error)
            for req in reqs:
                self._answer(consumer, b"error", req, i, header)
            return slot
        fields: dict[str, Any] = {"tree": tree}
        pool = self._pools.get(consumer)
        if pool is None and consumer in self._pools and buffers:  # the first item with arrays: its pool is made
            pool = self._make_pool(consumer, item_bytes(buffers))
            if pool is not None:
                fields["pool"] = pool.announcement()
        built_in = slot >= 0  # (its arrays may lie in the slot)
        if pool is not None and pool.confirmed and buffers:
            place = slot if built_in else pool.take()
            places = None if place < 0 else pool.place(place, buffers)
            if places is not None:
                req = reqs.pop()  # the latest request for it (an earlier one may be one the consumer dropped)
                self._answer(consumer, b"item", req, i, pool.hand_over(place, req, i, {**fields, "places": places}))
                slot = -1
            elif place >= 0 and not built_in:  # too large for the slot
                pool.let_go(place)
        if reqs and built_in:  # asked for twice: its arrays lie in a slot that is the consumer's now, or free again
            buffers = [buffer.copy() if type(buffer) is np.ndarray else buffer for buffer in buffers]
        for req in reqs:
            self._answer(consumer, b"item", req, i, fields, buffers)
        return slot

    def _answer(
        self, consumer: bytes, kind: bytes, req: int, i: int, fields: dict[str, Any], buffers: list | None = None
    ) -> None:
        """Answer request ``req`` (item ``i``), naming this server instance: a consumer notices one that came back."""
        self.send(consumer, kind, {"req": req, "index": i, "server": self.token, **fields}, buffers or [])

    def _engine_failed(self, error: LoaderFailure) -> None:
        """The workers cannot go on; which waiting requests hear why, and which are asked of new workers.

        A worker that died names the items that may have ended it (a worker
        process: the one it was computing, if any). A consumer waiting for
        one of them hears why; every other waiting request is asked of new
        workers, which compute a suspect item that nobody waited for only
        once it is asked for, not ahead. So a worker killed from outside costs
        at most the item it was computing, an item that ends every worker
        fails its own request once it is asked for, and the server never
        starts workers forever while requests wait. A worker that died as it
        started (killed from outside, say) has new workers asked the same way,
        once: if one of those dies as it starts too, every waiting request
        hears why, as for any other failure (workers that cannot start).
        """
        self._close_engine()
        if daemon_thread_at_exit():  # closed by the finalizers as the program ends: nobody to tell
            return
        suspects: set[Any] | None = None  # tasks that may have ended the worker that died: (consumer, i), ChunkPart
        if isinstance(error, WorkerDied):
            self._start_deaths = self._start_deaths + 1 if error.while_starting else 0
            if self._start_deaths < START_DEATHS:
                suspects = set(error.suspects)
        message = f"the server's workers failed: {named(error)}"
        cause = error.__cause__
        if cause is not None and named(cause) not in message:  # a worker's own: the reason (most loaders say it)
            message += f", from {named(cause)}"
        if suspects is None:
            log.warning("the server's workers failed; the requests waiting for them hear why", exc_info=error)
        else:
            log.warning(  # (its message says all: the traceback would be the server's own code)
                "a worker of the server died (the request of the item it computed, if any, hears why; new workers "
                "compute the others): %s",
                error,
            )
        for consumer, reads in self._reads.items():
            if suspects is None:
                failed, failed_chunks = list(reads.waiting), list(reads.chunks)
            else:
                its = {task[1] for task in suspects if task[0] == consumer and type(task) is not ChunkPart}
                failed = sorted(its.intersection(reads.waiting))
                reads.suspects.update(its.difference(failed))  # computed again only once asked for
                parts = [task for task in suspects if type(task) is ChunkPart and task.consumer == consumer]
                failed_chunks = sorted(
                    {p.req for p in parts if p.req in reads.chunks and reads.chunks[p.req].serial == p.serial}
                )
            for i in failed:
                for req in reads.waiting.pop(i):
                    self._answer(consumer, b"failed", req, i, {"message": message})
            for req in failed_chunks:
                request = reads.chunks.pop(req)
                self._answer(consumer, b"failed", req, int(request.positions[0]), {"message": message})
            reads.held.clear()  # what was computed ahead went with the workers
            reads.frontier = reads.last + 1
            self._ask_again = self._ask_again or bool(reads.waiting) or bool(reads.chunks)

    def _resubmit_waiting(self) -> None:
        """Ask new workers for the items still waited for after the last ones failed, and for those ahead."""
        self._ask_again = False
        engine = self._running_engine()
        for consumer, reads in list(self._reads.items()):
            if reads.waiting:
                self._submit(engine, self._hold(engine, consumer, reads, sorted(reads.waiting)))
            for req, request in list(reads.chunks.items()):
                self._submit_parts(engine, consumer, req, request)
            if self._engine is not engine:  # these workers failed too: the next call asks again
                return
            if reads.steady:
                self._compute_ahead(consumer, reads)

    def _submit_parts(self, engine: Engine, consumer: bytes, req: int, request: ChunkRequest) -> None:
        """Submit the tasks of ``request`` that are neither done nor on their way."""
        tasks = [
            task
            for task in request.tasks(consumer, req)
            if task[0] not in engine.pending and task[0] not in engine.ready
        ]
        if tasks and engine is self._engine:  # (workers that failed meanwhile: the next ones are asked)
            self._submit(engine, tasks)

    def fds(self) -> list[int]:
        """What the server's thread waits on, besides its sockets: readable when results may be in."""
        engine = self._engine
        return [] if engine is None or not engine.pending else engine.workers.fds()

    def _close_engine(self) -> None:
        """Close the workers. The slots that items were computed into are free again, but for those of the items
        that a worker thread still computes (busy past the close): never used again, as it may write into them."""
        engine, self._engine = self._engine, None
        if engine is None:
            return
        engine.close()
        threads = engine.workers.workers  # (only worker threads compute into slots)
        busy = threads.busy_with() if isinstance(threads, ThreadWorkers) else set()
        for key in list(self._into):
            if key in busy:
                del self._into[key]
            else:
                self._let_go_of_slot(key)
        self._cancelled_into.clear()

    def close(self) -> None:
        self._close_engine()
        self._reads.clear()
        for consumer in list(self._pools):
            self._close_pool(consumer)


def _index_error(i: int, n: int | None) -> dict[str, str]:
    message = f"index {i} out of range for the served view of length {n}"
    return {"type": "IndexError", "message": message, "chain": "", "traceback": ""}


def _not_connected(consumer: bytes, kind: bytes, header: Any, buffers: list) -> None:
    raise RuntimeError("the service sends through its server, which has not set it up yet")

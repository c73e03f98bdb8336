"""What ``connect`` gives: a view read from a server by index, or an iterator over a served stream."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple, cast

import numpy as np

from ..arguments import flag
from ..extras import require
from ..loading.closing import hurried, interrupts_deferred, wait_unless_hurried
from ..loading.failures import LoaderError
from ..loading.jobs import ItemsAt
from ..loading.thread_workers import worker_stopping
from ..views import errors
from ..views.base import View
from ..views.display import describe_spec
from ..views.keys import Positions
from . import wire
from .chunk_reads import ChunkReads, Taken
from .connection import Connection
from .endpoints import check_endpoint
from .failures import restore_failure
from .frames import DONTWAIT
from .reads_begun import ReadsBegun
from .shared_items import ReceivedPool, hello_fields

__all__ = ["RemoteStream", "RemoteView", "connect"]

STEADY_READS = 5  # reads in a row of one thread at a step other than 1 after which the reads ahead follow it
RECENT = 256  # stream items remembered as handed out: sent again after a lost connection, they are dropped
# A caller that waits for the next item: how long before what it had is acknowledged on its own rather than with the
# request that goes as the next item is handed out (one message less for each item of a stream quicker to read than
# to make)
ACK_WHILE_WAITING = 0.02
CONFIRM_ON_CLOSE = 1.0  # seconds a stream's close() waits for the server to know every item handed out
# Connections of their own that threads reading one served view open while another thread's read holds its
# connection, at most (beyond them, a read waits for one to be free)
SPARE_CONNECTIONS = 15
MAX_DROPPED = 1024  # requests dropped after jumps whose answers have not come, remembered (see RemoteView._dropped)


class RemoteView(View[Any]):
    """The items of a view served by :func:`~lazyseq.serve`, read by index over a socket.

    While it is read in order, up to ``ahead`` of the next items are asked
    for before they are needed, in runs (one request for several items, once
    half of those asked for ahead have been read); any other order still gets
    the right items, one round trip each. The items of a batch (a read of
    several at once) come in one message, as the served view reads them
    (vectorized); batches read in order also ask for the next one before it
    is needed. A server that restarts at the same
    address within ``timeout`` is asked again for what was lost; one that
    stays away raises :class:`~lazyseq.ServerLost`.

    >>> import lazyseq
    >>> with lazyseq.serve(lazyseq.smap(lambda x: x * 10, range(5)), "tcp://127.0.0.1:0") as server:
    ...     with lazyseq.connect(server.address) as remote:
    ...         len(remote), remote[-1], list(remote[1:3])
    (5, 40, [10, 20])
    """

    kind = "served"
    # the reads under way and their read-ahead (see _start_reads)
    _asked: dict[int, int]
    _asking: dict[int, int]
    _arrived: dict[int, tuple[str, Any]]
    _last: int
    _requested: set[int]
    _step: int
    _last_step: int
    _last_reader: int
    _step_run: int
    _behind: bool
    _chunks: ChunkReads

    def __init__(self, connection: Connection, info: dict[str, Any], ahead: int, settings: dict[str, Any]) -> None:
        length = info.get("length")
        if length is not None and (type(length) is not int or not 0 <= length <= sys.maxsize):  # len() says no above
            raise wire.ProtocolError(f"the server sent an invalid length {length!r}")
        self._len = length
        self._length_unknown = info.get("may_end") is True  # it ends where reading it finds its end (uniter)
        self._connection = connection
        self._ahead = ahead
        self._settings = settings  # what connect() was given: a copy of this view in a worker reconnects
        self._remote_label = str(info.get("label", "a view"))
        self._take_specs(info)
        self._served = Served.from_welcome(info)  # a server back at the address must serve the same
        self._replaced: str | None = None  # why, once it serves something else: raised anew at every read
        self._restarting = False  # a new server instance was found, and not told apart from the last one yet
        self._lock = threading.Lock()
        self._reads = ReadsBegun()  # the reads of threads sharing this view's connection, under way
        self._spares: list[RemoteView] = []  # connections of their own for reads of other threads, free now
        self._all_spares: list[RemoteView] = []  # and all of them (closed with this view)
        self._spares_lock = threading.Lock()
        self._opening = 0  # spares being opened
        self._next_req = 0
        # requests dropped after a jump, not answered yet: answered with a slot of the pool, the slot goes back
        # (asked again with the others should the answer be lost with a connection)
        self._dropped: dict[int, int] = {}
        self._start_reads()
        self._pool: ReceivedPool | None = None  # on the server's machine: where it writes items (see .shared_items)
        self._at_once = info.get("at_once") is True  # whether the server answers them (older ones do not)
        self._open_pool(info)

    @property
    def address(self) -> str:
        return self._connection.address

    def _item_spec(self) -> tuple[Any, ...] | None:
        return self._spec

    def _item_spec_at_most(self) -> tuple[Any, ...] | None:
        return self._spec_at_most

    def _take_specs(self, info: dict) -> None:
        """What the served view's items are, where it knows; and what its largest are (a short last batch aside)."""
        self._spec = wire.decode_spec(info.get("items"))
        at_most = info.get("items_at_most")  # (not sent by a server of an earlier version)
        self._spec_at_most = self._spec if at_most is None else wire.decode_spec(at_most)

    def _get(self, i: int) -> Any:
        spare = self._spare_if_busy()
        if spare is None:
            return self._read(i)
        try:
            return spare._read(i)  # (not its _get: the chain of views in an error names this view once)
        finally:
            self._spares.append(spare)

    def _read(self, i: int) -> Any:
        """Item ``i``, through this view's connection."""
        # (another thread's read may hold the connection first: the timeout counts from this read's start)
        with self._reads.begun() as began:
            if self._connection.pid != os.getpid():  # a forked worker: its parent's sockets are not its own
                self._connect_here()
            self._await_turn(f"item {i}", began)
            try:
                with self._lock:
                    status, value = self._read_held(i)
            finally:
                if self._connection.closed:  # from elsewhere (another thread, a signal handler) meanwhile
                    self._let_go_if_closed()
        if status == "error":
            raise value
        return value

    def _read_held(self, i: int) -> tuple[str, Any]:
        """Item ``i``'s answer, the lock held: asked for now if it was not, with the items ahead of it."""
        self._check_readable()
        n, step, last = self._len, self._stride(i), self._last
        after = i == last + step
        # in order: the next one, one asked for ahead (threads reading in turn come in either order), or the
        # last one again (the items ahead stay)
        in_order = after or i in self._asking or i in self._arrived or i == last
        stop = i + step * (1 + self._ahead) if in_order else i + 1
        wanted = range(i, stop if n is None else min(n, stop), step)
        self._last = i
        if not in_order:  # a jump: what was read ahead is not needed
            self._keep_only(wanted)
            self._requested.clear()
        elif not after or self._behind:  # read in another order: what is far behind is not needed
            self._keep_only(range(i - step * self._ahead, sys.maxsize))
            self._behind = any(j < i for j in self._arrived) or any(j < i for j in self._asking)
        # those asked for already (read since, some of them): not again
        missing = [] if i in self._arrived or i in self._asking else [i]
        requested = self._requested
        missing += [j for j in wanted[1:] if j not in requested]
        if len(requested) > 4 * (self._ahead + 1):  # (those far behind: read, or dropped)
            self._requested = {j for j in requested if j >= i - step * self._ahead}
        # Read in order, the items ahead are asked for in runs, once half of them have been used: one request
        # every few reads rather than one per read (each costs the reader a send).
        if missing and (missing[0] == i or len(wanted) - len(missing) - 1 <= self._ahead // 2):
            self._ask(missing, read_again=i == missing[0] and not after and i == last)
        while i not in self._arrived:
            self._receive_one(f"item {i}")
        return self._arrived.pop(i)

    def _get_many(self, idx: Positions) -> Any:
        n = self._len
        if n is None or len(idx) < 2 or not self._at_once:  # (a view that may end is read until it does)
            return super()._get_many(idx)
        spare = self._spare_if_busy()
        reader = self if spare is None else spare
        try:
            with reader._reads.begun() as began:  # (as in _read)
                taken = reader._take_many(idx, n, began)
        finally:
            if spare is not None:
                self._spares.append(spare)
        if taken.apart:  # each item can travel, not all of them in one message (objects, say): one by one from now
            self._at_once = reader._at_once = False
            return super()._get_many(idx)
        if taken.error is not None:
            i = taken.at  # noqa: F841  # the item that failed: the chain of views names it (see views/errors.py)
            raise taken.error
        return taken.chunk

    def _take_many(self, idx: Positions, n: int, began: float) -> Taken:
        """Ask for items ``idx`` at once (of ``n``), and wait for their answers."""
        if self._connection.pid != os.getpid():
            self._connect_here()
        waiting_for = f"items {ItemsAt(np.asarray(idx))}"
        self._await_turn(waiting_for, began)
        try:
            with self._lock:
                self._check_readable()
                requests, to_send = self._chunks.plan(idx, n, self._number_request)
                try:
                    for req, positions in to_send:
                        self._connection.send(b"get", {"req": req, "positions": positions})
                except BaseException:  # (a Ctrl-C): what was not sent would be waited for in vain
                    self._chunks.abandon(requests + [req for req, _ in to_send])
                    raise
            try:
                while True:  # the lock let go between two messages: another thread's request may go out then
                    self._await_turn(waiting_for, began)
                    with self._lock:
                        if not self._chunks.waiting(requests):
                            return self._chunks.take(requests, len(idx))
                        self._receive_one(waiting_for)
            except BaseException:  # a Ctrl-C, a server lost: the answers still to come are dropped, not kept
                with self._lock:
                    self._chunks.abandon(requests)
                raise
        finally:
            if self._connection.closed:  # from elsewhere meanwhile (see _read)
                self._let_go_if_closed()

    def _check_readable(self) -> None:
        """With the lock held, before a read asks for anything: it raises if this view is closed (its items read
        ahead too: none is read once it is closed) or the server serves another view; a new server instance whose
        check was cut short is checked now."""
        if self._connection.closed:
            raise self._connection.closed_error()
        if self._replaced is not None:  # (a new error each time: one raised before holds the frames it went through)
            raise LoaderError(self._replaced)
        if self._restarting:
            self._server_restarted()

    def _spare_if_busy(self) -> RemoteView | None:
        """A connection of its own for this read, taken from the free ones or opened, if another thread's read holds
        this view's connection (None: read through it).

        Threads reading one served view at once (the workers of a thread
        ``prefetch``) would otherwise take turns: the server computes for one
        read at a time, and each waits for the others' round trips (or a slow
        item's). A spare is another consumer of the server, as a copy of this
        view in a worker process is; free again once the read ends, kept for
        later reads, and closed with this view.
        """
        connection = self._connection
        if not self._lock.locked() or connection.pid != os.getpid() or self._replaced is not None or connection.closed:
            return None
        try:
            return self._spares.pop()  # (the last one freed: a thread reading in order keeps its read-ahead)
        except IndexError:
            pass
        with self._spares_lock:  # (not held while one is opened: each waits for its own hello, not the others')
            if len(self._all_spares) + self._opening >= SPARE_CONNECTIONS:
                return None
            self._opening += 1
        try:
            opened, info = _open_connection(self._settings)
            try:
                replaced = self._serving_another(info)
                if replaced is not None:
                    raise replaced
                spare = RemoteView(opened, info, self._ahead, self._settings)
            except BaseException:
                opened.close()
                raise
            self._all_spares.append(spare)
        finally:
            with self._spares_lock:
                self._opening -= 1
        if self._connection.closed:  # this view was closed meanwhile (its close() may have missed this one)
            spare.close()
            return None
        return spare

    def _keep_only(self, kept: range) -> None:
        """Drop the items asked for or arrived but for ``kept`` (their answers are dropped as they come)."""
        for j in [j for j in self._arrived if j not in kept]:
            del self._arrived[j]
        for j in [j for j in self._asking if j not in kept]:
            req = self._asking.pop(j)
            index = self._asked.pop(req)
            if self._pool is not None:
                self._dropped[req] = index
                if len(self._dropped) > MAX_DROPPED:  # (answers lost for good, a slot each: the oldest forgotten)
                    del self._dropped[next(iter(self._dropped))]

    def _await_turn(self, waiting_for: str, began: float) -> None:
        """Wait while another thread's read holds the connection, hearing ``ServerLost`` in time meanwhile.

        A read begun before the server died is told within its own timeout,
        not once the reads that other threads begin meanwhile have timed out
        too. The lock is taken and let go at once (then taken with ``with``,
        which a Ctrl-C cannot leave held), a Ctrl-C held back meanwhile.
        """
        lock = self._lock
        if not lock.locked():
            return
        with interrupts_deferred():  # (a Ctrl-C ends the wait, and is raised at the block's end)
            while not wait_unless_hurried(lambda seconds: lock.acquire(timeout=seconds), self._connection.interval):
                if hurried():
                    return
                if worker_stopping():
                    raise self._connection.stopping(waiting_for)
                self._connection.check_heard(waiting_for, began)
            lock.release()

    def _stride(self, i: int) -> int:
        """The step of the reads in order, with item ``i`` read now: 1, or ``k`` once ``STEADY_READS`` reads in a row
        of one thread went ``k`` ahead (a strided ``shard``, ``view[::k]``), until a read goes another way.

        Reads in order that come in another order (threads reading in turn, a
        thread that swaps a few) are taken as such by :meth:`_read_held`, at
        step 1; what was asked for ahead at one step is kept at the next, and
        goes as any item once it falls behind.
        """
        step, thread = i - self._last, threading.get_ident()
        run = self._step_run + 1 if step == self._last_step and thread == self._last_reader else 1
        self._last_step, self._last_reader, self._step_run = step, thread, run
        if step == self._step:
            return step
        if step > 1 and run >= STEADY_READS:
            self._behind = True  # what was asked for ahead off it goes once it falls behind (see _read_held)
        elif self._step == 1:
            return 1
        else:
            step = 1
        self._step = step
        return step

    def _start_reads(self) -> None:
        """No request under way, nothing read yet: reads are assumed to start in order."""
        self._asked = {}  # request number -> index, for requests not answered yet
        self._asking = {}  # index -> its request number
        self._arrived = {}  # index -> ("ok", value) or ("error", exception)
        self._last = -1
        self._requested = set()  # the indices asked for since the last jump (read since, some of them)
        # the step of reads in order; the last read's, its thread, and how many reads in a row of it took that step
        self._step, self._last_step, self._last_reader, self._step_run = 1, 1, 0, 0
        self._behind = False  # whether items behind the last read may be kept (read in another order)
        self._chunks = ChunkReads()  # what reads of several items at once asked for

    def _number_request(self) -> int:
        self._next_req += 1
        return self._next_req - 1

    def _connect_here(self) -> None:
        self._connection, info = _open_connection(self._settings)
        self._lock = threading.Lock()
        self._reads.only_this_thread()
        self._spares, self._all_spares = [], []  # the parent's (closed in this process as it was forked)
        self._spares_lock, self._opening, self._restarting = threading.Lock(), 0, False
        self._start_reads()
        self._drop_pool()  # the parent's (closed in this process as it was forked): it names its slots
        self._open_pool(info)

    def _ask(self, indices: list[int], read_again: bool = False) -> None:
        """Ask for ``indices`` (ascending), one request per run of consecutive ones; ``read_again``: the first one is
        the item read last, read again (the server keeps what it computed ahead)."""
        start = 0
        for k in range(1, len(indices) + 1):
            if k == len(indices) or indices[k] != indices[k - 1] + 1 or k - start == wire.MAX_COUNT:
                first, count, req = indices[start], k - start, self._next_req
                self._requested.update(range(first, first + count))
                self._next_req += count
                for offset in range(count):
                    self._asked[req + offset], self._asking[first + offset] = first + offset, req + offset
                header: dict[str, Any] = {"req": req, "index": first}
                if count > 1:
                    header["count"] = count
                header.update(self._step_said())
                if read_again and start == 0:
                    header["again"] = True
                pool = self._pool
                if pool is None:
                    self._connection.send(b"get", header)
                else:  # it names the pool it opened, and hands back the slots of the items let go
                    header["in"], back = pool.name, pool.to_hand_back()
                    if back:
                        header["free"] = back
                    try:
                        self._connection.send(b"get", header)
                    except BaseException:  # not sent, or cut short (dropped whole): handed back next time
                        pool.hand_back_later(back)
                        raise
                start = k

    def _step_said(self) -> dict[str, int]:
        """What a request says of the step of the reads (the server computes ahead at it), if not 1."""
        return {"step": self._step} if self._step > 1 else {}

    def _receive_one(self, waiting_for: str) -> None:
        # (the server's silence counted from the start of the earliest read under way: see .reads_begun)
        kind, header, buffers = self._connection.receive(waiting_for, self._reads.earliest(None))
        if kind == b"restarted":
            self._server_restarted()
            return
        if kind == b"silent":  # an answer may have been lost with a broken connection
            self._ask_again()
            return
        server = header.get("server") if isinstance(header, dict) else None
        if kind == b"forgotten" and (server == self._connection.server or self._is_new(server)):
            self._server_restarted()  # taken for dead (stopped for longer than its timeout), or a new server: a
            return  # hello anew, and what was asked is asked again
        if kind not in (b"item", b"error", b"failed") or not isinstance(header, dict):
            return
        if self._is_new(server):  # answered before a heartbeat said so
            self._server_restarted()
        if server == self._connection.server:  # not a late answer of a server gone since: its pool is gone too
            self._open_pool(header)
        answered = header.get("req")
        if isinstance(answered, int) and answered in self._chunks.asked:
            self._chunks.answered(answered, kind, header, buffers, f"the server at {self.address}")
            return
        places = header.get("places") if kind == b"item" else None
        pool, bad = self._pool, None
        slot: Any = header.get("slot")  # (ints, once handed_anew has checked them)
        number: Any = header.get("handover")
        if places is not None:
            if pool is None or header.get("in") != pool.name:  # written into a pool no longer ours: asked again
                if isinstance(answered, int) and answered in self._asked:
                    self._connection.send(
                        b"get", {"req": answered, "index": self._asked[answered], **self._step_said()}
                    )
                return
            try:
                if not pool.handed_anew(slot, number):  # a repeat of an answer received already (asked again)
                    return
            except wire.ProtocolError as error:
                bad = error
        j = self._asked.pop(answered, None) if isinstance(answered, int) else None
        if j is None:  # an answer to a request dropped after a jump, or answered already
            if isinstance(answered, int):
                self._dropped.pop(answered, None)
            if places is not None and bad is None:
                cast(ReceivedPool, pool).not_read(slot, number)
            return
        del self._asking[j]
        where = f"the server at {self.address}"
        if kind == b"item":
            try:
                if bad is not None:
                    raise bad
                if places is not None:
                    assert pool is not None  # checked above
                    try:
                        buffers = pool.buffers(slot, number, places)
                    except wire.ProtocolError:  # nothing was leased: the slot goes back
                        pool.not_read(slot, number)
                        raise
                self._arrived[j] = ("ok", wire.decode(header.get("tree"), buffers))
            except wire.ProtocolError as error:
                self._arrived[j] = ("error", error)
        elif kind == b"error":
            self._arrived[j] = ("error", restore_failure(header, where))
        else:
            self._arrived[j] = ("error", LoaderError(f"{where} could not compute item {j}: {header.get('message')}"))

    def _is_new(self, server: Any) -> bool:
        return isinstance(server, str) and self._connection.is_new(server)

    def _open_pool(self, fields: Any) -> None:
        """Open the pool that ``fields`` (a welcome, an item's answer) announce, if any and none is open."""
        if isinstance(fields, dict) and "pool" in fields and self._pool is None:
            if self._settings.get("shared_memory", True):
                self._pool = ReceivedPool.open(fields["pool"])

    def _drop_pool(self) -> None:
        """Let go of the pool (with the lock held, or in a new process)."""
        pool, self._pool, self._dropped = self._pool, None, {}
        if pool is not None:
            pool.close()

    def _server_restarted(self) -> None:
        """A new server at the address: read on if it serves the same view; ask it what the last one lost.

        The last server's pool goes (items read from it stay readable); the new one makes another.
        """
        self._restarting = True  # until it is done: a read cut short (a Ctrl-C, a loader closing) leaves it to the next
        self._drop_pool()
        info = self._connection.hello()
        self._check_still_served(info)
        self._at_once = isinstance(info, dict) and info.get("at_once") is True  # (the next reads; those asked: again)
        self._open_pool(info)
        self._ask_again()
        self._restarting = False

    def _ask_again(self) -> None:
        """Ask again for everything asked and not answered (an answer that comes twice is dropped); the slots
        handed back go again with the next request."""
        if self._pool is not None:
            self._pool.hand_back_again()
        # (those dropped first: the server takes the last asked for as where this view reads)
        for number, index in [*self._dropped.items(), *self._asked.items()]:
            self._connection.send(b"get", {"req": number, "index": index, **self._step_said()})
        for number, positions in list(self._chunks.asked.items()):
            self._connection.send(b"get", {"req": number, "positions": positions})

    def _check_still_served(self, info: Any) -> None:
        """``LoaderError`` (now and at every later read) if a server that came back serves another view."""
        replaced = self._serving_another(info)
        if replaced is not None:
            self._replaced = str(replaced)
            raise replaced
        served = Served.from_welcome(info)
        if served.items is not None or self._served.items is None:  # what the items are, once known, is compared on
            self._served = served
            self._take_specs(info)  # (and views above may have found it once: kept)

    def _serving_another(self, info: Any) -> LoaderError | None:
        """The error to raise if a server's welcome, ``info``, says that it serves another view than this one."""
        served = Served.from_welcome(info)
        if not served.differs_from(self._served):
            return None
        return LoaderError(
            f"connect: the server at {self.address} came back serving {served.described()}, where it served "
            f"{self._served.described()}: connect again to read what it serves now"
        )

    def _describe(self) -> str:
        return f"served({self.address}) {self._remote_label}"

    def close(self) -> None:
        """Disconnect (the server frees what it held for this consumer); idempotent.

        Items already read stay readable, those read from shared memory too.
        """
        try:
            self._connection.close()  # a read waiting in another thread wakes up, and raises
        finally:  # a Ctrl-C raised once the connection is released: the spares and the pool too
            try:
                self._close_spares()
            finally:
                self._let_go_if_closed()

    def _let_go_if_closed(self) -> None:
        """Once the connection is closed: the items read ahead go, and the pool; unless a read holds them, which
        lets go of them as it ends (whoever holds the lock looks once it let go of it, after the close)."""
        if self._connection.closed and self._lock.acquire(blocking=False):
            try:
                self._arrived.clear()  # never to be read now (in the pool: it goes)
                if self._connection.pid == os.getpid():  # (a forked child's copy was closed as it was forked)
                    self._drop_pool()
            finally:
                self._lock.release()

    def _close_spares(self) -> None:
        """Close every spare connection, whatever one of them raises (a Ctrl-C): raised once all are closed."""
        raised: BaseException | None = None
        while self._all_spares:
            try:
                self._all_spares.pop().close()
            except BaseException as error:
                raised = raised or error
        if raised is not None:
            raise raised

    def __enter__(self) -> RemoteView:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reconnect, (self._settings,))


class Served(NamedTuple):
    """What tells one served view from another (the same view may be labelled otherwise).

    >>> Served("view", 10, False, None).differs_from(Served("view", 10, False, ["f8"]))  # items known to one side
    False
    >>> Served("view", 12, False, None).described()
    'a view of length 12'
    """

    kind: Any
    length: Any
    may_end: Any
    items: Any  # the items' encoded spec, where the server knows it

    @classmethod
    def from_welcome(cls, info: Any) -> Served:
        info = info if isinstance(info, dict) else {}
        return cls(info.get("kind"), info.get("length"), info.get("may_end"), info.get("items"))

    def differs_from(self, other: Served) -> bool:
        """Whether this is another view than ``other``: items described by one side only may be the same."""
        if self[:3] != other[:3]:
            return True
        return None not in (self.items, other.items) and self.items != other.items

    def described(self) -> str:
        if self.kind != "view":
            return f"a {self.kind}" if isinstance(self.kind, str) else "something else"
        what = f"a view of length {self.length}" if not self.may_end else "a view of unknown length"
        try:
            return what if self.items is None else f"{what} (items {describe_spec(wire.decode_spec(self.items))})"
        except wire.ProtocolError:
            return what


class RemoteStream(Iterator[Any]):
    """The items of a stream served by :func:`~lazyseq.serve`; each one goes to exactly one consumer.

    ``ahead`` items are asked for ahead of use. An item counts as delivered
    once its caller is done with it: it comes back for the next item (whose
    request says so: a process killed before that request left goes without
    having said it), calls :meth:`sync` (which waits until the server knows)
    or closes the consumer (not a ``with`` block left on an exception).
    Items received and not delivered when the consumer dies (the one its
    caller was working on too) go to another consumer.

    >>> import lazyseq
    >>> with lazyseq.serve(iter(["a", "b", "c"]), "tcp://127.0.0.1:0") as server:
    ...     with lazyseq.connect(server.address) as stream:
    ...         list(stream)
    ['a', 'b', 'c']
    """

    def __init__(self, connection: Connection, ahead: int) -> None:
        self._connection = connection
        self._ahead = ahead
        self._received: deque[tuple[str, int, str, Any]] = deque()  # (server instance, seq, status, value)
        self._asked = 0  # items asked for and not received
        self._handed: deque[int] = deque(maxlen=RECENT)  # the items handed out last (their acks may be lost)
        self._acks = _Acknowledgements(connection.server)
        self._servers_before: set[str] = set()  # the server instances that served it before the one it acknowledges to
        connection.say_at_goodbye(self._acks.farewell)  # collected, or the program ends, without close()
        self._owed = self._acks.owed
        self._unconfirmed = self._acks.unconfirmed
        self._requests = 0  # requests sent: each one numbered
        self._ended = False
        self._gaps = connection.gaps()  # the heartbeats' gaps the server confirmed it lived through (see __next__)
        self._lock = threading.Lock()
        self._reads = ReadsBegun()  # the reads of threads sharing this stream, under way

    @property
    def address(self) -> str:
        return self._connection.address

    @property
    def _server(self) -> str | None:
        """The server instance that numbered the items handed out and acknowledged."""
        return self._acks.server

    def __iter__(self) -> RemoteStream:
        return self

    def __getitem__(self, key: Any) -> Any:
        raise TypeError(f"{self._not_a_view()}: its items are read in turn (next(), a for loop), not by index")

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and hasattr(View, name):  # view.smap(...) on what connect() gave: a stream
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}: {self._not_a_view()}; "
                "lazyseq.uniter(stream) views its items in the order they come"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _not_a_view(self) -> str:
        return f"the server at {self.address} serves a stream (an iterable), not a view"

    def __next__(self) -> Any:
        if self._connection.pid != os.getpid():
            raise LoaderError(
                f"connect: a stream served at {self.address} cannot be read in a process forked from the one that "
                "connected to it (both would hand out the items it had received); connect to it in this process"
            )
        taken = None
        try:
            with self._reads.begun(), self._lock:  # (a thread that waits meanwhile: see .reads_begun)
                if self._connection.closed:  # (its items received too: none is handed out once it is closed)
                    raise self._connection.closed_error()
                # the caller came back: what it had is acknowledged with the next request, or at once if it waits
                unsent = self._requests if self._acknowledge_owed() else None
                while True:
                    if self._ended:
                        raise StopIteration
                    if not self._received and not self._asked:
                        self._ask(self._ahead)
                    while not self._received:
                        if self._ended:
                            raise StopIteration
                        if unsent == self._requests:  # (no request sent since: messages that sent none go on waiting)
                            message = self._connection.receive_within(ACK_WHILE_WAITING, "the next item of the stream")
                            if message is None:
                                self._ask(0)
                            else:
                                self._take_in(*message)
                            continue
                        self._receive_one()
                    gaps = self._connection.gaps()
                    if gaps == self._gaps:
                        break
                    self._confirm()  # the server may have taken this consumer for dead, and given its items to others
                    self._gaps = gaps  # once the server answered
                    # A server that went away meanwhile may have done so before it went, and cannot say: what it sent
                    # and this consumer had not handed out is dropped.
                    answering = self._connection.server
                    kept = deque(entry for entry in self._received if entry[0] == answering)
                    if len(kept) < len(self._received):  # asked for anew: ahead stays ahead
                        self._received = kept
                        more = self._ahead - len(kept) - self._asked
                        if more > 0:
                            self._ask(more)
                # A Ctrl-C comes between two calls: until the item leaves the queue, it is there to be read again;
                # from then on, the handler below puts it back. Either way it is not acknowledged yet.
                entry = self._received[0]
                server, seq, status, value = entry
                self._ask(1)  # one more asked for, acknowledging what the caller had before
                del self._received[0]
                taken = entry
                if server == self._server:  # (else sent by a server that is gone: nobody to acknowledge it to)
                    self._owed.append(seq)
                    self._handed.append(seq)
            if status == "error":  # (within the try: a Ctrl-C as it is raised puts it back, below)
                try:
                    raise value
                except Exception as error:
                    errors.reraise(error)
        except KeyboardInterrupt:
            # interrupted as the lock was let go: the caller has not got the item (unless another thread reads now)
            if taken is not None and self._lock.acquire(blocking=False):
                try:
                    self._received.appendleft(taken)
                    if taken[0] == self._server:
                        self._not_handed_out([taken[1]])
                finally:
                    self._lock.release()
            raise
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(
            f"a stream served at {self.address} cannot be pickled: each of its items goes to one consumer, and a "
            "copy would be another one sharing this one's items; connect to the server where the items are read"
        )

    def _acknowledge_owed(self) -> bool:
        """The caller came back: the items handed out before are done with, and acknowledged by the next request.

        Whether there were any.
        """
        if not self._owed:
            return False
        for seq in self._owed:
            self._unconfirmed.setdefault(seq, self._requests + 1)
        self._owed.clear()
        return True

    def _ask(self, more: int) -> None:
        """Ask for ``more`` items, acknowledging every item done with and not known to be known."""
        self._connection.send(b"next", self._next_header(more))
        # Counted once sent: a request cut short by a Ctrl-C may count items never asked for, and the stream would
        # wait for them for ever; one sent but not counted brings an item more than asked, which is kept.
        self._asked += more

    def _next_header(self, more: int, **more_fields: Any) -> dict[str, Any]:
        return {"more": more, **self._acks_header(), **more_fields}

    def _acks_header(self) -> dict[str, Any]:
        """A request's number and acknowledgements: every item handed out and done with, not known to be known."""
        self._requests += 1
        return {"ack": list(self._unconfirmed), "req": self._requests, "server": self._server}

    def _known_up_to(self, header: dict) -> None:
        """The server acted on the requests up to ``header["acked"]``: the items they acknowledged are known."""
        acked = header.get("acked")
        if type(acked) is int and self._unconfirmed:
            for seq in [seq for seq, request in self._unconfirmed.items() if request <= acked]:
                del self._unconfirmed[seq]

    def _receive_one(self, waiting_for: str = "the next item of the stream") -> bytes:
        """Take in one message from the server; its kind."""
        return self._take_in(*self._connection.receive(waiting_for, self._reads.earliest(None)))

    def _take_in(self, kind: bytes, header: Any, buffers: list) -> bytes:
        """Act on a message from the server; its kind."""
        if kind == b"restarted":  # a new server: it knows nothing of what was asked
            self._connection.send(b"next", {"more": self._asked, "ack": [], "server": self._server})
        elif kind == b"silent":  # what the server sent may be lost: it sends again what was not acknowledged
            have = [seq for server, seq, _, _ in self._received if server == self._server]
            # "asked": how many items it waits for, should a request have been lost (see Connection.send)
            self._connection.send(b"next", self._next_header(0, resend=have, asked=self._asked))
        elif kind == b"forgotten":  # taken for dead: what it had not handed out went to others
            server = header.get("server") if isinstance(header, dict) else None
            self._received = deque(entry for entry in self._received if entry[0] != server)
            self._connection.hello()
            self._asked = 0
            # handed out: the server keeps them from going out again; those still held (of a server that went away)
            # count against ahead, and each one handed out asks for one more
            self._ask(max(0, self._ahead - len(self._received)))
        elif kind == b"end":
            self._ended = True
            self._asked = 0
            if isinstance(header, dict):
                self._known_up_to(header)
        elif kind == b"synced" and isinstance(header, dict):
            server = header.get("server")
            if server == self._server:
                self._known_up_to(header)
            elif isinstance(server, str) and server not in self._servers_before:  # a new server instance: what this
                self._serving_anew(server)  # consumer acknowledged is of another
        elif kind in (b"item", b"error") and isinstance(header, dict) and type(header.get("seq")) is int:
            seq, server = header["seq"], str(header.get("server", self._server))
            if server in self._servers_before:  # sent before the server went, read since: handed out, unacknowledged
                pass
            elif server != self._server:  # a new server instance numbers its items anew
                self._serving_anew(server)
            else:
                self._known_up_to(header)
                if seq in self._handed or seq in self._unconfirmed:  # handed out: the server did not hear so
                    self._unconfirmed[seq] = self._requests + 1  # acknowledged again by the next request
                    return kind
                if any(seq == s and server == i for i, s, _, _ in self._received):
                    return kind  # sent again after a silence, but it had arrived
            self._asked = max(0, self._asked - 1)
            if kind == b"item":
                try:
                    self._received.append((server, seq, "ok", wire.decode(header.get("tree"), buffers)))
                except wire.ProtocolError as malformed:  # handed out (and acknowledged) as this item's failure
                    self._received.append((server, seq, "error", malformed))
            else:
                failure = restore_failure(header, f"the server at {self.address}")
                chain = getattr(failure, errors.REMOTE_CHAIN, "")
                setattr(failure, errors.REMOTE_CHAIN, f"stream[{seq}]" + (f" -> {chain}" if chain else ""))
                self._received.append((server, seq, "error", failure))
        return kind

    def _serving_anew(self, server: str) -> None:
        """A new server instance, ``server``, numbers its items anew: what was handed out, or is to be acknowledged,
        was the last one's. Messages of the last one read since (received before a new one's) change nothing."""
        if self._acks.server is not None:
            self._servers_before.add(self._acks.server)
        self._acks.server = server
        self._handed.clear()
        self._unconfirmed.clear()

    def sync(self) -> None:
        """Wait until the server has recorded every item handed out so far: none of them goes to anyone again."""
        with self._lock:
            self._acknowledge_owed()
            # again if taken for dead (it said hello again, and asked again), or an acknowledgement was lost
            while not self._confirm() or self._unconfirmed:
                pass

    def _confirm(self, within: float | None = None) -> bool:
        """Ask the server whether it still counts on this consumer: False if it had taken it for dead.

        What was received and not handed out is then dropped (the server gave
        it to others), and this consumer says hello and asks anew. The items
        handed out that the server may not know of are acknowledged again.
        ``within``: seconds to wait for the answer at most (then False too).
        """
        # again: requests may have been lost with a connection
        flags = 0 if within is None else DONTWAIT
        self._connection.send(b"sync", self._acks_header(), flags)
        deadline = None if within is None else time.monotonic() + within
        while True:
            if deadline is None:
                kind = self._receive_one("the server to confirm")
            else:
                left = deadline - time.monotonic()
                message = None if left <= 0 else self._connection.receive_within(left, "the server to confirm")
                if message is None:
                    return False
                kind = self._take_in(*message)
            if kind in (b"synced", b"forgotten"):
                return kind == b"synced"
            # The 'sync' or its answer lost with a broken connection, or a new server: asked again.
            if kind in (b"silent", b"restarted"):
                self._connection.send(b"sync", self._acks_header(), flags)

    def close(self) -> None:
        """Disconnect: items received and not handed out go back to the server for other consumers.

        The items handed out count as done with. Those the server may not know
        of yet (their requests lost with a broken connection, or on their way)
        are acknowledged once more, and the server's answer awaited for up to
        ``CONFIRM_ON_CLOSE`` seconds (:meth:`sync` waits as long as it takes);
        the goodbye says them again. A ``with`` block left on an exception
        closes without the last item handed out: its caller did not finish it,
        and it goes to another consumer.
        """
        try:
            if (self._owed or self._unconfirmed) and self._connection.pid == os.getpid() and self._lock.acquire(False):
                try:  # (not while a read uses the socket, nor in a forked child: the socket is its parent's)
                    self._acknowledge_owed()
                    self._confirm(within=CONFIRM_ON_CLOSE)
                except Exception:  # the server is gone, or cannot take it now: as with any message lost
                    pass
                finally:
                    self._lock.release()
        finally:
            self._connection.close()

    def __enter__(self) -> RemoteStream:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        # left on an error, not one raised as the caller came back for more: the caller did not finish its item
        if kind is not None and not self._acks.came_back_in(trace) and self._lock.acquire(blocking=False):
            try:
                self._not_handed_out(list(self._owed))
            finally:
                self._lock.release()
        self.close()

    def _not_handed_out(self, seqs: list[int]) -> None:
        """Items that count as never handed out after all: the server gives them to another consumer (or this one)."""
        for seq in seqs:
            for handed in (self._owed, self._handed):
                if seq in handed:
                    handed.remove(seq)

    def __repr__(self) -> str:
        return f"<lazyseq.RemoteStream from {self.address}>"


class _Acknowledgements:
    """What a stream's consumer has to tell its server about the items it handed out, kept apart from the consumer:
    the goodbye of its connection says it too, when the consumer is collected or the program ends without close()."""

    def __init__(self, server: str | None) -> None:
        self.server = server  # the server instance that numbered the items
        # Items handed out whose acknowledgement waits for the caller to come back (the next read, sync() or close()):
        # the one it was working on when its process died goes to another consumer
        self.owed: list[int] = []
        # Items acknowledged that the server has not said it knows of, each with the request that first acknowledged
        # it. Every request acknowledges them all again, so that a connection broken under one loses none: items
        # say which request the server acted on last ("acked"), and those it covers are known.
        self.unconfirmed: dict[int, int] = {}

    def farewell(self) -> dict[str, Any]:
        """The goodbye's header: the items handed out count as done with, unless the program ends on an error that
        it did not catch, raised while the caller worked (then the one it was working on goes to another consumer,
        as after a crash)."""
        acks = list(self.unconfirmed)
        trace = _uncaught_at_exit()
        if trace is None or self.came_back_in(trace):
            acks += self.owed
        return {"ack": acks, "server": self.server} if acks else {}

    def came_back_in(self, trace: Any) -> bool:
        """Whether the traceback ``trace`` passes through its consumer's ``__next__``: raised as the caller had come
        back for the next item (a Ctrl-C as the read began), it had finished the last one."""
        while trace is not None:
            frame = trace.tb_frame
            if (
                frame.f_code is RemoteStream.__next__.__code__
                and getattr(frame.f_locals.get("self"), "_acks", None) is self
            ):
                return True
            trace = trace.tb_next
        return False


def _uncaught_at_exit() -> Any:
    """The traceback of the exception the program is ending on (its main thread is done; Python printed it), if any."""
    if threading.main_thread().is_alive():
        return None
    error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return None if error is None else error.__traceback__


def connect(
    address: str,
    *,
    timeout: float = 10.0,
    server_key: Any = None,
    curve_keypair: tuple[Any, Any] | None = None,
    ahead: int = 4,
    shared_memory: bool = True,
) -> Any:
    """Connect to a :func:`~lazyseq.serve` server: a view of what it serves, or an iterator over its stream.

    Which of the two comes back depends on what the server serves, which
    only the server knows: type checkers see ``Any`` (a :class:`RemoteView`
    or a :class:`RemoteStream`), so that either is used without a check.

    A served view comes back as a :class:`RemoteView`: ``len``, indexing,
    slices and every combinator work on it, reads in order keep up to
    ``ahead`` items asked for ahead of use (asked in runs, once half of them
    have been read), a batch (``remote.batch(k)``, after ``shuffle`` too)
    asks for its items at once and gets them in one message, and
    ``shard(remote, rank, world_size)`` splits it between trainers. Threads
    reading it at once (a thread ``prefetch``) do not wait for each other: a
    read that finds its connection busy opens one of its own, kept for later
    reads and closed with the view. A served stream comes back as a :class:`RemoteStream`,
    whose items no other consumer gets. A server that does not answer for
    ``timeout`` seconds raises :class:`~lazyseq.ServerLost` naming the
    address; one that comes back within ``timeout`` is reconnected to.

    With CURVE: ``server_key`` is the server's public key, ``curve_keypair``
    this client's ``(public, secret)`` pair (one is made when not given; the
    server must allow its public key if it lists ``allowed_clients``).

    A served view read on the server's own machine (over loopback or
    ``ipc://``) gets its items' arrays through shared memory rather than the
    socket, where the system lets this process open the server's (Linux, the
    same user): the server's worker threads compute each item into a slot of a
    pool it made for this consumer (a batch is built there, not copied), and
    the slot is reused once nothing refers to the item any more.
    ``shared_memory=False`` keeps everything on the socket. Items that cost
    less to compute than a round trip of messages (batches under 1 MiB
    gathered from memory maps, say) come faster with ``ahead=8`` or more:
    the consumer then rarely waits for an answer.

    >>> import lazyseq
    >>> with lazyseq.serve(iter(["a", "b", "c"]), "tcp://127.0.0.1:0") as server:
    ...     with lazyseq.connect(server.address) as stream:
    ...         print(list(stream))
    ['a', 'b', 'c']
    """
    from ..loading.options import positive

    require("zmq", "connect", "server", "pyzmq")
    ahead = positive(ahead, "ahead", "connect")
    check_endpoint(address, "connect", binding=False)
    settings = {
        "address": address,
        "timeout": timeout,
        "server_key": server_key,
        "curve_keypair": curve_keypair,
        "ahead": ahead,
        "shared_memory": flag(shared_memory, "connect: shared_memory"),
    }
    connection, info = _open_connection(settings)
    try:
        if not isinstance(info, dict) or info.get("kind") not in ("view", "stream"):
            raise wire.ProtocolError(f"{address} did not answer as a lazyseq server")
        if info["kind"] == "stream":
            return RemoteStream(connection, ahead)
        return RemoteView(connection, info, ahead, settings)
    except BaseException:
        connection.close()
        raise


def _reconnect(settings: dict[str, Any]) -> RemoteView | RemoteStream:
    return connect(**settings)


def _open_connection(settings: dict[str, Any]) -> tuple[Connection, Any]:
    """A connection to the server that ``settings`` name, and its answer to hello (what it serves)."""
    connection = Connection(settings["address"], settings["timeout"], settings["server_key"], settings["curve_keypair"])
    fields = hello_fields(settings["ahead"]) if settings.get("shared_memory", True) else {}  # on its machine?
    try:
        return connection, connection.hello(fields)
    except BaseException:
        connection.close()
        raise

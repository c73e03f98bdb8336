"""A view of what a server serves, read from it by index: what ``connect`` gives for a served view."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, NamedTuple, cast

import numpy as np

from ..loading.closing import hurried, interrupts_deferred, wait_unless_hurried
from ..loading.failures import LoaderError
from ..loading.jobs import ItemsAt
from ..loading.thread_workers import worker_stopping
from ..views.base import View
from ..views.display import describe_spec
from ..views.keys import Positions
from . import wire
from .chunk_reads import ChunkReads, Taken
from .connection import Connection
from .failures import restore_failure
from .reads_begun import ReadsBegun
from .shared_items import ReceivedPool, hello_fields

__all__ = ["RemoteView", "Served", "open_connection"]

STEADY_READS = 5  # reads in a row of one thread at a step other than 1 after which the reads ahead follow it
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
                    try:
                        status, value = self._read_held(i)
                    except KeyboardInterrupt:
                        self._interrupted = True  # (see _ask_again_if_interrupted)
                        raise
            finally:
                if self._connection.closed:  # from elsewhere (another thread, a signal handler) meanwhile
                    self._let_go_if_closed()
        if status == "error":
            raise value
        return value

    def _read_held(self, i: int) -> tuple[str, Any]:
        """Item ``i``'s answer, the lock held: asked for now if it was not, with the items ahead of it."""
        self._check_readable()
        self._ask_again_if_interrupted()
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
                self._ask_again_if_interrupted()
                requests, to_send = self._chunks.plan(idx, n, self._number_request)
                try:
                    for req, positions in to_send:
                        self._connection.send(b"get", {"req": req, "positions": positions})
                except BaseException as error:  # (a Ctrl-C): what was not sent would be waited for in vain
                    self._chunks.abandon(requests + [req for req, _ in to_send])
                    if isinstance(error, KeyboardInterrupt):
                        self._interrupted = True  # (see _ask_again_if_interrupted)
                    raise
            try:
                while True:  # the lock let go between two messages: another thread's request may go out then
                    self._await_turn(waiting_for, began)
                    with self._lock:
                        if not self._chunks.waiting(requests):
                            return self._chunks.take(requests, len(idx))
                        self._receive_one(waiting_for)
            except BaseException as error:  # a Ctrl-C, a server lost: the answers still to come are dropped, not kept
                with self._lock:
                    self._chunks.abandon(requests)
                    if isinstance(error, KeyboardInterrupt):
                        self._interrupted = True  # (see _ask_again_if_interrupted)
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
            opened, info = open_connection(self._settings)
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
        self._interrupted = False  # whether the last read was interrupted (see _ask_again_if_interrupted)

    def _number_request(self) -> int:
        self._next_req += 1
        return self._next_req - 1

    def _connect_here(self) -> None:
        self._connection, info = open_connection(self._settings)
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

    def _ask_again_if_interrupted(self) -> None:
        """With the lock held, as a read begins: if the last read was interrupted, ask again for what is under way
        (an answer that comes twice is dropped).

        pyzmq looks for signals after each frame it sends or receives: an
        interrupt raised there may lose a request (the rest of its frames are
        not sent, and the server drops what came) or an answer (read from the
        socket, not kept), which would otherwise be asked for again only once
        the server's silence ran out of patience.
        """
        if self._interrupted:
            self._ask_again()  # (cut short too: asked again at the next read)
            self._interrupted = False

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
        from .client import reconnect  # (which calls connect, which makes views of this class)

        return (reconnect, (self._settings,))


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


def open_connection(settings: dict[str, Any]) -> tuple[Connection, Any]:
    """A connection to the server that ``settings`` name, and its answer to hello (what it serves)."""
    connection = Connection(settings["address"], settings["timeout"], settings["server_key"], settings["curve_keypair"])
    fields = hello_fields(settings["ahead"]) if settings.get("shared_memory", True) else {}  # on its machine?
    try:
        return connection, connection.hello(fields)
    except BaseException:
        connection.close()
        raise

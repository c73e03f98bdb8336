"""An iterator over a served stream, and what it acknowledges: what ``connect`` gives for a stream."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, NoReturn

from ..loading.failures import LoaderError
from ..views import errors
from ..views.base import View
from . import wire
from .connection import Connection
from .failures import restore_failure
from .frames import DONTWAIT
from .reads_begun import ReadsBegun

__all__ = ["RemoteStream"]

RECENT = 256  # stream items remembered as handed out: sent again after a lost connection, they are dropped
# A caller that waits for the next item: how long before what it had is acknowledged on its own rather than with the
# request that goes as the next item is handed out (one message less for each item of a stream quicker to read than
# to make)
ACK_WHILE_WAITING = 0.02
CONFIRM_ON_CLOSE = 1.0  # seconds a stream's close() waits for the server to know every item handed out


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
        self._interrupted = False  # whether the last read was interrupted (see _ask_again_if_interrupted)
        self._ended = False
        self._ended_on: LoaderError | None = None  # the failure the stream stopped at, given to another consumer
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
                self._ask_again_if_interrupted()
                while True:
                    if self._ended:
                        self._end()
                    if not self._received and not self._asked:
                        self._ask(self._ahead)
                    while not self._received:
                        if self._ended:
                            self._end()
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
            self._interrupted = True
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

    def _ask_again_if_interrupted(self) -> None:
        """If the last read was interrupted, ask the server for what it sent and this consumer lacks, as after a
        silence.

        pyzmq looks for signals after each frame it receives: an interrupt
        raised there loses the item read from the socket, which would
        otherwise be sent again only once the server's silence ran out of
        patience.
        """
        if self._interrupted:
            self._take_in(b"silent", {}, [])
            self._interrupted = False

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
                if header.get("server", self._server) == self._server:  # (not a late end of a server gone since)
                    self._ended_on = self._failure_elsewhere(header.get("after_error"))
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

    def _end(self) -> NoReturn:
        """The end of the stream for this consumer: the failure the iterable stopped at the first time, if another
        consumer was handed it, then ``StopIteration``."""
        failure, self._ended_on = self._ended_on, None
        if failure is not None:
            raise failure
        raise StopIteration

    def _failure_elsewhere(self, failed: Any) -> LoaderError | None:
        """What this consumer raises at the end of a stream whose iterable stopped at the failure ``failed`` (what
        the end says), unless it was handed that failure itself."""
        if not isinstance(failed, dict) or type(failed.get("seq")) is not int:
            return None
        seq = failed["seq"]
        if seq in self._handed or any(s == seq for _, s, _, _ in self._received):
            return None
        return LoaderError(
            f"the stream served at {self.address} ended right after its item {seq} failed, and that failure went to "
            f"another consumer: {failed.get('type')}: {failed.get('message')}; if the iterable stopped on it (a "
            "generator ends as it raises), the items it would have given after it are missing"
        )

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

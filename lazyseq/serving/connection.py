"""A consumer's side of a data server: one socket for data, a heartbeat thread, ``ServerLost`` instead of a hang.

The data socket (a ZeroMQ DEALER named after the consumer, so that the server
knows it again after a reconnection) is used only by the thread that reads;
``close()`` from another thread wakes that reader (which raises
:class:`ConnectionClosed`) and waits for it to let go of the socket before
closing it.
A second socket, owned by a small heartbeat thread, pings the server every
quarter of ``timeout``: the server's answers say it is alive (and which
instance it is: a server that restarted gets the requests it lost sent again),
and the pings tell the server this consumer is alive while it trains.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..arguments import seconds
from ..loading.closing import Finalizer, collected_while_running, interrupts_deferred, interrupts_held
from ..loading.failures import LoaderError
from ..loading.thread_workers import worker_stopping
from . import wire
from .endpoints import is_ipv6
from .envelopes import opened
from .failures import ServerLost
from .frames import DONTWAIT, receive_waiting, send_frames
from .security import key_bytes, keypair_bytes

__all__ = ["Connection", "ConnectionClosed"]

BYE_LINGER_MS = 200
_ONE_KINDS = {b"welcome", b"item", b"error", b"failed", b"end", b"synced", b"refused", b"forgotten"}
_SERVER_KINDS = _ONE_KINDS | {b"several", b"closing"}  # (several messages in one: see .envelopes)


class ConnectionClosed(LoaderError):
    """A consumer of a data server was closed (from another thread, say) while it waited for the server, or is read
    after it was closed.

    >>> import lazyseq
    >>> issubclass(lazyseq.ConnectionClosed, lazyseq.LoaderError)
    True
    """


ConnectionClosed.__module__ = "lazyseq"  # where users import it from


class Connection:
    """Talks to the server at ``address``: ``send`` requests, ``receive`` answers, within ``timeout``."""

    def __init__(
        self,
        address: str,
        timeout: float,
        server_key: Any = None,
        curve_keypair: tuple[Any, Any] | None = None,
    ) -> None:
        import zmq  # here: lazyseq imports zmq only when a server or a consumer is made

        timeout = seconds(timeout, "connect: timeout", positive=True, at_most=wire.MAX_TIMEOUT)
        if curve_keypair is not None and server_key is None:
            raise ValueError("connect: curve_keypair needs server_key (the server's public key) too")
        self.address = address
        self.timeout = float(timeout)
        self.name = os.urandom(12)
        self._zmq = zmq
        curve = None
        if server_key is not None:  # (checked before anything is made: a wrong key leaves nothing to close)
            public, secret = keypair_bytes(
                curve_keypair if curve_keypair is not None else zmq.curve_keypair(), "connect"
            )
            curve = (key_bytes(server_key, "connect: server_key"), public, secret)
        self._curve = curve
        self.closed = False
        self.pid = os.getpid()
        self._goodbye: list[Callable[[], dict] | None] = [None]  # what the goodbye says besides itself
        self.server: str | None = None  # the server instance answering, from its welcome
        self.gone: set[str] = set()  # those that answered before it: their late messages restart nothing
        self._hello_fields: dict = {}
        self._hellos = 0  # hellos sent
        self._patience = Patience(2 * self.interval, self.timeout)
        self._heard = time.monotonic()  # when the last message from the server came
        self._closing: Any = None  # the server instance that said it was closing, if one did
        self._unread: deque[tuple[bytes, Any, list]] = deque()  # the rest of a 'several' message (.envelopes)
        try:
            with interrupts_deferred():  # a Ctrl-C as the sockets, pipes and thread are made: raised once all are
                self._open_all(zmq)
        except KeyboardInterrupt:
            self.close()
            raise

    def _open_all(self, zmq: Any) -> None:
        """Make the sockets, the pipe that wakes a reader and the heartbeat's thread; what was made goes should a
        step fail."""
        context = self._context = zmq.Context()
        pipe: tuple[int, ...] = ()
        heartbeat = None
        try:
            socket = self._socket = self._open(zmq.DEALER, self.name)
            self._poller = zmq.Poller()
            self._poller.register(socket, zmq.POLLIN)
            pipe = self._wake_fd, self._waker_fd = os.pipe()  # close() from another thread wakes a waiting reader
            self._poller.register(self._wake_fd, zmq.POLLIN)
            self._using = threading.RLock()  # held while the socket is in use; re-entrant: a signal handler may close
            heartbeat = self.heartbeat = _Heartbeat(self, self.interval)
            self._finalizer = Finalizer(
                self, _close, self.pid, socket, heartbeat, context, pipe, self._using, self._goodbye
            )
        except BaseException:
            if heartbeat is not None:
                heartbeat.stop()  # (never started: its socket and pipe are closed)
            for fd in pipe:
                os.close(fd)
            with interrupts_held():
                context.destroy(linger=0)
            raise
        self._finalizer.also_as_a_child_ends(self)  # a worker process that read a view says goodbye as it ends
        try:
            heartbeat.start()
        except BaseException:  # no thread to be had
            self._finalizer()
            raise

    @property
    def interval(self) -> float:
        return wire.heartbeat_interval(self.timeout)

    def _open(self, kind: int, name: bytes) -> Any:
        zmq = self._zmq
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.IPV6, is_ipv6(self.address))
        socket.setsockopt(zmq.ROUTING_ID, name)
        socket.setsockopt(zmq.RECONNECT_IVL, 50)
        # tries spaced by at most half a heartbeat: a server back late within the timeout is not missed by a long wait
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, max(50, int(self.interval * 500)))
        socket.setsockopt(zmq.SNDTIMEO, int(self.timeout * 1000))  # no peer to send to: ServerLost, not a hang
        if self._curve is not None:
            socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = self._curve
        try:
            socket.connect(self.address)
        except zmq.ZMQError as error:
            socket.close(linger=0)
            raise ValueError(f"connect: cannot connect to {self.address!r}: {error}") from None
        return socket

    def send(self, kind: bytes, header: Any, flags: int = 0) -> None:
        with _InUse(self, "sending", kind):
            try:
                send_frames(self._socket, [wire.TAG, kind, wire.dumps(header)], flags)
            except self._zmq.Again:  # the first frame (ZeroMQ takes the others of a message with it)
                raise ServerLost(
                    f"lost the server at {self.address}: could not send to it for {self.timeout:g} s{self._hint()}"
                ) from None
            except BaseException:  # a Ctrl-C between two frames, say: the next message would be glued to them
                self._cut_short()
                raise

    def _cut_short(self) -> None:
        """End whatever part of a message was sent with a frame that tells the server to drop it all.

        If none of it went out, that frame is a message alone, dropped too.
        The request is lost as a lost answer would be: asked again by the
        next read of the view or stream that sent it (the interrupt ended its
        read), or after a silence.
        """
        try:
            self._socket.send(wire.CUT, DONTWAIT)
        except Exception:  # the socket is gone (closed meanwhile): so is the message
            pass

    def closed_error(self) -> ConnectionClosed:
        """What a read of a consumer closed already raises."""
        return ConnectionClosed(
            f"connect: this consumer of the server at {self.address} is closed: connect again to read from it"
        )

    def _closed(self, doing: str) -> ConnectionClosed:
        return ConnectionClosed(f"connect: the connection to {self.address} was closed while {doing}")

    def _hint(self) -> str:
        """What may be wrong when the server never answered: keys (a CURVE server drops what it cannot decrypt)."""
        if self.heartbeat.answers:
            return ""
        if self._curve is not None:
            return " (with CURVE: check server_key, and that the server allows this client's public key)"
        return " (nothing answered at that address; a server with CURVE keys needs server_key and curve_keypair here)"

    def gaps(self) -> int:
        """How many long gaps the heartbeats had: a consumer that saw a new one may have been taken for dead.

        Stopped (``SIGSTOP``, a suspended machine) or starved of the GIL, this
        process did not ping for half its timeout; cut off from the server, it
        heard no answer for as long. The heartbeat thread counts such gaps, and
        one still going on counts too.
        """
        beat = self.heartbeat
        now = time.monotonic()
        # The thread counts a gap, then moves its time on: read in the other order, a gap that ends meanwhile is
        # counted once or twice (a harmless check more), never missed.
        going_on = (now - beat.last_ping > beat.lapse) + (now - beat.last_answer > beat.lapse)
        return going_on + beat.lapses + beat.silences

    def hello(self, fields: dict | None = None) -> dict:
        """Ask what the server serves, saying ``fields`` too (those of the last hello if None).

        ``ServerLost`` if no server answers within ``timeout``.
        """
        if fields is not None:
            self._hello_fields = fields
        said = self._say_hello()
        while True:
            kind, header, _ = self.receive(waiting_for="an answer to hello")
            if kind in (b"silent", b"restarted"):  # the hello or its answer lost with a connection; a new server
                said = self._say_hello()
            elif kind == b"welcome" and isinstance(header, dict) and header.get("hello") == said:
                self._answered_by(header.get("server"))
                return header
            # else: the answer to an earlier hello, which the server has made anew since (a consumer's pool, say)

    def is_new(self, server: str) -> bool:
        """Whether ``server``, an instance named in a message, is another than the one answering and those before."""
        return server != self.server and server not in self.gone

    def _answered_by(self, server: Any) -> None:
        if self.server is not None and server != self.server:
            self.gone.add(self.server)
        self.server = server

    def _say_hello(self) -> int:
        """Send a hello, numbered: only the answer to the last one sent is taken (see :meth:`hello`)."""
        self._hellos += 1
        hello = {**self._hello_fields, "timeout": self.timeout, "hello": self._hellos, "several": True}
        self.send(b"hello", hello)
        return self._hellos

    def receive(self, waiting_for: str, since: float | None = None) -> tuple[bytes, Any, list]:
        """The next message from the server: ``(kind, header, buffers)``.

        ``ServerLost`` once the server has not answered (heartbeats included)
        for ``timeout``, counted from the last answer or the start of this
        wait, whichever is later; ``since``, a ``time.monotonic()`` earlier
        than now, starts the wait then (a reader that waited for another
        thread's read to end first: each has ``timeout``, not one after the
        other). ``kind`` is ``b"restarted"`` when a new server
        instance answers at the address (what was asked of the old one is
        lost), and ``b"silent"`` when the server answers heartbeats but sent
        nothing else for a while (an answer may have been lost with a
        connection that broke: the caller asks again); how long, see
        :class:`Patience`.
        """
        with _InUse(self, "waiting for", waiting_for):
            return self._receive(waiting_for, since)

    def receive_within(self, seconds: float, waiting_for: str) -> tuple[bytes, Any, list] | None:
        """The next message from the server if one arrives within ``seconds``, else None."""
        with _InUse(self, "waiting for", waiting_for):
            began = time.monotonic()
            while True:  # (what arrives may be no answer: a server's closing note, a message dropped)
                message = self._next_message(began)
                if message is not None:
                    return self._answer(message, waiting_for)
                left = began + seconds - time.monotonic()
                if left <= 0 or not self._socket.poll(max(1, int(left * 1000)), self._zmq.POLLIN):
                    return None

    def _receive(self, waiting_for: str, since: float | None = None) -> tuple[bytes, Any, list]:
        poller, beat = self._poller, self.heartbeat
        lapses = beat.lapses  # (read before the time it resumed: see _Heartbeat.run)
        quiet_since = time.monotonic()
        # (from ``since``, unless a message, a heartbeat's answer or this process resuming after a stop came later)
        waited_since = quiet_since if since is None else min(quiet_since, max(since, self._heard, beat.resumed))
        while True:
            message = self._next_message(quiet_since)  # one that has arrived already (read ahead): no poll
            if message is not None:
                return self._answer(message, waiting_for)
            if worker_stopping():  # a worker thread of a loader that is closing: nobody waits for this any more
                raise self.stopping(waiting_for)
            overdue = time.monotonic() - max(beat.last_answer, waited_since) > self.timeout  # (then no poll first)
            if not overdue and poller.poll(int(self.interval * 1000)):
                if self.closed:  # woken by close() from another thread
                    raise self._closed(f"waiting for {waiting_for}")
                if time.monotonic() - max(beat.last_answer, waited_since) <= self.timeout:
                    continue  # (else a socket that wakes with nothing to read: the checks below end the wait)
            now = time.monotonic()
            if beat.server is not None and self.server is not None and self.is_new(beat.server):
                self._answered_by(beat.server)
                return b"restarted", {}, []
            if now - quiet_since > self._patience.seconds and now - beat.last_answer < self.interval * 1.5:
                self._patience.lost_patience()
                return b"silent", {}, []
            # Each wait gives the server its whole timeout: one that came back after an earlier ServerLost
            # is found again (the heartbeats start over), not reported lost at once.
            silent = now - max(beat.last_answer, waited_since)
            stopped = beat.lapses != lapses or (now - beat.last_ping > beat.lapse and beat.is_alive())
            if silent > self.timeout and stopped:  # this process was stopped, not the server: it gets its timeout
                lapses, quiet_since, waited_since = beat.lapses, now, now
            elif silent > self.timeout:
                raise self._lost(silent, waiting_for)

    def _answer(self, message: tuple[bytes, Any, list], waiting_for: str) -> tuple[bytes, Any, list]:
        """``message``, unless the server refused a request: a server that cannot answer what this client asks (it
        serves another kind)."""
        kind, header, _ = message
        if kind == b"refused":
            reason = header.get("message") if isinstance(header, dict) else None
            raise LoaderError(
                f"connect: the server at {self.address} refused a request while this client was waiting for "
                f"{waiting_for}: {reason if isinstance(reason, str) else 'no reason given'}"
            )
        return message

    def _next_message(self, quiet_since: float) -> tuple[bytes, Any, list] | None:
        """The next message that has arrived (the rest of a message of several first), or None; what is not
        from a lazyseq server is dropped."""
        if self._unread:
            return self._unread.popleft()
        while True:
            frames = receive_waiting(self._socket, copied=3)  # (tag, kind and header: bytes, see receive_frames)
            if frames is None:
                return None
            self._heard = time.monotonic()
            self._patience.heard_after(self._heard - quiet_since)
            try:
                message = self._parse(frames)
                if message[0] == b"closing":  # kept for the ServerLost to come, unless a server answers again
                    header = message[1]
                    self._closing = header.get("server") if isinstance(header, dict) else None
                    continue
                if message[0] != b"several":
                    return message
                self._unread.extend(opened(message[1], message[2], _ONE_KINDS))  # (a Ctrl-C from here: kept)
            except wire.ProtocolError:
                continue
            return self._unread.popleft()

    def stopping(self, waiting_for: str) -> LoaderError:
        """What a read in a worker thread of a loader that is closing raises, rather than wait on (its loader would
        wait for it to end, up to the server's ``timeout`` for one that went away)."""
        return LoaderError(
            f"connect: stopped waiting for {waiting_for} from the server at {self.address}: the loader reading it is "
            "closing"
        )

    def check_heard(self, waiting_for: str, since: float) -> None:
        """``ServerLost`` if nothing came from the server for ``timeout`` since ``since`` (or since the last message,
        answer to a ping, or resumption after a stop, if later): for a reader waiting for another thread's read."""
        beat, now = self.heartbeat, time.monotonic()
        pinged = beat.last_ping  # (read before the time it resumed: see _Heartbeat.run)
        silent = now - max(since, self._heard, beat.last_answer, beat.resumed)
        if silent > self.timeout and now - pinged <= beat.lapse:  # (else this process was stopped)
            raise self._lost(silent, waiting_for)

    def _lost(self, silent: float, waiting_for: str) -> ServerLost:
        return ServerLost(
            f"lost the server at {self.address}: no answer for {silent:.1f} s (timeout={self.timeout:g}) "
            f"while waiting for {waiting_for}{self._hint()}{self._closed_there()}"
        )

    def _closed_there(self) -> str:
        """What a lost server said as it closed, if it did and none answered since: it was stopped, not cut off."""
        closing, answering = self._closing, self.heartbeat.server
        if closing is None or closing != self.server or answering not in (None, self.server):
            return ""
        return "; it said it was closing, and no server answered there since"

    @staticmethod
    def _parse(frames: list) -> tuple[bytes, Any, list]:
        if len(frames) < 3 or frames[0] != wire.TAG:
            raise wire.ProtocolError("not a lazyseq message")
        kind = frames[1]
        if kind not in _SERVER_KINDS:
            raise wire.ProtocolError(f"unknown message {kind[:20]!r}")
        return kind, wire.loads(frames[2]), [f.buffer for f in frames[3:]]

    def say_at_goodbye(self, fields: Callable[[], dict]) -> None:
        """Have the goodbye carry ``fields()`` (called then), whoever closes: ``close()``, the collector, the exit."""
        self._goodbye[0] = fields

    def close(self) -> None:
        """Say goodbye (the server frees what it held for this consumer) and release the sockets and thread.

        From another thread than the one reading, the reader is woken (it
        raises :class:`ConnectionClosed`) and the sockets are closed once it
        has let go of them.
        """
        if self.closed or not hasattr(self, "_finalizer"):  # (its making cut short: nothing was kept)
            return
        self.closed = True
        if os.getpid() != self.pid:  # a forked child's copy: the sockets, pipes and thread are its parent's
            return
        try:
            os.write(self._waker_fd, b"c")
        except OSError:
            pass
        with interrupts_deferred(), self._using:  # a second Ctrl-C (the first one ended the read) as it closes
            self._finalizer()  # says goodbye first


class Patience:
    """How long a server that answers heartbeats may send nothing else before the consumer asks again.

    At first ``2 * interval``: an answer lost with a connection that broke is
    asked for again soon. But an answer may take longer than that to arrive
    whole (a large item over a slow link, an item slow to compute), and asking
    again then only queues a copy behind it. So each time the consumer runs out
    of patience it waits twice as long the next time (``at_most`` at most),
    and an answer that took ``t`` to come keeps it waiting ``2 * t`` at least;
    answers that come quickly bring it back down, a tenth at a time.

    >>> patience = Patience(0.5, at_most=10.0)
    >>> patience.lost_patience(); patience.seconds
    1.0
    >>> patience.heard_after(3.0); patience.seconds
    6.0
    >>> for _ in range(40):
    ...     patience.heard_after(0.0)
    >>> patience.seconds
    0.5
    """

    def __init__(self, least: float, at_most: float) -> None:
        self.least, self.at_most = least, max(least, at_most)
        self.seconds = least

    def lost_patience(self) -> None:
        self.seconds = min(self.seconds * 2, self.at_most)

    def heard_after(self, waited: float) -> None:
        self.seconds = min(max(self.least, self.seconds * 0.9, 2 * waited), self.at_most)


class _InUse:
    """Holds the connection's socket while it is used for ``doing`` ``what``.

    ``ConnectionClosed`` if it is closed before or (by a signal handler)
    during that. A class, not a generator: it runs at every read, often
    after the reader slept, when every line of code costs cache misses.
    """

    __slots__ = ("connection", "doing", "what")

    def __init__(self, connection: Connection, doing: str, what: bytes | str) -> None:
        self.connection, self.doing, self.what = connection, doing, what

    def __enter__(self) -> None:
        connection = self.connection
        connection._using.acquire()
        if connection.closed:  # (by another thread, as this read went on: one begun after is told so before)
            connection._using.release()
            raise connection._closed(self._describe())

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _: object) -> None:
        connection = self.connection
        try:
            if isinstance(error, connection._zmq.ZMQError) and connection.closed:
                raise connection._closed(self._describe()) from None
        finally:
            connection._using.release()

    def _describe(self) -> str:
        what = self.what
        return f"{self.doing} a request" if isinstance(what, bytes) else f"{self.doing} {what}"  # (bytes: its kind)


class _Heartbeat(threading.Thread):
    """Pings the server every ``interval``; records when it last answered and which instance it is."""

    def __init__(self, connection: Connection, interval: float) -> None:
        super().__init__(name="lazyseq-connect-heartbeat", daemon=True)
        zmq = connection._zmq
        self._socket = connection._open(zmq.DEALER, connection.name + b"/heartbeat")
        self._ping = wire.dumps({"client": connection.name.hex(), "timeout": connection.timeout})
        self._interval = interval
        self._wake_fd, self._waker_fd = os.pipe()
        self.last_answer = time.monotonic()
        self.answers = 0
        self.server: str | None = None
        self.last_ping = time.monotonic()  # when this thread last pinged (or started)
        self.lapses = 0  # how often it pinged late enough that the server may have taken this consumer for dead
        self.resumed = time.monotonic()  # when it last pinged after such a lapse (or started)
        self.silences = 0  # how often the server answered late enough for the same (a network cut, say)
        self.lapse = connection.timeout / 2

    def run(self) -> None:
        import zmq

        socket = self._socket
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(self._wake_fd, zmq.POLLIN)
        next_ping = 0.0
        try:
            while True:
                now = time.monotonic()
                if now >= next_ping:
                    if now - self.last_ping > self.lapse:  # this process was stopped, or starved of the GIL
                        self.resumed = now  # (before the count and the ping's time, which readers read first)
                        self.lapses += 1
                    self.last_ping = now
                    try:
                        socket.send_multipart([wire.TAG, b"ping", self._ping], zmq.NOBLOCK)
                    except zmq.Again:  # not connected (yet): the silence is what the reader notices
                        pass
                    next_ping = now + self._interval
                ready = dict(poller.poll(int(max(0.0, next_ping - now) * 1000)))
                if self._wake_fd in ready:
                    return
                if socket in ready:
                    while True:
                        try:
                            frames = socket.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if len(frames) == 3 and frames[0] == wire.TAG and frames[1] == b"pong":
                            try:
                                header = wire.loads(frames[2])
                            except wire.ProtocolError:
                                continue
                            answered = time.monotonic()
                            if answered - self.last_answer > self.lapse:
                                self.silences += 1
                            self.last_answer = answered
                            self.answers += 1
                            if isinstance(header, dict) and isinstance(header.get("server"), str):
                                self.server = header["server"]
        finally:
            socket.close(linger=0)
            os.close(self._wake_fd)

    def stop(self) -> None:
        """Tell the thread to end, without waiting for it (see ``_end``); if it never started, release its socket."""
        if self.ident is None:
            self._socket.close(linger=0)
            os.close(self._wake_fd)
        else:
            try:
                os.write(self._waker_fd, b"s")
            except OSError:  # the thread already ended
                pass
        os.close(self._waker_fd)


def _close(
    pid: int,
    socket: Any,
    heartbeat: _Heartbeat,
    context: Any,
    wake_fds: tuple[int, int],
    using: Any,
    goodbye: list[Callable[[], dict] | None],
) -> None:
    """Say goodbye and release what a connection holds: on ``close()``, on garbage collection, and at exit."""
    if os.getpid() != pid:  # a forked child inherited a copy: the sockets and the thread are its parent's
        return
    if not using.acquire(blocking=False):  # at exit, a (daemon) thread waits on the socket: closing it under that
        return  # wait would break it with a ZeroMQ error; the process ends, and takes the socket with it
    try:
        with interrupts_deferred():  # all the way, whatever Ctrl-C says meanwhile (see lazyseq.loading.closing)
            _release(socket, heartbeat, context, wake_fds, goodbye[0])
    finally:
        using.release()


def _release(
    socket: Any, heartbeat: _Heartbeat, context: Any, wake_fds: tuple[int, int], goodbye: Callable[[], dict] | None
) -> None:
    try:  # the server frees what it held for this consumer at once (a stream's items go to others)
        send_frames(socket, [wire.TAG, b"bye", wire.dumps(goodbye() if goodbye is not None else {})], DONTWAIT)
    except Exception:  # nobody to say it to
        pass
    socket.close(linger=BYE_LINGER_MS)  # a moment for "bye" to leave; the server times out the consumer anyway
    heartbeat.stop()
    if collected_while_running():  # the heartbeat's end and the context's are waited for by a thread of its own
        # Not a daemon: the program (a multiprocessing child too) waits for it as it ends, so "bye" leaves
        ending = threading.Thread(target=_end, args=(context, wake_fds, heartbeat), name="lazyseq-connect-close")
        try:
            ending.start()
            return
        except RuntimeError:  # no thread to be had: ended here, as a close() ends it
            pass
    _end(context, wake_fds, heartbeat)


def _end(context: Any, wake_fds: tuple[int, int], heartbeat: _Heartbeat) -> None:
    """Once the heartbeat's thread has ended, release a connection's ZeroMQ context (its sockets closed) and the
    pipe that wakes its reader.

    The garbage collector's close leaves this to a thread of its own, which
    ends a moment later, rather than wait in whichever thread the collector
    runs in, where the wait may never end (and no other collection runs in
    the process meanwhile):

    - the context waits for its sockets to close, the heartbeat's among them,
      which the heartbeat's thread closes only once a collection that runs
      in it has returned;
    - a thread takes the lock of :mod:`threading`'s list of threads as it
      ends (and as it starts), and a collection that began in
      ``threading.enumerate()`` or ``threading.active_count()`` holds it: the
      heartbeat's thread cannot end until that collection has returned, nor
      can this one begin.
    """
    if heartbeat.ident is not None and heartbeat is not threading.current_thread():
        heartbeat.join()
    with interrupts_held():  # a Ctrl-C would end the wait for the linger of "bye", and leave the context's thread
        context.term()
    for fd in wake_fds:
        os.close(fd)

"""The thread of a data server: its sockets, the service, and what it answers.

One thread runs a server. It owns the listening ZeroMQ ROUTER socket and the
service (:class:`.view_service.ViewService` for a view,
:class:`.stream_service.StreamService` for an iterable), and waits on both at
once: requests on the socket, results from the service's workers (their
file descriptors, see :meth:`.backends.WorkerBackend.fds`). Items are computed
by worker threads or processes, never by this thread, so that it goes on
answering requests and heartbeats while an item takes its time.

It checks every message (protocol tag, kind, a JSON header no larger than
``MAX_REQUEST_BYTES``, no integer longer than an int64's); a malformed one is
logged (logger ``lazyseq.serve``) and dropped, and the server goes on serving
everyone else.

Messages (frames: tag ``lazyseq/4``, kind, JSON header, buffers):

=============================  =================================================================
consumer -> server             server -> consumer
=============================  =================================================================
``hello`` {hello, timeout}     ``welcome`` {hello}: what is served (view: length and label;
                               stream); ``hello`` numbers the consumer's hellos, and only the
                               answer to its last one counts (the server makes its pool anew)
``get`` {req, index}           ``item`` {req, index, tree} + buffers, or ``error`` / ``failed``
``get`` {req, index, count}    the same for items ``index`` to ``index + count - 1``, one answer
                               each, as requests ``req`` to ``req + count - 1``
``get`` {..., again}           ``index`` is the item the consumer read last, read again: what was
                               computed ahead for it stays (any other read back is a jump)
``get`` {req, index, step}     the consumer reads every ``step``-th item (a strided shard): the
                               items computed ahead for it follow that step (no ``count`` then)
``get`` {..., in, free}        on the server's machine, a ``get`` of items one by one names the
                               consumer's pool once it opened it, and hands back the slots it let
                               go of; an ``item`` then comes as {..., slot, handover, places, in},
                               its buffers in the slot (see :mod:`.shared_items`)
``get`` {req, positions}       ``item`` {req, index, count, tree} + buffers, or ``error`` /
                               ``failed``: the items at ``positions`` as one chunk (see
                               :mod:`.chunk_requests`; ``apart`` where they could not be)
``next`` {more, ack, req}      ``item`` {seq, tree, acked} + buffers, ``error`` or ``end``, each
                               {acked}: the last ``req`` acted on (see :mod:`.stream_service`);
                               ``end`` {server, after_error}: the failure the iterable stopped on
``sync`` {ack, req}            ``synced`` {acked}: every message sent before it has been acted on
``get`` (taken for dead)       ``forgotten``, the ``get`` not acted on: the consumer says hello
                               again (its pool, its timeout), and asks again
``ping`` {client, timeout}     ``pong`` {server}: from a second socket, the consumer's heartbeat
(the server closes)            ``closing`` {server}: to every consumer it knows; one that hears
                               nothing more says so in its ``ServerLost``, once its timeout is up
``bye`` {ack, server}          (nothing: what the server held for that consumer is freed, a
                               stream's items it acknowledges first)
(the answers above)            ``several`` {messages} + their buffers: the small messages that
                               answer one request, or hand out results that arrived together, to
                               a consumer whose hello said {several} (see :mod:`.envelopes`)
=============================  =================================================================

A consumer that sends nothing (heartbeats included) for its ``timeout`` is
taken for dead: what the server held for it is freed, and the stream items it
had not acknowledged go to other consumers. One that misses
``QUIET_HEARTBEATS`` heartbeats before that is idle: a view's items computed
ahead for it go (see ``ViewService.idle``).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from ..loading.closing import (
    closing_for_collector,
    collected_while_running,
    daemon_thread_at_exit,
    interrupts_deferred,
    interrupts_held,
)
from . import wire
from .endpoints import absolute, is_ipv6
from .envelopes import Outbox
from .frames import receive_waiting, send_frames
from .security import ZAP_ENDPOINT, ClientCheck, keypair_bytes
from .socket_files import SocketFile, refuse_if_listening

if TYPE_CHECKING:
    from .stream_service import StreamService
    from .view_service import ViewService

__all__ = ["ReadUpTo", "ServerLoop"]

log = logging.getLogger("lazyseq.serve")

MAX_REQUEST_BYTES = 1 << 16  # consumers send small JSON requests: anything larger is refused by ZeroMQ
MAX_REQUEST_FRAMES = 5  # a request has 4 (with the consumer's identity), or 5 when cut short: more are dropped
MAX_REQUESTS_AT_ONCE = 64  # then results get their turn
SWEEP_SECONDS = 0.1  # how often the thread looks for consumers gone silent
CLOSING_LINGER_MS = 200  # how long a closing server's last messages (``closing`` included) have to leave
QUIET_HEARTBEATS = 3  # heartbeats missed after which a consumer's items computed ahead are let go (see _sweep)
DEFAULT_CONSUMER_TIMEOUT = 10.0
_CONSUMER_KINDS = {b"hello", b"get", b"next", b"sync", b"ping", b"bye"}
_BIND_HINTS = {  # what ZeroMQ's errors mean when a server binds
    errno.ENODEV: ": the host is not an IP address, an interface name or a host name of this machine",
    errno.EADDRNOTAVAIL: ": the host is not an address of this machine (a server listens at one of its own)",
}


class ServerLoop:
    """Listens at ``address`` and runs ``service`` in a thread of its own until :meth:`stop`.

    It holds no reference to the :class:`~lazyseq.serving.server.Server`
    that made it, so that a server nobody refers to any more is closed by the
    garbage collector.
    """

    def __init__(
        self,
        service: ViewService | StreamService,
        address: str,
        curve_keypair: tuple[Any, Any] | None,
        allowed_clients: Iterable[Any] | None,
    ) -> None:
        import zmq  # here: lazyseq imports zmq only when a server or a consumer is made

        self._service = service
        self._token = os.urandom(8).hex()  # tells consumers that a server came back as a new one
        self._seen: dict[bytes, tuple[float, float]] = {}  # consumer -> (when last heard, its timeout)
        self.info = service.info()
        context = self._context = zmq.Context()
        sockets = []
        pipe: tuple[int, ...] = ()
        try:
            with interrupts_deferred():  # a Ctrl-C while the sockets are made: raised once every one is listed
                self._check = None
                if curve_keypair is not None:
                    self._check = ClientCheck(allowed_clients)
                    zap = context.socket(zmq.REP)
                    zap.bind(ZAP_ENDPOINT)  # before the listening socket: its handshakes ask here
                    sockets.append(zap)
                router = context.socket(zmq.ROUTER)
                sockets.append(router)
                router.setsockopt(zmq.LINGER, 0)
                router.setsockopt(zmq.IPV6, is_ipv6(address))  # only then: tcp://localhost stays on 127.0.0.1
                router.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
                router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a consumer that reconnects under its name takes it over
                if curve_keypair is not None:
                    router.curve_server = True
                    router.curve_publickey, router.curve_secretkey = keypair_bytes(curve_keypair, "serve")
                    router.zap_domain = b"lazyseq"
                refuse_if_listening(address, "serve")  # ZeroMQ would take an ipc:// file from a live server
                try:
                    router.bind(address)
                except zmq.ZMQError as error:
                    hint = _BIND_HINTS.get(error.errno or 0, "")
                    raise OSError(f"serve: cannot listen at {address}: {error}{hint}") from None
                self.address: str = absolute(router.getsockopt_string(zmq.LAST_ENDPOINT))
                self._socket_file = SocketFile(self.address)
            # (a Ctrl-C from here on is the caller's to defer: Server's start defers it until the server is whole)
            pipe = self._stop_fd, self._stopper_fd = os.pipe()
            self._zap = sockets[0] if curve_keypair is not None else None
            self._router = router
            self._release_at_end = False  # stopped from the thread itself (by the collector): it releases all
            self._outbox = Outbox()  # what is sent to consumers that read several messages in one: until sent together
            self._several: set[bytes] = set()  # (those consumers)
            self._fds_failed = False  # whether the service's descriptors could not be had at the last turn
            service.send = self._send
            service.token = self._token
            self.thread = threading.Thread(target=self._run, name="lazyseq-serve", daemon=True)
            self.thread.start()  # (the last step: nothing after it can fail)
        except BaseException:
            for socket in sockets:
                socket.close(linger=0)
            for fd in pipe:
                os.close(fd)
            with interrupts_held():
                context.term()
            service.close()
            raise

    def stop(self) -> None:
        """Stop the thread; the service, its workers and the sockets are released. Call it once.

        A Ctrl-C meanwhile cuts short the wait for worker threads busy with an
        item (left to end it on their own), and is raised once all is released.
        """
        with interrupts_deferred():
            try:  # "c": the garbage collector's close, which waits for nothing (see closing.collected_while_running)
                os.write(self._stopper_fd, b"c" if collected_while_running() else b"s")
            except OSError:  # the thread ended already (it closed the other end)
                pass
            if self.thread is threading.current_thread():  # the collector, in the thread itself: it releases all
                self._release_at_end = True  # once its loop ends (the context waits for the sockets it holds)
                return
            self.thread.join()
            self._release()

    def _release(self) -> None:
        """What outlives the thread: the stopping pipe's other end, the context, the socket file (ipc://)."""
        os.close(self._stopper_fd)
        with interrupts_held():  # cut short by a signal, it would leave the context's threads
            self._context.term()
        self._socket_file.remove()

    def _run(self) -> None:
        import zmq

        router, zap, service = self._router, self._zap, self._service
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._stop_fd, zmq.POLLIN)
        if zap is not None:
            poller.register(zap, zmq.POLLIN)
        watched: set[int] = set()  # the service's file descriptors in the poller
        collected = False  # stopped by the garbage collector's close
        last_sweep = time.monotonic()
        read_up_to = ReadUpTo(last_sweep)
        try:
            service.work()  # listening now: a stream draws its first items before anyone asks
            while not daemon_thread_at_exit():  # the program ends: its finalizers close the workers, quietly
                self._send_kept()  # the results handed out together (work()), before the wait
                fds = self._service_fds()
                for fd in watched - fds:
                    poller.unregister(fd)
                for fd in fds - watched:
                    poller.register(fd, zmq.POLLIN)
                watched = fds
                polled = time.monotonic()
                ready = dict(poller.poll(int(SWEEP_SECONDS * 1000)))
                if self._stop_fd in ready:
                    collected = os.read(self._stop_fd, 1) == b"c"
                    return
                if zap is not None and zap in ready and self._check is not None:
                    zap.send_multipart(self._check.answer(zap.recv_multipart()))
                if router not in ready:
                    read_up_to.drained(polled)
                else:
                    began = time.monotonic()
                    for _ in range(MAX_REQUESTS_AT_ONCE):  # then results get their turn
                        frames = receive_waiting(router, MAX_REQUEST_FRAMES)
                        if frames is None:
                            read_up_to.drained(time.monotonic())
                            break
                        self._receive(frames)
                        self._send_kept()  # the answers to one request: at once (held for the next requests, a
                        # worker woken meanwhile would delay them)
                    else:
                        read_up_to.read_some(began, MAX_REQUESTS_AT_ONCE, 2 * len(self._seen) + 2)  # a ping socket each
                try:
                    service.work()
                except Exception:  # a bug, not a consumer's doing: logged, and the server goes on
                    if daemon_thread_at_exit():  # the workers closed at exit, under the server's feet
                        break
                    log.exception("the server at %s failed to hand out results", self.address)
                now = time.monotonic()
                if now - last_sweep > SWEEP_SECONDS:
                    last_sweep = now
                    self._sweep(read_up_to.time)
        except BaseException:  # a bug: logged (serve_forever raises), and what the server holds is released
            log.exception("the server at %s failed", self.address)
        finally:
            with closing_for_collector() if collected else contextlib.nullcontext():
                service.close()
            self._say_closing()
            router.close(linger=0 if collected else CLOSING_LINGER_MS)  # (the collector's close waits for nothing)
            if zap is not None:
                zap.close(linger=0)
            os.close(self._stop_fd)
            if self._release_at_end:
                self._release()

    def _say_closing(self) -> None:
        """Tell every consumer that this server is closing: one waiting for an answer says so if none comes back.

        What was kept for them goes first; the context waits up to
        ``CLOSING_LINGER_MS`` for it all to leave (what a consumer does not
        take by then is dropped, as it would be anyway).
        """
        try:
            self._send_kept()
            for consumer in self._seen:
                self._transmit(consumer, b"closing", {"server": self._token}, [])
        except Exception:  # (a socket unusable by now: nobody is told, as if the server had died)
            log.debug("could not tell the consumers of the server at %s that it closes", self.address, exc_info=True)

    def _service_fds(self) -> set[int]:
        """What the service's results wake the loop with; none while descriptors run out (its results are then
        taken in at each turn of the loop, at least every ``SWEEP_SECONDS``), which is logged once."""
        try:
            fds = set(self._service.fds())
        except OSError as error:  # too many open files: the pipe that signals results could not be made
            if not self._fds_failed:
                log.warning("the server at %s cannot watch its workers' results for now: %s", self.address, error)
            self._fds_failed = True
            return set()
        self._fds_failed = False
        return fds

    def _send(self, consumer: bytes, kind: bytes, header: Any, buffers: list) -> None:
        """Send a message to ``consumer``: with the others sent to it before the next wait, if it reads them so."""
        if consumer not in self._several:
            self._transmit(consumer, kind, header, buffers)
            return
        try:
            now = self._outbox.put(consumer, kind, header, buffers)
        except ValueError as error:
            self._not_json(consumer, kind, error)
            return
        for message in now:
            self._transmit(consumer, *message)

    def _send_kept(self) -> None:
        """Send what was kept for consumers that read several messages in one."""
        for consumer, *message in self._outbox.drain():
            self._transmit(consumer, *message)

    def _one_by_one(self, consumer: bytes) -> None:
        """Send ``consumer`` its messages one by one from now on, those kept for it first."""
        self._several.discard(consumer)
        kept = self._outbox.take(consumer)
        if kept is not None:
            self._transmit(consumer, *kept)

    def _transmit(self, consumer: bytes, kind: bytes, header: Any, buffers: list) -> None:
        import zmq

        try:
            text = header if type(header) is bytes else wire.dumps(header)  # (kept: JSON already)
            send_frames(self._router, [consumer, wire.TAG, kind, text, *buffers], copy=False)
        except zmq.ZMQError as error:  # the consumer is gone: what it asked for is dropped
            log.debug("could not send to consumer %s: %s", consumer.hex(), error)
        except ValueError as error:
            self._not_json(consumer, kind, error)

    @staticmethod
    def _not_json(consumer: bytes, kind: bytes, error: ValueError) -> None:
        """A header that JSON refuses: wire.encode lets nothing like it through, so this is a bug."""
        log.error("could not send a %r message to consumer %s: %s", kind, consumer.hex(), error)

    def _sweep(self, read_up_to: float) -> None:
        """Forget the consumers that went silent for longer than their timeout, up to when all they sent was read."""
        seen = self._seen
        for consumer in [c for c, (heard, timeout) in seen.items() if read_up_to - heard > timeout]:
            del seen[consumer]
            self._one_by_one(consumer)
        for consumer in self._service.consumers:
            if consumer not in seen:
                log.info("consumer %s went silent: freeing what it held", consumer.hex())
                self._service.forget(consumer)
        # One that missed a few heartbeats (killed, stopped, cut off) is not forgotten before its timeout, which it
        # chose, but what was computed ahead for it goes meanwhile: computed again if it reads on.
        for consumer, (heard, timeout) in seen.items():
            if read_up_to - heard > QUIET_HEARTBEATS * wire.heartbeat_interval(timeout):
                self._service.idle(consumer)

    def _act_on(self, consumer: bytes, kind: bytes, header: Any) -> None:
        service = self._service
        if kind == b"bye":
            self._seen.pop(consumer, None)
            self._several.discard(consumer)
            self._outbox.drop(consumer)
            if header:  # a stream's consumer says the last items it handed out, once more
                service.sync(consumer, header)
            service.forget(consumer)
        elif kind == b"sync":  # a consumer the service took for dead is told so, and asks anew
            answer = service.sync(consumer, header)
            if answer is None:
                self._send(consumer, b"forgotten", {"server": self._token}, [])
            else:
                self._send(consumer, b"synced", {"server": self._token, **answer}, [])
        else:
            service.handle(consumer, kind, header)

    def _receive(self, received: list) -> None:
        """Act on one message (frames not copied yet: only a well-formed request is read)."""
        consumer = received[0].bytes
        if len(received[-1]) == len(wire.CUT) and received[-1].bytes == wire.CUT:
            return  # a consumer stopped sending this part-way (see Connection.send): the request is asked again
        try:
            if len(received) < 4 or received[1].bytes != wire.TAG:
                tag = received[1].bytes if len(received) > 1 else b""
                if wire.another_version(tag):
                    raise wire.ProtocolError(
                        f"a message of protocol {tag.decode()} (a client of another version of lazyseq): this server "
                        f"speaks {wire.TAG.decode()} (lazyseq {_version()}); install the same version on both sides"
                    )
                raise wire.ProtocolError("not a lazyseq message (wrong protocol tag or too few frames)")
            kind = received[2].bytes
            if kind not in _CONSUMER_KINDS:
                raise wire.ProtocolError(f"unknown request {kind[:20]!r}")
            if len(received) != 4:
                raise wire.ProtocolError(f"a {kind.decode()!r} request carries no buffers")
            header = wire.loads(received[3].buffer, request=True)
            if kind == b"ping":
                self._heartbeat(consumer, header)
                return
            now = time.monotonic()
            if kind == b"hello":
                self._seen[consumer] = (now, _timeout(header))
                if type(header) is dict and header.get("several") is True:  # it reads several messages in one
                    self._several.add(consumer)
                else:
                    self._one_by_one(consumer)
                extra = self._service.hello(consumer, header, _on_this_machine(self.address, received[0]))
                said = header.get("hello") if type(header) is dict else None  # which hello: see Connection.hello
                welcome = {**self.info, **extra, "server": self._token, "hello": said if type(said) is int else None}
                self._send(consumer, b"welcome", welcome, [])
                return
            heard = self._seen.get(consumer)
            if heard is None and kind == b"get" and self.info["kind"] == "view":  # a consumer taken for dead (stopped,
                # paused in a debugger): it says hello again (for its pool and its timeout), then asks again
                cast("ViewService", self._service).check(kind, header)
                self._send(consumer, b"forgotten", {"server": self._token}, [])
                return
            self._seen[consumer] = (now, heard[1] if heard else DEFAULT_CONSUMER_TIMEOUT)
            self._act_on(consumer, kind, header)
        except wire.ProtocolError as error:
            log.warning("rejected a message from %s: %s", consumer.hex(), error)
            self._refuse(consumer, received, str(error))
        except Exception as error:  # a bug, not the consumer's doing: logged, and the server goes on
            log.exception("the server at %s failed on a message from %s", self.address, consumer.hex())
            self._refuse(consumer, received, f"the server failed on it ({type(error).__name__}: {error}; see its log)")

    def _refuse(self, consumer: bytes, received: list, message: str) -> None:
        """Tell a lazyseq client that its request was not acted on: it raises, rather than wait for an answer that
        never comes (its heartbeats go on). A client of another version is told in its own protocol's tag."""
        if len(received) < 3:
            return
        tag = received[1].bytes
        if tag == wire.TAG:
            self._send(consumer, b"refused", {"message": message[:500]}, [])
        elif wire.another_version(tag):
            with contextlib.suppress(Exception):  # (whatever that version makes of it)
                send_frames(self._router, [consumer, tag, b"refused", wire.dumps({"message": message[:500]})])

    def _heartbeat(self, sender: bytes, header: Any) -> None:
        if type(header) is not dict or type(header.get("client")) is not str:
            raise wire.ProtocolError("a ping needs 'client'")
        try:
            consumer = bytes.fromhex(header["client"])
        except ValueError:
            raise wire.ProtocolError("a ping's 'client' is not hexadecimal") from None
        if consumer in self._seen:  # only a consumer that said hello: pings do not make entries
            self._seen[consumer] = (time.monotonic(), _timeout(header))
        self._send(sender, b"pong", {"server": self._token}, [])


def _version() -> str:
    from .. import __version__

    return __version__


def _on_this_machine(address: str, frame: Any) -> bool:
    """Whether the consumer that sent ``frame`` connected from this machine: over ``ipc://``, or from loopback."""
    if address.startswith("ipc://"):
        return True
    try:
        peer = ipaddress.ip_address(frame.get("Peer-Address"))
    except Exception:  # no address to read (inproc://), or not one
        return False
    mapped = getattr(peer, "ipv4_mapped", None)
    return bool(peer.is_loopback or (mapped is not None and mapped.is_loopback))


def _timeout(header: Any) -> float:
    """The seconds of silence after which a consumer is taken for dead: its own ``timeout``, within reason."""
    timeout = header.get("timeout") if isinstance(header, dict) else None
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout <= wire.MAX_TIMEOUT:
        return float(timeout)
    return DEFAULT_CONSUMER_TIMEOUT


class ReadUpTo:
    """Up to when the server has read every message its consumers sent: silence counts only until then.

    A thread held up (by a large item, say) reads a consumer's heartbeats late:
    they wait in the socket, and the consumer is not silent. A read that finds
    the socket empty shows that everything sent before it began was read. A
    socket that never empties (more messages at every turn than a turn reads)
    still shows it for earlier moments: ZeroMQ takes the messages of its peers
    in turn (fair queuing), so once as many messages as there are peers have
    been read since a moment, each peer that had one waiting then has had one
    read. The server counts two peers per consumer (its requests and its
    heartbeats), and two more; senders that never said hello may make it
    count too few, and take a consumer for dead early: that consumer is then
    told so, says hello again and asks anew, and no item is lost or sent twice.

    >>> clock = ReadUpTo(0.0)
    >>> clock.read_some(1.0, count=64, peers=100)  # the turn that began at 1.0 read 64 and left some
    >>> clock.time
    0.0
    >>> clock.read_some(2.0, count=64, peers=100)  # 128 read since 1.0
    >>> clock.time
    1.0
    >>> clock.drained(3.0)
    >>> clock.time
    3.0
    """

    def __init__(self, now: float) -> None:
        self.time = now
        self._read = 0  # messages read in turns that left some
        self._marks: deque[tuple[float, int]] = deque()  # (when a turn began, messages read before it)

    def drained(self, began: float) -> None:
        """A read that began at ``began`` found nothing more to read."""
        self.time = max(self.time, began)
        self._marks.clear()

    def read_some(self, began: float, count: int, peers: int) -> None:
        """A turn that began at ``began`` read ``count`` messages and left some; ``peers`` may send messages."""
        marks = self._marks
        marks.append((began, self._read))
        self._read += count
        while marks and self._read - marks[0][1] >= peers:
            self.time = max(self.time, marks.popleft()[0])

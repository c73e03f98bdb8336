"""A data server: ``serve(view)`` answers consumers that ``connect`` to it, from another process or machine.

Two threads run a server. The *I/O thread* owns the listening ZeroMQ ROUTER
socket: it checks every message (protocol tag, kind, a JSON header no larger
than ``MAX_REQUEST_BYTES``), answers ``hello`` and heartbeats itself, passes
requests to the compute thread and sends what that thread gives back. The
*compute thread* owns the service (:class:`.view_service.ViewService` for a
view, :class:`.stream_service.StreamService` for an iterable) and its
workers. A malformed message is logged (logger ``lazyseq.serve``) and
dropped; the server goes on serving everyone else.

Messages (frames: tag ``lazyseq/1``, kind, JSON header, buffers):

=========================  =====================================================================
consumer -> server         server -> consumer
=========================  =====================================================================
``hello``                  ``welcome``: what is served (view: length and label; stream)
``get`` {req, index}       ``item`` {req, index, tree} + buffers, or ``error`` / ``failed``
``next`` {more, ack}       ``item`` {seq, tree} + buffers, ``error`` {seq, ...}, or ``end``
``sync``                   ``synced``: every message sent before it has been acted on
``ping`` {client, timeout} ``pong`` {server}: from a second socket, the consumer's heartbeat
``bye``                    (nothing: what the server held for that consumer is freed)
=========================  =====================================================================

A consumer that sends nothing (heartbeats included) for its ``timeout`` is
taken for dead: what the server held for it is freed, and the stream items it
had not acknowledged go to other consumers.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from ..loading.options import LoaderOptions, Method, StartMethod, positive
from ..views.base import View
from ..views.sources import as_view
from . import wire
from .security import ZAP_ENDPOINT, ClientCheck, check_address, key_bytes
from .stream_service import StreamService
from .view_service import ViewService

__all__ = ["Server", "serve"]

log = logging.getLogger("lazyseq.serve")

MAX_REQUEST_BYTES = 1 << 16  # consumers send small JSON requests: anything larger is refused by ZeroMQ
SWEEP_SECONDS = 0.1  # how often the compute thread looks for consumers gone silent
COMPUTE_POLL_SECONDS = 0.5  # the longest wait for results before looking at requests again
DEFAULT_CONSUMER_TIMEOUT = 10.0
MAX_WANTED = 1024  # the most stream items one consumer may ask for ahead of what it acknowledged
_CONSUMER_KINDS = {b"hello", b"get", b"next", b"sync", b"ping", b"bye"}
_STOP = object()


class Server:
    """A running data server; see :func:`serve`. Closes on ``close()``, ``with``, or garbage collection."""

    def __init__(
        self,
        source: Any,
        address: str,
        options: LoaderOptions,
        max_buffered: int,
        curve_keypair: tuple[Any, Any] | None,
        allowed_clients: Iterable[Any] | None,
        insecure: bool,
    ) -> None:
        import zmq  # here: lazyseq imports zmq only when a server or a consumer is made

        check_address(address, curve_keypair, insecure)
        self._token = os.urandom(8).hex()  # tells consumers that a server came back as a new one
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._seen: dict[bytes, tuple[float, float]] = {}  # consumer -> (when last heard, its timeout)
        self._service = self._service_for(source, options, max_buffered)
        self._info = self._service.info()
        context = self._context = zmq.Context()
        sockets = []
        try:
            self._check = None
            if curve_keypair is not None:
                self._check = ClientCheck(allowed_clients)
                zap = context.socket(zmq.REP)
                zap.bind(ZAP_ENDPOINT)  # before the listening socket: its handshakes ask here
                sockets.append(zap)
            router = context.socket(zmq.ROUTER)
            sockets.append(router)
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
            router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a consumer that reconnects under its name takes it over
            if curve_keypair is not None:
                public, secret = curve_keypair
                router.curve_server = True
                router.curve_publickey = key_bytes(public, "curve_keypair[0] (the public key)")
                router.curve_secretkey = key_bytes(secret, "curve_keypair[1] (the secret key)")
                router.zap_domain = b"lazyseq"
            try:
                router.bind(address)
            except zmq.ZMQError as error:
                raise OSError(f"serve: cannot listen at {address}: {error}") from None
            self.address: str = router.getsockopt_string(zmq.LAST_ENDPOINT)
            results_in, results_out = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
            sockets += [results_in, results_out]
            pipe = f"inproc://lazyseq-serve-{id(self)}-{self._token}"
            results_in.bind(pipe)
            results_out.connect(pipe)
        except BaseException:
            for socket in sockets:
                socket.close(linger=0)
            context.term()
            self._service.close()
            raise
        self._zap = sockets[0] if curve_keypair is not None else None
        self._router, self._results_in, self._results_out = router, results_in, results_out
        self._io = threading.Thread(target=self._run_io, name="lazyseq-serve-io", daemon=True)
        self._compute = threading.Thread(target=self._run_compute, name="lazyseq-serve-compute", daemon=True)
        self._io.start()
        self._compute.start()
        self.closed = False
        self._stopped = threading.Event()
        self._finalizer = weakref.finalize(self, _stop, self._inbox, self._service, [self._compute, self._io], context)

    @staticmethod
    def _service_for(source: Any, options: LoaderOptions, max_buffered: int):
        if isinstance(source, View) or (isinstance(source, Sequence) and not isinstance(source, (str, bytes))):
            return ViewService(as_view(source), options, max_buffered)  # its send() is set by the compute thread
        if isinstance(source, Iterable):
            if options.nworkers:
                raise ValueError(
                    "serve: an iterable is served as it comes, by one reader; nworkers only applies to a view "
                    "(give the iterable its own workers, e.g. with load_buffers)"
                )
            return StreamService(source, max_buffered, MAX_WANTED)
        raise TypeError(f"serve: source must be a view, a sequence or an iterable, got {type(source).__name__}")

    # -- the compute thread --------------------------------------------------------

    def _run_compute(self) -> None:
        import zmq

        service, inbox, out = self._service, self._inbox, self._results_out

        def send(consumer: bytes, kind: bytes, header: Any, buffers: list) -> None:
            out.send_multipart([consumer, kind, wire.dumps(header), *buffers], copy=False)

        service.send = send
        last_sweep = time.monotonic()
        try:
            while True:
                try:
                    message = inbox.get(timeout=SWEEP_SECONDS) if not service.busy else inbox.get_nowait()
                except queue.Empty:
                    message = None
                while message is not None:
                    if message is _STOP:
                        return
                    self._act_on(*message)
                    try:
                        message = inbox.get_nowait()
                    except queue.Empty:
                        message = None
                if service.busy:
                    service.work(COMPUTE_POLL_SECONDS)
                now = time.monotonic()
                if now - last_sweep > SWEEP_SECONDS:
                    last_sweep = now
                    for consumer in service.consumers:
                        heard, timeout = self._seen.get(consumer, (0.0, 0.0))
                        if now - heard > timeout:
                            log.info("consumer %s went silent: freeing what it held", consumer.hex())
                            service.forget(consumer)
        except Exception:
            log.exception("the compute thread of the server at %s failed", self.address)
        finally:
            service.close()
            try:
                out.send_multipart([b"", b"stop"])
            except zmq.ZMQError:
                pass

    def _act_on(self, consumer: bytes, kind: bytes, header: Any) -> None:
        service = self._service
        if kind == b"bye":
            service.forget(consumer)
        elif kind == b"sync":
            service.send(consumer, b"synced", {}, [])
        else:
            try:
                service.handle(consumer, kind, header)
            except wire.ProtocolError as error:
                log.warning("rejected a request from consumer %s: %s", consumer.hex(), error)

    # -- the I/O thread -----------------------------------------------------------------

    def _run_io(self) -> None:
        import zmq

        router, results, zap = self._router, self._results_in, self._zap
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(results, zmq.POLLIN)
        if zap is not None:
            poller.register(zap, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if results in ready:
                    while True:
                        try:
                            frames = results.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        if frames[1].bytes == b"stop":
                            return
                        try:
                            router.send_multipart([frames[0], wire.TAG, *frames[1:]], copy=False)
                        except zmq.ZMQError as error:  # the consumer is gone: what it asked for is dropped
                            log.debug("could not send to consumer %s: %s", frames[0].bytes.hex(), error)
                if router in ready:
                    while True:
                        try:
                            frames = router.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._receive(frames)
                if zap is not None and zap in ready:
                    zap.send_multipart(self._check.answer(zap.recv_multipart()))
        except Exception:
            log.exception("the I/O thread of the server at %s failed", self.address)
            self._inbox.put(_STOP)
        finally:
            for socket in (router, results, self._results_out, zap):
                if socket is not None:
                    socket.close(linger=0)

    def _receive(self, frames: list[bytes]) -> None:
        consumer = frames[0]
        try:
            if len(frames) < 4 or frames[1] != wire.TAG:
                raise wire.ProtocolError("not a lazyseq message (wrong protocol tag or too few frames)")
            kind = frames[2]
            if kind not in _CONSUMER_KINDS:
                raise wire.ProtocolError(f"unknown request {kind[:20]!r}")
            if len(frames) != 4:
                raise wire.ProtocolError(f"a {kind.decode()!r} request carries no buffers")
            header = wire.loads(frames[3])
            if kind == b"ping":
                self._heartbeat(consumer, header)
                return
            now = time.monotonic()
            if kind == b"hello":
                timeout = header.get("timeout") if type(header) is dict else None
                if type(timeout) not in (int, float) or not 0 < timeout <= 86400:
                    timeout = DEFAULT_CONSUMER_TIMEOUT
                self._seen[consumer] = (now, float(timeout))
                self._router.send_multipart(
                    [consumer, wire.TAG, b"welcome", wire.dumps({**self._info, "server": self._token})]
                )
                return
            heard = self._seen.get(consumer)
            self._seen[consumer] = (now, heard[1] if heard else DEFAULT_CONSUMER_TIMEOUT)
            if kind == b"bye":
                self._seen.pop(consumer, None)
        except wire.ProtocolError as error:
            log.warning("rejected a message from %s: %s", consumer.hex(), error)
            return
        self._inbox.put((consumer, kind, header))
        self._service.wake()

    def _heartbeat(self, sender: bytes, header: Any) -> None:
        if type(header) is not dict or type(header.get("client")) is not str:
            raise wire.ProtocolError("a ping needs 'client'")
        try:
            consumer = bytes.fromhex(header["client"])
        except ValueError:
            raise wire.ProtocolError("a ping's 'client' is not hexadecimal") from None
        timeout = header.get("timeout")
        if type(timeout) not in (int, float) or not 0 < timeout <= 86400:
            timeout = DEFAULT_CONSUMER_TIMEOUT
        self._seen[consumer] = (time.monotonic(), float(timeout))
        self._router.send_multipart([sender, wire.TAG, b"pong", wire.dumps({"server": self._token})])

    # -- lifetime -------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Block until the server is closed (from another thread) or interrupted (Ctrl-C), then close it."""
        try:
            while not self._stopped.wait(0.2):
                if not self._io.is_alive():
                    break
        finally:
            self.close()

    def close(self) -> None:
        """Stop serving: workers, threads and sockets are released; consumers get ``ServerLost`` after a timeout."""
        if self.closed:
            return
        self.closed = True
        self._stopped.set()
        self._finalizer()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "serving"
        what = self._info.get("label", "a stream")
        return f"<lazyseq.Server {state} {what} at {self.address}>"


def _stop(inbox: queue.SimpleQueue, service, threads: list[threading.Thread], context) -> None:
    inbox.put(_STOP)
    service.wake()
    current = threading.current_thread()
    for thread in threads:
        if thread is not current:
            thread.join()
    context.term()


def serve(
    source: Any,
    address: str = "tcp://127.0.0.1:5557",
    *,
    nworkers: int = 0,
    method: Method = "thread",
    max_buffered: int = 10,
    curve_keypair: tuple[Any, Any] | None = None,
    allowed_clients: Iterable[Any] | None = None,
    insecure: bool = False,
    start_hook=None,
    start_method: StartMethod | None = None,
    blas_threads: int | None = None,
    seed: int | None = None,
) -> Server:
    """Serve ``source`` at ``address`` to consumers that :func:`~lazyseq.connect` to it, until ``close()``.

    A view (or any sequence) is served by index: each consumer reads the
    items it asks for (indexing, slices, ``shard``...), while ``nworkers``
    threads or processes (``method``, as for :func:`~lazyseq.prefetch`)
    compute up to ``max_buffered`` of its next items ahead. An iterable
    (a generator, a ``load_buffers`` iterator) is served as a stream: each of
    its items goes to exactly one consumer, and one that a consumer received
    but did not use before it died goes to another.

    ``address`` is a ZeroMQ endpoint; port 0 picks a free port (the server's
    ``.address`` says which). Only plain data travels, never pickle: arrays
    (header and raw buffer), numbers, strings, bytes and ``None`` in tuples,
    lists and dicts; an item holding anything else reaches its consumer as an
    error naming it.

    Security: an address other processes on this machine only can reach
    (``127.0.0.1``, ``ipc://``) needs nothing. Any other needs CURVE keys:
    ``curve_keypair=(public, secret)`` from ``zmq.curve_keypair()`` encrypts
    everything (consumers pass ``server_key=public``), and
    ``allowed_clients=[their public keys]`` keeps every other client out
    during the handshake; ``insecure=True`` binds without them, for a
    network you trust. Store a secret key in a file only you can read.

    >>> import numpy as np, lazyseq
    >>> data = lazyseq.view(np.arange(12.0).reshape(6, 2)).smap(lambda row: row * 10)
    >>> with lazyseq.serve(data, "tcp://127.0.0.1:0") as server:
    ...     with lazyseq.connect(server.address) as remote:
    ...         print(len(remote), remote[1], remote[-1])
    6 [20. 30.] [100. 110.]
    """
    options = LoaderOptions.check("serve", nworkers, method, start_hook, start_method, blas_threads, 0.0, seed)
    positive(max_buffered, "max_buffered", "serve")
    return Server(source, address, options, max_buffered, curve_keypair, allowed_clients, insecure)

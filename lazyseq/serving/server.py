"""A data server: ``serve(view)`` answers consumers that ``connect`` to it, from another process or machine.

The work is done by :class:`.server_loop.ServerLoop`, in a thread of its own;
:class:`Server` is the handle that the user holds.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ..extras import require
from ..loading.buffering import ITEMS_AHEAD, Buffering
from ..loading.closing import Finalizer, interrupts_deferred
from ..loading.failures import LoaderError
from ..loading.options import LoaderOptions, Method, StartHook, StartMethod
from ..loading.weak_list import WeakList
from ..views.sources import as_view, is_sequence_like
from .endpoints import check_endpoint
from .security import check_address
from .server_loop import ServerLoop
from .stream_service import StreamService
from .view_service import ViewService

__all__ = ["Server", "serve"]

MAX_WANTED = 1024  # the most stream items one consumer may ask for ahead of what it acknowledged


_open_servers: WeakList[Server] = WeakList()  # the servers made in this process (see .loading.weak_list)


class Server:
    """A running data server; see :func:`~lazyseq.serve`. Closes on ``close()``, ``with``, or garbage collection.

    >>> import lazyseq
    >>> server = lazyseq.serve(range(3), "tcp://127.0.0.1:0")  # port 0: any free port, .address says which
    >>> server.address.startswith("tcp://127.0.0.1:"), server.closed
    (True, False)
    >>> server.close()
    >>> server.closed
    True
    """

    closed: bool

    def __init__(
        self,
        source: Any,
        address: str,
        options: LoaderOptions,
        max_buffered: Buffering,
        curve_keypair: tuple[Any, Any] | None,
        allowed_clients: Iterable[Any] | None,
        insecure: bool,
    ) -> None:
        require("zmq", "serve", "server", "pyzmq")
        check_address(check_endpoint(address, "serve", binding=True), curve_keypair, insecure, allowed_clients)
        if options.method == "ray" and options.nworkers:  # now, not in the server's thread (it answers heartbeats)
            from ..loading.ray_workers import connect_to_ray

            connect_to_ray("serve")
        self.closed = False
        try:
            with interrupts_deferred():  # a Ctrl-C as the server starts: raised once it is all made, and closed
                self._loop = _listening(
                    address,
                    lambda: ServerLoop(
                        self._service_for(source, options, max_buffered), address, curve_keypair, allowed_clients
                    ),
                )
                self.address: str = self._loop.address
                self._source = source  # what it serves
                _open_servers.add(self)
                self._info = self._loop.info
                self._stopped = threading.Event()
                self._finalizer = Finalizer(self, _stop_in, os.getpid(), self._loop.stop)
        except KeyboardInterrupt:
            self.close()
            raise

    @staticmethod
    def _service_for(source: Any, options: LoaderOptions, max_buffered: Buffering) -> ViewService | StreamService:
        if is_sequence_like(source):  # what view() takes (a str too, as a sequence of characters): served by index
            return ViewService(as_view(source), options, max_buffered)
        if isinstance(source, Mapping):
            raise TypeError(
                f"serve: source is a {type(source).__name__}, a mapping, which has no order to serve by index and whose "
                "iteration gives only its keys; serve a view of its values (lazyseq.collate for several arrays)"
            )
        if isinstance(source, Iterable):
            if options.nworkers:
                raise ValueError(
                    "serve: an iterable is served as it comes, by one reader; nworkers only applies to a view "
                    "(give the iterable its own workers, e.g. with load_buffers)"
                )
            _check_servable(source)
            return StreamService(source, max_buffered.capacity(None), MAX_WANTED)  # no workers: a number
        hint = "; call it: serve(f())" if callable(source) else ""
        raise TypeError(f"serve: source must be a view, a sequence or an iterable, got {type(source).__name__}{hint}")

    # -- lifetime -------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Block until the server is closed (from another thread) or interrupted (Ctrl-C), then close it."""
        try:
            while not self._stopped.wait(0.2):
                # stopped by close(), from a signal handler run as the wait ended: not an error
                if not self._loop.thread.is_alive() and not self._stopped.is_set():
                    raise LoaderError(
                        f"serve: the server at {self.address} stopped on an error, which the 'lazyseq.serve' "
                        "logger reported"
                    )
        finally:
            self.close()

    def close(self) -> None:
        """Stop serving: workers, threads and sockets are released; consumers get ``ServerLost`` after a timeout.

        A worker thread busy computing an item cannot be stopped: as with
        ``prefetch``, closing waits 10 s at most for such threads, then leaves
        them to finish their item on their own (worker processes are stopped).
        """
        if self.closed or not hasattr(self, "_finalizer"):  # (closed, or its start cut short: nothing to close)
            return
        self.closed = True
        self._stopped.set()
        self._finalizer()
        self._source = None  # a generator's own clean-up (its finally, a file it opened) runs once nothing holds it

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if not hasattr(self, "_finalizer"):  # (seen in a traceback's locals)
            return "<lazyseq.Server that did not start>"
        state = "closed" if self.closed else "serving"
        what = self._info.get("label", "a stream")
        return f"<lazyseq.Server {state} {what} at {self.address}>"


def _listening(address: str, listen: Callable[[], ServerLoop]) -> ServerLoop:
    """``listen()``; where ``address`` is taken, by a server of this process still open, its error says so."""
    try:
        return listen()
    except OSError as error:
        if not any(server.address == address and not server.closed for server in _open_servers):
            raise
        raise OSError(  # a notebook's cell run again, say
            f"{error}; a server made in this process listens there, still open: close it first (server.close(), "
            "or serve in a with block)"
        ) from None


def _stop_in(pid: int, stop: Callable[[], None]) -> None:
    """Stop the server, but only in the process that started it (a forked child inherits the finalizer)."""
    if os.getpid() == pid:
        stop()


def _check_servable(source: Iterable) -> None:
    """``ValueError`` for an iterator that gives nothing to serve: a generator used up, or one a server serves (an
    iterable that makes an iterator of its own for each, a set, say, is served twice as well as once)."""
    if isinstance(source, Iterator):  # (first: a server that drew every item of a short one still serves them)
        for server in _open_servers:
            if not server.closed and server._source is source:
                raise ValueError(
                    f"serve: this iterator is served already, at {server.address}: two servers would split its "
                    "items; connect every consumer to that one"
                )
    if inspect.isgenerator(source) and inspect.getgeneratorstate(source) == inspect.GEN_CLOSED:
        raise ValueError("serve: the generator has ended (or was closed): it has nothing left to serve; make a new one")


def serve(
    source: Any,
    address: str = "tcp://127.0.0.1:5557",
    *,
    nworkers: int = 0,
    method: Method = "thread",
    max_buffered: int | None = None,
    curve_keypair: tuple[Any, Any] | None = None,
    allowed_clients: Iterable[Any] | None = None,
    insecure: bool = False,
    start_hook: StartHook | None = None,
    start_method: StartMethod | None = None,
    blas_threads: int | None = None,
    seed: int | None = None,
) -> Server:
    """Serve ``source`` at ``address`` to consumers that :func:`~lazyseq.connect` to it, until ``close()``.

    A view (or an array, or any sequence that :func:`~lazyseq.view` takes) is
    served by index: each consumer reads the items it asks for (indexing,
    slices, ``shard``...), while ``nworkers``
    threads, processes or Ray tasks (``method``, as for
    :func:`~lazyseq.prefetch`) compute up to ``max_buffered`` of its next
    items ahead (``None``: as for :func:`~lazyseq.prefetch`: 10 with threads,
    more for quick items with processes, room for three runs per worker with
    Ray; ``nworkers=0``: one thread; a negative ``nworkers``: all available
    cores but ``-nworkers``, as for :func:`~lazyseq.prefetch`). An iterable
    (a generator, a ``load_buffers`` iterator) is served as a stream: each of
    its items goes to exactly one consumer, and one that a consumer received
    but did not use before it died goes to another. It is read by one
    thread, as it comes: ``nworkers`` is refused there (a ``ValueError``);
    give the iterable workers of its own (``load_buffers``, say).

    ``address`` is a ZeroMQ endpoint, ``tcp://`` or ``ipc://`` (``inproc://``
    reaches no client, and is refused), at an IPv4 address, a host name or an
    IPv6 address in brackets (``tcp://[::1]:5557``); port 0 picks a free port
    (the server's ``.address`` says which), a port beyond 65535 is refused. Between two
    processes of one machine, ``ipc:///tmp/NAME`` (a Unix socket) moves
    large items faster than loopback TCP; a server refuses the file of one
    that is listening (``OSError``, as for a TCP port in use), replaces one
    left by a server that died, and removes its own at close. Only plain data travels, never pickle: arrays
    (header and raw buffer), numbers, strings, bytes and ``None`` in tuples,
    lists and dicts; an item holding anything else reaches its consumer as an
    error naming it.

    ``start_hook``, ``start_method``, ``blas_threads`` and ``seed`` apply
    to the server's worker processes as for :func:`~lazyseq.prefetch`.

    Security: an address other processes on this machine only can reach
    (``127.0.0.1``, ``localhost``, ``[::1]``, ``ipc://``) needs nothing. Any other needs CURVE keys:
    ``curve_keypair=(public, secret)`` from ``zmq.curve_keypair()`` encrypts
    everything (consumers pass ``server_key=public``), and
    ``allowed_clients=[their public keys]`` keeps every other client out
    during the handshake (it needs ``curve_keypair``: without encryption
    clients cannot be told apart, and giving it alone is a ``ValueError``);
    ``insecure=True`` binds without them, for a network you trust. With
    ``method="ray"``, ``serve`` connects to Ray (or starts it) before it
    returns, so that the server answers its consumers from the start. Store a secret key in a file only you can read.

    >>> import numpy as np, lazyseq
    >>> data = lazyseq.view(np.arange(12.0).reshape(6, 2)).smap(lambda row: row * 10)
    >>> with lazyseq.serve(data, "tcp://127.0.0.1:0") as server:
    ...     with lazyseq.connect(server.address) as remote:
    ...         print(len(remote), remote[1], remote[-1])
    6 [20. 30.] [100. 110.]
    """
    options = LoaderOptions.check("serve", nworkers, method, start_hook, start_method, blas_threads, 0.0, seed)
    ahead = Buffering.resolve(max_buffered, options, ITEMS_AHEAD, deepen=True)
    return Server(source, address, options, ahead, curve_keypair, allowed_clients, insecure)

"""``connect``: a view read from a server by index, or an iterator over a served stream."""

from __future__ import annotations

from typing import Any

from ..arguments import flag
from ..extras import require
from . import wire
from .endpoints import check_endpoint
from .remote_stream import RemoteStream
from .remote_view import RemoteView, open_connection

__all__ = ["MAX_AHEAD", "RemoteStream", "RemoteView", "connect"]

MAX_AHEAD = 4096  # items asked for ahead at most: each read looks over them, and their answers are held


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
    have been read; 4,096 at most), a batch (``remote.batch(k)``, after ``shuffle`` too)
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
    if ahead > MAX_AHEAD:  # (each read looks over those asked for: a billion made every read take seconds)
        raise ValueError(f"connect: ahead must be at most {MAX_AHEAD:,} (items asked for ahead of use), got {ahead:,}")
    check_endpoint(address, "connect", binding=False)
    settings = {
        "address": address,
        "timeout": timeout,
        "server_key": server_key,
        "curve_keypair": curve_keypair,
        "ahead": ahead,
        "shared_memory": flag(shared_memory, "connect: shared_memory"),
    }
    connection, info = open_connection(settings)
    try:
        if not isinstance(info, dict) or info.get("kind") not in ("view", "stream"):
            raise wire.ProtocolError(f"{address} did not answer as a lazyseq server")
        if info["kind"] == "stream":
            return RemoteStream(connection, ahead)
        return RemoteView(connection, info, ahead, settings)
    except BaseException:
        connection.close()
        raise


def reconnect(settings: dict[str, Any]) -> RemoteView | RemoteStream:
    """``connect`` again with the ``settings`` a view was made with: how a pickled :class:`RemoteView` (a copy of
    it in a worker process) comes back."""
    return connect(**settings)

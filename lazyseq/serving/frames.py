"""The frames of one message sent or received with little Python: every item a server sends goes through here.

pyzmq's ``send_multipart`` and ``recv_multipart`` combine their flags as enum
members and, after each frame received, ask the socket whether more follow (an
option read through an enum too): about forty lines of Python per message, as
many as the rest of a consumer's read of an item. These pass the flags as plain
integers and read ``Frame.more`` of the frame just received. The module does
not import zmq (``import lazyseq`` must not): the flags are libzmq's values.

>>> import zmq
>>> context = zmq.Context()
>>> a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
>>> _ = a.bind("inproc://frames"), b.connect("inproc://frames")
>>> has_message(b)
False
>>> send_frames(a, [b"kind", b"header", memoryview(b"data")], copy=False)
>>> [frame.bytes for frame in receive_frames(b, 0)]
[b'kind', b'header', b'data']
>>> a.close(); b.close(); context.term()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["DONTWAIT", "SNDMORE", "has_message", "receive_frames", "receive_waiting", "send_frames"]

DONTWAIT = 1  # ZMQ_DONTWAIT (zmq.NOBLOCK)
SNDMORE = 2  # ZMQ_SNDMORE
_EVENTS = 15  # ZMQ_EVENTS
_POLLIN = 1  # ZMQ_POLLIN
_RCVMORE = 13  # ZMQ_RCVMORE


def send_frames(socket: Any, frames: Sequence[Any], flags: int = 0, *, copy: bool = True) -> None:
    """Send ``frames`` (bytes, buffers) as one message; ``copy=False``: large buffers are sent from where they are."""
    more = flags | SNDMORE
    send = socket.send
    for frame in frames[:-1]:
        send(frame, more, copy=copy)
    send(frames[-1], flags, copy=copy)


def has_message(socket: Any) -> bool:
    """Whether a message waits on ``socket``: a third of what a receive costs that raises ``zmq.Again``."""
    return bool(socket.get(_EVENTS) & _POLLIN)


def receive_waiting(socket: Any, most: int | None = None, copied: int = 0) -> list[Any] | None:
    """The frames of the message waiting on ``socket`` (see :func:`receive_frames`), or None if none is: no
    exception raised when nothing waits, which is most of the times a reader looks."""
    if not has_message(socket):
        return None
    try:
        return receive_frames(socket, DONTWAIT, most, copied)
    except _again():  # (evaluated only if something was raised: zmq is imported by then)
        return None


def _again() -> type[Exception]:
    import zmq

    return zmq.Again


def receive_frames(socket: Any, flags: int, most: int | None = None, copied: int = 0) -> list[Any]:
    """The frames (``zmq.Frame``, not copied) of the next message; ``zmq.Again`` with ``DONTWAIT`` if none is there.

    Past ``most`` frames, the rest of the message is read and dropped, but
    for its last frame, kept last (it may say that the message was cut
    short): a message of millions of frames costs time, not memory held by
    Python. The first ``copied`` frames come as ``bytes`` instead (the
    small ones at the start of a message, read at once): pyzmq looks for
    signals as it lets go of a ``Frame``, where a Ctrl-C cannot be raised
    (it is printed, and lost), and a frame copied has none to let go of.
    """
    frames: list[Any] = []
    while len(frames) < copied:
        frames.append(socket.recv(flags, copy=True))
        if not socket.get(_RCVMORE):
            return frames
    frame = socket.recv(flags, copy=False)
    frames.append(frame)
    while frame.more:  # the rest of a message arrives with its first frame
        frame = socket.recv(flags, copy=False)
        if most is None or len(frames) < most:
            frames.append(frame)
        else:
            frames[-1] = frame
    return frames

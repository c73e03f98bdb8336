"""Several small messages to one consumer in one: what a server sends a consumer at once travels together.

A consumer reading small items (a stream's rows, a served view read in
order) costs a message each, and each message costs both sides more Python
and system calls than its bytes. The server's loop therefore keeps the
messages it sends a consumer while it answers one request (a run of items
computed ahead), or hands out the results that arrived together (:class:`Outbox`),
then sends them as one ``several`` message: its header lists each one's kind,
header and number of buffers, and its buffers follow in order. A consumer's
connection reads them back one by one, as if each had come alone
(:func:`opened`). Only a consumer whose hello says it reads them
(``several``) gets them; a message whose header and buffers take more than
``GROUP_BYTES`` goes alone (another message costs it nothing), after those
kept before it. Messages are not held for the requests that follow: the
workers the server wakes meanwhile would delay them (a consumer reading
ahead by 4 items lost a fifth of its speed so).

>>> from lazyseq.serving.wire import loads
>>> outbox = Outbox()
>>> outbox.put(b"c", b"item", {"seq": 0}, [b"ab"]), outbox.put(b"c", b"end", {}, [])
([], [])
>>> [(consumer, kind, header, buffers)] = outbox.drain()
>>> kind, loads(header), buffers
(b'several', {'messages': [['item', {'seq': 0}, 1], ['end', {}, 0]]}, [b'ab'])
>>> opened(loads(header), buffers, {b"item", b"end"})
[(b'item', {'seq': 0}, [b'ab']), (b'end', {}, [])]
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

from .wire import ProtocolError, dumps

__all__ = ["GROUP_BYTES", "GROUP_MESSAGES", "Outbox", "opened"]

GROUP_BYTES = 1 << 16  # messages travel together up to this many bytes (headers and buffers)
GROUP_MESSAGES = 256  # and this many messages

Message = tuple[bytes, Any, list]  # (kind, header, buffers); the header as JSON text once kept


class Outbox:
    """The messages kept for each consumer until the server's loop :meth:`drain` s them (see the module).

    Headers are kept as JSON text, and a ``several`` message's header is
    made of theirs: each is encoded once, and counts with its buffers.
    """

    def __init__(self) -> None:
        self._kept: dict[bytes, list[tuple[bytes, bytes, list]]] = {}
        self._bytes: dict[bytes, int] = {}

    def put(self, consumer: bytes, kind: bytes, header: Any, buffers: list) -> list[Message]:
        """Keep a message for ``consumer``; what must go to it now, in order (those kept before, if it is large
        or they are many), headers as JSON text."""
        text = dumps(header)
        size = len(text) + sum(memoryview(buffer).nbytes for buffer in buffers)
        kept = self._kept.get(consumer)
        now: list[Message] = []
        if kept and (size + self._bytes[consumer] > GROUP_BYTES or len(kept) == GROUP_MESSAGES):
            self._take(consumer)
            now.append(_together(kept))
            kept = None
        if size > GROUP_BYTES:
            now.append((kind, text, buffers))
        elif kept is None:
            self._kept[consumer], self._bytes[consumer] = [(kind, text, buffers)], size
        else:
            kept.append((kind, text, buffers))
            self._bytes[consumer] += size
        return now

    def drain(self) -> Iterator[tuple[bytes, bytes, Any, list]]:
        """``(consumer, kind, header, buffers)`` for every consumer with messages kept: one message each."""
        if not self._kept:  # (at every turn of the loop)
            return
        kept, self._kept = self._kept, {}
        self._bytes.clear()
        for consumer, messages in kept.items():
            yield (consumer, *_together(messages))

    def take(self, consumer: bytes) -> Message | None:
        """What was kept for ``consumer``, as one message (None if nothing was)."""
        kept = self._take(consumer)
        return None if kept is None else _together(kept)

    def drop(self, consumer: bytes) -> None:
        """Forget what was kept for ``consumer`` (it left)."""
        self._take(consumer)

    def _take(self, consumer: bytes) -> list[tuple[bytes, bytes, list]] | None:
        self._bytes.pop(consumer, None)
        return self._kept.pop(consumer, None)


def _together(messages: list[tuple[bytes, bytes, list]]) -> Message:
    """``messages`` (headers as JSON text) as one (the message itself if there is one)."""
    if len(messages) == 1:
        return messages[0]
    listed = b",".join(b'["%s",%s,%d]' % (kind, text, len(buffers)) for kind, text, buffers in messages)
    return b"several", b'{"messages":[%s]}' % listed, [buffer for _, _, buffers in messages for buffer in buffers]


def opened(header: Any, buffers: list, kinds: Collection[bytes]) -> list[Message]:
    """The messages of a ``several`` message, in order; :class:`ProtocolError` if it does not hold together or
    holds a kind not in ``kinds``."""
    listed = header.get("messages") if type(header) is dict else None
    if type(listed) is not list or not listed:
        raise ProtocolError("a 'several' message needs a list of 'messages'")
    messages, start = [], 0
    for entry in listed:
        if type(entry) is not list or len(entry) != 3 or type(entry[0]) is not str or type(entry[2]) is not int:
            raise ProtocolError("each of a 'several' message's messages is [kind, header, buffers]")
        kind, count = entry[0].encode(), entry[2]
        if kind not in kinds or count < 0 or start + count > len(buffers):
            raise ProtocolError(f"a 'several' message holds a {kind[:20]!r} message it cannot hold")
        messages.append((kind, entry[1], buffers[start : start + count]))
        start += count
    if start != len(buffers):
        raise ProtocolError("a 'several' message has buffers that none of its messages has")
    return messages

"""Serving a stream: every item of an iterable goes to exactly one consumer.

Consumers ask for items (``next`` with ``more``: how many more they want) and
acknowledge each one once their caller is done with it (``ack``; a goodbye,
``bye``, may carry the last ones). Until then the
server keeps it: the items of a consumer that leaves or dies without
acknowledging them go, first, to the next consumer that asks (or to the same
one when it comes back). The stream ends for a consumer (``end``) only when
the iterable is exhausted and no other consumer holds an item it has not
acknowledged, since that item could still come back. An end right after an
item that failed (a generator that raised: it ends there) says so
(``after_error``: its ``seq``, ``type`` and ``message``), and each consumer
but the one handed that failure raises it as its end: the items the iterable
would have given after it are missing.

A consumer silent for longer than its timeout (a stopped process) is taken
for dead. If it comes back, its next request is answered ``forgotten``: it
drops what it had received and not handed out (those items went back to the
others), says hello again and asks anew. The acknowledgements it brings keep
the items they name from going out again, unless another consumer got them
meanwhile: such an item went out twice once that one hands it out too, which
is logged.

A consumer acknowledges again, with every request, each item it handed out
that the server has not said it knows of: requests are numbered (``req``),
and each item sent to it says the last one acted on (``acked``). A request
lost with a broken connection (ZeroMQ reconnects at once) thus loses no
acknowledgement.

Items are numbered in the order they are drawn from the iterable (``seq``),
and encoded at once into buffers the server owns, so an iterable that reuses
its arrays (``load_buffers``) can go on. A server that comes back at the same
address numbers its items from 0 again: each item says which server instance
sent it (``server``, its token), and a consumer's ``next`` says which instance
its acknowledgements are for, so that one never acknowledges (and makes lost)
an item of another that happens to have the same number.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ..loading.buffering import refill_size
from ..loading.engine import Engine
from ..loading.options import LoaderOptions
from . import wire
from .failures import failure_header

__all__ = ["StreamService"]

log = logging.getLogger("lazyseq.serve")

Send = Callable[[bytes, bytes, Any, list], None]

TAKEN_OVER_KEPT = 4096  # items given to a consumer after another was taken for dead, remembered once acknowledged


class _Consumer:
    __slots__ = ("wanted", "unacked", "request")

    def __init__(self) -> None:
        self.wanted = 0  # items asked for and not sent yet
        # seq -> (kind, header, buffers, the consumers that held it before, left or taken for dead): sent, not
        # acknowledged
        self.unacked: dict[int, tuple] = {}
        self.request = 0  # the last of its requests acted on: what the items sent to it say ("acked")


class _Unsendable(TypeError):
    """An item of the stream that cannot travel: the iterable itself did not fail."""


class _Draw:
    """The drawer's job: the next item of the stream, encoded into buffers of its own (``None`` at the end)."""

    def __init__(self, items: Iterator) -> None:
        self.items = items

    def __call__(self, seq: int) -> tuple | None:
        try:
            value = next(self.items)
        except StopIteration:
            return None
        try:
            tree, buffers = wire.encode(value)
        except TypeError as error:
            raise _Unsendable(f"item {seq} of the stream cannot be sent: {error}") from None
        # a copy the server owns: the iterable may reuse its arrays (load_buffers does)
        return tree, [np.array(b, copy=True) if isinstance(b, np.ndarray) else b for b in buffers]


class StreamService:
    """Hands the items of ``iterable`` out to consumers; see the module's description.

    One thread draws the items, up to ``max_buffered`` ahead, so that the
    server's own thread goes on answering while the iterable takes its time;
    while it is busy, it gets more to draw only once half the room is free
    (:func:`~lazyseq.loading.buffering.refill_size`): waking it, and being
    woken by it, for every item handed out cost the server about 15% more
    CPU with small items.
    """

    kind = "stream"

    def __init__(self, iterable: Iterable, max_buffered: int, max_wanted: int, send: Send | None = None) -> None:
        options = LoaderOptions.check("serve", 1, "thread", inline_below=0.0)
        self._draw = _Draw(iter(iterable))
        self._drawer = Engine(self._draw, options, max_buffered, task_name="item")
        self._max_buffered = max_buffered
        self._max_wanted = max_wanted  # the most items a consumer may ask for ahead of what it acknowledged
        self.send: Send = send if send is not None else _not_connected
        self._consumers: dict[bytes, _Consumer] = {}
        self._drawn: deque[tuple] = deque()  # (seq, kind, header, buffers) drawn, not handed out
        # (seq, kind, header, buffers, holders): handed to consumers that left without acknowledging them, the last
        # one last
        self._returned: deque[tuple] = deque()
        # seq -> the consumer taken for dead that had it: items acknowledged by the one they went to next, lately
        self._taken_over: dict[int, tuple[bytes, ...]] = {}
        # seq -> the consumer taken for dead that said it handed it out, after it was sent to another consumer: out
        # twice if that one hands it out too, not to be handed out again if it does not
        self._handed_late: dict[int, bytes] = {}
        self._seq = 0  # the next item to ask the drawer for
        self.exhausted = False
        self._last_error: dict[str, Any] | None = None  # the last item that failed: seq, type, message
        self._ended_after: dict[str, Any] = {}  # what the end says: the error the stream stopped at, if it did
        self.token = ""  # this server instance, in each item's header (set by the server)
        # Nothing is drawn yet: a server that cannot listen (a port in use, say) takes no item from the iterable.
        # Its thread draws the first ones (work()) once it listens.

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind}

    @property
    def consumers(self) -> list[bytes]:
        return list(self._consumers)

    def sync(self, consumer: bytes, header: Any) -> dict[str, Any] | None:
        """Take in the acknowledgements ``sync`` brings; what ``synced`` tells ``consumer`` then (the last of its
        requests acted on), or None (``forgotten``) once it was taken for dead."""
        acks, request = _acknowledged(header)
        if type(header) is dict and header.get("server", self.token) != self.token:  # another instance's items
            acks, request = [], None
        state = self._consumers.get(consumer)
        if state is None:
            self._late_acks(consumer, acks)
            return None
        self._take_acks(consumer, state, acks, request)
        self._hand_out()  # acknowledged items may have been all the stream waited for to end
        return {"acked": state.request}

    def hello(self, consumer: bytes, header: Any, local: bool) -> dict[str, Any]:
        """A consumer said hello: it may ask for items (stream items always come through the socket)."""
        self._consumers.setdefault(consumer, _Consumer())
        return {}

    def handle(self, consumer: bytes, kind: bytes, header: Any) -> None:
        if kind != b"next":
            raise wire.ProtocolError(f"a served stream answers 'next', not {kind!r}")
        if type(header) is not dict:
            raise wire.ProtocolError("'next' needs a header object")
        more = header.get("more", 0)
        if type(more) is not int or more < 0:
            raise wire.ProtocolError("'next' needs an integer 'more' >= 0")
        acks, request = _acknowledged(header)
        have = header.get("resend")
        if header.get("server", self.token) != self.token:  # numbers of another instance's items: not ours
            acks, have = [], None
        state = self._consumers.get(consumer)
        if state is None:  # taken for dead (silent for longer than its timeout), or never said hello
            self._late_acks(consumer, acks)
            self.send(consumer, b"forgotten", {"server": self.token}, [])
            return
        self._take_acks(consumer, state, acks, request)
        wanted, resent = state.wanted + more, 0
        if type(have) is list:  # the consumer heard nothing for a while: what it lacks is sent again
            have = {s for s in have if type(s) is int}
            for seq, (kind, item_header, buffers, _) in sorted(state.unacked.items()):
                if seq not in have:
                    self._send_to(consumer, state, kind, item_header, buffers)
                    resent += 1
        asked = header.get("asked")  # after a silence: what it waits for (a request of it may have been lost)
        if type(asked) is int and asked >= 0:
            wanted = asked - resent
        state.wanted = max(0, min(wanted, self._max_wanted - len(state.unacked)))
        self._hand_out()

    def _take_acks(self, consumer: bytes, state: _Consumer, acks: list[int], request: int | None) -> None:
        """The items ``consumer`` acknowledged (in its request number ``request``) are handed out for good."""
        unknown, unacked = [], state.unacked
        for seq in acks:
            entry = unacked.pop(seq, None)
            if entry is None:
                unknown.append(seq)
            elif seq in self._handed_late:
                self._out_twice(seq, self._handed_late.pop(seq), consumer)
            elif holders := tuple(h for h in entry[3] if h != consumer):  # which may say they handed it out too
                self._taken_over_from(seq, holders)
        if unknown and (self._returned or self._taken_over or self._handed_late or len(self._consumers) > 1):
            # handed out before this consumer was taken for dead (their acknowledgement lost with the connection),
            # or acknowledged again (it goes on until it knows the server knows): only its own items count
            self._late_acks(consumer, unknown)
        if request is not None and request > state.request:
            state.request = request

    def _taken_over_from(self, seq: int, holders: tuple[bytes, ...]) -> None:
        """Item ``seq`` was handed out, and ``holders`` (taken for dead) had it: they may say they handed it out too
        (the last ``TAKEN_OVER_KEPT`` such items are remembered)."""
        taken_over = self._taken_over
        taken_over[seq] = holders
        if len(taken_over) > TAKEN_OVER_KEPT:
            del taken_over[next(iter(taken_over))]

    def _late_acks(self, consumer: bytes, acks: list[int]) -> None:
        """Items that a consumer taken for dead handed out after all: not to be handed out again.

        Only items that ``consumer`` held count. One that another consumer
        handed out already went out twice: logged, since nothing can take it
        back (of those the other one acknowledged, the last
        ``TAKEN_OVER_KEPT`` are remembered for it). One sent to another
        consumer, not acknowledged yet, goes out twice if that one hands it
        out too (logged then), and goes to nobody else if it does not.
        """
        if not acks:
            return
        late = set(acks)
        kept = [entry for entry in self._returned if entry[0] not in late or consumer not in entry[4]]
        if len(kept) < len(self._returned):
            self._returned = deque(kept)
        for state in self._consumers.values():
            for seq in late.intersection(state.unacked):
                if consumer in state.unacked[seq][3]:
                    self._handed_late[seq] = consumer
        for seq in sorted(late.intersection(self._taken_over)):
            if consumer in self._taken_over[seq]:
                del self._taken_over[seq]  # logged once, whatever acknowledges it again
                self._out_twice(seq, consumer, None)

    @staticmethod
    def _out_twice(seq: int, first: bytes, then: bytes | None) -> None:
        log.warning(
            "item %d of the stream was handed out twice: consumer %s, taken for dead, had handed it out before %s got "
            "it",
            seq,
            first.hex(),
            "another consumer" if then is None else f"consumer {then.hex()}",
        )

    def idle(self, consumer: bytes) -> None:
        """``consumer`` went quiet: what it was handed stays its own until it is forgotten (see the module)."""

    def forget(self, consumer: bytes) -> None:
        """A consumer left or died: what it did not acknowledge goes to the next one that asks (but for what a
        consumer taken for dead said it handed out after all)."""
        state = self._consumers.pop(consumer, None)
        if state is not None:
            for seq, entry in sorted(state.unacked.items()):
                if self._handed_late.pop(seq, None) is None:
                    self._returned.append((seq, *entry[:3], (*entry[3], consumer)))
                else:  # handed out by the one it had been sent to before: out twice if this one handed it out too
                    self._taken_over_from(seq, (consumer,))
            self._hand_out()

    def fds(self) -> list[int]:
        """What the server's thread waits on, besides its sockets: readable when drawn items may be in."""
        return self._drawer.workers.fds() if self._drawer.pending else []

    def work(self) -> None:
        """Take in what the drawer drew, draw more if there is room, and hand out what consumers wait for."""
        drawer = self._drawer
        if drawer.pending:
            drawer.collect(0.0)
        for seq in list(drawer.ready):
            done = drawer.ready.pop(seq)
            if self.exhausted:
                continue
            if done.status == "error":
                failure = failure_header(done.value)
                if type(done.value) is _Unsendable:  # (not a failure of the iterable, which goes on)
                    failure["type"] = "TypeError"
                else:
                    self._last_error = {"seq": seq, "type": failure["type"], "message": failure["message"]}
                self._drawn.append((seq, b"error", {"seq": seq, "server": self.token, **failure}, []))
            elif done.value is None:
                self.exhausted = True
                if self._last_error is not None and self._last_error["seq"] + 1 == seq:  # (a generator that raised)
                    self._ended_after = {"after_error": self._last_error}
            else:
                tree, buffers = done.value
                self._drawn.append((seq, b"item", {"seq": seq, "server": self.token, "tree": tree}, buffers))
        self._draw_ahead()
        self._hand_out()

    def _draw_ahead(self) -> None:
        drawer = self._drawer
        pending = len(drawer.pending)
        room = refill_size(self._max_buffered, len(self._drawn) + pending, pending, workers=1)
        if room and not self.exhausted:
            drawer.submit([(seq, seq) for seq in range(self._seq, self._seq + room)])
            self._seq += room

    def _hand_out(self) -> None:
        """Items to the consumers that asked, one each in turn: consumers reading as fast get as many.

        A consumer handed an item goes to the end of the line, so the next
        item goes to another one that waits (a slow stream is shared, not
        taken by whoever asked first).
        """
        consumers, returned, drawn = self._consumers, self._returned, self._drawn
        while returned or drawn:
            waiting = [consumer for consumer, state in consumers.items() if state.wanted]
            if not waiting:
                break
            for consumer in waiting:
                if not (returned or drawn):
                    break
                seq, kind, header, buffers, holders = returned.popleft() if returned else (*drawn.popleft(), ())
                state = consumers[consumer] = consumers.pop(consumer)  # to the end of the line
                state.unacked[seq] = (kind, header, buffers, holders)
                state.wanted -= 1
                self._send_to(consumer, state, kind, header, buffers)
        if self.exhausted and not (returned or drawn) and not any(s.unacked for s in consumers.values()):
            for consumer, state in consumers.items():
                if state.wanted:
                    self._send_to(consumer, state, b"end", {"server": self.token, **self._ended_after}, [])
                    state.wanted = 0
        self._draw_ahead()

    def _send_to(self, consumer: bytes, state: _Consumer, kind: bytes, header: dict, buffers: list) -> None:
        """Send to ``consumer``, saying which of its requests was acted on last (see the module's description)."""
        self.send(consumer, kind, {**header, "acked": state.request}, buffers)

    def close(self) -> None:
        self._drawer.close()
        self._draw.items = iter(())  # the iterable's own clean-up runs once nothing else holds it
        self._consumers.clear()
        self._taken_over.clear()
        self._drawn.clear()
        self._returned.clear()


def _acknowledged(header: Any) -> tuple[list[int], int | None]:
    """The items a request acknowledges (``ack``), and its number (``req``), if it gives one."""
    acks = header.get("ack", []) if type(header) is dict else []
    if type(acks) is not list or not all(type(seq) is int for seq in acks):
        raise wire.ProtocolError("a request's 'ack' must be a list of integers")
    request = header.get("req") if type(header) is dict else None
    return acks, request if type(request) is int else None


def _not_connected(consumer: bytes, kind: bytes, header: Any, buffers: list) -> None:
    raise RuntimeError("the service sends through its server, which has not set it up yet")

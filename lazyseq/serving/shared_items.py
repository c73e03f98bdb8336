"""Items for a consumer on the same machine: computed into shared memory that it maps, not sent through the socket.

Over a socket, every array of an item is copied into the kernel and out
again, into memory the consumer has just allocated (and must fault in). A
consumer on the server's machine (the same boot of the same host, connected
over loopback or ``ipc://``) says so in its hello; the server then makes it a
pool of slots, a ``memfd`` of its own, and tells it where the pool is (the
server's pid, the descriptor, and the pool's name, which carries a random
token): in its welcome, where the view says the size of its items (batches
of arrays), else in the answer of the first item with arrays, sized from it.
The consumer opens it through ``/proc/<pid>/fd`` and checks that it is that
pool (its name, its size, of this user) and that its size is sealed (a pool
shrunk under its map would end the consumer with ``SIGBUS`` at its next
read): where it cannot (another user, root's consumers included, another pid
namespace, a system without ``/proc``), it reads on over the socket.

Every slot starts as the server's. Once the consumer's requests name the pool
(``in``: it opened it), the server's worker threads compute its items
straight into slots the server holds (a view that builds its batches in
place, see ``View._get_into``, copies nothing at all); what an item's view
builds elsewhere is copied into the slot as it is sent. The answer sends only
the item's tree and where its buffers lie (``places``: ``[offset, size]``
pairs, checked by the consumer against the slot's size), naming the slot, the
pool and the hand-over (``handover``, a number that grows with each): with
it, the slot is the consumer's. The consumer's arrays are views of a lease of
the slot (see :class:`~lazyseq.loading.shared_slots.SharedSlots`); once
nothing refers to the item, its next request for items one by one hands the
slot back (``free``: ``[slot, number]`` pairs). The server takes back only a slot handed over with
that number, and a consumer reads a slot only from a hand-over newer than the
last it read or handed back of that slot: so a request asked again (its answer lost with
a connection) is answered again with the same slot while the consumer has not
handed it back, a repeated answer is read once, a hand-back repeated (a
request cut short, sent again; after a silence, the consumer hands back again
every slot it handed back and was not handed since, as the request that did
may have been lost) takes nothing, and the server writes only into slots it
holds. An answer that names another pool is not read (the item is
asked for again). Items the consumer holds beyond the pool's slots, and items
sent while it holds every slot, come through the socket. Nothing but plain
bytes is read from the pool, as from the socket: no pickle either way.

>>> import numpy as np
>>> served = ServedPool(2, 4096)
>>> slot = served.take()
>>> places = served.place(slot, [np.arange(3.0).view(np.uint8), b"zz"])  # copied: computed elsewhere
>>> places
[[0, 24], [64, 2]]
>>> answer = served.hand_over(slot, 7, 0, {"places": places})  # the answer to request 7, for item 0
>>> received = ReceivedPool.open(served.announcement())
>>> received.handed_anew(slot, answer["handover"])
True
>>> [bytes(buffer) for buffer in received.buffers(slot, answer["handover"], places)][1]
b'zz'
>>> received.handed_anew(slot, answer["handover"])  # the same answer again (asked again): read once
False
>>> received.close(); served.close()
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..loading.closing import interrupts_deferred
from ..loading.shared_slots import PAGE, SharedSlots, available_shared_memory, size_sealed, slot_bytes_for
from ..loading.structure import address_of
from ..machine import this_machine
from ..views.chunks import aligned  # each buffer of an item starts where a loader's arrays would in its slot
from .wire import ProtocolError

__all__ = ["EXTRA_SLOTS", "MAX_POOLS", "ReceivedPool", "ServedPool", "hello_fields", "item_bytes", "same_machine"]

NAME = "lazyseq-served-"  # the start of every pool's name; a random token follows
EXTRA_SLOTS = 4  # slots beyond those asked ahead: items the consumer's loop still holds
MAX_SLOTS = 256
MAX_POOLS = 64  # consumers with a pool at once, each holding descriptors of the server's: the others use the socket
MAX_POOL_SHARE = 8  # a server's pools take at most this fraction of the shared memory available, together


def hello_fields(ahead: int) -> dict[str, Any]:
    """What a consumer's hello says so that a server on its machine makes it a pool (nothing elsewhere)."""
    machine = this_machine()
    if machine is None or not hasattr(os, "memfd_create"):
        return {}
    return {"machine": list(machine), "slots": min(ahead + EXTRA_SLOTS, MAX_SLOTS)}


def same_machine(hello: Any) -> int:
    """How many slots the consumer that sent ``hello`` wants, if it runs on this machine; else 0."""
    machine = this_machine()
    if machine is None or not isinstance(hello, dict) or hello.get("machine") != list(machine):
        return 0
    slots = hello.get("slots")
    return slots if type(slots) is int and 0 < slots <= MAX_SLOTS else 0


def item_bytes(buffers: Sequence[Any]) -> int:
    """The bytes an item's ``buffers`` take in a slot."""
    return sum(aligned(memoryview(buffer).nbytes) for buffer in buffers)


class ServedPool:
    """The server's side of one consumer's pool: the slots it holds, and those handed over with an item."""

    def __init__(self, count: int, slot_bytes: int) -> None:
        self.name = NAME + os.urandom(8).hex()
        self._slots = SharedSlots(count, slot_bytes, "serve", name=self.name)
        self._free = list(range(count - 1, -1, -1))  # the server's, holding nothing (taken from the end)
        # the consumer's, until it hands them back: slot -> (its hand-over's number, the request it answered)
        self._handed: dict[int, tuple[int, int]] = {}
        self._numbers = itertools.count(1)
        self._answers: dict[int, tuple[int, dict[str, Any]]] = {}  # request -> (index, its answer) while handed over
        self.confirmed = False  # whether the consumer opened the pool (its requests name it): then items go in it
        self.copied = 0  # bytes of items copied into slots (built elsewhere)

    @classmethod
    def sized(
        cls, count: int, item_bytes: int, others: int = 0, pools: int = 0, least: int | None = None
    ) -> ServedPool | None:
        """A pool of ``count`` slots (at least ``least``, if that is all there is room for) that hold items of
        ``item_bytes``, beside ``pools`` others of ``others`` bytes in all.

        None if ``least`` slots would take more than a share of the shared memory available, or there are
        ``MAX_POOLS``.
        """
        if pools >= MAX_POOLS:
            return None
        slot_bytes = slot_bytes_for(aligned(item_bytes))
        room = (others + available_shared_memory()) // MAX_POOL_SHARE - others
        least = count if least is None else least
        count = min(count, room // slot_bytes)
        if count < max(least, 1):
            return None
        try:
            return cls(count, slot_bytes)
        except (OSError, MemoryError):  # less memory now than a moment ago (NoSharedMemory)
            return None

    def announcement(self) -> dict[str, Any]:
        """Where the consumer finds the pool."""
        slots = self._slots
        return {"pid": os.getpid(), "fd": slots.fd, "name": self.name, "count": slots.count, "bytes": slots.slot_bytes}

    @property
    def size(self) -> int:
        return self._slots.count * self._slots.slot_bytes

    @property
    def closed(self) -> bool:
        return self._slots.closed

    def take(self) -> int:
        """A slot of the server's to compute or copy an item into; -1 if it holds none free."""
        return self._free.pop() if self._free and not self._slots.closed else -1

    def array(self, slot: int) -> np.ndarray:
        """The bytes of ``slot`` (taken), for a worker to build an item in."""
        return np.frombuffer(self._slots.memory(slot), np.uint8)

    def let_go(self, slot: int) -> None:
        """A slot taken and not handed over (its item went unsent): free again."""
        self._free.append(slot)

    def place(self, slot: int, buffers: Sequence[Any]) -> list[list[int]] | None:
        """Where each of an item's ``buffers`` lies in ``slot``: those built there stay, the others are copied after
        them; None (nothing copied) if they do not fit."""
        memory = self.array(slot)
        base, size = address_of(memory), len(memory)
        places: list = [None] * len(buffers)
        end = 0
        for k, buffer in enumerate(buffers):
            if type(buffer) is np.ndarray:
                offset = address_of(buffer) - base
                if 0 <= offset <= size - buffer.nbytes:
                    places[k] = [offset, buffer.nbytes]
                    end = max(end, offset + buffer.nbytes)
        copies = []
        for k, buffer in enumerate(buffers):
            if places[k] is None:
                view = np.frombuffer(buffer, np.uint8) if type(buffer) is not np.ndarray else buffer
                start = aligned(end)
                end = start + view.nbytes
                places[k] = [start, view.nbytes]
                copies.append((start, view))
        if end > size:
            return None
        for start, view in copies:
            memory[start : start + view.nbytes] = view  # numpy copies without the GIL
            self.copied += view.nbytes
        return places

    def hand_over(self, slot: int, req: int, index: int, fields: dict[str, Any]) -> dict[str, Any]:
        """The answer to request ``req`` (item ``index``, described by ``fields``) that hands ``slot`` over to the
        consumer with the item in it: numbered, so that a repeat of it is told from a later hand-over."""
        number = next(self._numbers)
        self._handed[slot] = (number, req)
        answer = {**fields, "slot": slot, "handover": number, "in": self.name}
        self._answers[req] = (index, answer)
        return answer

    def answer_again(self, req: int, index: int) -> dict[str, Any] | None:
        """The answer that handed a slot over for request ``req`` (item ``index``), if the consumer asks again (the
        answer lost with a connection) while the slot is still its: the item is still there."""
        kept = self._answers.get(req)
        return kept[1] if kept is not None and kept[0] == index else None

    def handed_back(self, entries: Any) -> None:
        """The consumer let go of the slots that ``entries`` (a request's ``free``: ``[slot, number]`` pairs) name:
        the server's again. Any other entry (a slot not handed over, an earlier hand-over of it) is ignored."""
        if type(entries) is not list:
            return
        handed = self._handed
        for entry in entries:
            if type(entry) is list and len(entry) == 2 and type(entry[0]) is int and type(entry[1]) is int:
                slot, number = entry
                handover = handed.get(slot)
                if handover is not None and handover[0] == number:
                    del handed[slot]
                    self._free.append(slot)
                    self._answers.pop(handover[1], None)

    def close(self) -> None:
        """Let the pool go: the consumer keeps what it maps until it lets go too; items being written, theirs."""
        self._slots.close(free_unleased=False)  # (the consumer's items live in slots that are free here)


def _announced(announcement: Any) -> tuple[int, int, str, int, int] | None:
    """``(pid, fd, name, count, slot_bytes)`` from a pool's announcement, if they are what they must be."""
    if not isinstance(announcement, dict):
        return None
    pid, fd, name = announcement.get("pid"), announcement.get("fd"), announcement.get("name")
    count, slot_bytes = announcement.get("count"), announcement.get("bytes")
    if not (type(pid) is int and type(fd) is int and type(count) is int and type(slot_bytes) is int):
        return None
    if not (isinstance(name, str) and name.startswith(NAME) and 0 < count <= MAX_SLOTS and slot_bytes > 0):
        return None
    return (pid, fd, name, count, slot_bytes) if slot_bytes % PAGE == 0 else None


class ReceivedPool:
    """The consumer's side of the pool: the items written into the slots handed over, and the slots to hand back."""

    def __init__(self, slots: SharedSlots, name: str) -> None:
        self._slots = slots
        slots.take_many(slots.count)  # every slot is the server's until it hands one over with an item
        self._last = [0] * slots.count  # slot -> the number of its last hand-over read or handed back
        self._number = [0] * slots.count  # slot -> the number of the hand-over its item came with
        self._back: list[list[int]] = []  # [slot, number] to hand back besides the slots of items let go
        self._handed_back: dict[int, int] = {}  # slot -> the number it was last handed back with, until handed anew
        self.name = name  # the server names it in every answer written into it

    @classmethod
    def open(cls, announcement: Any) -> ReceivedPool | None:
        """The pool that ``announcement`` describes, or None where it cannot be opened here or is not that pool."""
        with interrupts_deferred():  # a Ctrl-C as it is opened: raised once its descriptor is the pool's (or closed)
            return cls._open(announcement)

    @classmethod
    def _open(cls, announcement: Any) -> ReceivedPool | None:
        fields = _announced(announcement)
        if fields is None:
            return None
        pid, fd, name, count, slot_bytes = fields
        expected = f"/memfd:{name} (deleted)"
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path) != expected:  # another process, or another descriptor, at that number
                return None
            mine = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # another user's, another pid namespace, no /proc: the socket it is
            return None
        try:
            # What was opened, not what the path showed a moment before (the server may have closed it since); of
            # this user (root opens anyone's); a size that cannot shrink under the map (a read there: SIGBUS).
            stat = os.fstat(mine)
            same = os.readlink(f"/proc/self/fd/{mine}") == expected and stat.st_size == count * slot_bytes
            same = same and stat.st_uid == os.getuid() and size_sealed(mine)
        except OSError:
            same = False
        if not same:
            os.close(mine)
            return None
        try:
            return cls(SharedSlots(count, slot_bytes, "connect", fd=mine), name)  # which takes the descriptor over
        except OSError:  # it could not be mapped (the descriptor is closed): the socket it is
            return None

    def handed_anew(self, slot: Any, number: Any) -> bool:
        """Whether an answer hands ``slot`` over (hand-over ``number``), rather than repeat one read or handed back
        already (the hand-over counts as received once :meth:`buffers` or :meth:`not_read` takes it).

        :class:`~lazyseq.serving.wire.ProtocolError` for a slot the pool lacks, or that holds an item read.
        """
        if not (type(slot) is int and 0 <= slot < len(self._last) and type(number) is int):
            raise ProtocolError(f"an item was written into slot {str(slot)[:20]} ({str(number)[:20]}), not of its pool")
        if number <= self._last[slot]:
            return False
        if self._slots.leased(slot):
            raise ProtocolError(f"an item was written into slot {slot}, which holds an item in use")
        return True

    def to_hand_back(self) -> list[list[int]]:
        """``[slot, number]`` of the slots let go of since the last call (their items are gone, or were not read)."""
        slots = self._slots
        back = [[slot, self._number[slot]] for slot in slots.take_many(slots.free_count())] + self._back
        self._back = []
        handed_back = self._handed_back
        for slot, number in back:
            handed_back[slot] = number
        return back

    def hand_back_again(self) -> None:
        """Hand back once more, with the next request, every slot handed back and not handed over since: after a
        silence, a request that handed some back may have been lost with a connection (the server takes nothing
        twice)."""
        self._back.extend(
            [slot, number] for slot, number in self._handed_back.items() if [slot, number] not in self._back
        )

    def hand_back_later(self, back: list[list[int]]) -> None:
        """``back`` (from :meth:`to_hand_back`) did not reach the server: handed back with the next request."""
        self._back.extend(back)

    def not_read(self, slot: int, number: int) -> None:
        """An answer handed ``slot`` over (``number``, see :meth:`handed_anew`) with an item that is not read."""
        self._last[slot] = number
        self._back.append([slot, number])

    def buffers(self, slot: int, number: int, places: Any) -> list[np.ndarray]:
        """The buffers of an item the server wrote into ``slot`` at ``places`` (handed over anew, ``number``); the
        slot is leased (see the module).

        :class:`~lazyseq.serving.wire.ProtocolError` for places that are not within the slot.
        """
        size = self._slots.slot_bytes
        if type(places) is not list or len(places) > size:
            raise ProtocolError("an item's 'places' are not a list of [offset, size] pairs within its slot")
        for place in places:
            if not (
                type(place) is list
                and len(place) == 2
                and all(type(n) is int for n in place)
                and 0 <= place[0]
                and 0 <= place[1] <= size - place[0]
            ):
                raise ProtocolError(f"an item's place {str(place)[:40]} is not an [offset, size] pair within its slot")
        holder = self._slots.lease(slot)
        self._last[slot] = self._number[slot] = number
        self._handed_back.pop(slot, None)
        return [holder[start : start + length] for start, length in places]

    def close(self) -> None:
        """No more slots: items received from the pool stay readable while they are referred to."""
        self._slots.close()

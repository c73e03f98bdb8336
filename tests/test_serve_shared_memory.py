"""A consumer on the server's machine: items written into a pool of shared memory, checked, never overwritten in use.

Servers listen on 127.0.0.1 only; every server and consumer a test starts is stopped by it.
"""

import contextlib
import gc
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import served_pipelines
from loader_helpers import check_a_forked_child_keeps_what_it_inherited, same

import lazyseq

zmq = pytest.importorskip("zmq")

from serve_helpers import ServerProcess, drive  # noqa: E402

from lazyseq.loading import thread_workers  # noqa: E402
from lazyseq.loading.buffering import Buffering  # noqa: E402
from lazyseq.loading.options import LoaderOptions  # noqa: E402
from lazyseq.loading.shared_slots import PAGE  # noqa: E402
from lazyseq.serving import server_loop, shared_items, wire  # noqa: E402
from lazyseq.serving.connection import Connection  # noqa: E402
from lazyseq.serving.shared_items import ReceivedPool, ServedPool, hello_fields, same_machine  # noqa: E402
from lazyseq.serving.view_service import ViewService  # noqa: E402

LOOPBACK = "tcp://127.0.0.1:0"
BATCHES = lazyseq.view(np.arange(40 * 6, dtype=np.float64).reshape(40, 6)).batch(4)  # 10 batches, each its own

pytestmark = pytest.mark.skipif(not hello_fields(4), reason="shared memory between processes needs Linux's memfd")


@pytest.fixture
def pool_reads(monkeypatch):
    """The slots of the items the consumers of this process read from a pool, one per item read."""
    reads = []
    note_pool_reads(monkeypatch, lambda slot, buffers: reads.append(slot))
    return reads


@pytest.fixture
def items_from_pool(monkeypatch):
    """The items the consumers of this process read from a pool, each named by its first value (float64 arrays)."""
    items = []
    note_pool_reads(monkeypatch, lambda slot, buffers: items.append(int(np.frombuffer(buffers[0], np.float64)[0])))
    return items


def note_pool_reads(monkeypatch, note):
    """Have ``note(slot, buffers)`` called for each item a consumer of this process reads from a pool."""
    real = ReceivedPool.buffers

    def noted(self, slot, number, places):
        buffers = real(self, slot, number, places)
        note(slot, buffers)
        return buffers

    monkeypatch.setattr(ReceivedPool, "buffers", noted)


def served_pools():
    """The pools of shared memory this process holds open (a server's, a consumer's: each by name, once)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed since
            pass
    return sorted({link for link in links if link.startswith("/memfd:lazyseq-served-")})


@contextlib.contextmanager
def raw_consumer(hello, served=BATCHES):
    """A server of ``served`` and a bare connection to it: the welcome to ``hello``, the answer to a get of item 0."""
    with lazyseq.serve(served, LOOPBACK) as server:
        connection = Connection(server.address, timeout=30.0)
        try:
            welcome = connection.hello(hello)
            opened = {"in": welcome["pool"]["name"]} if "pool" in welcome else {}  # as if the consumer opened it
            connection.send(b"get", {"req": 0, "index": 0, **opened})
            yield connection, welcome, connection.receive("item 0")
        finally:
            connection.close()


def numbers(i):
    return np.full(3, float(i))


def test_a_consumer_on_the_server_machine_reads_its_items_from_shared_memory(pool_reads):
    with lazyseq.serve(BATCHES, LOOPBACK, nworkers=2) as server, lazyseq.connect(server.address) as remote:
        read = [batch.copy() for batch in remote]
        assert [batch.tolist() for batch in read] == [batch.tolist() for batch in BATCHES]
        assert len(pool_reads) == 10  # the view says how large its items are: the pool comes with the welcome
        assert remote[3].flags.writeable  # as a local loader's batches: the consumer's own while it holds them


def test_only_the_answer_to_the_last_hello_counts(monkeypatch, pool_reads):
    # A hello said again after a silence: the server made the consumer's pool anew for the second. A consumer that
    # took the late answer to the first would read its items from a pool the server no longer writes into.
    receive, late = Connection._receive, []

    def first_welcome_late(connection, waiting_for, since=None):
        if late and late[0] is not None:
            message, late[0] = late[0], None
            return message
        message = receive(connection, waiting_for, since)
        if message[0] == b"welcome" and not late:
            late.append(message)
            return b"silent", {}, []  # as if lost: the hello is said again, then its answer comes
        return message

    monkeypatch.setattr(Connection, "_receive", first_welcome_late)
    with lazyseq.serve(BATCHES, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        assert [batch.tolist() for batch in remote] == [batch.tolist() for batch in BATCHES]
    assert late == [None] and len(pool_reads) == 10


def test_items_of_unknown_size_get_a_pool_with_the_first_of_them(items_from_pool):
    with lazyseq.serve(lazyseq.smap(numbers, range(10)), LOOPBACK) as server:
        with lazyseq.connect(server.address) as remote:
            assert [item.tolist() for item in remote] == [[float(i)] * 3 for i in range(10)]
    # The first item told where the pool is; the 4 asked for with it came through the pool only if the server sent
    # them after the consumer's next request said it had opened the pool (a busy machine); every later one did.
    assert sorted(items_from_pool)[-5:] == [5, 6, 7, 8, 9] and set(items_from_pool) <= set(range(1, 10))
    assert len(set(items_from_pool)) == len(items_from_pool)  # each once


def test_a_server_in_another_process_writes_assorted_items_into_the_consumer_s_pool(pool_reads):
    server = ServerProcess("assorted")
    try:
        local = served_pipelines.assorted()
        with lazyseq.connect(server.address, ahead=2) as remote:
            for i in [*range(40), -1, 7, 3]:  # in order, then jumps
                same(remote[i], local[i])
        assert len(pool_reads) >= 40 - 3
    finally:
        server.stop()


MANY_BATCHES = lazyseq.view(np.arange(40 * 4 * 6, dtype=np.float64).reshape(-1, 6)).batch(4)  # 40 batches


def test_items_the_consumer_holds_are_never_overwritten_and_more_than_the_pool_holds_come_through_the_socket(
    pool_reads,
):
    expected = [batch.tolist() for batch in MANY_BATCHES]
    with lazyseq.serve(MANY_BATCHES, LOOPBACK, nworkers=2) as server:
        with lazyseq.connect(server.address, ahead=1) as remote:
            held = [remote[i] for i in range(40)]
            slots = remote._pool._slots.count  # 1 + 4 asked for by the consumer, and 10 computed ahead
            assert (slots, len(pool_reads), sorted(pool_reads)) == (15, 15, list(range(15)))  # each handed over once
            for _ in range(3):  # every slot is held: the socket it is
                assert [batch.tolist() for batch in remote] == expected
            assert len(pool_reads) == 15
            del held[2:]  # two from the pool kept, thirteen slots handed back with the next request
            for _ in range(3):
                assert [batch.tolist() for batch in remote] == expected
            assert len(pool_reads) >= 15 + 3 * 40 - 15
            kept = [remote[i] for i in range(40)]
    assert [batch.tolist() for batch in held + kept] == expected[:2] + expected


def test_shared_memory_false_keeps_every_item_on_the_socket(pool_reads):
    with lazyseq.serve(BATCHES, LOOPBACK) as server:
        with lazyseq.connect(server.address, shared_memory=False) as remote:
            assert [batch.tolist() for batch in remote] == [batch.tolist() for batch in BATCHES]
    assert pool_reads == []


def test_a_pool_the_consumer_cannot_open_leaves_its_items_on_the_socket(monkeypatch, pool_reads):
    def not_permitted(path):  # another user's server, or one in another pid namespace
        raise PermissionError(1, "Operation not permitted", path)

    monkeypatch.setattr(shared_items.os, "readlink", not_permitted)
    made = served_pools_made(monkeypatch)
    with lazyseq.serve(BATCHES, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        assert [batch.tolist() for batch in remote] == [batch.tolist() for batch in BATCHES]
    assert pool_reads == []
    # The server hands a slot over only once the consumer's requests say it opened the pool: each answer handed over
    # was dropped, and the read waited for its silence to ask again (2, 4, 8 s...) until the slots ran out.
    assert [(pool.confirmed, pool._handed) for pool in made] == [(False, {})]


def test_a_consumer_back_at_a_new_server_reads_from_the_new_one_s_pool(pool_reads):
    first = lazyseq.serve(BATCHES, LOOPBACK)
    address = first.address
    with lazyseq.connect(address, ahead=1) as remote:
        assert [remote[i].tolist() for i in range(4)] == [batch.tolist() for batch in BATCHES[:4]]
        assert len(pool_reads) == 4
        first.close()
        with lazyseq.serve(BATCHES, address):
            assert [batch.tolist() for batch in remote] == [batch.tolist() for batch in BATCHES]
    # from the new server, those asked of the last one are asked again through the socket (one or two, as the
    # restart is noticed by a heartbeat or by an answer), every later one comes from its pool
    assert 4 + 8 <= len(pool_reads) <= 4 + 9


@pytest.mark.parametrize("served", [BATCHES, lazyseq.smap(numbers, range(10))], ids=["welcome", "first item"])
def test_the_server_lets_a_consumer_s_pool_go_when_it_leaves_or_says_hello_again(served):
    with raw_consumer(hello_fields(4), served) as (connection, welcome, (kind, header, buffers)):
        for k in range(2):
            announced = (welcome if "pool" in welcome else header)["pool"]
            assert set(announced) == {"pid", "fd", "name", "count", "bytes"}
            assert served_pools() == [f"/memfd:{announced['name']} (deleted)"]
            welcome = connection.hello()  # the same again: the first pool goes, and another is made
            connection.send(b"get", {"req": 1 + k, "index": 1})
            kind, header, buffers = connection.receive("item 1")
        connection.send(b"bye", {})
        connection.send(b"sync", {})  # answered once the goodbye was acted on
        assert connection.receive("synced")[0] == b"synced"
        assert pools_once_tasks_end() == []  # (tasks computing into it, cancelled, hold it until a worker skips them)


def pools_once_tasks_end(seconds=30.0):
    """``served_pools()`` once none is left, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while served_pools() and time.monotonic() < deadline:
        time.sleep(0.01)
    return served_pools()


def test_a_consumer_that_says_it_runs_elsewhere_gets_no_pool():
    elsewhere = {"machine": ["another boot", "another host"], "slots": 4}
    with raw_consumer(elsewhere) as (_, welcome, (kind, header, buffers)):
        assert "pool" not in welcome and "pool" not in header and len(buffers) == 1
        assert served_pools() == []


def test_slots_handed_back_that_the_consumer_does_not_hold_are_ignored():
    # Else a consumer could make the server write an item into a slot that holds another one it reads.
    with raw_consumer(hello_fields(4), MANY_BATCHES) as (connection, welcome, (_, first, _)):
        name, count = welcome["pool"]["name"], welcome["pool"]["count"]
        held = {first["slot"]: first["handover"]}
        not_held = [[slot, number] for slot in range(count) for number in range(5) if slot not in held]
        wrong = [
            not_held,  # never handed over
            [[first["slot"], first["handover"] + 1], [first["slot"], first["handover"] - 1]],  # not its hand-over
            [[count, 1], [-2, 1], ["0", 1], [True, 1], [1.0, 1], None, [0], [0, 1, 2], 0],
            "0",
            {"0": 1},
        ]
        for req, free in enumerate(wrong, 1):
            connection.send(b"get", {"req": req, "index": req, "free": free, "in": name})
            kind, header, buffers = connection.receive(f"item {req}")
            assert header["slot"] not in held and buffers == []
            held[header["slot"]] = header["handover"]
        back = [[slot, number] for slot, number in held.items()]
        connection.send(b"get", {"req": 6, "index": 6, "free": back, "in": "lazyseq-served-another"})
        for req in range(6, 40):
            if req > 6:
                connection.send(b"get", {"req": req, "index": req, "in": name})
            kind, header, buffers = connection.receive(f"item {req}")
            if "slot" in header:
                assert header["slot"] not in held and buffers == []
                held[header["slot"]] = header["handover"]
            else:  # every slot is the consumer's: the socket
                assert np.frombuffer(buffers[0]).reshape(4, 6).tolist() == MANY_BATCHES[req].tolist()
        assert sorted(held) == list(range(count))
        connection.send(b"get", {"req": 40, "index": 0, "free": [[3, held[3]], [3, held[3]]], "in": name})
        kind, header, buffers = connection.receive("item 0")
        assert (header["slot"], header["places"]) == (3, [[0, 4 * 6 * 8]])  # the one slot handed back, once
        connection.send(b"get", {"req": 41, "index": 1, "in": name})
        kind, header, buffers = connection.receive("item 1")
        assert "slot" not in header


def test_pools_are_offered_only_to_consumers_of_this_machine():
    here = hello_fields(4)
    assert same_machine(here) == 8  # the slots it asks for: ahead, and a few the loop may hold
    assert same_machine({**here, "machine": ["another boot", here["machine"][1]]}) == 0
    assert [same_machine({**here, "slots": slots}) for slots in (0, 257, 2.0, True)] == [0, 0, 0, 0]

    class Frame:
        def __init__(self, peer):
            self.peer = peer

        def get(self, name):
            assert name == "Peer-Address"
            return self.peer

    local = ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"]
    assert [server_loop._on_this_machine("tcp://127.0.0.1:5557", Frame(peer)) for peer in local] == [True] * 4
    elsewhere = ["10.0.0.7", "::ffff:10.0.0.7", "2001:db8::1", "", None]
    assert [server_loop._on_this_machine("tcp://0.0.0.0:5557", Frame(peer)) for peer in elsewhere] == [False] * 5
    assert server_loop._on_this_machine("ipc:///tmp/lazyseq.ipc", Frame("localhost:0:0:22885"))


def test_a_consumer_opens_only_the_pool_it_was_told_of():
    served = ServedPool(2, PAGE)
    good = served.announcement()
    try:
        with tempfile.TemporaryFile() as other:
            wrong = [
                {**good, "name": "lazyseq-served-0000000000000000"},  # another pool's name
                {**good, "name": "not-lazyseq"},
                {**good, "bytes": 2 * PAGE},  # not its size
                {**good, "bytes": PAGE + 1},
                {**good, "count": 0},
                {**good, "fd": other.fileno()},  # another file of that process
                {**good, "pid": 2**22 + 7},  # no such process
                {**good, "pid": "1"},
                "a pool",
            ]
            assert [ReceivedPool.open(announcement) for announcement in wrong] == [None] * len(wrong)
        received = ReceivedPool.open(good)
        assert received is not None
        received.close()
    finally:
        served.close()


def test_a_pool_whose_size_could_shrink_under_the_consumer_is_not_opened():
    # A server that shrank its pool after a consumer had mapped it ended the consumer with SIGBUS at its next read.
    import fcntl

    served = ServedPool(2, PAGE)
    unsealed = os.memfd_create("lazyseq-served-00000000000000aa", os.MFD_CLOEXEC)
    try:
        seals = fcntl.fcntl(served._slots.fd, fcntl.F_GET_SEALS)
        assert seals == fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        with pytest.raises(PermissionError):
            os.ftruncate(served._slots.fd, 0)
        os.ftruncate(unsealed, 2 * PAGE)
        announcement = {**served.announcement(), "fd": unsealed, "name": "lazyseq-served-00000000000000aa"}
        assert ReceivedPool.open(announcement) is None  # (read through the socket)
    finally:
        os.close(unsealed)
        served.close()


def test_places_outside_the_slot_are_a_protocol_error():
    served = ServedPool(1, PAGE)
    received = ReceivedPool.open(served.announcement())
    try:
        for places in ([[0, PAGE + 1]], [[PAGE, 1]], [[-1, 4]], [[0, -1]], [[0]], [[0.0, 4]], [(0, 4)], {"0": 4}):
            with pytest.raises(wire.ProtocolError):
                received.buffers(0, 1, places)
        assert [bytes(b) for b in received.buffers(0, 1, [[PAGE - 2, 2], [0, 0]])] == [b"\0\0", b""]
    finally:
        received.close()
        served.close()


def test_an_item_too_large_for_its_slot_comes_through_the_socket(items_from_pool):
    sizes = [4, 4, 4, 400, 4, 4]  # the pool is sized from the first item
    items = lazyseq.smap(lambda k: np.full(sizes[k] * 1024, float(k)), range(len(sizes)))
    with lazyseq.serve(items, LOOPBACK) as server, lazyseq.connect(server.address, ahead=1) as remote:
        assert [batch.size for batch in remote] == [n * 1024 for n in sizes]
    # Not the first (it told where the pool is), nor the large one; the second, asked for with the first, only if
    # the server sent it after the consumer's next request said it had opened the pool (a busy machine).
    assert items_from_pool in ([2, 4, 5], [1, 2, 4, 5])


def test_the_pools_of_a_server_take_an_eighth_of_the_shared_memory_at_most(monkeypatch, pool_reads):
    # room for one pool of 18 pages: 8 slots the consumer asks for, and 10 for items computed ahead
    monkeypatch.setattr(shared_items, "available_shared_memory", lambda: 8 * 18 * PAGE)
    with lazyseq.serve(BATCHES, LOOPBACK) as server:
        with lazyseq.connect(server.address) as first, lazyseq.connect(server.address) as second:
            assert [batch.tolist() for batch in first] == [batch.tolist() for batch in BATCHES]
            assert len(pool_reads) == 10
            assert [batch.tolist() for batch in second] == [batch.tolist() for batch in BATCHES]
            assert len(pool_reads) == 10  # no room for its pool: the socket


def test_a_pool_short_of_room_has_fewer_slots_for_items_computed_ahead(monkeypatch, pool_reads):
    monkeypatch.setattr(shared_items, "available_shared_memory", lambda: 8 * 12 * PAGE)  # room for 12 pages
    with lazyseq.serve(MANY_BATCHES, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        assert [batch.tolist() for batch in remote] == [batch.tolist() for batch in MANY_BATCHES]
        assert remote._pool._slots.count == 12  # 8 asked for, and 4 of the 10 for items computed ahead
        assert len(pool_reads) >= 30  # (a batch sent while every slot was taken came through the socket)


def test_a_server_makes_at_most_max_pools_pools_at_once(monkeypatch, pool_reads):
    # Each pool holds descriptors of the server's: consumers saying hello without end (closed at once, each of its
    # own name) made the server run out of them, and its thread end ("Too many open files").
    monkeypatch.setattr(shared_items, "MAX_POOLS", 1)
    with lazyseq.serve(BATCHES, LOOPBACK) as server:
        with lazyseq.connect(server.address) as first, lazyseq.connect(server.address) as second:
            assert [batch.tolist() for batch in second] == [batch.tolist() for batch in BATCHES]
            assert [batch.tolist() for batch in first] == [batch.tolist() for batch in BATCHES]
            assert len(pool_reads) == 10 and len(served_pools()) == 1  # the first one's (each name once)
        with lazyseq.connect(server.address) as third:  # the first ones' pools went with their goodbyes
            assert [batch.tolist() for batch in third] == [batch.tolist() for batch in BATCHES]
            assert len(pool_reads) == 20


VANISHING_CONSUMER = """
import os, sys
import lazyseq
remote = lazyseq.connect(sys.argv[1], timeout=3.0)  # its pool is made as it says hello; taken for dead 3 s after
print(len(remote), flush=True)
os._exit(0)  # no goodbye, no item asked for
"""


def test_the_server_lets_go_of_the_pool_of_a_consumer_that_died_before_asking_for_an_item():
    with lazyseq.serve(BATCHES, LOOPBACK) as server:
        ended = subprocess.run(
            [sys.executable, "-c", VANISHING_CONSUMER, server.address], capture_output=True, timeout=60
        )
        assert (ended.stdout, len(served_pools())) == (b"10\n", 1)
        assert pools_once_tasks_end() == []  # taken for dead: silent past its timeout


def test_a_consumer_collected_without_close_lets_its_pool_go():
    # Its pool went with a collection of cycles only (its slots' callbacks held it): with gc.disable() (or gc.freeze()
    # in a training loop), each consumer dropped unclosed kept its pool's memory and two descriptors.
    server = ServerProcess("assorted")  # its pools are not this process's: only the consumers' are counted
    gc.disable()
    try:
        for _ in range(3):
            remote = lazyseq.connect(server.address)
            assert len(list(remote)) == 40
            del remote
        assert (served_pools(), pool_descriptors()) == ([], 0)
    finally:
        gc.enable()
        server.stop()


def pool_descriptors():
    """How many descriptors of pools this process holds (each pool: its own, and one its memory map keeps)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:lazyseq-served-")
    return count


def report_pools_and(held, end):
    end.send((pool_descriptors(), [bytes(item) for item in held]))


def forked_child_report(held):
    fork = multiprocessing.get_context("fork")
    ends = fork.Pipe()
    child = fork.Process(target=report_pools_and, args=(held, ends[1]))
    child.start()
    report = ends[0].recv()
    child.join()
    return report


def test_a_forked_child_lets_go_of_the_pools_it_inherited():
    served = ServedPool(2, PAGE)
    received = ReceivedPool.open(served.announcement())
    try:
        assert forked_child_report([]) == (0, [])
        slot = served.take()
        served.place(slot, [b"kept"])
        held = received.buffers(slot, served.hand_over(slot, 0, 0, {})["handover"], [[0, 4]])  # inherited by the child
        assert forked_child_report(held) == (1, [b"kept"])
        assert pool_descriptors() == 4  # the parent's pools work on
        slot = served.take()
        served.place(slot, [b"more"])
        assert bytes(received.buffers(slot, served.hand_over(slot, 1, 1, {})["handover"], [[0, 4]])[0]) == b"more"
    finally:
        received.close()
        served.close()


def test_a_forked_child_keeps_the_items_it_inherited_as_they_were_when_forked():
    # The pool stayed shared: the child saw the parent's later items in its copy, the parent the child's writes.
    rows = np.arange(60 * 1000).reshape(60, 1000)
    with lazyseq.serve(lazyseq.view(rows), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        check_a_forked_child_keeps_what_it_inherited(iter(remote), rows)


def test_requests_waiting_when_the_consumer_says_hello_again_are_answered_from_its_new_pool():
    gate = threading.Event()

    def gated(i):
        if i == 5:
            gate.wait(30)
        return np.full(3, float(i))

    with lazyseq.serve(lazyseq.smap(gated, range(10)), LOOPBACK, nworkers=2) as server:
        connection = Connection(server.address, timeout=30.0)
        try:
            connection.hello(hello_fields(4))
            connection.send(b"get", {"req": 0, "index": 0})
            first = connection.receive("item 0")[1]["pool"]["name"]
            connection.send(b"get", {"req": 1, "index": 5, "in": first})  # waits at the gate
            connection.hello()  # the pool goes
            connection.send(b"get", {"req": 2, "index": 1})
            kind, header, buffers = connection.receive("item 1")
            pool = header["pool"]
            assert pool["name"] != first
            connection.send(b"get", {"req": 3, "index": 2, "in": pool["name"]})  # opened
            assert connection.receive("item 2")[1]["req"] == 3
            gate.set()
            kind, header, buffers = connection.receive("item 5")
            with opened_pool(pool) as received:
                req, item = read_from(received, header)
                assert (req, item.tolist()) == (1, [5.0] * 3)
        finally:
            gate.set()
            connection.close()


@contextlib.contextmanager
def opened_pool(announcement):
    """The pool that ``announcement`` describes, opened as a consumer opens it (closed at the end: a consumer
    closes its pool only once it reads no more from it, and the server's slots may be emptied then)."""
    received = ReceivedPool.open(announcement)
    try:
        yield received
    finally:
        received.close()


def read_from(received, header):
    """The request that ``header`` answers, and the item it hands over in ``received``, read as a consumer would."""
    assert header["in"] == received.name and received.handed_anew(header["slot"], header["handover"])
    return header["req"], np.frombuffer(received.buffers(header["slot"], header["handover"], header["places"])[0])


def test_items_computed_into_a_pool_let_go_since_are_computed_again_into_the_new_one():
    with raw_consumer(hello_fields(4), MANY_BATCHES) as (connection, welcome, _):  # 1 to 10 computed into its pool
        pool = connection.hello()["pool"]  # said again: that pool goes, another is made
        assert pool["name"] != welcome["pool"]["name"]
        with opened_pool(pool) as received:
            for req in range(1, 12):
                connection.send(b"get", {"req": req, "index": req, "in": pool["name"]})
                kind, header, buffers = connection.receive(f"item {req}")
                assert read_from(received, header)[1].tolist() == MANY_BATCHES[req].reshape(-1).tolist()


def test_a_consumer_closed_while_it_reads_an_item_from_its_pool_ends_the_read_cleanly(monkeypatch):
    with lazyseq.serve(BATCHES, LOOPBACK) as server:
        remote = lazyseq.connect(server.address)
        assert [remote[i].tolist() for i in range(6)] == [batch.tolist() for batch in BATCHES[:6]]
        receive = remote._connection.receive

        def closed_meanwhile(*args, **kwargs):  # as another thread would close it, once an answer is in
            answer = receive(*args, **kwargs)
            remote.close()
            return answer

        monkeypatch.setattr(remote._connection, "receive", closed_meanwhile)
        item = remote[6]
        assert item.tolist() == BATCHES[6].tolist()  # the answer in hand is read from the pool
        # ... which close() left to the read (a signal handler's close, or another thread's), and the read let go of
        # as it ended (it stayed for as long as the closed view was referred to); the item read stays
        assert remote._pool is None and item.tolist() == BATCHES[6].tolist()
        del item
        assert pools_once_tasks_end(seconds=10) == []
        with pytest.raises(lazyseq.LoaderError, match="closed"):
            remote[0]


def test_a_pool_that_cannot_be_mapped_leaves_the_items_on_the_socket(monkeypatch):
    gc.collect()
    served = ServedPool(2, PAGE)
    try:
        descriptors = pool_descriptors()

        def no_memory(*args, **kwargs):
            raise OSError(12, "Cannot allocate memory")

        monkeypatch.setattr("lazyseq.loading.shared_slots.mmap.mmap", no_memory)
        assert ReceivedPool.open(served.announcement()) is None
        gc.collect()
        assert pool_descriptors() == descriptors  # its descriptor closed, once
    finally:
        served.close()


@pytest.fixture
def served_pool_list(monkeypatch):
    """Every pool the servers of this process make."""
    return served_pools_made(monkeypatch)


def served_pools_made(monkeypatch):
    made = []
    real = ServedPool.__init__

    def recorded(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(ServedPool, "__init__", recorded)
    return made


@pytest.mark.parametrize("ahead", [1, 4, 16])
def test_worker_threads_build_batches_in_the_consumer_s_slots_without_a_copy(served_pool_list, pool_reads, ahead):
    expected = [batch.tolist() for batch in MANY_BATCHES]
    with lazyseq.serve(MANY_BATCHES, LOOPBACK, nworkers=2) as server:
        with lazyseq.connect(server.address, ahead=ahead) as remote:
            for _ in range(3):
                assert [batch.tolist() for batch in remote] == expected
    assert len(pool_reads) == 3 * 40 and [pool.copied for pool in served_pool_list] == [0]


def test_items_built_elsewhere_are_copied_into_the_slot_they_go_out_in(served_pool_list, pool_reads):
    with lazyseq.serve(lazyseq.smap(numbers, range(10)), LOOPBACK, nworkers=2) as server:
        with lazyseq.connect(server.address) as remote:
            assert [item.tolist() for item in remote] == [[float(i)] * 3 for i in range(10)]
    assert len(pool_reads) == 5 and [pool.copied for pool in served_pool_list] == [5 * 3 * 8]


def slow_numbers(i):
    time.sleep(0.002)  # (long enough for jumps to cancel items being computed into slots)
    return np.full(3, float(i))


def test_slots_of_items_dropped_after_jumps_are_all_the_server_s_again(pool_reads):
    # Jumps drop the items computed ahead (some done, some being computed, some not started), each in a slot taken
    # for it; afterwards, a consumer that holds every item it reads is handed every slot of its pool, each once.
    rng = np.random.default_rng(0)
    with lazyseq.serve(lazyseq.smap(slow_numbers, range(60)), LOOPBACK, nworkers=2) as server:
        with lazyseq.connect(server.address, ahead=2) as remote:
            for start in rng.integers(0, 55, size=25).tolist():
                expected = [[float(i)] * 3 for i in range(start, start + 3)]
                assert [remote[i].tolist() for i in range(start, start + 3)] == expected
            before = len(pool_reads)
            held = [remote[i] for i in range(60)]
            assert [item.tolist() for item in held] == [[float(i)] * 3 for i in range(60)]
            assert sorted(pool_reads[before:]) == list(range(remote._pool._slots.count))


def every_slot_comes_back(remote, pool_reads):
    """Whether a consumer that holds every item it reads now is handed every slot of its pool, each once: none was
    lost on the way (handed over to a consumer that never hands it back, or taken by the server for good)."""
    gc.collect()
    before = len(pool_reads)
    held = [remote[i] for i in range(len(remote))]
    assert [item.tolist() for item in held] == [item.tolist() for item in MANY_BATCHES]
    return sorted(pool_reads[before:]) == list(range(remote._pool._slots.count))


def test_an_answer_lost_with_a_connection_is_answered_again_with_the_same_slot(monkeypatch, pool_reads):
    receive, lost = Connection._receive, []

    def losing_three(connection, waiting_for, since=None):
        message = receive(connection, waiting_for, since)
        kind, header, _ = message
        if kind == b"item" and "slot" in header and len(lost) < 3 and header["req"] % 7 == 3:
            lost.append(header["slot"])
            return b"silent", {}, []  # as if lost with a connection that broke: the consumer asks again
        return message

    monkeypatch.setattr(Connection, "_receive", losing_three)
    with lazyseq.serve(MANY_BATCHES, LOOPBACK) as server, lazyseq.connect(server.address, ahead=2) as remote:
        for _ in range(3):
            assert [batch.tolist() for batch in remote] == [batch.tolist() for batch in MANY_BATCHES]
        assert len(lost) == 3 and every_slot_comes_back(remote, pool_reads)  # (each of them was lost for good)


def test_a_request_cut_short_hands_its_slots_back_with_the_next(monkeypatch, pool_reads):
    send, cut = Connection.send, []

    def interrupted_once(connection, kind, header, *args, **kwargs):
        if kind == b"get" and header.get("free") and not cut:
            cut.append(header["free"])
            raise KeyboardInterrupt  # (dropped whole by the server, had any of it gone out)
        return send(connection, kind, header, *args, **kwargs)

    monkeypatch.setattr(Connection, "send", interrupted_once)
    with lazyseq.serve(MANY_BATCHES, LOOPBACK) as server, lazyseq.connect(server.address, ahead=2) as remote:
        read = 0
        while read < 3 * 40:
            try:
                assert remote[read % 40].tolist() == MANY_BATCHES[read % 40].tolist()
                read += 1
            except KeyboardInterrupt:
                pass
        assert cut and every_slot_comes_back(remote, pool_reads)


def test_slots_handed_back_by_a_request_lost_with_a_connection_are_handed_back_again(monkeypatch, pool_reads):
    # The request was asked again after the silence, without them: the server kept them as the consumer's for good.
    send, lost = Connection.send, []

    def losing_one(connection, kind, header, *args, **kwargs):
        if kind == b"get" and header.get("free") and not lost:
            lost.append(header["free"])
            return  # (as if lost with a connection that broke)
        return send(connection, kind, header, *args, **kwargs)

    monkeypatch.setattr(Connection, "send", losing_one)
    with lazyseq.serve(MANY_BATCHES, LOOPBACK) as server, lazyseq.connect(server.address, ahead=2, timeout=2) as remote:
        for _ in range(2):
            assert [batch.tolist() for batch in remote] == [batch.tolist() for batch in MANY_BATCHES]
        assert lost and every_slot_comes_back(remote, pool_reads)


def test_a_consumer_taken_for_dead_that_reads_on_says_hello_again_and_gets_its_pool_back(monkeypatch, pool_reads):
    # Stopped for longer than its timeout (paused in a debugger), it read on without its pool: every item came through
    # the socket, and the server used its own timeout for it.
    with lazyseq.serve(MANY_BATCHES, LOOPBACK) as server, lazyseq.connect(server.address, timeout=30) as remote:
        assert [remote[i].tolist() for i in range(5)] == [batch.tolist() for batch in MANY_BATCHES[:5]]
        loop, forgetting = server._loop, threading.Event()
        sweep = loop._sweep

        def as_if_silent(read_up_to):  # (in the server's thread, every SWEEP_SECONDS)
            sweep(read_up_to + 60 if forgetting.is_set() else read_up_to)
            forgetting.clear()

        monkeypatch.setattr(loop, "_sweep", as_if_silent)
        forgetting.set()
        deadline = time.monotonic() + 10
        while loop._service.consumers and time.monotonic() < deadline:  # (taken for dead: forgotten)
            time.sleep(0.01)
        assert loop._service.consumers == []
        before = len(pool_reads)
        assert [remote[i].tolist() for i in range(5, 40)] == [batch.tolist() for batch in MANY_BATCHES[5:]]
        assert len(pool_reads) - before >= 25  # (but those asked for before it was told, asked again: the socket)
        assert [timeout for _, timeout in loop._seen.values()] == [30]


def slots_accounted(service, consumer):
    """Whether each slot of ``consumer``'s pool is free, handed over, or held by one task of the service, once."""
    pool = service._pools[consumer]
    computing = [slot for kept, slot in service._into.values() if kept is pool]
    return sorted(pool._free + list(pool._handed) + computing) == list(range(pool._slots.count))


CONSUMER = b"consumer"


@contextlib.contextmanager
def service_with_pool(view, nworkers=1, start_hook=None):
    """A view service of ``view`` (as a server's thread drives it), its answers (a list, kept as they are sent), and
    what the requests of a consumer on this machine say once it opened its pool (made by the welcome, or by the
    first item with arrays: the last one, answered here). The service is closed at the end."""
    sent = []
    options = LoaderOptions.check("serve", nworkers, start_hook=start_hook)
    service = ViewService(view, options, Buffering(8), send=lambda *m: sent.append(m))
    try:
        if "pool" not in service.hello(CONSUMER, hello_fields(4), local=True):
            service.handle(CONSUMER, b"get", {"req": 100, "index": len(view) - 1})
            drive(service, lambda: sent)
        yield service, sent, {"in": service._pools[CONSUMER].name}
    finally:
        service.close()


def second_worker_fails_once(failing):
    """A start hook: the second worker thread fails to start once ``failing`` is set (while items are computed)."""

    def start_hook(k):
        if k == 1 and failing.wait(30):
            raise RuntimeError("the second worker could not start")

    return start_hook


def test_a_cancelled_task_resumed_after_a_worker_skipped_it_frees_its_slot_once_let_go():
    # Items ahead, queued each with a slot, cancelled by a jump, skipped by the worker, then wanted again before the
    # server took the skips in: the resume came too late, and a later jump dropped them without freeing their slots.
    gate = threading.Event()

    def item(i):
        if i == 0:
            gate.wait(30)
        return np.full(8, float(i))

    c = CONSUMER
    with service_with_pool(lazyseq.smap(item, range(100))) as (service, sent, opened):

        def answered(i):
            return any(header["index"] == i for _, kind, header, _ in sent)

        try:
            service.handle(c, b"get", {"req": 0, "index": 0, **opened})  # its worker waits at the gate
            service.handle(c, b"get", {"req": 1, "index": 1, **opened})  # in order: items ahead queued, each in a slot
            ahead = [key for key in service._into if key[1] > 1]
            service.handle(c, b"get", {"req": 2, "index": 50, **opened})  # a jump: they are cancelled
            tickets = dict(service._engine.workers.workers._tickets)
            gate.set()
            deadline = time.monotonic() + 30
            while any(tickets[key].state != "skipped" for key in ahead) and time.monotonic() < deadline:
                time.sleep(0.01)  # (the worker skips them; the server has not taken that in)
            assert ahead and all(tickets[key].state == "skipped" for key in ahead)
            service.handle(c, b"get", {"req": 3, "index": 2, **opened})  # back: resumed, too late
            service.handle(c, b"get", {"req": 4, "index": 3, **opened})
            drive(service, lambda: answered(2) and answered(3))
            service.handle(c, b"get", {"req": 5, "index": 90, **opened})  # a jump elsewhere: the items ahead go
            drive(service, lambda: answered(90) and not service._engine.pending)
            engine = service._engine
            assert slots_accounted(service, c)
            assert [key for key in service._into if key not in engine.ready] == []  # (held by tasks that ended)
        finally:
            gate.set()


def test_after_its_workers_failed_the_slots_of_items_they_computed_are_free_again():
    failing = threading.Event()
    c = CONSUMER
    with service_with_pool(MANY_BATCHES, 2, second_worker_fails_once(failing)) as (service, sent, opened):
        try:
            service.handle(c, b"get", {"req": 0, "index": 0, **opened})
            engine = service._engine
            drive(service, lambda: sent and len(engine.ready) >= 4)  # items computed ahead, each in a slot
            failing.set()
            service.handle(c, b"get", {"req": 1, "index": 1, **opened})  # reads on: the failure is taken in
            drive(service, lambda: service._engine is not engine)
            assert slots_accounted(service, c)  # (those of the items computed were kept for good)
        finally:
            failing.set()


def test_an_answer_lost_for_a_request_dropped_after_a_jump_is_asked_for_again_and_its_slot_comes_back(
    monkeypatch, pool_reads
):
    receive, lost = Connection._receive, []

    def losing_item_3(connection, waiting_for, since=None):
        while True:
            message = receive(connection, waiting_for, since)
            kind, header, _ = message
            if not (kind == b"item" and header.get("index") == 3 and "slot" in header and not lost):
                return message
            lost.append(header["slot"])  # as if lost with a connection that broke

    monkeypatch.setattr(Connection, "_receive", losing_item_3)
    with lazyseq.serve(MANY_BATCHES, LOOPBACK) as server, lazyseq.connect(server.address, ahead=4) as remote:
        assert [remote[i].tolist() for i in (0, 1, 20)] == [MANY_BATCHES[i].tolist() for i in (0, 1, 20)]  # a jump
        remote._ask_again()  # what a silence does (as when the connection broke)
        for _ in range(2):
            assert [batch.tolist() for batch in remote] == [batch.tolist() for batch in MANY_BATCHES]
        assert lost and every_slot_comes_back(remote, pool_reads)


def test_when_workers_fail_only_the_slot_of_an_item_a_thread_still_computes_is_kept_from_use(monkeypatch):
    monkeypatch.setattr(thread_workers, "JOIN_SECONDS", 0.1)  # (how long a close waits for a busy thread)
    failing, busy = threading.Event(), threading.Event()

    def item(i):
        if i == 3:
            busy.wait(30)  # still computed as the workers fail, and after their close
        return np.full(8, float(i))

    c = CONSUMER
    view = lazyseq.smap(item, range(40))
    with service_with_pool(view, 2, second_worker_fails_once(failing)) as (service, sent, opened):
        try:
            service.handle(c, b"get", {"req": 0, "index": 0, **opened})
            service.handle(c, b"get", {"req": 1, "index": 1, **opened})  # in order: items ahead, each in a slot
            engine = service._engine
            drive(service, lambda: (c, 2) in engine.ready)  # 2 computed, 3 being computed, 4 and on queued
            busy_slot = service._into[(c, 3)][1]
            failing.set()
            drive(service, lambda: service._engine is not engine)
            pool = service._pools[c]
            computing = [slot for _, slot in service._into.values()]
            assert sorted(pool._free + list(pool._handed) + computing + [busy_slot]) == list(range(pool._slots.count))
        finally:
            busy.set()
            failing.set()


def test_a_read_interrupted_as_its_answer_came_reads_it_when_asked_again(monkeypatch, pool_reads):
    # The answer's hand-over counted as received at once: asked again, the same answer was taken for a repeat and
    # dropped, every time, and the read never ended.
    real, interrupted = ReceivedPool.handed_anew, []

    def interrupted_once(pool, slot, number):
        fresh = real(pool, slot, number)
        if fresh and not interrupted:
            interrupted.append(slot)
            raise KeyboardInterrupt  # a Ctrl-C as the answer is taken in
        return fresh

    monkeypatch.setattr(ReceivedPool, "handed_anew", interrupted_once)
    with lazyseq.serve(MANY_BATCHES, LOOPBACK) as server, lazyseq.connect(server.address, timeout=30) as remote:
        with pytest.raises(KeyboardInterrupt):
            remote[5]
        assert remote[5].tolist() == MANY_BATCHES[5].tolist()  # asked again after a silence, answered the same
        assert interrupted and every_slot_comes_back(remote, pool_reads)


def test_a_closed_consumer_lets_go_of_its_pool_though_items_it_read_ahead_had_arrived():
    # An item read ahead and not read yet kept its slot leased, and with it the pool's memory and descriptor, for as
    # long as the closed view was referred to.
    with lazyseq.serve(MANY_BATCHES, LOOPBACK) as server:
        remote = lazyseq.connect(server.address, ahead=8)
        assert remote[0].tolist() == MANY_BATCHES[0].tolist()
        while len(remote._arrived) < 4:  # (the items after it arrive)
            remote._receive_one("the items read ahead")
        remote.close()  # (the server lets go of its side as it hears the goodbye)
        assert pools_once_tasks_end(seconds=10) == [] and remote._arrived == {}

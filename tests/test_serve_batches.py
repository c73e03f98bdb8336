"""The data server: a batch of a served view asks for its items at once, and gets them in one message.

Servers listen on 127.0.0.1 only; every server, consumer and process a test starts is stopped by it.
"""

import _thread
import concurrent.futures
import json
import logging
import pickle
import re
import socket
import threading
import time

import numpy as np
import pytest
import served_pipelines
from loader_helpers import ENDED_ITSELF, die_on, same

import lazyseq

zmq = pytest.importorskip("zmq")

from serve_helpers import (  # noqa: E402
    LOOPBACK,
    bare_dealer,
    drive,
    lazyseq_threads,
    losing_the_first,
    noting_computed,
    say_hello,
    sent_gets,
)

from lazyseq.serving import wire  # noqa: E402
from lazyseq.serving.connection import Connection  # noqa: E402
from lazyseq.serving.view_service import ViewService  # noqa: E402


def recording_requests(monkeypatch, kind=b"get"):
    """The headers of the requests of ``kind`` that consumers send from now on."""
    sent, original = [], Connection.send

    def record(self, sent_kind, header, flags=0):
        if sent_kind == kind:
            sent.append(dict(header))
        return original(self, sent_kind, header, flags)

    monkeypatch.setattr(Connection, "send", record)
    return sent


BATCHED_SOURCES = {
    "array": lambda: lazyseq.view(np.arange(60, dtype=np.float32).reshape(20, 3)),
    "tuple": lambda: lazyseq.collate([np.array(["a", "bb", "c", "dd"] * 5, "<U5"), np.arange(20, dtype=">f8")]),
    "dict": lambda: lazyseq.collate({"s": np.array(["xy"] * 20), "n": np.arange(20, dtype=np.uint16)}),
    "nested": lambda: lazyseq.smap(served_pipelines.assorted_item, range(20)),
}


@pytest.mark.parametrize("source", BATCHED_SOURCES.values(), ids=BATCHED_SOURCES)
def test_a_batch_of_a_served_view_is_one_request_read_as_the_server_reads_it(monkeypatch, source):
    # Its items travelled one by one: 13,000 items a second at best, where a batch of 64 now comes at once.
    local = source()
    sent = recording_requests(monkeypatch)
    with lazyseq.serve(local, LOOPBACK) as server, lazyseq.connect(server.address, ahead=4) as remote:
        for got, expected in zip(remote.batch(4), local.batch(4), strict=True):
            same(got, expected)
        assert [h["positions"] for h in sent] == [list(range(k, k + 4)) for k in range(0, 20, 4)]  # the next, ahead
        sent.clear()
        order = np.random.default_rng(0).permutation(20)
        for got, expected in zip(remote.take(order).batch(5), local.take(order).batch(5), strict=True):
            same(got, expected)
        assert [h["positions"] for h in sent] == [order[k : k + 5].tolist() for k in range(0, 20, 5)]  # none ahead


def test_a_batch_larger_than_one_request_holds_is_asked_for_in_parts(monkeypatch):
    sent = recording_requests(monkeypatch)
    with lazyseq.serve(np.arange(5000), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        batch = remote.batch(5000)[0]
        assert batch.dtype == np.int64 and batch.tolist() == list(range(5000))
    assert [len(h["positions"]) for h in sent] == [2048, 2048, 904]


def costly_then_waiting_for_the_others(barrier):
    def item(i):
        if i < 18:
            time.sleep(0.003)  # what the first batches cost tells the server that its items are worth sharing out
        elif i % 3 == 0:  # the first item of each worker's part: the three parts are read side by side, or none is
            barrier.wait()
        return np.full(2, i)

    return item


def test_the_server_workers_read_parts_of_a_batch_of_costly_items_side_by_side():
    barrier = threading.Barrier(3, timeout=30)
    source = lazyseq.smap(costly_then_waiting_for_the_others(barrier), range(27))
    with lazyseq.serve(source, LOOPBACK, nworkers=3) as server, lazyseq.connect(server.address) as remote:
        assert [b.tolist() for b in remote.batch(9)] == [[[i, i] for i in range(k, k + 9)] for k in (0, 9, 18)]


def test_an_item_that_fails_in_a_batch_is_named_as_a_local_read_names_it():
    with lazyseq.serve(served_pipelines.failing(), LOOPBACK, nworkers=2) as server:
        with lazyseq.connect(server.address) as remote:
            with pytest.raises(lazyseq.EvaluationError) as caught:
                remote.batch(4)[0]
            assert str(caught.value) == (
                "failed to compute batch[0] -> served[3] -> smap(fail_at_3)[3]: RemoteError: ValueError: item 3 is bad"
            )
            assert 'raise ValueError("item 3 is bad")' in caught.value.__cause__.__notes__[0]
            with pytest.raises(lazyseq.EvaluationError) as caught:
                remote.take([5, 3, 1]).batch(3)[0]
            assert str(caught.value).startswith("failed to compute batch[0] -> gather[1] -> served[3] -> smap(")
            assert remote.batch(4)[1].tolist() == [4, 5, 6, 7]  # the server goes on


def test_an_item_of_a_batch_that_cannot_be_sent_is_named():
    items = lazyseq.smap(lambda i: np.array([i, "x"], dtype=object) if i == 1 else np.arange(2), range(3))
    with lazyseq.serve(items, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        with pytest.raises(lazyseq.EvaluationError) as caught:
            remote.batch(3)[0]
    assert str(caught.value) == (
        "failed to compute batch[0] -> served[1]: RemoteError: TypeError: item 1 cannot be sent: the item is an array "
        "of Python objects (dtype object): only arrays of plain data can be sent; convert it to a numeric, bytes or "
        "str dtype, or to a list"
    )


def test_a_worker_process_that_dies_on_a_batch_fails_that_batch_and_new_workers_read_the_others(caplog):
    source = lazyseq.smap(die_on(5, "exit"), range(20))  # item 5 ends every worker process that reads it
    caplog.set_level(logging.WARNING, logger="lazyseq.serve")
    with lazyseq.serve(source, LOOPBACK, nworkers=2, method="process") as server:
        with lazyseq.connect(server.address) as remote:
            outcomes = []
            for k in range(5):
                try:
                    outcomes.append(remote.batch(4)[k].tolist())
                except lazyseq.LoaderError as error:
                    outcomes.append(str(error))
    assert outcomes[:1] + outcomes[2:] == [list(range(k, k + 4)) for k in (0, 8, 12, 16)]
    assert re.search(
        r"could not compute items 4 to 7: .* died with exit code 3 while computing items 4 to 7"
        + re.escape(ENDED_ITSELF)
        + "$",
        outcomes[1],
    )
    # Each death logged as its message says it, without the traceback of the server's own code. (Item 5 may end a
    # second worker: computed ahead of the requests, as well as in the batch asked for.)
    deaths = [record for record in caplog.records if "died with" in record.getMessage()]
    assert deaths and all(record.exc_info is None for record in deaths)
    for record in deaths:
        assert re.fullmatch(
            r"a worker of the server died \(the request of the item it computed, if any, hears why; new workers compute "
            r"the others\): serve: worker process \d \(pid \d+\) died with exit code 3 while computing "
            r"(items 4 to 7|item 5)" + re.escape(ENDED_ITSELF),
            record.getMessage(),
        )


def test_a_batch_whose_request_was_lost_is_asked_for_again_after_a_silence(monkeypatch):
    send_request, lost = losing_the_first(b"get", lambda header: "positions" in header)
    monkeypatch.setattr(Connection, "send", send_request)
    with lazyseq.serve(np.arange(12), LOOPBACK) as server, lazyseq.connect(server.address, timeout=1) as remote:
        assert [b.tolist() for b in remote.batch(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert lost == [{"req": 0, "positions": [0, 1, 2, 3]}]


def test_a_consumer_reads_batches_on_when_its_server_comes_back(server_process):
    first = server_process("numbers")
    with lazyseq.connect(first.address, timeout=20.0) as remote:
        batches = remote.batch(10)
        got = [batches[0].tolist(), batches[1].tolist()]  # the third is asked for ahead, of this server
        first.kill()
        server_process("numbers", first.address)
        got.extend(b.tolist() for b in batches[2:])
    assert got == [list(range(k, k + 10)) for k in range(0, 100, 10)]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_worker_processes_read_batches_of_a_served_view(start_method):
    with lazyseq.serve(served_pipelines.numbers(), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        assert remote.batch(10)[0].tolist() == list(range(10))  # asked for the next batch ahead, then forked
        with lazyseq.prefetch(remote.batch(10), nworkers=2, method="process", start_method=start_method) as ahead:
            assert [b.tolist() for b in ahead] == [list(range(k, k + 10)) for k in range(0, 100, 10)]
        assert remote.batch(10)[1].tolist() == list(range(10, 20))


def test_a_consumer_that_leaves_while_its_batch_is_read_leaves_nothing_held():
    started, release = threading.Event(), threading.Event()

    def item(i):
        started.set()
        release.wait(30)
        return i

    with lazyseq.serve(lazyseq.smap(item, range(10)), LOOPBACK) as server:
        service = server._loop._service
        remote = lazyseq.connect(server.address, timeout=2)
        failed = []
        reading = threading.Thread(
            target=lambda: failed.append(pytest.raises(lazyseq.LoaderError, remote.batch(4).__getitem__, 0))
        )
        reading.start()
        assert started.wait(30)  # the batch is being read
        remote.close()
        reading.join(30)
        deadline = time.monotonic() + 30
        while service._reads and time.monotonic() < deadline:  # its goodbye read by the server
            time.sleep(0.01)
        assert not service._reads and len(failed) == 1
        release.set()
        with lazyseq.connect(server.address) as other:
            assert other.batch(4)[0].tolist() == [0, 1, 2, 3]
        assert not service._engine.ready  # the batch read for the consumer that left was dropped


def test_requests_for_items_at_once_are_checked():
    with lazyseq.serve(np.arange(10) * 10, LOOPBACK) as server:
        context = zmq.Context()
        client = bare_dealer(context, server.address)
        assert say_hello(client) == b"welcome"
        for header in [
            {"req": 0, "positions": []},
            {"req": 0, "positions": list(range(2049))},
            {"req": "0", "positions": [1]},
            {"req": 0, "positions": [1, "2"]},
            {"req": 0, "positions": [1, 2.0]},
            {"req": 0, "positions": [3, 10, -1]},
            {"req": 1, "positions": [9, 0, 9]},
        ]:
            client.send_multipart([wire.TAG, b"get", wire.dumps(header)])
        answers = [client.recv_multipart() for _ in range(7)]
        client.close()
        context.term()
    kinds = [kind for _, kind, *_ in answers]
    assert kinds == [b"refused"] * 5 + [b"error", b"item"]
    assert json.loads(answers[0][2]) == {"message": "'get' needs an integer 'req' and from 1 to 2048 'positions'"}
    assert json.loads(answers[3][2]) == {"message": "'get' needs 'positions' to be integers"}
    error = json.loads(answers[5][2])
    assert (error["type"], error["message"]) == ("IndexError", "index 10 out of range for the served view of length 10")
    _, _, header, *buffers = answers[6]
    header = json.loads(header)
    assert header["count"] == 3 and wire.decode(header["tree"], buffers)[1].tolist() == [90, 0, 90]


@pytest.mark.parametrize(
    "value",
    [
        ("rows", np.arange(2)),
        ("rows", np.int64(3)),
        ("items", [1, 2]),
        ("items", (1, 2, 3)),
        ("columns", [("rows", np.arange(3)), ("items", [1])], None),
        ("columns", [("rows", np.arange(3))], ("a", "b")),
        ("columns", [], None),
        ("columns", [("rows", np.arange(3))], ([1, 2],)),
        ("columns", [("rows", np.arange(3)), ("rows", np.arange(3))], ("a", "a")),
        ("cells", [1, 2, 3]),
        [("rows", np.arange(3))],
    ],
)
def test_items_at_once_that_are_not_what_was_asked_for_are_a_protocol_error(value):
    from lazyseq.serving.chunk_wire import from_wire

    with pytest.raises(wire.ProtocolError, match=r"^not 3 items of a served view$"):
        from_wire(value, 3)


def test_items_that_travel_only_one_by_one_are_read_so_in_a_batch(monkeypatch):
    # Items nested as deep as a message allows travel item by item, not all in one message: their batches failed;
    # then each batch was asked for whole again, its items computed twice.
    sent = recording_requests(monkeypatch)
    deep = [wire.MAX_DEPTH - 1]
    for _ in range(wire.MAX_DEPTH - 1):
        deep = [deep]
    items = [deep] * 6
    with lazyseq.serve(items, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        assert list(remote.batch(2, collate_fn=list)) == [[deep, deep]] * 3
        assert [remote[i] for i in range(6)] == items
    assert [h["positions"] for h in sent if "positions" in h] == [[0, 1], [2, 3]]  # the first batch, and one ahead


def test_a_batch_of_an_array_of_python_objects_is_read_at_once_as_a_local_read_makes_it(monkeypatch):
    # Its items went one by one, and a batch of them came as a list where a local read gives an array of objects.
    sent = recording_requests(monkeypatch)
    objects = np.array(["a", 1, 2.5, None, [7], np.arange(2)], dtype=object)
    with lazyseq.serve(objects, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        for local, served in [
            (lazyseq.view(objects), remote),
            (lazyseq.view(objects).shuffle(seed=0), remote.shuffle(seed=0)),
        ]:
            for batch, expected in zip(served.batch(4), local.batch(4)):
                assert type(batch) is np.ndarray and batch.dtype == object and batch.shape == expected.shape
                assert [type(x) for x in batch] == [type(x) for x in expected]
                assert all(
                    np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(batch, expected)
                )
    assert sent and all("positions" in header for header in sent)  # each batch at once, no item asked for alone


def test_a_server_that_does_not_answer_items_at_once_is_asked_one_by_one(monkeypatch):
    # A server of an earlier version refuses 'positions': batches of its views failed.
    sent = recording_requests(monkeypatch)
    info = ViewService.info
    monkeypatch.setattr(ViewService, "info", lambda self: {k: v for k, v in info(self).items() if k != "at_once"})
    with lazyseq.serve(np.arange(8), LOOPBACK) as server, lazyseq.connect(server.address, ahead=2) as remote:
        assert [b.tolist() for b in remote.batch(4)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert all("positions" not in header for header in sent)


def test_a_batch_read_cut_short_leaves_nothing_behind(monkeypatch):
    # The requests of a batch read that a Ctrl-C cut short stayed, their answers kept for ever (64 MB for 10 reads).
    receive, armed = Connection.receive, []

    def interrupted_once(self, waiting_for, since=None):
        if armed and armed.pop() == waiting_for:
            raise KeyboardInterrupt
        return receive(self, waiting_for, since)

    monkeypatch.setattr(Connection, "receive", interrupted_once)
    with lazyseq.serve(np.arange(40), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        armed.append("items 0 to 3")
        with pytest.raises(KeyboardInterrupt):
            remote.batch(4)[0]
        # its request is forgotten; the next batch's, asked for ahead, stays
        assert (list(remote._chunks.asked) + list(remote._chunks.arrived), remote._chunks._ahead) == (
            [1],
            {(4, 8): [1]},
        )
        assert remote.batch(4)[0].tolist() == [0, 1, 2, 3]
        assert [b.tolist()[0] for b in remote.batch(4)[1:]] == list(range(4, 40, 4))
        assert len(remote._chunks.arrived) + len(remote._chunks.asked) == 0


def test_batches_read_out_of_order_by_two_threads_ask_for_each_item_once(monkeypatch):
    # prefetch with threads: each thread's read asked ahead for a batch the other thread asked for (17% more asked).
    sent = recording_requests(monkeypatch)
    with lazyseq.serve(np.arange(20), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        batches = remote.batch(4)
        assert [batches[k].tolist()[0] for k in (0, 2, 1, 3, 4)] == [0, 8, 4, 12, 16]  # as two threads may read them
    assert [h["positions"][0] for h in sent] == [0, 4, 8, 12, 16]


def test_batches_read_here_and_there_hold_two_batches_ahead_at_most():
    rng = np.random.default_rng(0)
    with lazyseq.serve(np.arange(1000), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        batches = remote.batch(10)
        for start in rng.integers(0, 97, size=30):
            for k in range(start, start + 3):  # a few in order, then a jump
                assert batches[k].tolist()[0] == 10 * k
                assert len(remote._chunks._ahead) <= 2
                assert len(remote._chunks.asked) + len(remote._chunks.arrived) <= 2


def test_a_task_left_by_a_request_the_server_forgot_is_no_part_of_the_request_asked_again():
    # The consumer, taken for gone, asks again with the same request number; a task of the old request that ended
    # then was taken for a part of the new one (split otherwise): items 4 and 5 twice, 2 and 3 never.
    from lazyseq.loading.backends import Done
    from lazyseq.loading.buffering import Buffering
    from lazyseq.loading.options import LoaderOptions
    from lazyseq.serving.chunk_requests import ChunkPart

    sent = []
    service = ViewService(
        lazyseq.view(list(range(8))), LoaderOptions.check("serve", 4), Buffering(4), send=lambda *m: sent.append(m)
    )
    try:
        service._splitting._item_seconds = 0.0005  # two parts
        service.handle(b"c", b"get", {"req": 5, "positions": list(range(8))})
        forgotten = service._reads[b"c"].chunks[5]
        service.forget(b"c")  # silent past its timeout
        service._splitting._item_seconds = 0.01  # four parts
        service.handle(b"c", b"get", {"req": 5, "positions": list(range(8))})
        stale = ChunkPart(b"c", 5, 0, forgotten.serial)  # the forgotten request's first part, ending now
        service._engine.ready[stale] = Done(stale, "ok", [4, 5, 6, 7])
        drive(service, lambda: sent)
    finally:
        service.close()
    (_, kind, header, buffers), *_ = sent
    assert (kind, wire.decode(header["tree"], buffers)) == (b"item", ("items", list(range(8))))


def test_a_part_of_a_batch_that_its_workers_skipped_is_read_again():
    # Ray reports the rest of a run skipped after an item raised KeyboardInterrupt: the batch was never answered.
    from lazyseq.loading.backends import Done
    from lazyseq.loading.buffering import Buffering
    from lazyseq.loading.options import LoaderOptions
    from lazyseq.serving.chunk_requests import ChunkPart

    sent = []
    service = ViewService(
        lazyseq.view(list(range(10))), LoaderOptions.check("serve", 1), Buffering(4), send=lambda *m: sent.append(m)
    )
    try:
        service.handle(b"c", b"get", {"req": 0, "positions": [0, 1]})
        service.handle(b"c", b"get", {"req": 1, "positions": [2, 3]})
        workers = service._engine.workers
        poll, skipped = workers.poll, ChunkPart(b"c", 1, 0, 1)

        def skipping(timeout):
            return [Done(d.task, "skipped", None) if d.task == skipped else d for d in poll(timeout)]

        workers.poll = skipping
        drive(service, lambda: sent)
        workers.poll = poll
        drive(service, lambda: len(sent) == 2)
    finally:
        service.close()
    answers = sorted((header["req"], wire.decode(header["tree"], buffers)) for _, _, header, buffers in sent)
    assert answers == [(0, ("items", [0, 1])), (1, ("items", [2, 3]))]


@pytest.mark.parametrize("batched", [False, True], ids=["item", "batch"])
def test_a_worker_process_reading_a_served_view_names_the_chain_on_the_server_too(batched):
    # The chain stopped at served[3], and the error read "RemoteError: RemoteError: ValueError" (it did not unpickle).
    with lazyseq.serve(served_pipelines.failing(), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        view, i, outer = (remote.batch(4), 0, "batch[0] -> ") if batched else (remote, 3, "")
        with lazyseq.prefetch(view, nworkers=1, method="process", inline_below=0) as ahead:
            with pytest.raises(lazyseq.EvaluationError) as caught:
                ahead[i]
    assert str(caught.value) == (
        f"failed to compute prefetch[{i}] -> {outer}served[3] -> smap(fail_at_3)[3]: RemoteError: ValueError: item 3 "
        "is bad"
    )


def test_a_remote_error_travels_to_another_process_as_itself():
    error = lazyseq.RemoteError("ValueError", "item 3 is bad")
    error.add_note("raised on the server")
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), again.type_name, again.__notes__) == (
        lazyseq.RemoteError,
        "ValueError: item 3 is bad",
        "ValueError",
        ["raised on the server"],
    )


@pytest.fixture
def silent_connection():
    """A connection to an address where nothing listens, which has heard nothing for 10 s (timeout 1 s); and when
    its reader began to wait."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{unused.getsockname()[1]}"
    connection = Connection(address, timeout=1.0)
    began = time.monotonic() - 10
    connection.heartbeat.last_answer = connection.heartbeat.resumed = connection._heard = began
    yield connection, began
    connection.close()


def test_a_read_that_waited_for_another_threads_read_counts_its_timeout_from_its_own_start(silent_connection):
    # Each of several threads reading one consumer of a server that died waited a timeout of its own once the
    # thread before it let the connection go: the last one heard of it after a timeout per thread.
    connection, began = silent_connection
    with pytest.raises(lazyseq.ServerLost, match=r"^lost the server at .*: no answer for 10\.\d s \(timeout=1\)"):
        connection.receive("item 3", since=began)


def test_a_read_waiting_for_another_threads_read_hears_that_the_server_is_lost_in_time(silent_connection):
    # It waited until the other thread's read ended, itself given a timeout of its own (and reads begun meanwhile).
    from types import SimpleNamespace

    from lazyseq.serving.remote_view import RemoteView

    connection, began = silent_connection
    view = SimpleNamespace(_lock=threading.Lock(), _connection=connection)
    with view._lock:  # another thread's read
        with pytest.raises(lazyseq.ServerLost, match=r"no answer for 10\.\d s \(timeout=1\) while waiting for item 3"):
            RemoteView._await_turn(view, "item 3", began)


def test_the_read_holding_a_served_views_connection_counts_the_silence_from_the_earliest_read_waiting(
    silent_connection,
):
    # A read that saw the connection free, and lost it to a read begun after it, waited for that read's timeout,
    # then for its own.
    from lazyseq.serving.remote_view import RemoteView

    connection, began = silent_connection
    view = RemoteView(connection, {"length": 10}, ahead=0, settings={})
    view._reads._began[-1] = began  # another thread's read, begun 10 s ago, waiting for its turn
    with pytest.raises(lazyseq.ServerLost, match=r"no answer for 10\.\d s \(timeout=1\) while waiting for item 3"):
        view[3]
    assert view._reads.earliest(None) == began  # (the other read's, still under way)


def test_the_read_holding_a_served_streams_connection_counts_the_silence_from_the_earliest_read_waiting(
    silent_connection,
):
    # Another thread's next() waited for the lock with no check of the server's silence at all: two timeouts.
    from lazyseq.serving.remote_stream import RemoteStream

    connection, began = silent_connection
    stream = RemoteStream(connection, ahead=2)
    stream._reads._began[-1] = began
    with pytest.raises(lazyseq.ServerLost, match=r"no answer for 10\.\d s \(timeout=1\) while waiting for the next"):
        next(stream)


class HeldItem:
    """Item ``held`` is computed once ``release`` is set (``computing`` says it is being computed); others at once."""

    def __init__(self, held=0):
        self.held, self.computing, self.release = held, threading.Event(), threading.Event()

    def __call__(self, i):
        if i == self.held:
            self.computing.set()
            self.release.wait(30)
        return i * 10


def test_threads_reading_one_served_view_at_once_do_not_wait_for_each_other():
    # They took turns on its connection: a read waited for the others' answers, and a thread prefetch over a served
    # view did no better than no loader (the server computed for one read at a time).
    held = HeldItem()
    with lazyseq.serve(lazyseq.smap(held, range(20)), LOOPBACK, nworkers=2) as server:
        remote = lazyseq.connect(server.address)
        first = []
        reader = threading.Thread(target=lambda: first.append(remote[0]))
        reader.start()
        try:
            assert held.computing.wait(30)  # that read holds the connection, waiting for its answer
            assert [remote[5], remote[7], list(remote[2:4])] == [50, 70, [20, 30]]  # meanwhile
            [spare] = remote._all_spares  # a connection of its own, kept for the next reads
            assert remote._spares == [spare]
        finally:
            held.release.set()
            reader.join()
        assert first == [0] and remote[9] == 90
        remote.close()
        assert remote._all_spares == [] and spare._connection.closed
    assert lazyseq_threads() == []


def test_threads_reading_one_served_view_at_once_open_connections_up_to_a_limit(monkeypatch):
    monkeypatch.setattr("lazyseq.serving.remote_view.SPARE_CONNECTIONS", 1)
    held = [HeldItem(2), HeldItem(3)]
    with lazyseq.serve(lazyseq.smap(lambda i: held[i % 2](i), range(4)), LOOPBACK, nworkers=3) as server:
        with lazyseq.connect(server.address) as remote:
            got = []
            readers = [threading.Thread(target=lambda i=i: got.append(remote[i])) for i in (2, 3)]  # (jumps)
            try:
                readers[0].start()
                assert held[0].computing.wait(30)
                readers[1].start()  # through a spare connection
                assert held[1].computing.wait(30)
                assert remote._spares == [] and len(remote._all_spares) == 1
                waiting = threading.Thread(target=lambda: got.append(remote[1]))  # waits for the view's connection
                waiting.start()
                held[0].release.set()
                waiting.join()
                readers[0].join()
                assert sorted(got) == [10, 20]
            finally:
                held[0].release.set(), held[1].release.set()
                for reader in readers:
                    reader.join()
            assert sorted(got) == [10, 20, 30]


def test_a_thread_prefetch_over_a_served_view_that_fails_does_not_wait_for_reads_still_under_way():
    # Closing on the failure waited for its worker threads, one of them waiting for an item from the server: up to
    # the server's timeout (a server gone: ServerLost came two or three timeouts late), or the item's own time.
    held = HeldItem(1)

    def item(i):
        if i == 0:
            held.computing.wait(30)  # item 1 is being computed, for the read of another worker
            raise ValueError("item 0 is bad")
        return held(i)

    with lazyseq.serve(lazyseq.smap(item, range(10)), LOOPBACK, nworkers=2) as server:
        with lazyseq.connect(server.address, timeout=2) as remote:
            try:
                with pytest.raises(lazyseq.EvaluationError, match="item 0 is bad"):
                    with lazyseq.prefetch(remote, nworkers=2, inline_below=0) as loaded:
                        loaded[0]
                assert [t.name for t in threading.enumerate() if t.name.startswith("lazyseq-prefetch")] == []
                assert not held.release.is_set()  # (item 1 still computing)
            finally:
                held.release.set()
            assert remote[1] == 10


def read_in_turn(view, indices):
    """``view[i]`` for each of ``indices``, read one after the other by two threads in turn (a thread prefetch's)."""
    threads = [concurrent.futures.ThreadPoolExecutor(1), concurrent.futures.ThreadPoolExecutor(1)]
    try:
        return [threads[k % 2].submit(view.__getitem__, i).result() for k, i in enumerate(indices)]
    finally:
        for thread in threads:
            thread.shutdown()


def test_reads_of_items_asked_for_ahead_in_another_order_keep_the_others():
    # Threads reading a served view in turn (a thread prefetch over it) read its items in either order: each read
    # of an item but the next counted as a jump, dropped the items asked for ahead, and asked for them again.
    with lazyseq.serve(np.arange(20) * 10, LOOPBACK) as server, lazyseq.connect(server.address, ahead=4) as remote:
        asked, send = [], remote._connection.send
        remote._connection.send = lambda kind, header, flags=0: (asked.append(header), send(kind, header, flags))[1]
        assert read_in_turn(remote, (0, 2, 1, 3, 5, 4, 12, 13)) == [0, 20, 10, 30, 50, 40, 120, 130]
        # (items 0-4, then ahead as half of them are read; a jump to 12: that one alone, then in order from 13)
        assert [(h["index"], h.get("count", 1)) for h in asked] == [(0, 5), (5, 2), (7, 3), (12, 1), (13, 5)]
        assert sorted(remote._asking.keys() | remote._arrived.keys()) == [14, 15, 16, 17]  # (nothing else kept)
    with lazyseq.serve(np.arange(200), LOOPBACK) as server, lazyseq.connect(server.address, ahead=4) as remote:
        asked, send = [], remote._connection.send
        remote._connection.send = lambda kind, header, flags=0: (asked.append(header), send(kind, header, flags))[1]
        assert [remote[i] for i in (0, 4, 3, 2, 1)] == [0, 4, 3, 2, 1]
        assert [(h["index"], h.get("count", 1)) for h in asked] == [(0, 5), (5, 4)]  # (not 3 and 4 again, read)
    with lazyseq.serve(np.arange(200), LOOPBACK) as server, lazyseq.connect(server.address, ahead=4) as remote:
        assert [remote[i] for i in (0, *range(2, 100))] == [0, *range(2, 100)]
        kept = remote._asking.keys() | remote._arrived.keys()
        assert min(kept) == 100 and len(kept) <= 4  # (not item 1, skipped, for ever)


def test_a_strided_shard_of_a_served_view_asks_for_its_items_only(monkeypatch):
    # Its reads counted as in order (the next one had been asked for ahead) or as jumps: the consumer asked for every
    # item up to `ahead` after each, and the server computed the whole view for each of 4 strided shards. (Reads in
    # order that come in another order are not taken for steps: see the test after this one.)
    sent = sent_gets(monkeypatch)
    served, computed = noting_computed(range(40))
    with lazyseq.serve(served, LOOPBACK, nworkers=1) as server, lazyseq.connect(server.address, ahead=4) as remote:
        assert list(lazyseq.shard(remote, 1, 4, contiguous=False)) == list(range(1, 40, 4))
        # once 5 reads in a row took the same step (item 21), the next ones at that step are asked for ahead
        assert [(h["index"], h.get("count", 1)) for h in sent] == [(i, 1) for i in range(1, 40, 4)]
        assert sorted(computed) == list(range(1, 40, 4))
        assert [remote[i] for i in range(8)] == list(range(8))  # in order again: the step is 1 from the next read
        assert sorted(remote._asking.keys() | remote._arrived.keys()) == [8, 9, 10, 11]
    assert [(h["index"], h.get("count", 1)) for h in sent[10:]] == [(0, 1), (1, 5), (6, 2), (8, 2), (10, 2)]


def test_the_server_computes_ahead_at_the_step_its_consumer_reads_at():
    # Each read of a strided shard was a jump for the server: it computed nothing ahead, so no more than the
    # consumer's `ahead` items were on their way, whatever the server's workers and max_buffered.
    from lazyseq.loading.buffering import Buffering
    from lazyseq.loading.options import LoaderOptions

    service = ViewService(lazyseq.view(list(range(30))), LoaderOptions.check("serve", 1), Buffering(3), lambda *m: 0)
    try:
        service.handle(b"c", b"get", {"req": 0, "index": 0})
        held = [sorted(service._reads[b"c"].held)]
        for req, i in enumerate([3, 6, 9], start=1):
            service.handle(b"c", b"get", {"req": req, "index": i, "step": 3})
            held.append(sorted(service._reads[b"c"].held))
        service.handle(b"c", b"get", {"req": 4, "index": 10})  # at step 1 again: what was ahead at step 3 goes
        held.append(sorted(service._reads[b"c"].held))
        for req, i in [(5, 20), (6, 27)]:  # a jump computes nothing ahead; the next read on its step, to the end
            service.handle(b"c", b"get", {"req": req, "index": i, "step": 7})
            held.append(sorted(service._reads[b"c"].held))
    finally:
        service.close()
    waiting = [0, 3, 6, 9]  # (not answered here: held too)
    assert held == [
        [0, 1, 2, 3],
        [0, 3, 6, 9, 12],
        [0, 3, 6, 9, 12, 15],
        [0, 3, 6, 9, 12, 15, 18],
        [*waiting, 10, 11, 12, 13],
        [*waiting, 10, 20],
        [*waiting, 10, 20, 27],
    ]


def tasks_sent_reading_in_order(monkeypatch, nworkers, slow, ready, reads):
    """The runs of tasks that a served view of 100 items (``max_buffered=10``) sends its ``nworkers`` worker threads
    as a consumer reads item 0, then, once items ``ready`` are computed, items ``reads``; items ``slow`` hold their
    worker until the end."""
    from lazyseq.loading.buffering import Buffering
    from lazyseq.loading.engine import Engine
    from lazyseq.loading.options import LoaderOptions

    release = threading.Event()

    def item(i):
        if i in slow:
            release.wait(30)
        return i

    runs = []
    submit = Engine.submit
    monkeypatch.setattr(
        Engine, "submit", lambda self, tasks: (runs.append([i for (_, i), _ in tasks]), submit(self, tasks))
    )
    options = LoaderOptions.check("serve", nworkers, "thread")
    service = ViewService(lazyseq.smap(item, range(100)), options, Buffering(10), lambda *m: 0)
    try:
        service.handle(b"c", b"get", {"req": 0, "index": 0})
        while not {(b"c", i) for i in ready} <= service._engine.ready.keys():
            service._engine.collect(1.0)
        for req, i in enumerate(reads, start=1):
            service.handle(b"c", b"get", {"req": req, "index": i})
    finally:
        release.set()
        service.close()
    return runs


def test_the_server_computes_ahead_in_runs_while_its_workers_are_busy(monkeypatch):
    # Each item read in order sent one task ahead: a wake-up of a worker thread, and of the server's, for every item.
    runs = tasks_sent_reading_in_order(monkeypatch, 1, slow=range(6, 100), ready=range(1, 6), reads=range(1, 6))
    assert runs == [[0], list(range(1, 11)), list(range(11, 16))]


def test_the_server_computes_ahead_at_once_for_a_worker_left_without_a_task(monkeypatch):
    # Waiting for half the room to be free left 2 of 4 workers idle behind two slow items.
    runs = tasks_sent_reading_in_order(monkeypatch, 4, slow={6, 7}, ready={1, 2, 3, 4, 5, 8, 9, 10}, reads=[1])
    assert runs == [[0], list(range(1, 11)), [11]]


def test_a_strided_reader_asking_again_says_its_step(monkeypatch):
    # Asked again after a silence without it, its requests made the server drop what it computed ahead at the step.
    sent = sent_gets(monkeypatch)
    with lazyseq.serve(lazyseq.arange(100), LOOPBACK) as server, lazyseq.connect(server.address, ahead=4) as remote:
        strided = lazyseq.shard(remote, 0, 5, contiguous=False)
        assert [strided[k] for k in range(7)] == list(range(0, 35, 5))
        asked = sorted(remote._asked.values())
        del sent[:]
        remote._ask_again()
        assert asked and sorted((h["index"], h["step"]) for h in sent) == [(i, 5) for i in asked]
    for header in (
        {"req": 0, "index": 0, "step": 0},
        {"req": 0, "index": 0, "step": "5"},
        {"req": 0, "index": 0, "step": 5, "count": 2},
    ):
        with pytest.raises(
            wire.ProtocolError, match="^'get' needs a 'step' from 1 to 9223372036854775807, if any, and 1"
        ):
            ViewService.check(b"get", header)


def test_reads_of_one_thread_in_a_shuffled_order_ask_as_reads_in_order_do(monkeypatch):
    # Taken for steps (two reads in a row 2 ahead), they asked for items on that step only, and read the others one
    # by one: twice the requests.
    sent = sent_gets(monkeypatch)
    pairs_swapped = [0] + [j for i in range(1, 17, 2) for j in (i + 1, i)]  # 0, 2, 1, 4, 3, ...
    rng = np.random.default_rng(1)
    windows_shuffled = [int(j) for start in range(17, 81, 4) for j in rng.permutation(range(start, start + 4))]
    order = pairs_swapped + windows_shuffled
    with lazyseq.serve(np.arange(100), LOOPBACK) as server, lazyseq.connect(server.address, ahead=4) as remote:
        assert [remote[i] for i in order] == order
        assert len(sent) == 40 and remote._step == 1  # (81 reads; 44 requests when two reads 2 ahead made a step)


def test_a_ctrl_c_as_a_served_view_closes_leaves_no_spare_connection_open(monkeypatch):
    # Raised once the view's own connection was closed, it skipped its spares: their sockets and threads lived on.
    with lazyseq.serve(np.arange(10) * 10, LOOPBACK) as server:
        remote = lazyseq.connect(server.address)
        with remote._lock:  # another thread's read: this one takes a spare
            assert remote[3] == 30
        [spare] = remote._all_spares
        close = remote._connection.close

        def close_then_ctrl_c():
            close()
            raise KeyboardInterrupt

        monkeypatch.setattr(remote._connection, "close", close_then_ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            remote.close()
        assert spare._connection.closed and remote._all_spares == []
    assert lazyseq_threads() == []


def test_spare_connections_open_side_by_side(monkeypatch):
    # Each waited for the hello of the one opened before it: with the server gone, one timeout after another.
    from lazyseq.serving import remote_view

    opening, release = threading.Event(), threading.Event()
    open_connection = remote_view.open_connection

    def first_waits(settings):
        if not opening.is_set():
            opening.set()
            release.wait(30)
        return open_connection(settings)

    with lazyseq.serve(np.arange(10) * 10, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        monkeypatch.setattr(remote_view, "open_connection", first_waits)
        got = []
        with remote._lock:  # another thread's read: these take spares
            reader = threading.Thread(target=lambda: got.append(remote[3]))
            reader.start()
            try:
                assert opening.wait(30)
                assert remote[4] == 40 and got == []  # (while the first spare is still being opened)
            finally:
                release.set()
                reader.join()
        assert got == [30] and len(remote._all_spares) == 2


def test_an_items_error_read_through_a_spare_connection_names_the_served_view_once():
    def item(i):
        if i % 5 == 3:
            raise ValueError(f"bad item {i}")
        return i

    with lazyseq.serve(lazyseq.smap(item, range(20)), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        with remote._lock:  # another thread's read: these take a spare
            for read, chain in (  # (it said "served[8] -> served[8] -> ...")
                (lambda: remote[8], r"served\[8\] -> smap\([^)]*item\)\[8\]"),
                (lambda: remote.batch(4)[3], r"batch\[3\] -> served\[13\] -> smap\([^)]*item\)\[13\]"),
            ):
                with pytest.raises(
                    lazyseq.EvaluationError, match=f"^failed to compute {chain}: RemoteError: ValueError"
                ):
                    read()


def test_a_restart_whose_check_was_cut_short_is_checked_at_the_next_read():
    # A read stopped in the hello to a new server instance (a Ctrl-C; a loader closing) left it unchecked: a server
    # serving another view would have been read as the old one.
    from lazyseq.serving.remote_view import Served

    with lazyseq.serve(np.arange(20), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        remote._restarting, remote._served = True, Served("view", 30, False, None)  # (what it served before)
        with pytest.raises(
            lazyseq.LoaderError,
            match=r"came back serving a view of length 20 \(items int64\), where it served a view of length 30",
        ):
            remote[3]
        with pytest.raises(lazyseq.LoaderError, match="came back serving"):
            remote.batch(4)[0]


def test_a_spare_connection_to_a_server_that_serves_another_view_is_refused():
    from lazyseq.serving.remote_view import Served

    held = HeldItem()
    with lazyseq.serve(lazyseq.smap(held, range(20)), LOOPBACK, nworkers=2) as server:
        with lazyseq.connect(server.address) as remote:
            remote._served = Served("view", 30, False, None)  # what it served when this consumer connected
            reader = threading.Thread(target=remote.__getitem__, args=(0,))
            reader.start()
            try:
                assert held.computing.wait(30)
                with pytest.raises(lazyseq.LoaderError) as caught:
                    remote[5]
            finally:
                held.release.set()
                reader.join()
            assert str(caught.value) == (
                f"connect: the server at {server.address} came back serving a view of length 20, "
                "where it served a view of length 30: connect again to read what it serves now"
            )
            assert remote._all_spares == []


class WatchedLock:
    """A lock that says when a thread waits for it with a timeout (as a read waiting for another thread's does)."""

    def __init__(self):
        self._lock, self.waited = threading.Lock(), threading.Event()

    def locked(self):
        return self._lock.locked()

    def acquire(self, blocking=True, timeout=-1):
        if timeout != -1:
            self.waited.set()
        return self._lock.acquire(blocking, timeout)

    def release(self):
        self._lock.release()

    def __enter__(self):
        self._lock.acquire()

    def __exit__(self, *exc_info):
        self._lock.release()


def test_a_ctrl_c_as_a_read_gets_its_turn_leaves_the_consumer_usable(monkeypatch):
    # Raised as the lock was taken, it left the lock held: every later read waited for ever.
    monkeypatch.setattr("lazyseq.serving.remote_view.SPARE_CONNECTIONS", 0)  # (no connection of its own: it waits)
    with lazyseq.serve(np.arange(10) * 10, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        lock = remote._lock = WatchedLock()
        lock.acquire()  # another thread's read

        def ctrl_c_as_that_read_ends():
            lock.waited.wait(30)
            _thread.interrupt_main()
            lock.release()

        other = threading.Thread(target=ctrl_c_as_that_read_ends)
        other.start()
        with pytest.raises(KeyboardInterrupt):
            remote[5]
        other.join()
        assert not lock.locked() and remote[6] == 60


def test_a_ctrl_c_while_a_read_waits_for_another_threads_read_is_raised_at_once(monkeypatch):
    # It was held back until the other read ended: minutes, for an item that takes minutes to compute.
    monkeypatch.setattr("lazyseq.serving.remote_view.SPARE_CONNECTIONS", 0)
    with lazyseq.serve(np.arange(10) * 10, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        lock = remote._lock = WatchedLock()
        lock.acquire()  # another thread's read, which goes on
        done = threading.Event()

        def ctrl_c_meanwhile():
            lock.waited.wait(30)
            _thread.interrupt_main()
            done.wait(30)
            lock.release()

        other = threading.Thread(target=ctrl_c_meanwhile)
        other.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                remote[5]
            assert lock.locked()  # the other read still holds the connection
        finally:
            done.set()
            other.join()
        assert remote[6] == 60


def test_the_items_computed_ahead_for_a_consumer_that_left_are_not_computed_for_nobody():
    # They stayed queued for the server's workers: the next consumer waited for all of them (10 items of a slow
    # pipeline: 10 times its cost) before its own first item was even started.
    started, release, computed = threading.Event(), threading.Event(), []

    def slow_from_one(i):
        computed.append(i)
        if i == 1:
            started.set()
            release.wait(10)
        return i

    with lazyseq.serve(lazyseq.smap(slow_from_one, range(100)), LOOPBACK, nworkers=1, max_buffered=10) as server:
        service = server._loop._service
        with lazyseq.connect(server.address) as first:
            assert first[0] == 0
            assert started.wait(10)  # item 1 in the worker, items 2 to 10 behind it
            name = first._connection.name
        deadline = time.monotonic() + 10
        while name in service.consumers and time.monotonic() < deadline:  # (its goodbye is read by another thread)
            threading.Event().wait(0.01)
        assert name not in service.consumers
        release.set()
        with lazyseq.connect(server.address) as second:
            assert second[50] == 50
    assert [i for i in computed if i < 50] == [0, 1]


def test_served_batches_whose_last_is_short_say_how_large_the_others_are():
    # The welcome said nothing of their items: a consumer's unbatch lost its rows' description, and its loaders
    # sized their buffers from the first batch read.
    batches = lazyseq.view(np.zeros((10, 3), np.float32)).batch(4)
    with lazyseq.serve(batches, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        assert remote._item_spec() is None  # (not all alike)
        assert remote._item_spec_at_most() == batches._item_spec_at_most()
        rows = lazyseq.unbatch(remote, 4, 2)
        assert repr(rows).splitlines()[0].endswith("items float32 (3,)]") and len(list(rows)) == 10


def test_a_view_whose_server_restarted_says_hello_once_as_soon_as_the_new_one_answers_it(monkeypatch):
    # The new server answered its reads 'forgotten': it waited for a heartbeat to say hello again; and, hello said,
    # a wait that ended with the heartbeat still naming the old server took it for a restart and said hello once more.
    def slow_at(i):
        if i == 90:
            time.sleep(0.3)  # (the consumer's waits end every 50 ms meanwhile: each looks at the heartbeat)
        return i

    first = lazyseq.serve(lazyseq.arange(100), LOOPBACK)
    monkeypatch.setattr(wire, "heartbeat_interval", lambda timeout: 60.0)  # a heartbeat that stays behind
    with lazyseq.connect(first.address, timeout=240.0) as remote:
        connection = remote._connection
        assert [remote[i] for i in range(5)] == list(range(5))
        old = connection.server
        first.close()
        monkeypatch.setattr(wire, "heartbeat_interval", lambda timeout: 0.05)
        with lazyseq.serve(lazyseq.smap(slow_at, lazyseq.arange(100)), first.address):
            # (a jump first: what it asked the old server for ahead is lost with it, and waits for a heartbeat)
            assert [remote[i] for i in [80, *range(5, 60), 90]] == [80, *range(5, 60), 90]
            assert connection.heartbeat.server == old and connection.server != old
            assert connection._hellos == 2

"""The data server: served views and streams give the values read locally, whatever their dtypes and nesting.

Servers listen on 127.0.0.1 only; every server, consumer and process a test starts is stopped by it.
"""

import gc
import logging
import re
import socket
import threading

import numpy as np
import pytest
import served_pipelines
from loader_helpers import ENDED_ITSELF, die_on, same

import lazyseq

zmq = pytest.importorskip("zmq")

from serve_helpers import LOOPBACK, lazyseq_threads  # noqa: E402

from lazyseq.serving import wire  # noqa: E402
from lazyseq.serving.view_service import ViewService  # noqa: E402


def test_a_view_served_from_another_process_reads_as_locally(server_process):
    server = server_process("assorted")
    local = served_pipelines.assorted()
    with lazyseq.connect(server.address, timeout=10) as remote:
        assert len(remote) == 40
        assert repr(remote).startswith(f"served({server.address}) smap(assorted_item)")
        for i in [*range(40), -1, 7, 3]:  # in order, then jumps
            same(remote[i], local[i])
        same(list(remote[5:9]), list(local[5:9]))
        same(list(remote.take([30, 2, 30])), list(local.take([30, 2, 30])))


@pytest.mark.parametrize("nworkers, method", [(2, "thread"), (2, "process")])
def test_a_view_computed_by_the_server_workers(nworkers, method):
    local = served_pipelines.numbers().smap(lambda x: x * 3)
    with lazyseq.serve(local, LOOPBACK, nworkers=nworkers, method=method, max_buffered=4) as server:
        with lazyseq.connect(server.address, ahead=2) as remote:
            got = [remote[i] for i in range(100)]
            assert got == [local[i] for i in range(100)] and type(got[0]) is np.int64
            assert remote[50] == 150 and remote[0] == 0


def test_a_worker_process_that_dies_fails_the_request_of_its_item_and_new_workers_compute_the_rest():
    source = lazyseq.smap(die_on(5, "exit"), range(20))  # item 5 ends every worker process that computes it
    with lazyseq.serve(source, LOOPBACK, nworkers=2, method="process") as server:
        with lazyseq.connect(server.address) as remote:
            values, failed = [], {}
            for i in range(20):
                try:
                    values.append(remote[i])
                except lazyseq.LoaderError as error:
                    failed[i] = str(error)
            assert remote[6] == 6  # the server goes on serving
    assert list(failed) == [5] and values == [i for i in range(20) if i != 5]
    # the item as the consumer numbers it, not the server's task key
    assert re.search(
        r"could not compute item 5: .* died with exit code 3 while computing item 5" + re.escape(ENDED_ITSELF) + "$",
        failed[5],
    )


class ByPosition:
    """A sequence that is no collections.abc.Sequence: __len__ and __getitem__ only."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        if not 0 <= i < 3:
            raise IndexError(i)
        return np.full(2, i)


@pytest.mark.parametrize(
    "source", [np.arange(5.0).reshape(5, 1), ByPosition(), "abc"], ids=["array", "sequence", "str"]
)
def test_an_array_or_any_sequence_is_served_by_index(source):
    with lazyseq.serve(source, LOOPBACK, nworkers=2) as server:
        with lazyseq.connect(server.address) as remote:
            assert isinstance(remote, lazyseq.View) and len(remote) == len(source)
            np.testing.assert_array_equal(np.stack(list(remote)), np.stack([source[i] for i in range(len(source))]))


@pytest.mark.parametrize("keys", [None, ("s", "f")], ids=["tuple", "dict"])
def test_a_batch_of_served_items_has_the_dtypes_a_local_batch_has(keys):
    # Items travel one by one: a batch stacked them as <U2 and float64 where locally it is <U5 and >f8.
    fields = [np.array(["a", "bb", "c", "dd"], "<U5"), np.arange(4, dtype=">f8")]
    source = lazyseq.collate(fields if keys is None else dict(zip(keys, fields)))
    with lazyseq.serve(source, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        assert remote._item_spec() == source._item_spec()
        for got, expected in zip(remote.batch(2), source.batch(2)):
            got, expected = (list(b.values()) if keys else list(b) for b in (got, expected))
            assert [f.dtype.str for f in got] == ["<U5", ">f8"]
            assert [f.tolist() for f in got] == [f.tolist() for f in expected]


@pytest.mark.parametrize(
    "node",
    [
        ["array", "|O", []],
        ["array", "<f8", [-1]],
        ["array", "<f8"],
        ["tuple", "x"],
        ["list", []],
        3,
        ["tuple", [7]],
        ["dict", [None], [1]],
        ["dict", [None, None], ["a", "a"]],
        ["dict", [None], []],
        ["dict", [None], [[1]]],  # a key that cannot be hashed
        ["array", "<f8", [2**40, 2**40]],  # more elements than numpy counts
    ],
)
def test_a_description_of_items_that_is_not_one_is_a_protocol_error(node):
    with pytest.raises(wire.ProtocolError):
        wire.decode_spec(node)


@pytest.mark.parametrize("length", [-1, 2**63, 1.0, "3"])
def test_a_length_no_view_can_have_is_a_protocol_error(length):
    from lazyseq.serving.remote_view import RemoteView

    with pytest.raises(wire.ProtocolError) as caught:  # 2**63: len() would raise OverflowError
        RemoteView(None, {"kind": "view", "length": length}, 1, {})
    assert str(caught.value) == f"the server sent an invalid length {length!r}"


def test_a_mapping_is_refused_as_a_source():
    with pytest.raises(TypeError) as caught:
        lazyseq.serve({"a": [1, 2]}, LOOPBACK)
    assert str(caught.value) == (
        "serve: source is a dict, a mapping, which has no order to serve by index and whose iteration gives only its "
        "keys; serve a view of its values (lazyseq.collate for several arrays)"
    )
    assert lazyseq_threads() == []


def test_a_pipeline_that_workers_cannot_get_is_refused_by_serve():
    # Accepted, then every read waited for ever while the server logged the same traceback at each request sent again
    lock = threading.Lock()

    def locked(x):
        with lock:
            return x

    with pytest.raises(TypeError) as caught:
        lazyseq.serve(lazyseq.smap(locked, range(4)), LOOPBACK, nworkers=2, method="process", start_method="spawn")
    assert type(caught.value).__name__ == "UnpicklablePipeline"
    assert str(caught.value) == (
        "serve: cannot send the smap(test_a_pipeline_that_workers_cannot_get_is_refused_by_serve.<locals>.locked) "
        "view to worker processes: TypeError: cannot pickle '_thread.lock' object; use method='thread', or make it "
        "picklable"
    )
    assert lazyseq_threads() == []


def test_workers_that_cannot_start_fail_the_read_rather_than_leave_it_waiting(monkeypatch):
    from lazyseq.loading.engine import Engine
    from lazyseq.loading.options import UnpicklablePipeline

    def cannot_start(engine, tasks):
        raise UnpicklablePipeline("serve: cannot send it")

    monkeypatch.setattr(Engine, "submit", cannot_start)
    with lazyseq.serve(np.arange(4), LOOPBACK) as server, lazyseq.connect(server.address, timeout=5) as remote:
        with pytest.raises(lazyseq.LoaderError) as caught:
            remote[0]
        assert str(caught.value) == (
            f"the server at {server.address} could not compute item 0: the server's workers failed: "
            "UnpicklablePipeline: serve: cannot send it"
        )


def test_a_request_the_server_fails_on_is_refused_rather_than_left_waiting(monkeypatch, caplog):
    # A server's error on a request was logged alone: the consumer, its heartbeats answered, waited for ever.

    def fails(service, consumer, kind, header):
        raise RuntimeError("a bug")

    monkeypatch.setattr(ViewService, "handle", fails)
    with lazyseq.serve(np.arange(4), LOOPBACK) as server, lazyseq.connect(server.address, timeout=5) as remote:
        with caplog.at_level(logging.CRITICAL, logger="lazyseq.serve"), pytest.raises(lazyseq.LoaderError) as caught:
            remote[0]
        assert str(caught.value) == (
            f"connect: the server at {server.address} refused a request while this client was waiting for item 0: "
            "the server failed on it (RuntimeError: a bug; see its log)"
        )


def test_an_iterator_that_gives_nothing_to_serve_is_refused():
    # A generator served twice split its items between the servers (or failed with "generator already executing");
    # one that had ended was served as an empty stream.
    def count():
        yield from range(50)  # more than the server draws ahead: not ended while it is served

    items = count()
    with lazyseq.serve(items, LOOPBACK) as server:
        with pytest.raises(ValueError) as caught:
            lazyseq.serve(items, LOOPBACK)
        assert str(caught.value) == (
            f"serve: this iterator is served already, at {server.address}: two servers would split its items; "
            "connect every consumer to that one"
        )
        with lazyseq.connect(server.address) as stream:
            assert list(stream) == list(range(50))
    with pytest.raises(ValueError) as caught:
        lazyseq.serve(items, LOOPBACK)
    assert str(caught.value) == (
        "serve: the generator has ended (or was closed): it has nothing left to serve; make a new one"
    )
    drawn = threading.Event()

    def short():
        yield from range(3)
        drawn.set()  # the server drew every item, and serves them still

    items = short()
    with lazyseq.serve(items, LOOPBACK) as server:
        assert drawn.wait(30)
        with pytest.raises(ValueError, match="^serve: this iterator is served already"):  # (not "has ended")
            lazyseq.serve(items, LOOPBACK)
        with lazyseq.connect(server.address) as stream:
            assert list(stream) == [0, 1, 2]
    with pytest.raises(TypeError) as caught:
        lazyseq.serve(count, LOOPBACK)
    assert str(caught.value) == (
        "serve: source must be a view, a sequence or an iterable, got function; call it: serve(f())"
    )
    labels = {"cat", "dog"}  # an iterable that gives each server an iterator of its own: served twice as well
    with lazyseq.serve(labels, LOOPBACK) as one, lazyseq.serve(labels, LOOPBACK) as two:
        for server in (one, two):
            with lazyseq.connect(server.address) as stream:
                assert sorted(stream) == ["cat", "dog"]


def test_a_served_generator_is_let_go_when_its_server_closes():
    # The server kept it: a file it had opened stayed open as long as a notebook held the server
    ended = []

    def lines():
        try:
            yield from range(100)
        finally:
            ended.append(True)

    server = lazyseq.serve(lines(), LOOPBACK)
    with lazyseq.connect(server.address) as stream:
        assert next(stream) == 0
    server.close()
    gc.collect()
    assert ended == [True]


def test_a_stream_read_as_a_view_and_a_server_given_as_an_address_say_what_to_do():
    with lazyseq.serve(iter(range(3)), LOOPBACK) as server:
        with pytest.raises(ValueError) as caught:
            lazyseq.connect(server)
        assert str(caught.value) == (
            f"connect: address must look like 'tcp://127.0.0.1:5557', got {server!r}; pass its .address, "
            f"{server.address!r}"
        )
        with pytest.raises(ValueError) as caught:
            lazyseq.connect("tcp://127.0.0.1:0")
        assert str(caught.value) == (
            "connect: the port of 'tcp://127.0.0.1:0' must be a number from 1 to 65535, got '0' (port 0 lets a "
            "server pick one: connect to the address it gives)"
        )
        with lazyseq.connect(server.address) as stream:
            stream_is = f"the server at {server.address} serves a stream (an iterable), not a view"
            with pytest.raises(TypeError) as caught:
                stream[0]
            assert str(caught.value) == f"{stream_is}: its items are read in turn (next(), a for loop), not by index"
            with pytest.raises(AttributeError) as caught:
                stream.batch(2)
            assert str(caught.value) == (
                f"'RemoteStream' object has no attribute 'batch': {stream_is}; lazyseq.uniter(stream) views its "
                "items in the order they come"
            )
            assert list(stream) == [0, 1, 2]


def ipv6_loopback_available() -> bool:

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback_available(), reason="this machine has no IPv6 loopback")
@pytest.mark.parametrize("source", [np.arange(6.0).reshape(3, 2), range(3)], ids=["view", "stream"])
def test_a_server_at_an_ipv6_address(source):
    # ZeroMQ refused tcp://[::1] ("No such device") without its IPv6 option on both sides.
    with lazyseq.serve(source if isinstance(source, np.ndarray) else iter(source), "tcp://[::1]:0") as server:
        assert server.address.startswith("tcp://[::1]:")
        with lazyseq.connect(server.address) as remote:
            assert [np.asarray(x).tolist() for x in remote] == [np.asarray(x).tolist() for x in source]
    assert lazyseq_threads() == []


def test_localhost_stays_an_ipv4_address():
    with lazyseq.serve(np.arange(3.0), "tcp://localhost:0") as server:
        assert server.address.startswith("tcp://127.0.0.1:")


class TwentyFive:
    """An iterable of unknown length that can start over."""

    def __iter__(self):
        return (np.full(2, k) for k in range(25))


def test_a_served_view_of_unknown_length_ends_where_its_items_end():
    # Its end travelled as an item's failure (RemoteError: EndOfData): every loop over it raised.
    items = lazyseq.uniter(TwentyFive())
    with lazyseq.serve(items, LOOPBACK) as server:
        with lazyseq.connect(server.address) as remote:
            assert [x.tolist() for x in remote] == [[k, k] for k in range(25)]
            assert [len(b) for b in remote.batch(4)] == [4, 4, 4, 4, 4, 4, 1]
            with pytest.raises(IndexError, match=r"^uniter index 25 out of range: the iterable ended after 25 items$"):
                remote[25]


def test_closing_a_consumer_from_another_thread_wakes_its_reader_with_a_clear_error():
    started, release = threading.Event(), threading.Event()

    def held(i):
        started.set()
        release.wait(10)
        return i

    outcome = []

    def read(remote):
        try:
            remote[0]
        except Exception as error:
            outcome.append(error)

    with lazyseq.serve(lazyseq.smap(held, range(3)), LOOPBACK, nworkers=1) as server:
        remote = lazyseq.connect(server.address)
        reader = threading.Thread(target=read, args=(remote,))
        reader.start()
        assert started.wait(10)
        remote.close()
        reader.join(10)
        release.set()
    [error] = outcome
    assert isinstance(error, lazyseq.LoaderError) and type(error).__name__ == "ConnectionClosed"
    assert str(error) == f"connect: the connection to {server.address} was closed while waiting for item 0"
    assert lazyseq_threads() == []


def test_reading_a_closed_consumer_says_it_is_closed():
    # It said the connection was closed "while sending 'get'" (or 'next'): a word of the protocol.
    with lazyseq.serve(np.arange(10.0), LOOPBACK) as server, lazyseq.serve(iter(range(5)), LOOPBACK) as streamed:
        remote, stream = lazyseq.connect(server.address), lazyseq.connect(streamed.address)
        remote.close(), stream.close()
        for read, address in ((lambda: remote[2], server.address), (lambda: next(stream), streamed.address)):
            with pytest.raises(lazyseq.LoaderError) as caught:
                read()
            assert str(caught.value) == (
                f"connect: this consumer of the server at {address} is closed: connect again to read from it"
            )
        assert len(remote) == 10  # (known without the server)
    with lazyseq.serve(np.arange(100), LOOPBACK) as server, lazyseq.connect(server.address, ahead=8) as remote:
        assert remote[0] == 0
        while 1 not in remote._arrived:  # (asked for ahead)
            remote._receive_one("item 1")
        remote.close()
        for read in (lambda: remote[1], lambda: remote.batch(4)[3]):  # (item 1, read ahead, came back)
            with pytest.raises(lazyseq.LoaderError, match="^connect: this consumer of the server at .* is closed"):
                read()
        assert len(remote._asking) <= 8  # (each read after close asked again, for ever)


def test_a_stream_served_from_another_process(server_process):
    server = server_process("counting")
    with lazyseq.connect(server.address) as stream:
        items = list(stream)
        assert [int(x[0]) for x in items] == list(range(60))
        assert next(stream, "ended") == "ended"


def test_two_consumers_over_shard_cover_every_item_once(server_process):
    server = server_process("numbers")
    with lazyseq.connect(server.address) as first, lazyseq.connect(server.address) as second:
        parts = [list(lazyseq.shard(remote, rank, 2)) for rank, remote in enumerate([first, second])]
    assert sorted(int(x) for part in parts for x in part) == list(range(100))
    assert len(parts[0]) == len(parts[1]) == 50


def test_two_consumers_of_a_stream_get_every_item_once(server_process):
    server = server_process("counting")
    got = {}

    def consume(name, ahead):  # a stream ends for one consumer once no other holds items that could come back
        with lazyseq.connect(server.address, ahead=ahead) as stream:
            got[name] = [int(x[0]) for x in stream]

    consumers = [threading.Thread(target=consume, args=(name, ahead)) for name, ahead in [("a", 3), ("b", 5)]]
    for consumer in consumers:
        consumer.start()
    for consumer in consumers:
        consumer.join()
    assert sorted(got["a"] + got["b"]) == list(range(60))

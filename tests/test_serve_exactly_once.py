"""The data server: every item exactly once, through killed consumers, restarted servers and lost connections.

Servers listen on 127.0.0.1 only; every server, consumer and process a test starts is stopped by it.
"""

import contextlib
import functools
import gc
import logging
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque

import numpy as np
import pytest

import lazyseq

zmq = pytest.importorskip("zmq")

from serve_helpers import LOOPBACK, consumer_process, losing_the_first, run_consumer, slept  # noqa: E402

from lazyseq.serving import wire  # noqa: E402
from lazyseq.serving.connection import Connection  # noqa: E402

CONSUMER = """
import sys, lazyseq
stream = lazyseq.connect(sys.argv[1], timeout=1.0, ahead=4)
for _ in range(int(sys.argv[2])):
    print(int(next(stream)[0]), flush=True)
stream.sync()
print("synced", flush=True)
sys.stdin.read()  # until killed
"""


def test_a_killed_consumer_restarted_gets_the_rest_exactly_once(server_process):
    server = server_process("counting")
    with consumer_process(CONSUMER, server.address, "25") as consumer:  # SIGKILLed on the way out: the 4 items it
        before = []  # received and did not hand out go back to the server
        for line in consumer.stdout:
            if line.strip() == "synced":
                break
            before.append(int(line))
    assert before == list(range(25))
    with lazyseq.connect(server.address, timeout=5) as restarted:
        after = [int(x[0]) for x in restarted]
    assert sorted(before + after) == list(range(60))


STOPPED_CONSUMER = """
import sys, lazyseq
stream = lazyseq.connect(sys.argv[1], timeout=0.5, ahead=4)
print(next(stream), flush=True)
stream.sync()  # items 1 to 4 were sent to it before the answer
print("synced", flush=True)
sys.stdin.readline()  # stopped (SIGSTOP) here, then let go on
print(*stream, "end", flush=True)
"""


def test_a_consumer_stopped_longer_than_its_timeout_leaves_its_items_to_others_and_goes_on():
    # Taken for dead, it handed out the items it had received (others got them too), or waited forever for more.
    with (
        lazyseq.serve(iter(range(40)), LOOPBACK) as server,
        consumer_process(STOPPED_CONSUMER, server.address) as stopped,
    ):
        assert stopped.stdout.readline() == "0\n" and stopped.stdout.readline() == "synced\n"
        stopped.send_signal(signal.SIGSTOP)
        with lazyseq.connect(server.address, timeout=5) as other:
            got = list(other)  # items 1 to 4 too, once the server has taken the stopped one for dead
        stopped.send_signal(signal.SIGCONT)
        out, _ = stopped.communicate("\n", timeout=30)
    assert sorted(got) == list(range(1, 40)) and out == "end\n"


def test_a_consumer_stopped_while_its_server_restarts_drops_what_the_old_one_gave_to_others():
    # It handed out items 1 to 4 when it went on, which the old server had given to another consumer already.
    server = lazyseq.serve(iter(range(40)), LOOPBACK)
    address = server.address
    with consumer_process(STOPPED_CONSUMER, address) as stopped:
        with server:
            assert stopped.stdout.readline() == "0\n" and stopped.stdout.readline() == "synced\n"
            stopped.send_signal(signal.SIGSTOP)
            with lazyseq.connect(address, timeout=5, ahead=1) as other:
                got = []
                while not {1, 2, 3, 4} <= set(got):  # once the server has taken the stopped one for dead
                    got.append(next(other))
        with lazyseq.serve(iter(range(100, 110)), address):  # a new server at the same address
            stopped.send_signal(signal.SIGCONT)
            out, _ = stopped.communicate("\n", timeout=30)
    assert out == " ".join(map(str, range(100, 110))) + " end\n"


def test_a_consumer_of_a_restarted_server_keeps_ahead_items_in_flight_with_those_of_the_old_one():
    # Each item of the old server handed out asked the new one for one more, on top of the ahead it asked at first.
    with lazyseq.serve(iter(range(40)), LOOPBACK) as old:
        address = old.address
        stream = lazyseq.connect(address, timeout=5, ahead=4)
        assert next(stream) == 0
        stream.sync()  # items 1 to 4 were sent to it before the answer
    held = []
    with stream, lazyseq.serve(iter(range(100, 140)), address) as new:
        consumers = new._loop._service._consumers
        got = []
        for _ in range(12):
            got.append(next(stream))
            stream.sync()  # the requests that went before were answered
            held.append(max(len(state.unacked) for state in consumers.values()))
    assert got == [1, 2, 3, 4, *range(100, 108)]
    assert held == [1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4]


WAITING_CONSUMER = """
import sys, lazyseq
remote = lazyseq.connect(sys.argv[1], timeout=1.0)
try:
    print(remote[0], flush=True)
except Exception as error:
    print(type(error).__name__, flush=True)
remote.close()
"""


def test_a_consumer_stopped_while_it_waits_for_an_item_gets_it_once_it_goes_on():
    # Continued after longer than its timeout, it raised ServerLost at once: the silence was its own.
    asked, answer = threading.Event(), threading.Event()

    def item(i):
        asked.set()
        answer.wait(30)
        return i

    with lazyseq.serve(lazyseq.smap(item, range(3)), LOOPBACK, nworkers=1) as server:
        service = server._loop._service
        waiting = subprocess.Popen([sys.executable, "-c", WAITING_CONSUMER, server.address], stdout=subprocess.PIPE)
        try:
            assert asked.wait(30)  # its request arrived: it waits for the answer
            waiting.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 30
            while service.consumers and time.monotonic() < deadline:  # taken for dead: silent past its timeout
                time.sleep(0.01)
            waiting.send_signal(signal.SIGCONT)
            answer.set()
            out, _ = waiting.communicate(timeout=30)
        finally:
            waiting.kill()
            waiting.wait()
    assert out == b"0\n"


def test_a_server_held_up_longer_than_a_consumers_timeout_does_not_take_it_for_dead():
    # The consumer's heartbeats waited unread in the socket: it was forgotten, and waited forever for its items.
    with lazyseq.serve(iter(range(8)), LOOPBACK) as server:
        service = server._loop._service
        work, held_up = service.work, threading.Event()

        def held_up_once():
            if service._consumers and not held_up.is_set():
                held_up.set()
                time.sleep(1.5)  # the server's thread busy (a large item, say) for three timeouts
            work()

        service.work = held_up_once
        got = []

        def read():
            stream = lazyseq.connect(server.address, timeout=0.5, ahead=2)
            while True:
                try:
                    got.append(next(stream))
                except StopIteration:
                    break
                except lazyseq.ServerLost:  # no answer while held up: reading again goes on
                    got.append("lost")
            stream.close()

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(30)
        assert not reader.is_alive(), f"the consumer waits forever, after {got}"
    assert held_up.is_set() and [x for x in got if x != "lost"] == list(range(8))


def test_a_server_that_dies_raises_server_lost(server_process):
    server = server_process("numbers")
    remote = lazyseq.connect(server.address, timeout=1.0)
    try:
        assert remote[0] == 0
        server.kill()
        with pytest.raises(lazyseq.ServerLost) as caught:
            remote[60]
        assert str(caught.value).startswith(f"lost the server at {server.address}: no answer for ")
        assert str(caught.value).endswith("(timeout=1) while waiting for item 60")
    finally:
        remote.close()


def test_a_consumer_that_lost_its_server_reads_again_once_one_is_back(server_process):
    # A read after ServerLost raised it again at once, the last answer being older than the timeout.
    first = server_process("numbers")
    with lazyseq.connect(first.address, timeout=1.0) as remote:
        assert remote[0] == 0
        first.kill()
        with pytest.raises(lazyseq.ServerLost):
            remote[50]
        with lazyseq.serve(range(100), first.address):  # back at once, before any heartbeat reached it
            assert [remote[i] for i in (51, 52, 3)] == [51, 52, 3]


def test_a_consumer_goes_on_when_the_server_comes_back(server_process):
    first = server_process("numbers")
    with lazyseq.connect(first.address, timeout=20.0) as remote:
        assert [remote[i] for i in range(5)] == list(range(5))
        first.kill()
        again = server_process("numbers", first.address)  # the same address, a new server
        assert again.address == first.address
        assert [remote[i] for i in range(5, 100)] == list(range(5, 100))


def test_a_stream_consumer_goes_on_when_a_new_server_comes_back_at_the_address():
    # The new server numbers its items from 0 again: the consumer dropped them as seen, and acknowledged (lost) some.
    first = lazyseq.serve(iter(range(100)), LOOPBACK)
    stream = lazyseq.connect(first.address, timeout=10.0, ahead=4)
    try:
        assert [next(stream) for _ in range(10)] == list(range(10))
        first.close()
        with lazyseq.serve(iter(range(1000, 1100)), first.address):
            rest = list(stream)
    finally:
        stream.close()
    received_before = len(rest) - 100  # from the first server, received before it went
    assert 0 <= received_before <= 4
    assert rest == list(range(10, 10 + received_before)) + list(range(1000, 1100))


def test_a_server_at_a_relative_ipc_path_gives_its_absolute_address(tmp_path, monkeypatch):
    # It gave the path as written: a client in another directory could not find it.
    monkeypatch.chdir(tmp_path)
    with lazyseq.serve(lazyseq.arange(3), "ipc://here.sock") as server:
        assert server.address == f"ipc://{tmp_path / 'here.sock'}"
        monkeypatch.chdir("/")
        with lazyseq.connect(server.address, timeout=10) as remote:
            assert list(remote) == [0, 1, 2]
    assert not (tmp_path / "here.sock").exists()
    from lazyseq.serving.endpoints import absolute

    deep = "ipc://" + "d" * 100 + "/x.sock"  # (absolute, longer than a socket's path may be: what it was, as it binds)
    assert absolute(deep) == deep and absolute("ipc://@abstract") == "ipc://@abstract"


def _end_this_worker(index):
    os._exit(3)


def test_a_read_of_a_served_view_whose_worker_processes_die_as_they_start_fails_rather_than_waits():
    # Such a death named no item that might have caused it: every read was asked of new workers, which died the same
    # way, for ever (thousands of starts a minute), and the consumer waited past its timeout.
    with (
        lazyseq.serve(
            lazyseq.arange(10), LOOPBACK, nworkers=2, method="process", start_hook=_end_this_worker
        ) as server,
        lazyseq.connect(server.address, timeout=60) as remote,
    ):
        for _ in range(2):  # and again: new workers, the same end
            with pytest.raises(lazyseq.LoaderError) as info:
                remote[3]
            assert "the server's workers failed: WorkerDied: serve: worker process" in str(info.value)
            assert "died with exit code 3 while starting, before it could compute anything" in str(info.value)


def _end_the_first_worker(marker):
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)


def test_a_worker_process_that_dies_once_as_it_starts_is_followed_by_others(tmp_path):
    # One death as a worker started (the OOM killer, say) failed every request waiting then; new workers are asked
    # once first (twice in a row: the requests hear why, see the test above).
    hook = functools.partial(_end_the_first_worker, str(tmp_path / "started once"))  # (called with no index)
    with (
        lazyseq.serve(lazyseq.arange(10), LOOPBACK, nworkers=1, method="process", start_hook=hook) as server,
        lazyseq.connect(server.address, timeout=60) as remote,
    ):
        assert [remote[3], remote[7]] == [3, 7]


def _refuse_to_start(index):
    raise RuntimeError(f"no dataset handle in worker {index}")


def test_a_consumer_hears_why_the_servers_workers_could_not_start(caplog):
    # It heard "start_hook failed in worker process 0", and the server's log said nothing of the hook's error.
    caplog.set_level(logging.WARNING, logger="lazyseq.serve")
    with (
        lazyseq.serve(
            lazyseq.arange(10), LOOPBACK, nworkers=1, method="process", start_hook=_refuse_to_start
        ) as server,
        lazyseq.connect(server.address, timeout=60) as remote,
    ):
        with pytest.raises(lazyseq.LoaderError) as info:
            remote[3]
    assert str(info.value).endswith(
        "could not compute item 3: the server's workers failed: LoaderError: serve: start_hook failed in worker process "
        "0: RuntimeError: no dataset handle in worker 0"
    )
    [record] = [r for r in caplog.records if "workers failed" in r.getMessage()]
    assert "RuntimeError: no dataset handle in worker 0" in caplog.text and record.exc_info is not None


def test_a_stream_acknowledges_to_the_new_server_what_the_old_one_sent_late_does_not_change():
    # Read after the new server's first item (ZeroMQ reads the connections in turn), the old one's item made the
    # stream acknowledge to the old server again: the new one's items handed out meanwhile went unacknowledged, and to
    # another consumer once this one left.
    with lazyseq.serve(iter(range(10)), LOOPBACK) as server, lazyseq.connect(server.address, ahead=2) as stream:
        assert next(stream) == 0
        old = stream._server

        def item(seq, value, instance):
            tree, buffers = wire.encode(value)
            return b"item", {"seq": seq, "server": instance, "tree": tree}, buffers

        stream._take_in(*item(0, "new 0", "0123456789abcdef"))
        stream._take_in(*item(5, "old 5", old))  # sent before the old server went
        assert stream._server == "0123456789abcdef"
        assert [(instance == old, value) for instance, _, _, value in stream._received][-2:] == [
            (False, "new 0"),
            (True, "old 5"),
        ]


@pytest.mark.parametrize("first_kind", ["view", "stream"])
def test_a_server_of_the_other_kind_back_at_the_address_is_an_error_not_a_hang(first_kind):
    def source(kind):
        return lazyseq.arange(100) if kind == "view" else iter(range(100))

    other = "stream" if first_kind == "view" else "view"
    first = lazyseq.serve(source(first_kind), LOOPBACK)
    consumer = lazyseq.connect(first.address, timeout=10.0, ahead=2)
    try:
        assert (consumer[0] if first_kind == "view" else next(consumer)) == 0
        first.close()
        with lazyseq.serve(source(other), first.address):
            with pytest.raises(lazyseq.LoaderError) as info:
                for i in range(1, 100):
                    consumer[i] if first_kind == "view" else next(consumer)
        asked = "'get'" if first_kind == "view" else "'next'"
        answers = "'next'" if other == "stream" else "'get'"
        assert str(info.value).startswith(f"connect: the server at {first.address} refused a request while this ")
        assert str(info.value).endswith(f"a served {other} answers {answers}, not b{asked}")
    finally:
        consumer.close()


@pytest.mark.parametrize(
    "first, then, described",
    [
        (lazyseq.arange(10), [lazyseq.arange(50)], ("a view of length 50", "a view of length 10")),
        (  # its batches of int64 items were cast to float64, 2**53 + 1 changed
            np.arange(10.0),
            [np.arange(10) + 2**53 + 1],
            ("a view of length 10 (items int64)", "a view of length 10 (items float64)"),
        ),
        (  # items unknown at first, then known, then others: the items known were not compared on
            lazyseq.smap(int, range(10)),
            [np.arange(10, dtype=np.int16), np.array(list("0123456789"), "<U8")],
            ("a view of length 10 (items <U8)", "a view of length 10 (items int16)"),
        ),
    ],
    ids=["length", "dtype", "dtype known later"],
)
def test_a_server_back_at_the_address_serving_another_view_is_an_error_not_other_data(first, then, described):
    # The consumer went on with what it was told first, reading the new view's first items as the old's.
    server = lazyseq.serve(first, LOOPBACK)
    remote = lazyseq.connect(server.address, timeout=10.0, ahead=2)
    try:
        assert remote[0] == 0  # items 1 and 2 are asked for ahead
        server.close()
        for accepted in then[:-1]:
            with lazyseq.serve(accepted, server.address):
                assert remote[5] == 5
        with lazyseq.serve(then[-1], server.address):
            with pytest.raises(lazyseq.LoaderError) as caught:
                remote.batch(2)[4]
            with pytest.raises(lazyseq.LoaderError) as again:
                remote[1]
        assert str(caught.value) == (
            f"connect: the server at {server.address} came back serving {described[0]}, where it served "
            f"{described[1]}: connect again to read what it serves now"
        )
        assert type(again.value) is lazyseq.LoaderError and str(again.value) == str(caught.value)
        assert again.value is not caught.value  # one error raised again would hold the frames of every read
    finally:
        remote.close()


def test_a_loader_left_over_a_view_whose_server_came_back_serving_another_goes_with_its_threads():
    # The error raised at every read was one object, which held the frames of the first read that raised it: a
    # loader's worker thread, the loader, the view; the threads, still running, kept all of them from the collector.
    server = lazyseq.serve(lazyseq.smap(slept, range(30)), LOOPBACK)  # (slow enough for the loader's threads)
    remote = lazyseq.connect(server.address, timeout=10.0)
    before = set(threading.enumerate())
    try:
        loader = lazyseq.prefetch(remote, nworkers=2)
        reads = iter(loader)
        assert next(reads) == 0
        server.close()
        with lazyseq.serve(np.arange(20), server.address):
            with pytest.raises(lazyseq.LoaderError, match="came back serving a view of length 20"):
                for _ in reads:
                    pass
        del reads
        threads = [t for t in threading.enumerate() if t not in before and t.name.startswith("lazyseq-prefetch-")]
        assert threads
        del loader
        gc.collect()
        for thread in threads:
            thread.join(30)
        assert [thread.name for thread in threads if thread.is_alive()] == []
    finally:
        remote.close()


def read_two(stream, answers):
    try:
        answers.put(("ok", [next(stream), next(stream)]))
    except Exception as error:
        answers.put((type(error).__name__, str(error)))


def test_a_stream_is_not_read_in_a_forked_child_nor_pickled():
    with lazyseq.serve(iter(range(100)), LOOPBACK) as server, lazyseq.connect(server.address, timeout=5.0) as stream:
        assert next(stream) == 0
        context = multiprocessing.get_context("fork")
        answers = context.Queue()
        child = context.Process(target=read_two, args=(stream, answers))
        child.start()
        outcome = answers.get(timeout=30)
        child.join(30)
        assert outcome == (
            "LoaderError",
            f"connect: a stream served at {server.address} cannot be read in a process forked from the one that "
            "connected to it (both would hand out the items it had received); connect to it in this process",
        )
        assert [next(stream) for _ in range(3)] == [1, 2, 3]  # the parent goes on, nothing handed out twice
        with pytest.raises(TypeError, match=r"^a stream served at .* cannot be pickled: each of its items goes to"):
            pickle.dumps(stream)


def test_a_stream_consumer_that_left_frees_its_items_for_another():
    with lazyseq.serve(iter(range(10)), LOOPBACK) as server:
        first = lazyseq.connect(server.address, ahead=4)
        assert next(first) == 0  # and 1, 2, 3 received, not handed out
        first.close()  # says goodbye: they go back at once
        with lazyseq.connect(server.address) as second:
            assert sorted(second) == list(range(1, 10))


def test_a_consumer_collected_without_close_says_goodbye_too():
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.RCVTIMEO, 10_000)  # a missing goodbye fails the test rather than hanging it
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        connection = Connection(f"tcp://127.0.0.1:{port}", timeout=30.0)
        name = connection.name
        del connection
        gc.collect()
        while (frames := router.recv_multipart())[2:3] != [b"bye"]:  # its heartbeat's pings come first
            pass
        assert frames == [name, wire.TAG, b"bye", b"{}"]
    finally:
        router.close(linger=0)
        context.term()


_connections_kept = []  # in a worker process: connections it made, left open as it ends


def _connect_and_keep(address, item=None):
    if not _connections_kept:
        _connections_kept.append(Connection(address, timeout=30.0))
    return item


def _byes_from(router, count):
    """The names of the first ``count`` consumers that say goodbye to ``router``."""
    names = []
    while len(names) < count:
        frames = router.recv_multipart()  # (a missing goodbye: zmq.Again after RCVTIMEO, not a hang)
        if frames[2:] == [b"bye", b"{}"]:
            names.append(frames[0])
    return names


@pytest.mark.parametrize("started_by", ["multiprocessing", "prefetch"])
def test_a_worker_process_that_connected_says_goodbye_as_it_ends(started_by):
    # Such a process ends with os._exit: the server kept each of its consumers until their timeout (a loader over a
    # served view made anew each epoch left two more each time, with their pools, until none was left for others).
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.RCVTIMEO, 10_000)
    address = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
    try:
        if started_by == "multiprocessing":
            child = multiprocessing.get_context("fork").Process(target=_connect_and_keep, args=(address,))
            child.start()
            child.join()
            assert child.exitcode == 0
            assert len(_byes_from(router, 1)) == 1
        else:
            connecting = lazyseq.smap(functools.partial(_connect_and_keep, address), range(4))
            with lazyseq.prefetch(connecting, nworkers=1, method="process") as loader:
                assert list(loader) == [0, 1, 2, 3]
            assert len(_byes_from(router, 1)) == 1
    finally:
        router.close(linger=0)
        context.term()


@pytest.mark.parametrize("then", ["close", "read to the end"])
def test_an_acknowledgement_lost_with_a_broken_connection_is_sent_again(monkeypatch, then):
    # A request lost as the connection broke (ZeroMQ reconnects at once) took its acknowledgement with it: the item
    # went out again to the next consumer, or to the same one at the end of the stream once it had handed out more
    # items since than it remembers (256; 4 here).
    monkeypatch.setattr("lazyseq.serving.remote_stream.RECENT", 4)
    with lazyseq.serve(iter(range(30)), LOOPBACK) as server:
        first = lazyseq.connect(server.address, ahead=2)
        send, lost = first._connection.send, []

        def losing_one(kind, header, flags=0):
            if kind == b"next" and header["ack"] and not lost:  # the first request that acknowledges an item
                lost.append(list(header["ack"]))
                return
            send(kind, header, flags)

        first._connection.send = losing_one
        try:
            got = [next(first) for _ in range(10)]
            if then == "read to the end":
                got += list(first)
        finally:
            first.close()
        with lazyseq.connect(server.address) as second:
            rest = list(second)
    assert lost == [[0]] and sorted(got + rest) == list(range(30))


class ScriptedConnection:
    """What a stream's consumer reads from a server: the messages given, in order; what it sends, kept."""

    def __init__(self, messages):
        self.messages, self.sent = list(messages), []
        self.address, self.server, self.pid = "tcp://127.0.0.1:1", "token", os.getpid()
        self.closed = False

    def send(self, kind, header, flags=0):
        self.sent.append((kind, header))

    def receive(self, waiting_for, since=None):
        return self.messages.pop(0)

    def receive_within(self, seconds, waiting_for):
        return self.messages.pop(0) if self.messages else None

    def say_at_goodbye(self, fields):
        self.goodbye = fields

    def gaps(self):
        return 0

    def close(self):
        pass


def test_an_item_handed_out_that_comes_back_is_acknowledged_again_not_handed_out_again():
    # A consumer taken for dead came back: its acknowledgements had been lost, and the items it had handed out
    # came back to it. It dropped them without a word, and the server waited for their acknowledgement for ever.
    from lazyseq.serving.remote_stream import RemoteStream

    def item(seq, acked):
        return b"item", {"seq": seq, "server": "token", "acked": acked, "tree": seq * 10}, []

    connection = ScriptedConnection([item(0, 0), item(0, 2), item(1, 2)])
    stream = RemoteStream(connection, ahead=1)
    assert next(stream) == 0  # asks (request 1), then for one more as it hands item 0 out (request 2)
    # back for the next item, which is on its way: item 0, acknowledged by no request yet, comes again (from a server
    # that had taken this consumer for dead meanwhile): acknowledged (request 3), not handed out again
    assert next(stream) == 10
    requests = [header for kind, header in connection.sent if kind == b"next"]
    assert [(r["req"], r["ack"]) for r in requests] == [(1, []), (2, []), (3, [0])]
    assert stream._unconfirmed == {0: 3} and stream._owed == [1]  # item 1: once its caller comes back


def test_a_consumer_that_waits_for_its_next_item_acknowledges_the_last_one_meanwhile():
    # Acknowledged with the request sent as the next item is handed out: a consumer killed while it waits for a slow
    # item would leave the one it was done with to go out again.
    from lazyseq.serving.remote_stream import RemoteStream

    class Slow(ScriptedConnection):
        def receive_within(self, seconds, waiting_for):
            return None  # nothing within ACK_WHILE_WAITING

    connection = Slow([(b"item", {"seq": s, "server": "token", "acked": s, "tree": s}, []) for s in (0, 1)])
    stream = RemoteStream(connection, ahead=1)
    assert [next(stream), next(stream)] == [0, 1]
    requests = [header for kind, header in connection.sent if kind == b"next"]
    assert [(r["req"], r["more"], r["ack"]) for r in requests] == [(1, 1, []), (2, 1, []), (3, 0, [0]), (4, 1, [0])]


def test_a_stream_item_goes_out_while_the_iterable_waits_for_the_next_one():
    # Drawing several items per task kept an item drawn at once until the next one came: a source that waits for
    # its consumer (a feedback loop, a queue) never saw it consumed.
    consumed = threading.Event()

    def items():
        yield 0
        if not consumed.wait(10):
            raise AssertionError("item 0 was held back while the source waited")
        yield 1

    with lazyseq.serve(items(), LOOPBACK) as server, lazyseq.connect(server.address) as stream:
        assert next(stream) == 0
        consumed.set()
        assert list(stream) == [1]


class ThreeAnswers:
    """A service that answers each request with three messages: two items and an error."""

    kind, token, consumers = "view", "", []

    def info(self):
        return {"kind": "view", "length": 3, "label": "three"}

    def hello(self, consumer, header, local):
        return {}

    def handle(self, consumer, kind, header):
        for i in range(2):
            self.send(
                consumer, b"item", {"req": header["req"] + i, "tree": {"a": [0, "<u2", [2]]}}, [b"\x01\x00\x02\x00"]
            )
        self.send(consumer, b"error", {"req": header["req"] + 2, "type": "ValueError", "message": "bad"}, [])

    def sync(self, consumer, header):
        return {}

    def forget(self, consumer):
        pass

    def fds(self):
        return []

    def work(self):
        pass

    def close(self):
        pass


def test_the_messages_a_server_sends_a_consumer_at_once_travel_in_one(monkeypatch):
    # Each went in a message of its own: a stream of small items read 9,000-13,000 items a second over loopback, and
    # a served view read in order 8,000-20,000, each item costing both sides a message.
    from lazyseq.serving.server_loop import ServerLoop

    parsed, parse = [], Connection._parse
    monkeypatch.setattr(Connection, "_parse", staticmethod(lambda frames: parsed.append(frames[1]) or parse(frames)))
    loop = ServerLoop(ThreeAnswers(), LOOPBACK, None, None)
    connection = Connection(loop.address, timeout=10.0)
    try:
        assert connection.hello({})["label"] == "three"
        connection.send(b"get", {"req": 5, "index": 0})
        received = [connection.receive("answers") for _ in range(3)]
        assert [(kind, header["req"]) for kind, header, _ in received] == [(b"item", 5), (b"item", 6), (b"error", 7)]
        assert [wire.decode(header["tree"], buffers).tolist() for _, header, buffers in received[:2]] == [[1, 2]] * 2
        assert parsed == [b"welcome", b"several"]
        assert connection.receive_within(0.0, "nothing") is None
    finally:
        connection.close()
        loop.stop()


def test_a_consumer_that_does_not_say_it_reads_several_messages_in_one_gets_them_one_by_one():
    from lazyseq.serving.server_loop import ServerLoop

    loop = ServerLoop(ThreeAnswers(), LOOPBACK, None, None)
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        dealer.connect(loop.address)
        dealer.send_multipart([wire.TAG, b"hello", b'{"hello": 1}'])  # an earlier client's
        assert dealer.recv_multipart()[1] == b"welcome"
        dealer.send_multipart([wire.TAG, b"get", b'{"req": 0, "index": 0}'])
        assert [dealer.recv_multipart()[1] for _ in range(3)] == [b"item", b"item", b"error"]
    finally:
        dealer.close(linger=0)
        context.term()
        loop.stop()


def test_small_messages_are_kept_together_up_to_a_size_and_a_large_one_goes_alone(monkeypatch):
    from lazyseq.serving import envelopes

    monkeypatch.setattr(envelopes, "GROUP_MESSAGES", 3)
    outbox = envelopes.Outbox()
    small = np.zeros(10, np.uint8)
    assert outbox.put(b"a", b"item", {"n": 0}, [small]) == []
    assert outbox.put(b"b", b"end", {}, []) == []
    # a header counts too: a long string in it is as large as an array, and goes alone, after the one kept before
    [(kind, header, buffers), (large, text, _)] = outbox.put(b"a", b"item", {"s": "x" * envelopes.GROUP_BYTES}, [])
    assert (kind, wire.loads(header)["n"], buffers) == (b"item", 0, [small])
    assert large == b"item" and wire.loads(text)["s"] == "x" * envelopes.GROUP_BYTES
    assert outbox.put(b"a", b"item", {"n": 2}, []) == []
    assert outbox.put(b"a", b"item", {"n": 3}, []) == outbox.put(b"a", b"item", {"n": 4}, []) == []
    [(kind, header, buffers)] = outbox.put(b"a", b"item", {"n": 5}, [small])  # GROUP_MESSAGES kept: they go
    assert kind == b"several" and [m[1]["n"] for m in wire.loads(header)["messages"]] == [2, 3, 4]
    assert [(c, k) for c, k, _, _ in outbox.drain()] == [(b"b", b"end"), (b"a", b"item")]
    assert list(outbox.drain()) == [] and outbox.take(b"a") is None


def test_the_outbox_keeps_nothing_of_a_consumer_once_its_messages_are_sent_or_dropped(monkeypatch):
    # a server that many consumers connect to, one after the other, must not grow with each of them
    from lazyseq.serving import envelopes

    monkeypatch.setattr(envelopes, "GROUP_MESSAGES", 2)
    outbox = envelopes.Outbox()
    for consumer in (b"drained", b"taken", b"dropped", b"full"):
        assert outbox.put(consumer, b"item", {"n": 0}, []) == []
    assert len(outbox.put(b"full", b"item", {"n": 1}, [])) == 0
    assert [kind for kind, _, _ in outbox.put(b"full", b"item", {"n": 2}, [])] == [b"several"]
    assert outbox.take(b"taken") is not None
    outbox.drop(b"dropped")
    assert sorted(consumer for consumer, *_ in outbox.drain()) == [b"drained", b"full"]
    assert (outbox._kept, outbox._bytes) == ({}, {})


@pytest.mark.parametrize(
    "header, buffers, problem",
    [
        ({"messages": []}, [], "a 'several' message needs a list of 'messages'"),
        ({"messages": [["item", {}]]}, [], "each of a 'several' message's messages is [kind, header, buffers]"),
        ({"messages": [["several", {}, 0]]}, [], "a 'several' message holds a b'several' message it cannot hold"),
        ({"messages": [["item", {}, 2]]}, [b"x"], "a 'several' message holds a b'item' message it cannot hold"),
        ({"messages": [["item", {}, -1]]}, [b"x"], "a 'several' message holds a b'item' message it cannot hold"),
        ({"messages": [["item", {}, 0]]}, [b"x"], "a 'several' message has buffers that none of its messages has"),
    ],
)
def test_a_malformed_message_of_several_is_refused(header, buffers, problem):
    from lazyseq.serving.envelopes import opened

    with pytest.raises(wire.ProtocolError) as caught:
        opened(header, buffers, {b"item"})
    assert str(caught.value) == problem


def test_acknowledgements_keep_from_going_out_again_only_the_items_their_consumer_held():
    # Any acknowledgement the server could not match took an item waiting to go out again away from everyone, and
    # those a consumer kept from a server that went away took the new server's items of the same numbers.
    from lazyseq.serving.stream_service import StreamService

    service = StreamService(iter([]), max_buffered=2, max_wanted=8, send=lambda *message: None)
    service.token = "new"
    try:
        service.hello(b"reader", {}, False)
        service._returned.extend([(0, b"item", {}, [], (b"gone",)), (1, b"item", {}, [], (b"gone",))])
        assert service.sync(b"reader", {"ack": [0], "req": 1, "server": "new"}) == {"acked": 1}  # not its item
        assert service.sync(b"gone", {"ack": [0, 1], "req": 9, "server": "old"}) is None  # another server's items
        assert [entry[0] for entry in service._returned] == [0, 1]
        assert service.sync(b"gone", {"ack": [1], "req": 9, "server": "new"}) is None  # taken for dead, back
        assert [entry[0] for entry in service._returned] == [0]  # item 1 it had handed out after all
    finally:
        service.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("then", ["sync", "next"])
def test_a_sync_lost_with_a_broken_connection_is_sent_again_after_a_silence(monkeypatch, then):
    # sync() sent its request once and waited for the answer for ever; so did a read that first confirmed with the
    # server (after a gap in the heartbeats): the server, alive and answering heartbeats, waited for a request.
    send_request, lost = losing_the_first(b"sync")
    with lazyseq.serve(iter(range(6)), LOOPBACK) as server:
        with lazyseq.connect(server.address, timeout=1, ahead=1) as stream:
            got = [next(stream), next(stream)]
            monkeypatch.setattr(Connection, "send", send_request)
            if then == "sync":
                stream.sync()
                assert stream._unconfirmed == {}
                # Asked again once the server was silent for 0.5 s; from then on it waits longer before it asks again
                # (twice as long, at most its timeout of 1 s), less a tenth for the answer that came soon after.
                assert stream._connection._patience.seconds == pytest.approx(0.9)
            else:
                stream._gaps -= 1  # as after a gap in the heartbeats: the read asks the server first
            got += list(stream)
    assert got == [0, 1, 2, 3, 4, 5] and len(lost) == 1


@pytest.mark.timeout(60)
def test_a_hello_lost_with_a_broken_connection_is_said_again_after_a_silence(monkeypatch):
    # connect() sent its hello once and waited for the welcome for ever (the heartbeats answered all along).
    send_request, lost = losing_the_first(b"hello")
    monkeypatch.setattr(Connection, "send", send_request)
    with lazyseq.serve(np.arange(5), LOOPBACK) as server, lazyseq.connect(server.address, timeout=1) as remote:
        assert list(remote) == [0, 1, 2, 3, 4]
    assert [header["hello"] for header in lost] == [1]


def test_sync_with_a_server_that_came_back_anew_returns():
    # Its acknowledgements were of the server that went away: the new one's 'synced' never confirmed them, and
    # sync() asked again and again, tens of thousands of times a second.
    from lazyseq.serving.remote_stream import RemoteStream

    item = b"item", {"seq": 0, "server": "token", "acked": 0, "tree": 7}, []
    connection = ScriptedConnection([item, (b"synced", {"server": "another token", "acked": 0}, [])])
    stream = RemoteStream(connection, ahead=1)
    assert next(stream) == 7 and stream._owed == [0]
    stream.sync()  # one 'sync' answered: a later message would be an IndexError of the script
    assert stream._unconfirmed == {} and connection.messages == []


@pytest.mark.parametrize("then", ["sync", "close"])
def test_acknowledgements_lost_with_a_broken_connection_are_known_after_sync_or_close(then):
    # sync() sent a bare 'sync', and close() sent them once more with its goodbye, which a connection that broke
    # then lost again: the items went out again to the next consumer.
    with lazyseq.serve(iter(range(20)), LOOPBACK) as server:
        first = lazyseq.connect(server.address, ahead=2)
        got = [next(first), next(first)]
        send = first._connection.send

        def losing_requests(kind, header, flags=0):
            if kind != b"next":  # every request for items is lost from now on
                send(kind, header, flags)

        first._connection.send = losing_requests
        got.append(next(first))  # item 2: its acknowledgement lost
        if then == "sync":
            first.sync()
            assert first._unconfirmed == {}
            first._connection.send = lambda *args, **kwargs: None  # it dies: nothing more reaches the server
        first.close()  # ('sync' carries them, and the server answers before the goodbye)
        assert first._unconfirmed == {}
        with lazyseq.connect(server.address) as second:
            rest = list(second)
    assert got == [0, 1, 2] and sorted(got + rest) == list(range(20))


def test_closing_a_consumer_of_a_server_that_is_gone_waits_a_moment_at_most(monkeypatch):
    monkeypatch.setattr("lazyseq.serving.remote_stream.CONFIRM_ON_CLOSE", 0.2)
    server = lazyseq.serve(iter(range(20)), LOOPBACK)
    stream = lazyseq.connect(server.address, ahead=2, timeout=30)
    assert next(stream) == 0  # handed out: the server is asked to confirm as the stream closes
    server.close()
    began = time.monotonic()
    stream.close()  # no answer comes: it waits a moment, not its timeout (30 s), and is closed
    assert time.monotonic() - began < 10 and stream._connection.closed


@contextlib.contextmanager
def item_5_sent_to_other():
    """A stream service whose item 5, that consumer ``gone`` had when taken for dead, went to consumer ``other``;
    and the messages it sent."""
    from lazyseq.serving.stream_service import StreamService

    sent: list = []
    service = StreamService(iter([]), max_buffered=2, max_wanted=8, send=lambda *message: sent.append(message))
    service.token = "token"
    try:
        service._returned.append((5, b"item", {"seq": 5}, [], (b"gone",)))
        service.hello(b"other", {}, False)
        service.handle(b"other", b"next", {"more": 1, "ack": [], "req": 1, "server": "token"})
        yield service, sent
    finally:
        service.close()


def test_an_item_handed_out_twice_is_logged_even_once_the_other_consumer_acknowledged_it(caplog):
    # Only an item the other consumer still held was logged: it usually reads fast, and nothing was said.
    with item_5_sent_to_other() as (service, sent):
        assert [(consumer, kind, header["seq"]) for consumer, kind, header, _ in sent] == [(b"other", b"item", 5)]
        service.handle(b"other", b"next", {"more": 0, "ack": [5], "req": 2, "server": "token"})  # read, acknowledged
        with caplog.at_level(logging.WARNING, logger="lazyseq.serve"):
            service.handle(b"gone", b"next", {"more": 1, "ack": [5], "req": 9, "server": "token"})  # back
        assert [record.getMessage() for record in caplog.records] == [
            f"item 5 of the stream was handed out twice: consumer {b'gone'.hex()}, taken for dead, had handed it out "
            "before another consumer got it"
        ]


@contextlib.contextmanager
def stream_service_with_returned(seq, holder):
    """A stream service (its answers sent nowhere) holding item ``seq`` of ``holder``, a consumer taken for dead that
    had not acknowledged it; closed at the end."""
    from lazyseq.serving.stream_service import StreamService

    service = StreamService(iter([]), max_buffered=2, max_wanted=8, send=lambda *message: None)
    service.token = "token"
    try:
        service._returned.append((seq, b"item", {"seq": seq}, [], (holder,)))
        yield service
    finally:
        service.close()


def test_an_item_handed_out_twice_is_logged_after_it_passed_through_several_consumers_that_left(caplog):
    # Only the last consumer to leave with it was remembered: the first one, taken for dead, said it had handed it out
    # after a third consumer had, and nothing was logged.
    with stream_service_with_returned(5, b"stopped") as service:  # it held item 5, taken for dead
        for consumer in (b"killed", b"third"):
            service.hello(consumer, {}, False)
            service.handle(consumer, b"next", {"more": 1, "ack": [], "req": 1, "server": "token"})
            assert 5 in service._consumers[consumer].unacked
            if consumer == b"killed":
                service.forget(consumer)  # it died with item 5 in hand
        service.handle(b"third", b"next", {"more": 0, "ack": [5], "req": 2, "server": "token"})  # handed out
        with caplog.at_level(logging.WARNING, logger="lazyseq.serve"):
            service.handle(b"stopped", b"next", {"more": 1, "ack": [5], "req": 9, "server": "token"})  # back
        assert [record.getMessage() for record in caplog.records] == [
            f"item 5 of the stream was handed out twice: consumer {b'stopped'.hex()}, taken for dead, had handed it "
            "out before another consumer got it"
        ]


def test_an_item_handed_out_twice_is_logged_once_the_consumer_that_had_it_next_has_left(caplog):
    # Alone again when it came back, the consumer taken for dead had its late acknowledgements taken as its own.
    with stream_service_with_returned(1, b"stopped") as service:  # it held item 1, taken for dead
        service.hello(b"other", {}, False)
        service.handle(b"other", b"next", {"more": 1, "ack": [], "req": 1, "server": "token"})
        service.handle(b"other", b"next", {"more": 0, "ack": [1], "req": 2, "server": "token"})  # handed out
        service.forget(b"other")  # and left
        service.hello(b"stopped", {}, False)  # back, told it was forgotten
        with caplog.at_level(logging.WARNING, logger="lazyseq.serve"):
            service.handle(b"stopped", b"next", {"more": 1, "ack": [1], "req": 1, "server": "token"})
        assert [record.getMessage() for record in caplog.records] == [
            f"item 1 of the stream was handed out twice: consumer {b'stopped'.hex()}, taken for dead, had handed it "
            "out before another consumer got it"
        ]


def test_an_item_handed_out_by_two_consumers_taken_for_dead_in_turn_is_logged(caplog):
    # The second one was forgotten with the item in hand, which the first had said it handed out: nothing was kept of
    # it, and its own late acknowledgement logged nothing.
    with stream_service_with_returned(0, b"first") as service:  # it held item 0, taken for dead
        service.hello(b"second", {}, False)
        service.handle(b"second", b"next", {"more": 1, "ack": [], "req": 1, "server": "token"})  # gets item 0
        service.handle(b"first", b"next", {"more": 1, "ack": [0], "req": 5, "server": "token"})  # back: handed out
        service.forget(b"second")  # taken for dead before its acknowledgement came
        with caplog.at_level(logging.WARNING, logger="lazyseq.serve"):
            service.handle(b"second", b"next", {"more": 1, "ack": [0], "req": 2, "server": "token"})  # back: so did it
        assert [record.getMessage() for record in caplog.records] == [
            f"item 0 of the stream was handed out twice: consumer {b'second'.hex()}, taken for dead, had handed it "
            "out before another consumer got it"
        ]
        assert service._returned == deque()  # (not handed to anyone else)


CTRL_C_AS_IT_STARTS = """
import os, signal, sys, threading
import lazyseq
from lazyseq.serving import server_loop
from lazyseq.serving.connection import _Heartbeat


def interrupted_after(step):  # step (a method), then a Ctrl-C: as if one came as it ended (a thread started, say)
    def run(*args, **kwargs):
        step(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)
    return run


def left():
    for thread in threading.enumerate():
        if thread.name == "lazyseq-connect-close":
            thread.join(30)
    threads = sorted(t.name for t in threading.enumerate() if t.name.startswith("lazyseq-"))
    return len(os.listdir("/proc/self/fd")), threads


step = sys.argv[1]
if step == "serve":
    before = left()
    start = server_loop.threading.Thread.start
    server_loop.threading.Thread.start = interrupted_after(start)
    try:
        lazyseq.serve(range(3), "tcp://127.0.0.1:0")
    except KeyboardInterrupt:
        print("interrupted")
    server_loop.threading.Thread.start = start
    print(left() == before, left(), before)
else:
    with lazyseq.serve(range(3), "tcp://127.0.0.1:0") as server:
        before = left()
        original = getattr(_Heartbeat, step)
        setattr(_Heartbeat, step, interrupted_after(original))
        try:
            lazyseq.connect(server.address)
        except KeyboardInterrupt:
            print("interrupted")
        setattr(_Heartbeat, step, original)
        print(left() == before, left(), before)
        with lazyseq.connect(server.address) as remote:
            print(list(remote))
"""


def _interrupted_as_it_starts(step: str) -> str:
    """What a process printed after a Ctrl-C at ``step``: its own, so that no thread of another test (Ray's) opens
    or closes descriptors as they are counted."""
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_AS_IT_STARTS, step], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("step", ["__init__", "start"])
def test_a_ctrl_c_as_connect_makes_its_heartbeat_leaves_nothing_behind(step):
    # The pipes made before the connection's finalizer were left open; and a Ctrl-C as the heartbeat's thread started
    # let it run on after connect() raised, the thread and the collector each closing its descriptors: a number
    # reused meanwhile (by ZeroMQ) was closed under its new owner, which once aborted the process.
    said = _interrupted_as_it_starts(step).splitlines()
    assert said[0] == "interrupted" and said[1].startswith("True ") and said[2] == "[0, 1, 2]"


def test_a_ctrl_c_as_serve_starts_its_thread_leaves_nothing_behind():
    # The server's thread served on, unreachable, its port taken, after serve() raised.
    said = _interrupted_as_it_starts("serve").splitlines()
    assert said[0] == "interrupted" and said[1].startswith("True ")


def test_a_ctrl_c_as_an_item_s_error_is_raised_leaves_it_to_the_next_read(monkeypatch):
    # The caller got the KeyboardInterrupt, never the error, and the next read acknowledged the item as handed out.
    from lazyseq.views import errors

    def items():
        yield 0
        raise ValueError("item 1 is bad")

    chain_of, interrupted = errors.chain_of, []

    def interrupted_once(error):  # where Python's SIGINT handler may raise, as the error is raised
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return chain_of(error)

    with lazyseq.serve(items(), LOOPBACK) as server, lazyseq.connect(server.address) as stream:
        assert next(stream) == 0
        monkeypatch.setattr(errors, "chain_of", interrupted_once)
        with pytest.raises(KeyboardInterrupt):
            next(stream)
        with pytest.raises(lazyseq.EvaluationError, match=r"^failed to compute stream\[1\]: RemoteError: ValueError"):
            next(stream)
        assert list(stream) == []


def test_a_with_block_left_on_an_error_leaves_the_item_in_hand_to_another_consumer():
    # close() acknowledged it on the way out: the caller had not finished it, and nobody else got it
    with lazyseq.serve(iter(range(10)), LOOPBACK) as server:
        with pytest.raises(RuntimeError), lazyseq.connect(server.address, ahead=2) as first:
            for item in first:
                if item == 3:
                    raise RuntimeError("failed on item 3")
        with lazyseq.connect(server.address) as second:
            assert list(second) == [3, 4, 5, 6, 7, 8, 9]


def test_a_consumer_left_unclosed_counts_the_items_it_handed_out_as_done():
    # Collected without close(), it said goodbye without its acknowledgements: the item its caller had finished went
    # to the next consumer too.
    with lazyseq.serve(iter(range(10)), LOOPBACK) as server:

        def read_three():
            first = lazyseq.connect(server.address, ahead=2)
            return [next(first) for _ in range(3)]

        assert read_three() == [0, 1, 2]
        gc.collect()
        with lazyseq.connect(server.address) as second:
            assert list(second) == [3, 4, 5, 6, 7, 8, 9]


ENDS_WITHOUT_CLOSE = """
import sys, lazyseq
stream = lazyseq.connect(sys.argv[1], ahead=2)
print([next(stream) for _ in range(3)], flush=True)
if sys.argv[2] == "on an error":
    raise RuntimeError("failed while working on item 2")
"""


@pytest.mark.parametrize("ending, rest", [("normally", [3, 4, 5, 6, 7]), ("on an error", [2, 3, 4, 5, 6, 7])])
def test_a_program_that_ends_without_closing_its_consumer_leaves_the_item_in_hand_only_on_an_error(ending, rest):
    # Its goodbye said nothing of the items handed out: the last one went out again, whatever the ending
    with lazyseq.serve(iter(range(8)), LOOPBACK) as server:
        done = run_consumer(ENDS_WITHOUT_CLOSE, server.address, ending)
        assert done.stdout == "[0, 1, 2]\n" and done.returncode == (0 if ending == "normally" else 1)
        with lazyseq.connect(server.address, timeout=5) as second:
            assert list(second) == rest


CTRL_C_AS_THE_NEXT_READ_BEGINS = """
import os, signal, sys, lazyseq
from lazyseq.serving.remote_stream import RemoteStream
acknowledge = RemoteStream._acknowledge_owed

def ctrl_c_first(self):
    if 4 in self._owed:  # the caller is done with item 4, and came back for item 5
        os.kill(os.getpid(), signal.SIGINT)  # raised at the next instruction: in next(), before its first line
    return acknowledge(self)

RemoteStream._acknowledge_owed = ctrl_c_first
stream = lazyseq.connect(sys.argv[1], ahead=2)
if sys.argv[2] == "in a with block":
    with stream:
        for item in stream:
            print(item, flush=True)
else:
    for item in stream:
        print(item, flush=True)
"""


@pytest.mark.parametrize("reading", ["in a with block", "alone"])
def test_a_ctrl_c_that_ends_the_program_as_the_next_read_begins_counts_the_last_item_done(reading):
    # The program ended on an error, so its last item counted as not finished: it went out again
    with lazyseq.serve(iter(range(10)), LOOPBACK) as server:
        done = run_consumer(CTRL_C_AS_THE_NEXT_READ_BEGINS, server.address, reading)
        assert done.stdout.split() == ["0", "1", "2", "3", "4"] and done.returncode == -signal.SIGINT, done.stderr
        with lazyseq.connect(server.address, timeout=5) as second:
            assert list(second) == [5, 6, 7, 8, 9]


def test_a_consumer_closed_from_another_thread_during_a_read_acknowledges_what_was_done():
    # close() could not take the lock from the read, and said goodbye without the acknowledgements
    gate = threading.Event()

    def items():
        yield from range(3)
        gate.wait(30)
        yield from range(3, 6)

    with lazyseq.serve(items(), LOOPBACK) as server:
        first = lazyseq.connect(server.address, ahead=1)
        assert [next(first), next(first), next(first)] == [0, 1, 2]
        failed = []
        reader = threading.Thread(target=lambda: failed.append(pytest.raises(lazyseq.LoaderError, next, first)))
        reader.start()  # waits for item 3, item 2 done with
        while not first._lock.locked():
            time.sleep(0.001)
        first.close()
        reader.join()
        gate.set()
        with lazyseq.connect(server.address) as second:
            assert list(second) == [3, 4, 5]
    assert len(failed) == 1


@pytest.mark.parametrize("then", ["hands it out", "leaves"])
def test_an_item_sent_to_another_consumer_is_out_twice_only_once_that_one_hands_it_out(caplog, then):
    # A consumer taken for dead said it handed out an item that the server had sent to another one, which had not
    # handed it out: logged as out twice at once, and again at each request that acknowledged it again.
    with item_5_sent_to_other() as (service, sent):
        service.hello(b"third", {}, False)
        with caplog.at_level(logging.WARNING, logger="lazyseq.serve"):
            for request in (9, 10):  # back: it had handed item 5 out (and says so until the server confirms)
                service.handle(b"gone", b"next", {"more": 0, "ack": [5], "req": request, "server": "token"})
            assert caplog.records == []
            if then == "hands it out":
                service.handle(b"other", b"next", {"more": 0, "ack": [5], "req": 2, "server": "token"})
                assert [record.getMessage() for record in caplog.records] == [
                    f"item 5 of the stream was handed out twice: consumer {b'gone'.hex()}, taken for dead, had handed "
                    f"it out before consumer {b'other'.hex()} got it"
                ]
            else:  # it leaves without handing item 5 out: nobody else gets it
                service.forget(b"other")
                service.handle(b"third", b"next", {"more": 1, "ack": [], "req": 1, "server": "token"})
                assert caplog.records == [] and [header["seq"] for who, _, header, _ in sent if who == b"third"] == []


def test_a_consumer_that_gets_its_own_items_back_hands_them_out_once_and_no_warning_says_twice(caplog):
    # Taken for dead, then back: its items went back to it, and acknowledging them again (as every request does
    # until the server confirms) logged each as handed out twice.
    with stream_service_with_returned(3, b"back") as service:  # it held item 3 when taken for dead
        service.hello(b"back", {}, False)
        service.hello(b"other", {}, False)
        with caplog.at_level(logging.WARNING, logger="lazyseq.serve"):
            service.handle(b"back", b"next", {"more": 1, "ack": [], "req": 1, "server": "token"})  # item 3 again
            service.handle(b"back", b"next", {"more": 0, "ack": [3], "req": 2, "server": "token"})
            service.handle(b"back", b"next", {"more": 0, "ack": [3], "req": 3, "server": "token"})  # once more
        assert caplog.records == []


KILLED_AS_IT_HANDS_OUT = """
import os, signal, sys, time, lazyseq
from lazyseq.serving.remote_stream import RemoteStream
ask = RemoteStream._ask

def ask_then_die(self, more, *rest):
    ask(self, more, *rest)
    if more == 1 and self._received and self._received[0][1] == 10:  # as item 10 is handed out
        time.sleep(0.05)  # descheduled here: what was sent has left
        os.kill(os.getpid(), signal.SIGKILL)

RemoteStream._ask = ask_then_die
stream = lazyseq.connect(sys.argv[1], timeout=0.5, ahead=4)
for item in stream:
    print(item, flush=True)
"""


def test_a_consumer_killed_as_it_hands_an_item_out_leaves_it_to_another():
    # The item was acknowledged before next() returned it: killed in between, nobody ever got it.
    with lazyseq.serve(iter(range(30)), LOOPBACK) as server:
        done = run_consumer(KILLED_AS_IT_HANDS_OUT, server.address)
        assert done.returncode == -signal.SIGKILL, done.stderr
        first = [int(line) for line in done.stdout.split()]
        with lazyseq.connect(server.address, timeout=5) as second:
            rest = list(second)  # items 10 to 14 last, once the server has taken the killed one for dead
    # (items before it too, should their acknowledgements have been on their way still)
    assert first == list(range(10)) and len(set(rest)) == len(rest) and set(first) | set(rest) == set(range(30))
    assert set(range(10, 30)) <= set(rest)


WORKING_ON_AN_ITEM = """
import sys, lazyseq
stream = lazyseq.connect(sys.argv[1], timeout=0.5, ahead=4)
for _ in range(5):
    print(next(stream), flush=True)
sys.stdin.read()  # working on item 4 until killed
"""


def test_the_item_a_consumer_was_working_on_when_killed_goes_to_another():
    # Acknowledged as it was handed out: a consumer killed halfway through its work on it took it along.
    with lazyseq.serve(iter(range(20)), LOOPBACK) as server:
        with consumer_process(WORKING_ON_AN_ITEM, server.address) as working:  # killed while it works on item 4
            first = [int(working.stdout.readline()) for _ in range(5)]
        with lazyseq.connect(server.address, timeout=5) as second:
            rest = list(second)
    # items before it too, at times: their acknowledgements may have been on their way still
    assert first == [0, 1, 2, 3, 4] and 4 in rest and len(set(rest)) == len(rest)
    assert set(first) | set(rest) == set(range(20)) and max(set(first) & set(rest)) == 4


CTRL_C_AS_IT_HANDS_OUT = """
import os, signal, sys, lazyseq
from lazyseq.serving.connection import Connection
send = Connection.send

def send_then_ctrl_c(self, kind, header, flags=0):
    send(self, kind, header, flags)
    if kind == b"next" and header.get("more") == 1 and len(printed) == 10:  # as item 10 is handed out
        os.kill(os.getpid(), signal.SIGINT)

Connection.send = send_then_ctrl_c
printed = []
with lazyseq.connect(sys.argv[1], timeout=1.0, ahead=4) as stream:
    for item in stream:
        print(item, flush=True)
        printed.append(item)
"""


def test_a_ctrl_c_that_ends_the_program_as_an_item_is_handed_out_loses_nothing():
    # Its acknowledgement had gone; the interrupt kept the item for the next read, which never came: lost.
    with lazyseq.serve(iter(range(30)), LOOPBACK) as server:
        done = run_consumer(CTRL_C_AS_IT_HANDS_OUT, server.address)
        assert done.returncode == -signal.SIGINT and done.stderr.strip().endswith("KeyboardInterrupt"), done.stderr
        first = [int(line) for line in done.stdout.split()]
        with lazyseq.connect(server.address, timeout=5) as second:
            rest = list(second)
    assert first == list(range(10)) and sorted(rest) == list(range(10, 30))


def test_consumers_of_a_stream_take_turns():
    gate = threading.Event()

    def items():
        for k in range(6):
            gate.wait()
            yield k

    with lazyseq.serve(items(), LOOPBACK) as server:
        with lazyseq.connect(server.address) as first, lazyseq.connect(server.address) as second:
            for consumer in (first, second):  # each asks for 3, and the server has heard it
                consumer._ask(3)
                consumer.sync()
            gate.set()
            assert [next(first) for _ in range(3)] == [0, 2, 4]  # not 0, 1, 2: the first to ask takes no more
            assert [next(second) for _ in range(3)] == [1, 3, 5]


def test_a_server_that_cannot_listen_takes_nothing_from_its_iterable():
    with lazyseq.serve(iter(range(3)), LOOPBACK) as server:
        items = iter(range(30))
        with pytest.raises(OSError, match="serve: cannot listen at"):
            lazyseq.serve(items, server.address)
        assert next(items) == 0


def test_an_iterable_given_workers_is_refused_before_anything_is_taken_from_it():
    items = iter(range(30))
    with pytest.raises(ValueError) as caught:
        lazyseq.serve(items, LOOPBACK, nworkers=2)
    assert str(caught.value) == (
        "serve: an iterable is served as it comes, by one reader; nworkers only applies to a view (give the iterable "
        "its own workers, e.g. with load_buffers)"
    )
    assert next(items) == 0


def test_arrays_of_values_of_no_bytes_travel():
    tree, buffers = wire.encode((np.zeros(3, "V0"), np.zeros((2, 0))))
    empty, nothing = wire.decode(tree, [memoryview(b).cast("B") for b in buffers])
    assert empty.dtype == np.dtype("V0") and empty.shape == (3,) and nothing.shape == (2, 0)
    with pytest.raises(TypeError, match=r"^the item\[1\] makes 16777217 values of no bytes \(\|V0\) in arrays"):
        wire.encode([np.zeros(2**24, "V0"), np.zeros(1, "V0")])


def test_a_stream_draws_its_items_in_runs_while_its_drawer_is_busy():
    # One task at a time woke the drawer's thread, and the server's thread in turn, for every item handed out.
    from lazyseq.serving.stream_service import StreamService

    allowed = threading.Semaphore(10)

    def items():
        for i in range(100):
            allowed.acquire()
            yield i

    service = StreamService(items(), max_buffered=10, max_wanted=20, send=lambda *message: None)
    service.token = "token"
    runs = []
    submit = service._drawer.submit
    service._drawer.submit = lambda tasks: (runs.append([seq for seq, _ in tasks]), submit(tasks))
    try:
        service.hello(b"c", {}, False)
        service.work()
        while service._drawer.pending:  # the first 10 drawn
            service._drawer.collect(1.0)
        service.work()
        for req in range(1, 8):  # the drawer is busy from the second item on: it waits for the semaphore
            service.handle(b"c", b"next", {"more": 1, "ack": [], "req": req, "server": "token"})
        assert runs == [list(range(10)), [10], [11, 12, 13, 14, 15]]
    finally:
        allowed.release(100)
        service.close()


@pytest.mark.parametrize("read", ["a view", "a stream"])
def test_a_consumer_whose_server_closed_says_so_when_it_gives_up(server_process, read):
    # A server stopped (SIGTERM here, as Ctrl-C or its close()) tells its consumers; killed, it could not.
    server = server_process("numbers" if read == "a view" else "counting")
    remote = lazyseq.connect(server.address, timeout=1.0, ahead=1)
    try:
        assert (remote[0] if read == "a view" else next(remote)[0]) == 0
        server.stop()
        with pytest.raises(lazyseq.ServerLost) as caught:
            remote[60] if read == "a view" else [next(remote) for _ in range(60)]
        message = str(caught.value)
        assert message.startswith(f"lost the server at {server.address}: no answer for "), message
        waited = "item 60" if read == "a view" else "the next item of the stream"
        assert re.search(
            rf"\(timeout=1\) while waiting for {waited}; it said it was closing, and no server answered there since$",
            message,
        ), message
    finally:
        remote.close()


def test_worker_threads_reading_a_stream_through_uniter_hand_out_every_item_once():
    # prefetch(uniter(stream)), as the serving guide shows: a worker thread that asked for item 11 before another's
    # item 5 dropped items 5 to 10, lost for every consumer.
    server = lazyseq.serve((np.array([i]) for i in range(300)), LOOPBACK)
    try:
        with lazyseq.connect(server.address) as stream:
            with lazyseq.prefetch(lazyseq.uniter(stream), nworkers=2, method="thread") as ahead:
                assert [int(x[0]) for x in ahead] == list(range(300))
    finally:
        server.close()


def test_the_consumers_of_a_stream_that_stopped_on_an_error_hear_of_it_all():
    # One consumer got the error; the others ended as if the stream were whole.
    def failing_after_two():
        yield from (np.array([0]), np.array([1]))
        raise ValueError("the disk is gone")

    got, ends = [], {}
    with lazyseq.serve(failing_after_two(), LOOPBACK) as server:
        with lazyseq.connect(server.address, ahead=1) as first, lazyseq.connect(server.address, ahead=1) as second:
            for stream in (first, second):
                try:
                    for x in stream:
                        got.append(int(x[0]))
                except lazyseq.LoaderError as error:  # (EvaluationError is not one)
                    ends["told"] = str(error)
                except lazyseq.EvaluationError as error:
                    ends["failed"] = str(error)
                with pytest.raises(StopIteration):  # either way, it ended there; said once
                    next(stream)
    assert sorted(got) == [0, 1]
    assert ends == {
        "failed": "failed to compute stream[2]: RemoteError: ValueError: the disk is gone",
        "told": f"the stream served at {server.address} ended right after its item 2 failed, and that failure went "
        "to another consumer: ValueError: the disk is gone; if the iterable stopped on it (a generator ends as it "
        "raises), the items it would have given after it are missing",
    }


class FailsOnceMidway:
    """An iterator whose item 1 fails, and which goes on: the stream is whole, but for that item."""

    def __init__(self):
        self.next = 0

    def __iter__(self):
        return self

    def __next__(self):
        self.next += 1
        if self.next == 2:
            raise ValueError("item 1 is bad")
        if self.next > 4:
            raise StopIteration
        return np.array([self.next - 1])


def unsendable_last():
    yield from (np.array([0]), np.array([1]))
    yield object()  # cannot be sent; the generator ends as it should


@pytest.mark.parametrize("source", [FailsOnceMidway, unsendable_last])
def test_the_consumers_of_a_stream_whose_iterable_did_not_stop_on_its_failure_end_as_usual(source):
    got, failures = [], []
    with lazyseq.serve(source(), LOOPBACK) as server:
        with lazyseq.connect(server.address, ahead=1) as first, lazyseq.connect(server.address, ahead=1) as second:
            for stream in (first, second):
                while True:
                    try:
                        got.append(int(next(stream)[0]))
                    except StopIteration:
                        break
                    except lazyseq.EvaluationError as error:
                        failures.append(str(error))
    if source is FailsOnceMidway:
        assert sorted(got) == [0, 2, 3] and failures == [
            "failed to compute stream[1]: RemoteError: ValueError: item 1 is bad"
        ]
    else:
        assert sorted(got) == [0, 1] and len(failures) == 1
        assert failures[0].startswith(
            "failed to compute stream[2]: RemoteError: TypeError: item 2 of the stream cannot be sent: "
        )

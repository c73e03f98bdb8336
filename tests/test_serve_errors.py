"""The data server: errors computing items reach the consumer, named; malformed messages are refused, logged, and the
server serves on.

Servers listen on 127.0.0.1 only; every server, consumer and process a test starts is stopped by it.
"""

import errno
import json
import logging

import numpy as np
import pytest

import lazyseq

zmq = pytest.importorskip("zmq")

from serve_helpers import LOOPBACK, bare_dealer, noting_computed, say_hello, sent_gets, slept  # noqa: E402

from lazyseq.serving import wire  # noqa: E402
from lazyseq.serving.view_service import ViewService  # noqa: E402


def test_an_error_computing_an_item_names_the_item_and_the_chain(server_process):
    server = server_process("failing")
    with lazyseq.connect(server.address) as remote:
        assert remote[2] == 2
        with pytest.raises(lazyseq.EvaluationError) as caught:
            remote[3]
        assert str(caught.value) == (
            "failed to compute served[3] -> smap(fail_at_3)[3]: RemoteError: ValueError: item 3 is bad"
        )
        cause = caught.value.__cause__
        assert isinstance(cause, lazyseq.RemoteError)
        assert f"raised on the server at {server.address}; its traceback there:" in cause.__notes__[0]
        assert 'raise ValueError("item 3 is bad")' in cause.__notes__[0]
        assert remote[4] == 4  # the server goes on


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt])
def test_an_item_that_raises_what_is_not_an_exception_fails_alone_and_the_server_goes_on(stream, error):
    # SystemExit (a library calling sys.exit), asyncio.CancelledError...: the server's thread ended, silently.
    def load(i):
        if i == 1:
            raise error("item 1 gave up")
        return i

    source = (load(i) for i in range(3)) if stream else lazyseq.smap(load, range(3))
    with lazyseq.serve(source, LOOPBACK) as server, lazyseq.connect(server.address, timeout=5) as remote:
        if stream:
            assert next(remote) == 0
            with pytest.raises(lazyseq.EvaluationError, match=r"^failed to compute stream\[1\]: RemoteError: "):
                next(remote)
            assert list(remote) == []  # a generator that raised has ended
        else:
            assert remote[0] == 0
            with pytest.raises(lazyseq.EvaluationError) as caught:
                remote[1]
            assert str(caught.value) == (
                f"failed to compute served[1] -> smap({load.__qualname__})[1]: RemoteError: {error.__name__}: item 1 gave up"
            )
            assert remote[2] == 2
        assert server._loop.thread.is_alive()


class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("no text")


def test_an_error_that_cannot_be_described_at_all_is_named_by_its_type():
    from lazyseq.serving.failures import failure_header

    class Loop(Exception):
        def __str__(self):
            raise Loop  # (which cannot be printed either)

    notes = ValueError("bad")
    notes.__notes__ = 3
    assert failure_header(Loop())["message"] == "<Loop could not be described: Loop>"
    assert failure_header(notes) == {
        "type": "ValueError",
        "message": "<ValueError could not be described: TypeError>",
        "chain": "",
        "traceback": "",
    }


@pytest.mark.parametrize("stream", [False, True])
def test_an_item_whose_error_cannot_be_printed_fails_alone(stream):
    # Describing the error raised: a stream's item vanished (none of its answers went out), a view's read waited for
    # ever (heartbeats still answered).
    class Items:  # an iterator that goes on after a failing item
        def __init__(self):
            self.i = -1

        def __iter__(self):
            return self

        def __next__(self):
            self.i += 1
            if self.i == 3:
                raise StopIteration
            if self.i == 1:
                raise UnprintableError
            return self.i

    def load(i):
        if i == 1:
            raise UnprintableError
        return i

    source = Items() if stream else lazyseq.smap(load, range(3))
    with lazyseq.serve(source, LOOPBACK) as server, lazyseq.connect(server.address, timeout=5) as remote:
        read = (lambda i: next(remote)) if stream else remote.__getitem__
        assert read(0) == 0
        with pytest.raises(lazyseq.EvaluationError) as caught:
            read(1)
        assert str(caught.value).endswith(
            "[1]: RemoteError: UnprintableError: <str() of UnprintableError failed: RuntimeError: no text>"
        )
        assert read(2) == 2


def test_serve_forever_raises_when_the_server_thread_ended_on_an_error(monkeypatch, caplog):
    def broken(*_):
        raise RuntimeError("a bug")

    with lazyseq.serve(range(3), LOOPBACK) as server:
        monkeypatch.setattr(server._loop, "_sweep", broken)  # the thread calls it within SWEEP_SECONDS
        with caplog.at_level(logging.ERROR, "lazyseq.serve"), pytest.raises(lazyseq.LoaderError) as caught:
            server.serve_forever()
    assert str(caught.value) == (
        f"serve: the server at {server.address} stopped on an error, which the 'lazyseq.serve' logger reported"
    )
    assert server.closed and f"the server at {server.address} failed" in caplog.text


def test_an_object_array_item_is_refused_by_name_and_the_server_goes_on():
    items = lazyseq.smap(lambda i: np.array([i, "x"], dtype=object) if i == 1 else np.arange(i), range(3))
    with lazyseq.serve(items, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        with pytest.raises(lazyseq.EvaluationError) as caught:
            remote[1]
        assert str(caught.value) == (
            "failed to compute served[1]: RemoteError: TypeError: item 1 cannot be sent: the item is an array of "
            "Python objects (dtype object): only arrays of plain data can be sent; convert it to a numeric, bytes "
            "or str dtype, or to a list"
        )
        assert remote[2].tolist() == [0, 1]
        assert caught.value.__cause__.__notes__ == [f"raised on the server at {server.address}"]  # no traceback there


class NeedsArguments(Exception):
    """Pickles, but cannot be unpickled: its ``__init__`` takes two arguments."""

    def __init__(self, a, b):
        super().__init__(f"a={a}")


def raise_needing_arguments(i):
    raise NeedsArguments(1, 2)


def test_an_error_that_a_worker_process_could_not_send_as_itself_is_named_as_it_was_raised():
    items = lazyseq.smap(raise_needing_arguments, range(3))
    with lazyseq.serve(items, LOOPBACK, nworkers=1, method="process") as server:
        with lazyseq.connect(server.address) as remote:
            with pytest.raises(lazyseq.EvaluationError) as caught:
                remote[0]
    assert str(caught.value) == (
        "failed to compute served[0] -> smap(raise_needing_arguments)[0]: RemoteError: NeedsArguments: a=1"
    )
    assert caught.value.__cause__.type_name == "NeedsArguments"
    assert "raise NeedsArguments(1, 2)" in caught.value.__cause__.__notes__[0]  # the worker's traceback


def test_a_client_of_another_version_is_told_in_its_own_protocol_which_version_the_server_speaks(caplog):
    caplog.set_level(logging.WARNING, logger="lazyseq.serve")
    with lazyseq.serve(range(10), LOOPBACK) as server:
        context = zmq.Context()
        older = bare_dealer(context, server.address)
        older.send_multipart([b"lazyseq/1", b"hello", b'{"hello": 1, "timeout": 10.0}'])
        tag, kind, header = older.recv_multipart()
        older.close()
        context.term()
        with lazyseq.connect(server.address) as remote:  # the server goes on
            assert list(remote) == list(range(10))
    message = (
        f"a message of protocol lazyseq/1 (a client of another version of lazyseq): this server speaks lazyseq/4 "
        f"(lazyseq {lazyseq.__version__}); install the same version on both sides"
    )
    assert (tag, kind, json.loads(header)) == (b"lazyseq/1", b"refused", {"message": message})
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [message]


def test_garbage_is_logged_and_the_server_goes_on(caplog):
    caplog.set_level(logging.WARNING, logger="lazyseq.serve")
    with lazyseq.serve(range(10), LOOPBACK) as server:
        context = zmq.Context()
        rogue = bare_dealer(context, server.address)
        rogue.send_multipart([b"HTTP/1.1", b"GET /"])
        rogue.send_multipart([wire.TAG, b"get", b"{not json"])
        rogue.send_multipart([wire.TAG, b"launch", b"{}"])
        rogue.send_multipart([wire.TAG, b"get", b'{"req": "x", "index": 1}'])
        rogue.send_multipart([wire.TAG, b"get", b"{}", b"extra"])
        rogue.send_multipart([wire.TAG, b"get", b'{"req": 0, "index": 1, "count": 0}'])
        rogue.send_multipart([wire.TAG, b"get", b'{"req": 0, "index": 1, "count": 257}'])
        rogue.send_multipart([wire.TAG, b"get", b'{"req": 1, "index": %s}' % (b"9" * 4300)])  # (written: an error)
        rogue.send_multipart([wire.TAG, b"sync", b"{}"])  # answered once the messages before it were read
        answers = [rogue.recv_multipart() for _ in range(8)]
        assert [kind for _, kind, _ in answers] == [b"refused"] * 7 + [b"synced"]  # told, where it speaks lazyseq
        assert json.loads(answers[1][2]) == {"message": "unknown request b'launch'"}
        rogue.send_multipart([wire.TAG, b"get", b"[" * 200_000])  # over the size limit: cut off by ZeroMQ
        rogue.close()  # cut off
        rogue = bare_dealer(context, server.address)
        rogue.send_multipart([wire.TAG, b"get", b"{}", *[b""] * 100_000])  # frames read past the fifth are dropped
        rogue.send_multipart([wire.TAG, b"get", b"{}", *[b""] * 100_000, wire.CUT])  # cut short: dropped silently
        rogue.send_multipart([wire.TAG, b"sync", b"{}"])
        assert [kind for _, kind, _ in (rogue.recv_multipart(), rogue.recv_multipart())] == [b"refused", b"synced"]
        with lazyseq.connect(server.address) as remote:
            assert list(remote) == list(range(10))
        rogue.close()
        context.term()
    reasons = [r.getMessage().split(": ", 1)[1] for r in caplog.records if r.getMessage().startswith("rejected")]
    assert reasons == [
        "not a lazyseq message (wrong protocol tag or too few frames)",
        "a header is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        "unknown request b'launch'",
        "'get' needs integers 'req' and 'index'",
        "a 'get' request carries no buffers",
        "'get' needs a 'count' from 1 to 256, if any",
        "'get' needs a 'count' from 1 to 256, if any",
        "a header is not valid JSON (an integer of 4300 digits: longer than any count)",
        "a 'get' request carries no buffers",
    ]


def test_a_server_out_of_descriptors_goes_on_serving(monkeypatch, caplog):
    # The pipe that wakes the server's thread when results come could not be made ("Too many open files", which any
    # client could bring about): the thread ended, and every consumer lost the server.

    def no_descriptors(service):
        raise OSError(errno.EMFILE, "Too many open files")

    caplog.set_level(logging.WARNING, logger="lazyseq.serve")
    monkeypatch.setattr(ViewService, "fds", no_descriptors)
    with lazyseq.serve(lazyseq.smap(slept, range(20)), LOOPBACK, nworkers=2) as server:
        with lazyseq.connect(server.address, timeout=5.0) as remote:
            assert list(remote) == list(range(20))  # results taken in at each turn of the server's loop
    assert [record.getMessage() for record in caplog.records] == [
        f"the server at {server.address} cannot watch its workers' results for now: [Errno 24] Too many open files"
    ]


def test_a_get_for_several_items_gets_one_answer_each():
    with lazyseq.serve(lazyseq.smap(lambda i: np.full(2, i), range(10)), LOOPBACK) as server:
        context = zmq.Context()
        client = bare_dealer(context, server.address)
        assert say_hello(client) == b"welcome"
        client.send_multipart([wire.TAG, b"get", wire.dumps({"req": 5, "index": 7, "count": 4})])
        answers = []
        for _ in range(4):
            _, kind, header, *buffers = client.recv_multipart()
            header = wire.loads(header)
            value = wire.decode(header.pop("tree"), buffers) if kind == b"item" else None
            answers.append((kind, header, None if value is None else value.tolist()))
        client.close()
        context.term()
    answers.sort(key=lambda answer: answer[1]["req"])  # the error is known at once, the items once computed
    token = server._loop._token  # which server answered: a consumer notices one that came back as another
    assert answers[:3] == [(b"item", {"req": 5 + k, "index": 7 + k, "server": token}, [7 + k] * 2) for k in range(3)]
    assert answers[3] == (
        b"error",
        {
            "req": 8,
            "index": 10,
            "server": token,
            "type": "IndexError",
            "message": "index 10 out of range for the served view of length 10",
            "chain": "",
            "traceback": "",
        },
        None,
    )


def test_a_consumer_reading_in_order_asks_for_the_next_items_in_runs(monkeypatch):
    sent = sent_gets(monkeypatch)
    with lazyseq.serve(range(10), LOOPBACK) as server, lazyseq.connect(server.address, ahead=4) as remote:
        assert [remote[i] for i in range(10)] == list(range(10))
        assert remote[3] == 3  # out of order: that item alone
    assert sent == [
        {"req": 0, "index": 0, "count": 5},  # the item read, and the 4 after it
        {"req": 5, "index": 5, "count": 2},  # read 2: 2 items ahead left, 2 more asked for
        {"req": 7, "index": 7, "count": 2},
        {"req": 9, "index": 9},  # the last one
        {"req": 10, "index": 3},
    ]


def test_reading_the_last_item_again_keeps_what_was_asked_for_ahead(monkeypatch):
    # It was taken for a jump: the consumer dropped its items ahead and the server what it computed ahead, both asked
    # for and computed again at the next read (1,190 items computed for 200 read twice each).
    sent = sent_gets(monkeypatch)
    served, computed = noting_computed(range(10))
    with lazyseq.serve(served, LOOPBACK, nworkers=1) as server, lazyseq.connect(server.address, ahead=4) as remote:
        assert [remote[i] for i in (0, 0, 1, 1, 2)] == [0, 0, 1, 1, 2]
    assert sent == [
        {"req": 0, "index": 0, "count": 5},
        {"req": 5, "index": 0, "again": True},  # item 0 alone, again
        {"req": 6, "index": 1, "again": True},  # item 1 again, and the next one ahead
        {"req": 7, "index": 5},
    ]
    assert [computed.count(i) for i in range(3)] == [2, 2, 1]  # each item read again is computed again, no other

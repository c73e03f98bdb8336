"""The data server: values as read locally, exactly once, no hang, nothing unsafe, nothing left behind.

Servers listen on 127.0.0.1 only; every server, consumer and process a test starts is stopped by it.
"""

import _thread
import concurrent.futures
import contextlib
import errno
import functools
import gc
import json
import logging
import math
import multiprocessing
import os
import pickle
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import served_pipelines
from loader_helpers import die_on, same

import lazyseq
from lazyseq.loading.thread_workers import worker_stopping

zmq = pytest.importorskip("zmq")

from lazyseq.serving import wire  # noqa: E402
from lazyseq.serving.connection import Connection  # noqa: E402
from lazyseq.serving.view_service import ViewService  # noqa: E402

TESTS = Path(__file__).parent
LOOPBACK = "tcp://127.0.0.1:0"


class ServerProcess:
    """``python -m lazyseq.serve served_pipelines:NAME`` in a process of its own; its address from its first line."""

    def __init__(self, name, address=LOOPBACK, *extra):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lazyseq.serve", f"served_pipelines:{name}", "--address", address, *extra],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.address = self.process.stdout.readline().strip()
        assert self.address.startswith("tcp://127.0.0.1:"), self.address

    def kill(self):
        self.process.kill()
        self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process.stdout.close()


@pytest.fixture
def server_process():
    started = []

    def start(name, address=LOOPBACK, *extra):
        server = ServerProcess(name, address, *extra)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@contextlib.contextmanager
def consumer_process(script, *args):
    """A consumer running ``script`` (with ``args``) in a process of its own, its standard input and output piped;
    killed on the way out, whatever it does."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        process.stdin.close()


def run_consumer(script, *args):
    """A consumer running ``script`` (with ``args``) in a process of its own, to its end: what it printed and how it
    ended."""
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60)


def lazyseq_threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("lazyseq-"))


# -- the wire -------------------------------------------------------------------------------


def test_wire_round_trip_keeps_values_and_types():
    for i in (0, 5):
        item = served_pipelines.assorted_item(i)
        tree, buffers = wire.encode(item)
        frames = [wire.dumps(tree), *(memoryview(b).cast("B") for b in buffers)]
        same(wire.decode(wire.loads(frames[0]), frames[1:]), item)


def test_wire_sends_a_str_subclass_as_its_text_not_as_what_str_gives():
    import enum

    class Color(str, enum.Enum):  # noqa: UP042  # what code written before StrEnum does
        RED = "red"

    class Tagged(str):
        def __str__(self):
            return "tagged"

    tree, buffers = wire.encode([Color.RED, {"c": Color.RED}, Tagged("abc")])
    assert wire.decode(wire.loads(wire.dumps(tree)), buffers) == ["red", {"c": "red"}, "abc"]


NUMPY_HAS_STRING_DTYPE = hasattr(getattr(np, "dtypes", None), "StringDType")


@pytest.mark.parametrize(
    "item, message",
    [
        (np.array([1, None]), "the item is an array of Python objects (dtype object): only arrays of plain data"),
        ((1, {"a": [{2, 3}]}), "the item[1]['a'][0] is a builtins.set, which cannot be sent"),
        (np.zeros(2, dtype=[("a", "f4")]), "the item has a structured dtype ([('a', '<f4')])"),
        ([served_pipelines], "the item[0] is a builtins.module, which cannot be sent"),
        (
            np.ma.masked_array([1, 2], [0, 1]),
            f"the item is a {np.ma.MaskedArray.__module__}.MaskedArray: only plain numpy arrays are sent",
        ),
        ({"n": 2**5000}, "the item['n'] is an int of 5001 bits: larger than 4096 bits cannot be sent"),
        pytest.param(
            np.array(["ab", "c"], dtype=np.dtypes.StringDType()) if NUMPY_HAS_STRING_DTYPE else None,
            "the item is an array of variable-width strings (dtype StringDType()): their bytes are not in the array's "
            "buffer; convert it to a fixed-width str dtype",
            marks=pytest.mark.skipif(not NUMPY_HAS_STRING_DTYPE, reason="numpy's StringDType came with numpy 2"),
        ),
    ],
)
def test_wire_refuses_what_needs_code_to_rebuild(item, message):
    with pytest.raises(TypeError) as caught:
        wire.encode(item)
    assert str(caught.value).startswith(message)


def test_an_array_like_that_cannot_be_sent_is_told_how_to_become_one():
    class Column:  # what makes an array (a torch tensor, a pandas Series)
        def __array__(self, dtype=None, copy=None):
            return np.zeros(2)

    with pytest.raises(TypeError) as caught:
        wire.encode((1, Column()))
    assert str(caught.value).endswith(
        "which cannot be sent: items may hold numpy arrays, numbers, strings, bytes and None, in tuples, lists and "
        "dicts; make it one in the pipeline (.numpy(), np.asarray)"
    )


@pytest.mark.parametrize(
    "tree, buffers, message",
    [
        ({"a": [0, "<f8", [2]]}, [b"x" * 8], "buffer 0 holds 8 bytes, an array float64 (2,) needs 16"),
        ({"a": [0, "|O", [1]]}, [b"x" * 8], "dtype '|O' is not allowed: only plain data travels"),
        ({"a": [0, "no such", [1]]}, [b"x"], "not a dtype: 'no such'"),
        ({"a": [1, "<f8", [1]]}, [b"x" * 8], "buffer 1 does not exist: the message has 1"),
        ({"t": [{"b": 0}, {"b": 0}]}, [b"x"], "buffer 0 is used twice"),
        ({"l": []}, [b"x"], "1 buffer(s) of the message are not part of the item"),
        ({"zz": 1}, [], "unknown kind of node 'zz'"),
        ({"a": 1, "b": 2}, [], "not a node of an item: {'a': 1, 'b': 2}"),
        ({"a": [0, "<f8", [-1]]}, [b""], "not an array shape: [-1]"),
        ({"d": [[{"l": []}, 1]]}, [], "a dict key cannot be a list"),
        ({"f": "1e999"}, [], "not a special float: '1e999'"),
        ({"c": [10**400, 0]}, [], "a complex number has parts too large: [1" + "0" * 55 + "..."),
        ({"s": [0, "|S,|,1"]}, [b"x"], "not a dtype: '|S,|,1'"),  # numpy's SyntaxError, reading it as Python
        ({"a": [0, "U0", [2**28]]}, [b""], "dtype 'U0' is not allowed: strings of no characters"),  # not 1 GiB
        (
            {"a": [0, "V0", [2**62, 4]]},
            [b""],
            "not an array shape: [4611686018427387904, 4]",
        ),
        (  # many arrays, each within the limit: the item's values count together
            {"l": [{"a": [k, "V0", [2**23]]} for k in range(3)]},
            [b""] * 3,
            f"{3 * 2**23} values of no bytes (|V0) in arrays of one item: more than 16777216 (each copy of them would "
            "take each in turn)",
        ),
        (  # no memory, but a copy (a batch stacked) would go through each value in turn: for ever
            {"a": [0, "V0", [2**62]]},
            [b""],
            f"{2**62} values of no bytes (|V0) in arrays of one item: more than 16777216 (each copy of them would "
            "take each in turn)",
        ),
        ({"s": [0, "<U1"]}, [b"\xff\xff\xff\xff"], "buffer 0 holds characters beyond Unicode's last (0x10FFFF)"),
        ({"a": [0, "|V0", [0, 2**70]]}, [b""], f"not an array shape: [0, {2**70}]"),  # no elements, too long a side
    ],
)
def test_wire_rejects_malformed_items(tree, buffers, message):
    with pytest.raises(wire.ProtocolError) as caught:
        wire.decode(tree, buffers)
    assert str(caught.value) == message


def test_wire_keeps_the_sign_and_payload_of_a_nan():
    # A NaN went as the text 'nan': one with its sign bit set arrived without it.
    odd = struct.unpack(">d", bytes.fromhex("7ff8000000000123"))[0]
    sent = [-math.nan, math.nan, odd, complex(-math.nan, 1), float("-inf")]
    tree, buffers = wire.encode(sent)
    back = wire.decode(wire.loads(wire.dumps(tree)), buffers)
    bits = [struct.pack(">d", x).hex() for x in [*back[:3], back[3].real, back[4]]]
    assert bits == ["fff8000000000000", "7ff8000000000000", "7ff8000000000123", "fff8000000000000", "fff0000000000000"]
    for garbled in ("nan:3ff0000000000000", "nan:fff8", "nan:FFF8000000000000", 1.5):  # a NaN's bits, of a NaN only
        with pytest.raises(wire.ProtocolError, match="^not a special float: "):
            wire.decode({"f": garbled}, [])


def test_wire_keeps_complex_numbers_with_nan_and_inf():
    tree, buffers = wire.encode([complex(float("nan"), 1), complex(0, float("-inf"))])
    nan, inf = wire.decode(wire.loads(wire.dumps(tree)), buffers)
    assert nan.real != nan.real and nan.imag == 1 and inf == complex(0, float("-inf"))


def test_wire_carries_what_it_sends_at_its_limits():
    # Sent, then refused by the consumer: arrays of 33 to 64 dimensions, a complex number at the deepest level.
    deepest = 1 + 2j
    for _ in range(wire.MAX_DEPTH):
        deepest = [deepest]
    for item in (np.zeros((1,) * NUMPY_MAX_DIMENSIONS), deepest):
        tree, buffers = wire.encode(item)
        same(wire.decode(wire.loads(wire.dumps(tree)), buffers), item)


def test_wire_refuses_arrays_of_more_dimensions_than_numpy_makes():
    # Before numpy 2 (32 dimensions at most), a header of 33 to 64 raised numpy's ValueError, not ProtocolError.
    shape = [1] * (NUMPY_MAX_DIMENSIONS + 1)
    with pytest.raises(wire.ProtocolError) as caught:
        wire.decode({"a": [0, "<f8", shape]}, [b"x" * 8])
    assert str(caught.value).startswith("not an array shape: [1, 1, 1")


def numpy_max_dimensions() -> int:
    for dimensions in (64, 32):  # numpy 2, numpy 1
        try:
            np.empty((1,) * dimensions)
        except ValueError:
            continue
        return dimensions
    raise AssertionError("numpy makes arrays of fewer than 32 dimensions")


NUMPY_MAX_DIMENSIONS = numpy_max_dimensions()


def test_wire_rejects_deep_nesting_and_bad_json():
    deep = 0
    for _ in range(wire.MAX_DEPTH + 2):
        deep = {"t": [deep]}
    with pytest.raises(wire.ProtocolError, match="nested more than 64 levels"):
        wire.decode(deep, [])
    with pytest.raises(wire.ProtocolError, match="a header is not valid JSON"):
        wire.loads(b"\xff{")
    with pytest.raises(wire.ProtocolError, match="Exceeds the limit"):  # a ValueError of json, not a crash
        wire.loads(b"1" * 5000)


# -- values ---------------------------------------------------------------------------------


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
    assert re.search(r"could not compute item 5: .* died with exit code 3 while computing item 5$", failed[5])


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
    from lazyseq.serving.view_service import ViewService

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
    import socket

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


# -- exactly once through failures --------------------------------------------------------


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
        "0, from RuntimeError: no dataset handle in worker 0"
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


def slept(i):
    time.sleep(0.002)
    return i


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
    monkeypatch.setattr(
        Connection, "_parse", staticmethod(lambda frames: parsed.append(frames[1].bytes) or parse(frames))
    )
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


def losing_the_first(kind, also=lambda header: True):
    """A ``Connection.send`` that loses the first request of ``kind`` (for which ``also`` holds) as a connection that
    broke would, and the list of the headers it lost."""
    request_send, lost = Connection.send, []

    def send_request(connection, sent_kind, header, flags=0):
        if sent_kind == kind and not lost and also(header):
            lost.append(header)
            return None
        return request_send(connection, sent_kind, header, flags)

    return send_request, lost


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


def ctrl_c_after(step):
    """``step`` (a method), followed by a Ctrl-C: as if one came as it ended (as a thread started, say)."""

    def interrupted(*args, **kwargs):
        step(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)

    return interrupted


def open_descriptors():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("step", ["__init__", "start"])
def test_a_ctrl_c_as_connect_makes_its_heartbeat_leaves_nothing_behind(monkeypatch, step):
    # The pipes made before the connection's finalizer were left open; and a Ctrl-C as the heartbeat's thread started
    # let it run on after connect() raised, the thread and the collector each closing its descriptors: a number
    # reused meanwhile (by ZeroMQ) was closed under its new owner, which once aborted the process.
    from lazyseq.serving.connection import _Heartbeat

    with lazyseq.serve(range(3), LOOPBACK) as server:
        before = open_descriptors(), lazyseq_threads()
        monkeypatch.setattr(_Heartbeat, step, ctrl_c_after(getattr(_Heartbeat, step)))
        with pytest.raises(KeyboardInterrupt):
            lazyseq.connect(server.address)
        monkeypatch.undo()
        assert (open_descriptors(), lazyseq_threads()) == before
        with lazyseq.connect(server.address) as remote:
            assert list(remote) == [0, 1, 2]


def test_a_ctrl_c_as_serve_starts_its_thread_leaves_nothing_behind(monkeypatch):
    # The server's thread served on, unreachable, its port taken, after serve() raised.
    before = open_descriptors(), lazyseq_threads()
    server_thread = lazyseq.serving.server_loop.threading.Thread
    monkeypatch.setattr(server_thread, "start", ctrl_c_after(server_thread.start))
    with pytest.raises(KeyboardInterrupt):
        lazyseq.serve(range(3), LOOPBACK)
    monkeypatch.undo()
    assert (open_descriptors(), lazyseq_threads()) == before


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


# -- errors ---------------------------------------------------------------------------------


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


def bare_dealer(context, address):
    """A ZeroMQ socket connected to ``address`` that sends and reads raw frames (no lazyseq client); closing it drops
    what it has not sent."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    return dealer


def say_hello(dealer):
    """Say hello on a bare ZeroMQ socket, as a lazyseq consumer does first (else its requests for items are answered
    'forgotten'); the welcome's kind."""
    dealer.send_multipart([wire.TAG, b"hello", b'{"hello": 1, "timeout": 10.0}'])
    return dealer.recv_multipart()[1]


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
    from lazyseq.serving.view_service import ViewService

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


def sent_gets(monkeypatch):
    """The headers of the ``get`` requests that consumers in this process send, as they go out."""
    sent = []
    original = Connection.send

    def record(self, kind, header, flags=0):
        if kind == b"get":
            sent.append(dict(header))
        original(self, kind, header, flags)

    monkeypatch.setattr(Connection, "send", record)
    return sent


def noting_computed(items):
    """A view of ``items`` that notes each item it computes (served with one worker thread: one at a time), and the
    list of them."""
    computed = []

    def compute(x):
        computed.append(x)
        return x

    return lazyseq.smap(compute, items), computed


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


# -- security -------------------------------------------------------------------------------


def test_a_public_address_needs_keys():
    with pytest.raises(ValueError) as caught:
        lazyseq.serve(range(3), "tcp://0.0.0.0:5557")
    assert str(caught.value).startswith(
        "serve: tcp://0.0.0.0:5557 can be reached from other machines, and anyone who reaches it could read the "
        "data; give curve_keypair=zmq.curve_keypair()"
    )
    zmq_keys = pytest.importorskip("zmq").curve_keypair
    with pytest.raises(ValueError) as caught:  # no keys to tell clients apart by: every client would get in
        lazyseq.serve(range(3), LOOPBACK, allowed_clients=[zmq_keys()[0]])
    assert str(caught.value).startswith("serve: allowed_clients needs curve_keypair: clients are told apart by")
    assert lazyseq_threads() == []


@pytest.mark.parametrize(
    ("call", "address", "message"),
    [
        ("serve", "tcp://127.0.0.1:70000", "the port of 'tcp://127.0.0.1:70000' must be a number from 0 to 65535"),
        ("serve", "tcp://127.0.0.1:-1", "the port of 'tcp://127.0.0.1:-1' must be a number from 0 to 65535"),
        ("connect", "tcp://127.0.0.1:0", "the port of 'tcp://127.0.0.1:0' must be a number from 1 to 65535, got '0'"),
        ("serve", "inproc://data", "'inproc://data' is an inproc:// endpoint, which only sockets of one ZeroMQ"),
        ("connect", "inproc://data", "'inproc://data' is an inproc:// endpoint, which only sockets of one ZeroMQ"),
        ("serve", "udp://127.0.0.1:0", "'udp://127.0.0.1:0' is a udp:// endpoint; a lazyseq server and its clients"),
        # (it said the port had to be a number, and that the host was the port)
        ("connect", "tcp://localhost", "'tcp://localhost' has no port: add one, as in 'tcp://localhost:5557'"),
        ("serve", "tcp://[::1]", "'tcp://[::1]' has no port: add one, as in 'tcp://[::1]:5557', or port 0 for any"),
    ],
)
def test_endpoints_no_server_can_use_are_refused(call, address, message):
    # libzmq binds port 70000 as 4464 and -1 as 65535; an inproc client waited out its timeout, then "lost" the server
    with pytest.raises(ValueError) as caught:
        lazyseq.serve(range(3), address) if call == "serve" else lazyseq.connect(address, timeout=0.5)
    assert str(caught.value).startswith(f"{call}: {message}")
    assert lazyseq_threads() == []


def test_an_ipc_file_is_not_taken_from_a_live_server_and_is_removed_at_close(tmp_path):
    path = tmp_path / "data.sock"
    address = f"ipc://{path}"
    with lazyseq.serve(np.arange(3), address):
        with pytest.raises(OSError) as caught:  # ZeroMQ alone replaced the file: new clients read the second server
            lazyseq.serve(np.arange(100, 103), address)
        assert str(caught.value) == (
            f"serve: cannot listen at {address}: another server is listening there (Address already in use); a "
            "server made in this process listens there, still open: close it first (server.close(), or serve in a "
            "with block)"
        )
        # the server that did not start, as a traceback's locals show it (its repr raised AttributeError)
        frames = [frame for frame, _ in traceback.walk_tb(caught.value.__traceback__)]
        unstarted = next(f.f_locals["self"] for f in frames if type(f.f_locals.get("self")).__name__ == "Server")
        assert repr(unstarted) == "<lazyseq.Server that did not start>"
        with lazyseq.connect(address, timeout=5) as remote:
            assert list(remote) == [0, 1, 2]
    assert not path.exists()
    leftover = socket.socket(socket.AF_UNIX)  # the file of a server that ended without removing it
    leftover.bind(str(path))
    leftover.close()
    with lazyseq.serve(np.arange(3), address), lazyseq.connect(address, timeout=5) as remote:
        assert list(remote) == [0, 1, 2]
    assert not path.exists() and lazyseq_threads() == []


def test_serving_at_an_ipc_path_that_is_not_a_socket_leaves_what_is_there(tmp_path):
    # ZeroMQ deleted whatever was at the path: a mistyped path cost the user a file.
    data = tmp_path / "important.csv"
    data.write_text("a,b\n1,2\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    link = tmp_path / "link"
    link.symlink_to(data)
    for path in (data, folder, link):
        address = f"ipc://{path}"
        with pytest.raises(OSError) as caught:
            lazyseq.serve(range(3), address)
        assert str(caught.value) == (
            f"serve: cannot listen at {address}: {path} exists and is not a socket (ZeroMQ would delete it); "
            "choose another path"
        )
    assert data.read_text() == "a,b\n1,2\n" and folder.is_dir() and link.is_symlink()
    assert lazyseq_threads() == []


def test_a_curve_keypair_must_be_a_public_key_and_its_secret_key():
    public, secret = zmq.curve_keypair()
    for pair in [(secret, public), (zmq.curve_keypair()[0], secret)]:  # swapped, or the public key of another pair
        with pytest.raises(ValueError) as caught:  # accepted, and every client then waited out its timeout
            lazyseq.serve(range(3), LOOPBACK, curve_keypair=pair)
        assert str(caught.value) == (
            "serve: curve_keypair[0] is not the public key of curve_keypair[1]: give (public, secret) in that order, "
            "both from one call of zmq.curve_keypair()"
        )
        with pytest.raises(ValueError, match=r"^connect: curve_keypair\[0\] is not the public key of"):
            lazyseq.connect("tcp://127.0.0.1:5557", server_key=public, curve_keypair=pair)
    assert lazyseq_threads() == []


def test_a_wrong_key_leaves_no_zmq_context_behind(recwarn):
    # The consumer's ZeroMQ context was made before its keys were checked, and left to the collector.
    with pytest.raises(ValueError, match="^connect: server_key"):
        lazyseq.connect("tcp://127.0.0.1:5557", server_key=b"not a key")
    gc.collect()
    assert [str(w.message) for w in recwarn if "Unclosed context" in str(w.message)] == []


def test_a_bool_is_not_a_count_and_a_string_is_not_a_flag():
    with pytest.raises(TypeError, match=r"^connect: ahead must be a positive integer, got True$"):
        lazyseq.connect("tcp://127.0.0.1:5557", ahead=True)
    with pytest.raises(TypeError, match=r"^connect: shared_memory must be True or False, got 'no'$"):
        lazyseq.connect("tcp://127.0.0.1:5557", shared_memory="no")  # (taken for True)


@pytest.mark.parametrize(
    ("timeout", "error"),
    [("10", TypeError), (True, TypeError), (0, ValueError), (float("inf"), ValueError), (1e5, ValueError)],
)
def test_a_timeout_must_be_seconds_the_server_accepts_too(timeout, error):
    expected = "connect: timeout must be a finite number of seconds > 0 and <= 86400, got "
    with pytest.raises(error) as caught:  # True was taken as 1 second, 1e5 was asked of a server that ignores it
        lazyseq.connect("tcp://127.0.0.1:5557", timeout=timeout)
    assert str(caught.value) == expected + repr(timeout)
    assert lazyseq_threads() == []


@pytest.mark.parametrize(("timeout", "most"), [(10.0, 500), (2.0, 250), (0.1, 50)])
def test_a_consumer_tries_to_reconnect_at_least_every_half_heartbeat(timeout, most):
    # Tries up to a second apart could miss a server back late within a short timeout: reported lost.
    with lazyseq.serve(range(5), LOOPBACK) as server, lazyseq.connect(server.address, timeout=timeout) as remote:
        sockets = (remote._connection._socket, remote._connection.heartbeat._socket)
        assert [socket.getsockopt(zmq.RECONNECT_IVL_MAX) for socket in sockets] == [most, most]


def test_curve_lets_allowed_clients_in_and_keeps_others_out(caplog):
    caplog.set_level(logging.INFO, logger="lazyseq.serve")
    server_keys, client_keys, stranger_keys = zmq.curve_keypair(), zmq.curve_keypair(), zmq.curve_keypair()
    with lazyseq.serve(range(5), LOOPBACK, curve_keypair=server_keys, allowed_clients=[client_keys[0]]) as server:
        with lazyseq.connect(server.address, server_key=server_keys[0], curve_keypair=client_keys) as remote:
            assert list(remote) == [0, 1, 2, 3, 4]
        with pytest.raises(lazyseq.ServerLost) as caught:
            lazyseq.connect(server.address, timeout=0.5, server_key=server_keys[0], curve_keypair=stranger_keys)
        # refused during the handshake: the hello waits unanswered, or cannot leave if the refusal came first
        assert str(caught.value).endswith(
            " (with CURVE: check server_key, and that the server allows this client's public key)"
        ) and (
            "while waiting for an answer to hello" in str(caught.value) or "could not send to it" in str(caught.value)
        )
        assert server._loop._seen == {}  # nothing the stranger sent was read
        with pytest.raises(lazyseq.ServerLost) as caught:  # without CURVE: no handshake either
            lazyseq.connect(server.address, timeout=0.5)
        assert str(caught.value).endswith(
            " (nothing answered at that address; a server with CURVE keys needs server_key and curve_keypair here)"
        )
    assert not [r for r in caplog.records if "rejected" in r.getMessage()]


# -- bounds and cleanup -----------------------------------------------------------------------


def test_what_is_held_for_a_consumer_stays_bounded():
    with lazyseq.serve(served_pipelines.numbers(), LOOPBACK, nworkers=2, max_buffered=3) as server:
        with lazyseq.connect(server.address, ahead=2) as remote:
            reads = server._loop._service._reads
            for i in range(100):
                assert remote[i] == i
                held = [len(r.held) for r in list(reads.values())]
                assert all(n <= 3 + 2 + 1 for n in held), held
                assert len(remote._asked) + len(remote._arrived) <= 2


def test_close_and_garbage_collection_leave_nothing_behind():
    def serve_large_items():  # pyzmq starts a thread of its own, for the buffers sent without a copy, and keeps it
        with lazyseq.serve(lazyseq.smap(np.ones, [2**17, 2**18]), LOOPBACK, nworkers=2) as server:
            with lazyseq.connect(server.address, shared_memory=False) as remote:
                assert [x.nbytes for x in remote] == [2**20, 2**21]

    serve_large_items()
    gc.collect()
    threads = set(threading.enumerate())
    fds = len(os.listdir("/proc/self/fd"))
    serve_large_items()
    with lazyseq.serve(range(20), LOOPBACK, nworkers=2) as server:
        remote = lazyseq.connect(server.address)
        assert list(remote) == list(range(20))
        remote.close()
    server = lazyseq.serve(iter(range(20)), LOOPBACK)
    stream = lazyseq.connect(server.address)
    assert next(stream) == 0
    del server, stream  # garbage collection closes both
    gc.collect()
    assert lazyseq_threads() == []
    assert set(threading.enumerate()) == threads
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_server_collected_leaves_a_busy_worker_thread_to_end_on_its_own(monkeypatch):
    # Dropped unclosed (a notebook's cell run again), it waited up to 10 s for worker threads busy in an item: the
    # collector's close reached them through the server's own thread, which did not know who closed it.
    import lazyseq.loading.thread_workers as thread_workers

    waits = []
    monkeypatch.setattr(thread_workers, "wait_unless_hurried", lambda wait, seconds: waits.append(seconds))
    started, release = threading.Event(), threading.Event()

    def blocking():
        started.set()
        release.wait()  # the first item takes its time (a stream is drawn before anyone asks)
        yield np.zeros(2)

    before = set(threading.enumerate())
    server = lazyseq.serve(blocking(), LOOPBACK)
    assert started.wait(10)
    busy = set(threading.enumerate()) - before
    del server
    gc.collect()
    assert waits == [] and any(thread in thread_workers._busy_at_exit for thread in busy)
    release.set()
    for thread in busy:
        thread.join(10)
    assert not any(thread.is_alive() for thread in busy)


def test_a_server_collected_in_its_own_thread_stops_and_releases_all():
    # The collector ran in the server's thread (which allocates as it polls): stop() waited in context.term() for
    # the sockets that very thread held, for ever; its workers were never stopped, its consumers lost it.
    server = lazyseq.serve(lazyseq.view(np.arange(10)), LOOPBACK, nworkers=2)
    service, collect = server._loop._service, threading.Event()
    real_work = service.work

    def work():  # what the server's thread runs at each turn of its loop: the collection comes there
        if collect.is_set():
            collect.clear()
            gc.collect()
        return real_work()

    service.work = work
    cycle = {"server": server}
    cycle["self"] = cycle  # freed by the cyclic collector only
    thread = server._loop.thread
    del server, cycle
    collect.set()
    thread.join(30)
    assert not thread.is_alive() and not collect.is_set()
    for worker in lazyseq_threads():
        worker.join(10)
    assert lazyseq_threads() == []


def test_import_lazyseq_imports_no_zmq():
    code = "import sys, lazyseq; print([m for m in sys.modules if m.split('.')[0] == 'zmq'])"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"


def test_the_command_says_what_is_wrong_with_its_argument():
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    run = subprocess.run(
        [sys.executable, "-m", "lazyseq.serve", "served_pipelines:nothing"], capture_output=True, text=True, env=env
    )
    assert run.returncode == 1
    assert run.stderr.strip() == "lazyseq.serve: module 'served_pipelines' has no attribute 'nothing'"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["nosuchmodule:x"], "lazyseq.serve: cannot import 'nosuchmodule': No module named 'nosuchmodule'"),
        (  # (a file's path ended in importlib's TypeError, with a traceback)
            ["./data.py:batches"],
            "lazyseq.serve: './data.py:batches' names a file: name its module and attribute as python -m would, "
            "e.g. data:batches",
        ),
        (
            ["../project/data.py:batches"],
            "lazyseq.serve: '../project/data.py:batches' names a file: name its module and attribute as python -m "
            "would (from ../project, or with it on PYTHONPATH), e.g. data:batches",
        ),
        (
            ["/srv/project/data.py:batches"],
            "lazyseq.serve: '/srv/project/data.py:batches' names a file: name its module and attribute as python -m "
            "would (from /srv/project, or with it on PYTHONPATH), e.g. data:batches",
        ),
        (
            ["string:digits", "--address", "bogus"],
            "lazyseq.serve: address must look like 'tcp://127.0.0.1:5557'",
        ),
        (
            ["os.path:join"],
            "lazyseq.serve: os.path:join is a function that needs arguments (missing a required argument: 'a'); "
            "name a view, or a function that takes none and returns one",
        ),
        (["string:digits", "--keys", "/nonexistent"], "lazyseq.serve: --keys /nonexistent: no /nonexistent/server.key"),
        (
            ["string:digits", "--address", "tcp://0.0.0.0:0"],
            "lazyseq.serve: tcp://0.0.0.0:0 can be reached from other machines, and anyone who reaches it could read "
            "the data; give --keys DIR (its server.key_secret, and clients/*.key for the clients let in), bind to "
            "127.0.0.1, or pass --insecure on a network you trust\n",
        ),
    ],
)
def test_the_command_says_what_is_wrong_without_a_traceback(arguments, message):
    run = subprocess.run([sys.executable, "-m", "lazyseq.serve", *arguments], capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.startswith(message) and "Traceback" not in run.stderr


COMMAND_MODULE = """
import numpy as np
print("loading the data...")


class Batches:
    pass


def nothing():
    pass


class Odd:
    def __len__(self):
        raise ValueError("the length is in another file")

    def __getitem__(self, i):
        return i


odd = Odd()
view = np.arange(4)
"""


@pytest.mark.parametrize(
    ("source", "says", "traceback"),
    [
        ("data:Batches", "lazyseq.serve: data:Batches is a class: name an instance of it in data (a view, a", False),
        (
            "data:nothing",
            "lazyseq.serve: data:nothing() returned None: it should return a view (or an iterable)",
            False,
        ),
        ("needs_more:x", "ModuleNotFoundError: No module named 'nosuchdependency'", True),  # the module's own import
        (
            "data:odd",
            "ValueError: the length is in another file",
            True,
        ),  # the pipeline's own error: where it was raised
    ],
)
def test_the_command_says_what_is_wrong_with_the_source_and_shows_where_the_pipeline_failed(
    tmp_path, source, says, traceback
):
    # A class got "call it: serve(f())", which the command does not do; a function that returned None, "got NoneType";
    # a module that imports a missing one, "cannot import 'needs_more'"; an error of the pipeline, one line, no trace.
    (tmp_path / "data.py").write_text(COMMAND_MODULE)
    (tmp_path / "needs_more.py").write_text("import nosuchdependency\n")
    run = subprocess.run(
        [sys.executable, "-m", "lazyseq.serve", source, "--address", "tcp://127.0.0.1:0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and run.stdout == ""
    assert (says in run.stderr, "Traceback" in run.stderr) == (True, traceback)


def test_the_command_prints_the_address_first_whatever_the_module_prints(tmp_path):
    (tmp_path / "data.py").write_text(COMMAND_MODULE)
    server = subprocess.Popen(
        [sys.executable, "-m", "lazyseq.serve", "data:view", "--address", "tcp://127.0.0.1:0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = server.stdout.readline().strip()
        with lazyseq.connect(address, timeout=30) as remote:
            assert list(remote) == [0, 1, 2, 3]
    finally:
        server.terminate()
        _, err = server.communicate(timeout=60)
    assert server.returncode == 0 and err == "loading the data...\n"


def test_the_command_names_the_key_file_that_is_wrong(tmp_path):
    # A pair whose halves differ was refused in the words of serve()'s curve_keypair, which the command hides.
    import zmq.auth

    zmq.auth.create_certificates(str(tmp_path), "server")
    os.chmod(tmp_path / "server.key_secret", 0o600)
    other_public, _ = zmq.curve_keypair()
    pair = (tmp_path / "server.key_secret").read_text()
    public = zmq.auth.load_certificate(tmp_path / "server.key_secret")[0].decode()
    (tmp_path / "server.key_secret").write_text(pair.replace(public, other_public.decode()))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lazyseq.serve",
            "string:digits",
            "--keys",
            str(tmp_path),
            "--address",
            "tcp://127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    assert run.stderr == (
        f"lazyseq.serve: {tmp_path / 'server.key_secret'}: its public key is not that of its secret key; make the "
        "pair again with zmq.auth.create_certificates\n"
    )


def test_the_command_says_a_key_directory_cannot_be_read_without_a_traceback():
    # Read where the pipeline's own errors keep their traceback, an unreadable directory printed one. (In a process of
    # its own: importing the command's module makes it the package's serve.)
    code = (
        "import lazyseq.serve as command\n"
        "def unreadable(directory):\n"
        "    raise PermissionError(13, 'Permission denied', directory + '/server.key_secret')\n"
        "command.read_keys = unreadable\n"
        "command.main(['string:digits', '--keys', '/locked', '--address', 'tcp://127.0.0.1:0'])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stderr) == (
        1,
        "lazyseq.serve: [Errno 13] Permission denied: '/locked/server.key_secret'\n",
    )


def test_the_commands_sigterm_is_handled_as_ctrl_c_is_at_that_moment():
    # SIGTERM raised KeyboardInterrupt wherever it came, in a close that defers a Ctrl-C too: a second one left the
    # ipc:// file and ZeroMQ's context behind.
    code = (
        "import signal, lazyseq.serve as command\n"
        "heard = []\n"
        "signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))\n"
        "command._as_ctrl_c(signal.SIGTERM, None)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a background job of a shell script): it still stops\n"
        "try:\n"
        "    command._as_ctrl_c(signal.SIGTERM, None)\n"
        "except KeyboardInterrupt:\n"
        "    heard.append('stopped')\n"
        "print(heard == [signal.SIGINT, 'stopped'])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.stdout, run.stderr) == ("True\n", "")


def test_importing_the_command_module_leaves_serve_callable():
    # import lazyseq.serve (documentation tools do) made lazyseq.serve that module: "'module' object is not callable"
    code = (
        "import lazyseq.serve, lazyseq\n"
        "with lazyseq.serve(range(3), 'tcp://127.0.0.1:0') as server:\n"
        "    print(list(lazyseq.connect(server.address)))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.stdout, run.stderr) == ("[0, 1, 2]\n", "")


def test_serve_forever_returns_when_closed_from_another_thread():
    server = lazyseq.serve(range(3), LOOPBACK)
    closer = threading.Timer(0.05, server.close)
    closer.start()
    server.serve_forever()
    closer.join()
    assert server.closed and lazyseq_threads() == []


def test_serve_forever_returns_when_a_signal_handler_closes_the_server_as_its_wait_ends(monkeypatch):
    # python -m lazyseq.serve stopped by SIGTERM (docker stop, systemd) exited with status 1 and "stopped on an
    # error": its handler, close(), had run between the end of a wait and the look at the server's thread.
    server = lazyseq.serve(range(3), LOOPBACK)
    waits = []

    def wait(timeout):
        waits.append(timeout)
        if len(waits) == 1:
            server.close()  # the handler, run as the wait timed out
            return False
        return True

    monkeypatch.setattr(server._stopped, "wait", wait)
    server.serve_forever()
    assert server.closed and lazyseq_threads() == []


@pytest.mark.parametrize("served", ["data:batches", "data:stream"])
def test_the_guide_two_script_workflow_runs_as_written(tmp_path, served):
    guide = (TESTS.parent / "docs" / "guide" / "serving.md").read_text()
    blocks = [block.split("```")[0] for block in guide.split("```python\n")[1:]]
    for name in ("data.py", "train.py"):
        (tmp_path / name).write_text(next(b for b in blocks if b.startswith(f'"""{name}')))
    alone = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert alone.stdout.startswith("training took ")
    server = subprocess.Popen(
        [sys.executable, "-m", "lazyseq.serve", served, "--address", "tcp://127.0.0.1:0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        address = server.stdout.readline().strip()
        train = (tmp_path / "train.py").read_text().replace("tcp://127.0.0.1:5557", address)
        (tmp_path / "train.py").write_text(train)
        parallel = subprocess.run(
            [sys.executable, "train.py", "--parallel"], cwd=tmp_path, capture_output=True, text=True, check=True
        )
        assert parallel.stdout.startswith("training took ")
    finally:
        server.terminate()
        server.wait()
        server.stdout.close()


class Counter:
    def __init__(self):
        self.count = 0

    def __call__(self):
        self.count += 1
        return np.full(3, self.count)


def test_a_load_buffers_iterator_is_served_as_a_stream_of_copies():
    with lazyseq.load_buffers(Counter(), max_cached=2, nworkers=1) as buffers:  # slots reused: the server copies
        with lazyseq.serve(buffers, LOOPBACK, max_buffered=3) as server, lazyseq.connect(server.address) as stream:
            got = [next(stream) for _ in range(12)]
    assert sorted(int(x[0]) for x in got) == list(range(1, 13))
    assert all((x == x[0]).all() for x in got)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_worker_processes_read_a_served_view_over_connections_of_their_own(start_method):
    with lazyseq.serve(served_pipelines.numbers(), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        assert remote[0] == 0  # connected in the parent before the workers fork
        doubled = remote.smap(served_pipelines.double)
        with lazyseq.prefetch(doubled, nworkers=2, method="process", start_method=start_method) as ahead:
            assert list(ahead) == [2 * i for i in range(100)]
        assert remote[99] == 99  # the parent's connection is still its own


def test_a_huge_request_or_item_harms_only_itself(caplog):
    caplog.set_level(logging.WARNING, logger="lazyseq.serve")
    items = lazyseq.smap(lambda i: 10**5000 if i == 1 else i, range(5))
    with lazyseq.serve(items, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        context = zmq.Context()
        rogue = bare_dealer(context, server.address)
        rogue.send_multipart([wire.TAG, b"get", b'{"req": ' + b"1" * 5000 + b', "index": 0}'])
        assert rogue.recv_multipart()[1] == b"refused"
        rogue.close()
        context.term()
        with pytest.raises(lazyseq.EvaluationError, match="item 1 cannot be sent: the item is an int of 16610 bits"):
            remote[1]
        assert [remote[i] for i in range(5) if i != 1] == [0, 2, 3, 4]
    assert any("an integer of 5000 digits: longer than any count" in r.getMessage() for r in caplog.records)


def test_what_was_computed_ahead_for_a_consumer_gone_quiet_goes_before_its_timeout(monkeypatch):
    # A consumer with a long timeout that was killed kept its items computed ahead until then: so many consumers
    # said hello with a timeout of a day, asked for an item and left, and the server's memory grew with each.
    from lazyseq.serving import server_loop
    from lazyseq.serving.view_service import ViewService

    monkeypatch.setattr(server_loop, "QUIET_HEARTBEATS", 0.2)  # a fifth of a heartbeat: quiet at once
    idled, real_idle = threading.Event(), ViewService.idle

    def idle(service, consumer):
        real_idle(service, consumer)
        idled.set()

    monkeypatch.setattr(ViewService, "idle", idle)
    with lazyseq.serve(lazyseq.smap(abs, range(30)), LOOPBACK, nworkers=1, max_buffered=8) as server:
        context = zmq.Context()
        quiet = bare_dealer(context, server.address)  # no heartbeats
        quiet.send_multipart([wire.TAG, b"hello", wire.dumps({"timeout": 86400})])
        assert quiet.recv_multipart()[1] == b"welcome"
        quiet.send_multipart([wire.TAG, b"get", wire.dumps({"req": 0, "index": 0})])
        assert wire.loads(quiet.recv_multipart()[2])["tree"] == 0
        assert idled.wait(30)
        [reads] = server._loop._service._reads.values()  # not forgotten: its hello, its reads go on
        assert reads.held == set()
        quiet.send_multipart([wire.TAG, b"get", wire.dumps({"req": 1, "index": 1})])
        assert wire.loads(quiet.recv_multipart()[2])["tree"] == 1
        quiet.close()
        context.term()


def test_pings_from_strangers_leave_nothing_on_the_server():
    with lazyseq.serve(range(3), LOOPBACK) as server:
        context = zmq.Context()
        rogue = bare_dealer(context, server.address)
        for _ in range(200):
            rogue.send_multipart([wire.TAG, b"ping", wire.dumps({"client": os.urandom(16).hex(), "timeout": 9e4})])
        for _ in range(200):
            assert rogue.recv_multipart()[1] == b"pong"
        assert server._loop._seen == {}
        rogue.close()
        context.term()


def test_out_of_order_reads_compute_only_what_is_read():
    computed = []
    items = lazyseq.smap(lambda i: computed.append(i) or i, range(100))  # worker threads: the same process
    with (
        lazyseq.serve(items, LOOPBACK, nworkers=2, max_buffered=8) as server,
        lazyseq.connect(server.address) as remote,
    ):
        picks = np.random.default_rng(0).permutation(100)[:20].tolist()
        assert [remote[i] for i in picks] == picks
        assert sorted(computed) == sorted(picks)


def test_a_forked_child_leaves_the_parent_server_running():
    with lazyseq.serve(range(3), LOOPBACK) as server:
        pid = os.fork()
        if pid == 0:  # the child inherits the server object: what its exit runs must not stop the parent's
            server._finalizer()
            os._exit(0)
        os.waitpid(pid, 0)
        with lazyseq.connect(server.address, timeout=5) as remote:
            assert list(remote) == [0, 1, 2]


def test_a_forked_child_that_closes_its_copy_of_a_consumer_leaves_the_parent_waiting_quietly():
    # The child's close() woke the parent's reader through their shared pipe, for ever: 100% CPU in every wait.
    with lazyseq.serve(range(3), LOOPBACK) as server, lazyseq.connect(server.address, timeout=5) as remote:
        assert remote[0] == 0
        pid = os.fork()
        if pid == 0:
            remote.close()
            os._exit(0)
        os.waitpid(pid, 0)
        connection = remote._connection
        assert not connection.closed
        assert select.select([connection._wake_fd], [], [], 0)[0] == []  # the wake-up pipe stayed empty
        assert remote[1] == 1


def test_keys_without_clients_warn_that_nobody_gets_in(tmp_path):
    zmq_auth = pytest.importorskip("zmq.auth")
    os.chmod(zmq_auth.create_certificates(str(tmp_path), "server")[1], 0o600)
    code = f"from lazyseq.serve import read_keys\nprint(read_keys({str(tmp_path)!r})[1])"  # not imported here
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.stdout, run.stderr) == (
        "[]\n",
        f"lazyseq.serve: warning: --keys {tmp_path}: no {tmp_path / 'clients' / '*.key'}: no client will be let in\n",
    )


def test_a_secret_key_that_others_can_read_is_warned_about(tmp_path):
    zmq_auth = pytest.importorskip("zmq.auth")
    secret = zmq_auth.create_certificates(str(tmp_path), "server")[1]
    os.chmod(secret, 0o644)  # what zmq.auth leaves under the usual umask
    os.makedirs(tmp_path / "clients")
    zmq_auth.create_certificates(str(tmp_path / "clients"), "trainer")
    os.remove(tmp_path / "clients" / "trainer.key_secret")
    code = f"from lazyseq.serve import read_keys\nprint(len(read_keys({str(tmp_path)!r})[1]))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.stdout, run.stderr) == (
        "1\n",
        f"lazyseq.serve: warning: {secret} can be read by other users (mode 644): whoever reads it can pose as this "
        "server; chmod 600 it\n",
    )


READER_AT_EXIT = """
import threading, time
import lazyseq

def slow(x):
    time.sleep(1)
    return x

server = lazyseq.serve(lazyseq.view(range(5)).smap(slow), "tcp://127.0.0.1:0")
remote = lazyseq.connect(server.address, timeout=10)
reading = threading.Event()

def read():
    reading.set()
    remote[0]

threading.Thread(target=read, daemon=True).start()
reading.wait()
print("main thread exits")
"""


def test_a_reader_thread_still_waiting_at_exit_gets_no_zeromq_error():
    # At exit, the connection's finalizer closed the socket under the waiting thread: ZMQError, non-socket.
    done = subprocess.run([sys.executable, "-c", READER_AT_EXIT], capture_output=True, text=True, timeout=120)
    assert (done.stdout, done.stderr, done.returncode) == ("main thread exits\n", "", 0)


class InterruptedSend:
    """Raises KeyboardInterrupt, as a Ctrl-C landing there would, in the next send of a request of ``kind``: after
    its first frame went out (``part_way``), or before anything of it did."""

    def __init__(self, monkeypatch, kind, part_way):
        self.kind, self.part_way, self.armed = kind, part_way, False
        frame_send, request_send = zmq.Socket.send, Connection.send

        def send_frame(socket, data, flags=0, **options):
            sent = frame_send(socket, data, flags, **options)
            reader = threading.current_thread() is threading.main_thread()  # not the server's thread
            if self.armed and self.part_way and self.sending and reader and flags & zmq.SNDMORE:
                self.armed = False
                raise KeyboardInterrupt
            return sent

        def send_request(connection, kind, header, flags=0):
            self.sending = kind == self.kind
            if self.armed and not self.part_way and self.sending:
                self.armed = False
                raise KeyboardInterrupt
            return request_send(connection, kind, header, flags)

        self.sending = False
        monkeypatch.setattr(zmq.Socket, "send", send_frame)
        monkeypatch.setattr(Connection, "send", send_request)


@pytest.mark.parametrize("part_way", [True, False])
def test_a_ctrl_c_while_a_request_is_sent_loses_nothing(monkeypatch, part_way):
    # Part-way: the next request was glued to the frames sent, and refused ("unknown request b'lazyseq/2'"); a stream
    # then waited for ever for the item asked for. Before: the item taken out was lost, and the stream waited too.
    interrupt = InterruptedSend(monkeypatch, b"get", part_way)
    with lazyseq.serve(np.arange(100) * 10, LOOPBACK) as server:
        with lazyseq.connect(server.address, timeout=3, ahead=1, shared_memory=False) as remote:
            assert remote[0] == 0
            interrupt.armed = True
            with pytest.raises(KeyboardInterrupt):
                remote[50]
            assert [remote[60], remote[50], remote[61]] == [600, 500, 610]
    interrupt.kind = b"next"
    with lazyseq.serve(iter(range(10)), LOOPBACK) as server:
        with lazyseq.connect(server.address, timeout=2, ahead=1) as stream:
            got = [next(stream)]
            interrupt.armed = True
            with pytest.raises(KeyboardInterrupt):
                next(stream)
            got.extend(stream)
        with lazyseq.connect(server.address, timeout=2) as other:
            assert list(other) == []
    assert got == list(range(10))


def test_a_stream_whose_request_was_lost_asks_again_after_a_silence(monkeypatch):
    # A 'next' lost on the way (a connection that broke as it was sent): the consumer waited for the item it had
    # asked for, and the server, alive and answering heartbeats, for a request: for ever.
    send_request, lost = losing_the_first(
        b"next", lambda header: header.get("more") and threading.current_thread().name == "MainThread"
    )
    with lazyseq.serve(iter(range(5)), LOOPBACK) as server:
        with lazyseq.connect(server.address, timeout=1, ahead=1) as stream:
            monkeypatch.setattr(Connection, "send", send_request)
            assert list(stream) == [0, 1, 2, 3, 4]
    assert [(header["more"], header["ack"]) for header in lost] == [(1, [])]  # the first: asking for item 0


def test_a_ctrl_c_while_a_server_closes_cuts_the_wait_short_and_still_releases_everything(tmp_path):
    # The close stopped where the interrupt came (the wait for a thread drawing a slow stream item): the socket file
    # and a pipe stayed, and a second close() did nothing.
    release, drawing = threading.Event(), threading.Event()

    def slow():
        yield 0
        drawing.set()
        while not worker_stopping():  # drawing item 1 as the server closes
            release.wait(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C during the close
        release.wait(30)
        yield 1

    path = tmp_path / "stream.sock"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server = lazyseq.serve(slow(), f"ipc://{path}")
        assert drawing.wait(10)
        with pytest.raises(KeyboardInterrupt):
            server.close()
    finally:
        signal.signal(signal.SIGINT, previous)
        release.set()
    assert not path.exists() and not server._loop.thread.is_alive()


SERVE_INTERRUPTED = """
import signal, zmq, lazyseq

class Interrupted(zmq.Context):
    def socket(self, *args, **kwargs):
        made = super().socket(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C as the socket is made, before serve() holds it
        return made

zmq.Context = Interrupted
try:
    lazyseq.serve(range(10), "tcp://127.0.0.1:0")
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_a_ctrl_c_while_serve_makes_its_socket_is_raised_once_the_socket_is_closed():
    # The socket was not listed yet: closing the context waited for it, for ever.
    done = subprocess.run([sys.executable, "-c", SERVE_INTERRUPTED], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "interrupted\n"), done.stderr


def test_a_ctrl_c_while_a_consumer_closes_is_raised_once_all_is_released(monkeypatch):
    # Raised at once, it left the heartbeat thread and ZeroMQ's context running.
    from lazyseq.serving import connection

    release = connection._release

    def interrupted(*args):
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C (the first one ended a read) as the consumer closes
        release(*args)

    with lazyseq.serve(iter(range(10)), LOOPBACK) as server:
        stream = lazyseq.connect(server.address)
        assert next(stream) == 0
        monkeypatch.setattr(connection, "_release", interrupted)
        with pytest.raises(KeyboardInterrupt):
            stream.close()
        assert stream._connection._context.closed and "lazyseq-connect-heartbeat" not in lazyseq_threads()


def test_a_ctrl_c_while_the_garbage_collector_closes_a_consumer_is_raised_once_all_is_released(monkeypatch):
    # The close run for a consumer dropped unclosed deferred nothing: it stopped at the Ctrl-C, and left the
    # heartbeat thread, ZeroMQ's context and the pipes that wake the threads; the interrupt was printed and dropped.
    from lazyseq.serving import connection

    stop = connection._Heartbeat.stop

    def interrupted(heartbeat):
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C as the heartbeat thread stops
        stop(heartbeat)

    def described(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            return None

    with lazyseq.serve(iter(range(10)), LOOPBACK) as server:
        stream = lazyseq.connect(server.address)
        assert next(stream) == 0
        context, heartbeat = stream._connection._context, stream._connection.heartbeat
        pipes = {
            fd: described(fd)
            for fd in (
                stream._connection._wake_fd,
                stream._connection._waker_fd,
                heartbeat._wake_fd,
                heartbeat._waker_fd,
            )
        }
        monkeypatch.setattr(connection._Heartbeat, "stop", interrupted)
        with pytest.raises(KeyboardInterrupt):
            del stream  # the last reference: the finalizer closes the connection
            threading.Event().wait(timeout=60)  # the interrupt comes here, once the close returned
        monkeypatch.undo()
        assert context.closed and not heartbeat.is_alive()
        assert all(described(fd) != pipe for fd, pipe in pipes.items())  # closed (or another's since)


# -- a batch of a served view: its items at once ---------------------------------------------


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


def test_a_worker_process_that_dies_on_a_batch_fails_that_batch_and_new_workers_read_the_others():
    source = lazyseq.smap(die_on(5, "exit"), range(20))  # item 5 ends every worker process that reads it
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
        r"could not compute items 4 to 7: .* died with exit code 3 while computing items 4 to 7$", outcomes[1]
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


def drive(service, until, seconds=30):
    """Let the service take its workers' results until ``until()`` holds."""
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:
        service.work()
        time.sleep(0.01)
    assert until()


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

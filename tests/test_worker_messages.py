"""The messages between a loader and its worker processes survive encoding, packed or pickled."""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest

import lazyseq
from lazyseq.loading.messages import PickledResult, RunTasks, SharedResult, Stop, Task, decode, encode


@pytest.mark.parametrize(
    ("tasks", "packed"),
    [
        ([Task(0, 0, -1), Task(7, 7, 3), Task(2**62, 2**62, 0)], True),  # prefetch: item i is task i
        ([Task(4, None, 1), Task(5, None, -1)], True),  # load_buffers: no argument
        ([], True),
        ([Task(1, 1, 0), Task(2, None, 0)], False),  # both kinds in one message
        ([Task(1, 2, 0)], False),  # an argument that is not the task
        ([Task(1, True, 0)], False),  # equal to the task, but a bool
        ([Task(2**63, 2**63, 0)], False),  # beyond 64 bits
        ([Task("a", "a", 0)], False),
        ([Task(np.int64(3), np.int64(3), 0)], False),
    ],
)
def test_tasks_come_back_equal_with_their_types(tasks, packed):
    raw = encode(RunTasks(tasks))
    assert (raw[0] != 0x80) is packed
    back = decode(raw)
    assert back == RunTasks(tasks)
    assert [tuple(map(type, task)) for task in back.tasks] == [tuple(map(type, task)) for task in tasks]


def test_a_result_in_a_slot_comes_back_equal_from_bytes_and_from_a_bytearray():
    skeleton = ("d", ("x", 1), [("a", 0), ("v", 1.5)])
    message = SharedResult(2**40, 3, skeleton, [("<f8", (256, 248), 0), ("<i8", (256,), 507904)], 1.25e-4)
    raw = encode(message)
    assert raw[:1] == b"s"
    assert decode(raw) == message
    assert decode(bytearray(raw)) == message
    assert type(decode(raw).skeleton[1][1]) is int


def test_other_messages_are_pickled():
    for message in (Stop(), PickledResult("k", -1, {"a": [1]}, 0, 0.5), SharedResult("k", 0, ("a", 0), [], 0.0)):
        raw = encode(message)
        assert raw[0] == 0x80
        assert decode(raw) == message


@pytest.mark.parametrize("dtype", [">M8[ns]", ">m8[s]", "<M8[D]", ">i4", ">f8", [("o", "O"), ("b", ">i4")]])
def test_a_pickled_result_keeps_the_byte_order_of_its_arrays(dtype, tmp_path):
    # numpy pickles times of the other byte order, and other arrays of it that are not contiguous, as arrays of
    # this one: '>M8[ns]' came back '<M8[ns]'. (Arrays of Python objects go as numpy pickles them, byte order kept.)
    a = np.array([(k, k) for k in range(6)], dtype) if isinstance(dtype, list) else np.arange(6).astype(dtype)
    mapped = np.lib.format.open_memmap(tmp_path / "a.npy", "w+", dtype, (6,)) if not a.dtype.hasobject else a
    mapped[:] = a
    sent = {"t": a, "every other": a[::2], "mapped": mapped[1:]}
    back = decode(encode(PickledResult(0, -1, sent, 0, 0.0))).result
    assert {key: value.dtype for key, value in back.items()} == {key: a.dtype for key in sent}
    assert {key: value.tolist() for key, value in back.items()} == {key: value.tolist() for key, value in sent.items()}


def test_an_unknown_message_kind_is_an_error():
    with pytest.raises(ValueError, match="^unknown message kind 0x7a$"):
        decode(b"z")


def test_a_one_array_result_decodes_to_the_one_array_skeleton_and_a_numpy_dtype():
    from lazyseq.loading.messages import decode_shared
    from lazyseq.loading.structure import ONE_ARRAY

    raw = encode(SharedResult(5, 1, ("a", 0), [(">i4", (3, 2), 64)], 0.5))
    for _ in range(2):  # the second time from what the first remembered
        task, slot, skeleton, ((dtype, shape, offset),), seconds = decode_shared(raw)
        assert (task, slot, skeleton is ONE_ARRAY, dtype, shape, offset, seconds) == (
            5,
            1,
            True,
            ">i4",
            (3, 2),
            64,
            0.5,
        )
        assert dtype == np.dtype(">i4") and isinstance(dtype, np.dtype)


def test_read_frame_reads_one_message_and_nothing_after_it():
    import os
    import threading

    from lazyseq.loading.messages import frame_header, read_frame, write_all

    read, write = os.pipe()
    big = bytes(range(256)) * 1000  # more than a pipe holds: read in parts
    writer = threading.Thread(
        target=write_all,
        args=(write, frame_header(3) + b"abc" + frame_header(0) + frame_header(len(big)) + big + b"next"),
    )
    writer.start()
    try:
        assert read_frame(read) == b"abc"
        assert read_frame(read) == b""
        assert read_frame(read) == big
        writer.join()
        assert os.read(read, 10) == b"next"
        write_all(write, frame_header(10) + b"cut")  # the writer goes away in the middle of a message
        os.close(write)
        write = -1
        with pytest.raises(EOFError, match="^the connection closed$"):
            read_frame(read)
        with pytest.raises(EOFError, match="^the connection closed$"):
            read_frame(read)
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)


def test_a_worker_far_ahead_sends_cheap_results_half_its_hand_at_a_time():
    # Three to a write woke the consumer a time in three results: its CPU and the workers' went to the wake-ups.
    import os

    from lazyseq.loading.worker_process import Outbox

    read, write = os.pipe()
    try:
        outbox = Outbox(write)
        held = []
        for k in range(10):  # ten tasks in hand: the first result has nine after it
            outbox.add(b"r%d" % k)
            held.append(outbox.due(remaining=9 - k, seconds=1e-5))
        assert held == [False, False, False, False, True, True, True, True, True, True]
    finally:
        os.close(read)
        os.close(write)


def test_cheap_results_go_back_together_and_a_slow_or_last_one_at_once():
    import os

    from lazyseq.loading.worker_process import Outbox

    read, write = os.pipe()
    try:
        outbox = Outbox(write)
        outbox.add(b"r1")
        assert not outbox.due(remaining=5, seconds=1e-5)  # the next task comes soon: wait for it
        outbox.add(b"r2")
        assert not outbox.due(remaining=4, seconds=1e-5)
        outbox.add(b"r3")
        assert outbox.due(remaining=3, seconds=1e-5)  # Outbox.TOGETHER of them
        assert Outbox.TOGETHER == 3
        outbox.send()
        outbox.add(b"r4")
        assert outbox.due(remaining=2, seconds=Outbox.HOLD_SECONDS)  # a slow task: the next would come late
        outbox.send()
        outbox.add(b"r5")
        assert outbox.due(remaining=0, seconds=1e-5)  # the last of its run
        outbox.send()
        assert os.read(read, 1000) == b"".join(b"\x00\x00\x00\x02r%d" % k for k in range(1, 6))
    finally:
        os.close(read)
        os.close(write)


def test_slots_are_taken_together_in_the_order_one_by_one_would_give_them():
    from lazyseq.loading.shared_slots import SharedSlots

    one, many = SharedSlots(4, 4096, "test"), SharedSlots(4, 4096, "test")
    try:
        assert [one.take() for _ in range(3)] == many.take_many(3) == [3, 2, 1]
        assert many.take_many(3) == [0, -1, -1]  # no slot left: the result is pickled
        many.give_back(2)
        assert many.take_many(1) == [2]
    finally:
        one.close()
        many.close()


def test_cancelled_tasks_are_skipped_when_tasks_are_taken_together():
    from lazyseq.loading.backends import Done
    from lazyseq.loading.task_queue import Backlog

    backlog = Backlog()
    backlog.extend([(k, k) for k in range(6)])
    backlog.cancel(1)
    backlog.cancel(2)
    assert backlog.take(3) == [(0, 0), (3, 3), (4, 4)]
    assert backlog.take_skipped() == [Done(1, "skipped", None), Done(2, "skipped", None)]
    backlog.cancel(4)  # sent already: nothing to skip
    assert backlog.take(5) == [(5, 5)] and backlog.take_skipped() == [] and len(backlog) == 0


def test_results_alike_go_back_as_one_message_in_order_with_the_others():
    import os

    from lazyseq.loading.message_reader import MessageReader
    from lazyseq.loading.messages import AlikeResults, decode, encode_shape, pack_numbers
    from lazyseq.loading.worker_process import Outbox

    shape = encode_shape(("a", 0), [("<f8", (2, 3), 0)])
    other = encode_shape(("a", 0), [("<f8", (1, 3), 0)])
    read, write = os.pipe()
    reader = MessageReader([read], [], "test", decode=lambda k, raw: decode(raw))
    try:
        outbox = Outbox(write)
        outbox.add_alike(shape, pack_numbers(1, 0, 0.5))
        outbox.add_alike(shape, pack_numbers(2, 1, 0.25))
        assert not outbox.due(remaining=4, seconds=1e-5)
        outbox.add(encode(Stop()))  # another message between: the results before it go first
        assert outbox.due(remaining=3, seconds=1e-5)  # three results waiting
        outbox.add_alike(shape, pack_numbers(3, 2, 0.125))
        outbox.add_alike(other, pack_numbers(4, 3, 0.0625))  # another shape: a message of its own
        outbox.send()
        messages = [message for _, message in reader.take(5.0)]
        assert [type(message) for message in messages] == [AlikeResults, Stop, AlikeResults, AlikeResults]
        assert [message.numbers for message in messages if type(message) is AlikeResults] == [
            [(1, 0, 0.5), (2, 1, 0.25)],
            [(3, 2, 0.125)],
            [(4, 3, 0.0625)],
        ]
        assert messages[3].layout[0][1] == (1, 3)
    finally:
        reader.close()
        os.close(read)
        os.close(write)


def test_the_reader_makes_results_alike_into_items_in_their_slots():
    from lazyseq.loading.messages import encode_alike, encode_shape, pack_numbers
    from lazyseq.loading.process_workers import ProcessWorkers
    from lazyseq.loading.shared_slots import SharedSlots

    workers = ProcessWorkers.__new__(ProcessWorkers)  # only its decoding, no process
    workers._slots = SharedSlots(3, 4096, "test")
    try:
        for slot in range(3):
            workers._slots._slot_memory[slot][8:56] = np.full((2, 3), slot * 10.0).tobytes()
        shape = encode_shape(("a", 0), [("<f8", (2, 3), 8)])
        assert workers._slots.take_many(3) == [2, 1, 0]  # as the tasks were sent
        read = workers._decode(0, encode_alike(shape, [pack_numbers(7, 2, 0.5), pack_numbers(9, 0, 0.25)]))
        assert [done.task for done in read.found] == [7, 9] and read.seconds == [0.5, 0.25]
        assert [(done.task, done.status, done.value.tolist()) for done in read.found] == [
            (7, "ok", [[20.0] * 3] * 2),
            (9, "ok", [[0.0] * 3] * 2),
        ]
        workers._slots.give_back(1)  # its task failed
        assert workers._slots.free_count() == 1  # slots 2 and 0 leased while the items live
        del read
        assert workers._slots.free_count() == 3
    finally:
        workers._slots.close()


def _serve_in_a_thread(messages, job, results=0):
    """The first ``results`` messages a worker's loop sends back for ``messages``, sent before it starts reading.

    Then it is told to stop (if ``messages`` did not), and its loop has returned.
    """
    import os
    import threading
    import types
    from multiprocessing import Pipe

    from lazyseq.loading.message_reader import MessageReader
    from lazyseq.loading.messages import frame_header, write_all
    from lazyseq.loading.worker_process import Outbox, _serve

    def send(message):
        data = encode(message)
        write_all(mine.fileno(), frame_header(len(data)) + data)

    mine, theirs = Pipe(duplex=True)
    read, write = os.pipe()
    reader = MessageReader([read], [], "test", decode=lambda k, raw: decode(raw))
    blas = types.SimpleNamespace(pending=False)
    worker = threading.Thread(target=_serve, args=(theirs, job, blas, Outbox(write), [0, 0], 0))
    try:
        for message in messages:
            send(message)
        worker.start()
        received = []
        while len(received) < results:
            received += [message for _, message in reader.take(5.0)]
        if not isinstance(messages[-1], Stop):
            send(Stop())
        worker.join()
    finally:
        reader.close()
        for fd in (read, write):
            os.close(fd)
        mine.close()
        theirs.close()
    return received


def test_a_worker_stops_between_two_tasks_and_drops_those_it_holds():
    from lazyseq.loading.jobs import CallFunction

    computed = []
    job = CallFunction(lambda: computed.append(len(computed)))
    _serve_in_a_thread([RunTasks([Task(k, None, -1) for k in range(10)]), Stop()], job)
    assert computed == []  # the stop, read before the next task, drops the ten tasks held


def test_tasks_that_arrive_while_others_run_join_them_in_order():
    from lazyseq.loading.jobs import ReadItem

    job = ReadItem(lazyseq.view(list(range(100))))
    results = _serve_in_a_thread([RunTasks([Task(5, 5, -1), Task(6, 6, -1)]), RunTasks([Task(2, 2, -1)])], job, 3)
    assert [(result.task, result.result) for result in results] == [(5, 5), (6, 6), (2, 2)]


def test_a_worker_told_to_stop_instead_of_given_its_slots_stops_quietly():
    # A close() from another thread sent Stop between UseSlots and the descriptor of the slots: the worker read the
    # Stop frame as the descriptor, printed "RuntimeError: received 0 items of ancdata" and died.
    import multiprocessing

    from lazyseq.loading.blas_limits import WorkerLimit
    from lazyseq.loading.messages import UseSlots
    from lazyseq.loading.worker_process import Outbox, _serve

    consumer, worker = multiprocessing.Pipe(duplex=True)
    try:
        consumer.send_bytes(encode(UseSlots(2, 4096)))
        consumer.send_bytes(encode(Stop()))
        _serve(worker, abs, WorkerLimit(1, inherited=True), Outbox(worker.fileno()), [0, 0], 0)  # returns
    finally:
        consumer.close()
        worker.close()


def test_a_quick_result_is_not_held_back_by_a_long_task_after_it():
    # A worker held a quick task's result while it computed the next task of its run: behind an item that took
    # seconds (or never ended), items already computed did not arrive, and the reader waited for them.
    import multiprocessing

    release = multiprocessing.Event()
    watchdog = threading.Timer(30, release.set)  # without the fix, item 1 comes once item 3 is released
    watchdog.start()
    try:
        with lazyseq.prefetch(
            lazyseq.smap(functools.partial(wait_at, 3, release), range(10)),
            nworkers=2,
            method="process",
            inline_below=0,
        ) as ahead:
            assert list(ahead[:3]) == [0, 1, 2]  # item 1 was computed by the worker that then took item 3
            assert not release.is_set()  # read while item 3 still waits
            release.set()
            assert list(ahead[3:]) == list(range(3, 10))
    finally:
        watchdog.cancel()
        watchdog.join()


def wait_at(slow, release, i):
    if i == slow:
        release.wait()
    return i

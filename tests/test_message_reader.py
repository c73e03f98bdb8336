import gc
import multiprocessing
import os
import select
import threading

import numpy as np
import pytest

import lazyseq
from lazyseq.loading import message_reader
from lazyseq.loading.message_reader import EXITED, MessageReader, Unreadable
from lazyseq.loading.messages import Ready, Task, TaskFailed, decode, encode


def framed(message) -> bytes:
    data = encode(message)
    return len(data).to_bytes(4, "big") + data


class FakeWorkers:
    """Two "workers": a pipe each for their messages, and a pipe each whose closing stands for the process's exit."""

    def __init__(self, unpack=None):
        self.pipes = [os.pipe() for _ in range(2)]
        self.lives = [os.pipe() for _ in range(2)]
        self.reader = MessageReader(
            [r for r, _ in self.pipes],
            [r for r, _ in self.lives],
            "lazyseq-test-reader",
            **({} if unpack is None else {"decode": lambda k, raw: unpack(k, decode(raw))}),
        )

    def send(self, k, data):
        os.write(self.pipes[k][1], data)

    def exit(self, k):
        os.close(self.lives[k][1])

    def close(self):
        self.reader.close()
        for r, w in self.pipes:
            os.close(r)
            os.close(w)
        for r, w in self.lives:
            os.close(r)
            try:
                os.close(w)
            except OSError:  # already closed by exit()
                pass


@pytest.fixture
def workers():
    made = FakeWorkers()
    yield made
    made.close()
    assert [t.name for t in threading.enumerate() if t.name.startswith("lazyseq-")] == []


def always_background(monkeypatch):
    """Every reader's thread reads from a consumer's second take on, however briefly it stays away."""
    monkeypatch.setattr(message_reader, "BACKGROUND_ABOVE", -1.0)
    monkeypatch.setattr(message_reader, "FOREGROUND_BELOW", -1.0)


def in_background(monkeypatch, reader):
    """From the next take on, the reader's thread reads (as it does for a consumer away between reads)."""
    always_background(monkeypatch)
    assert reader.take(0) == []  # the first take only starts the clock
    assert reader.take(0) == []


def test_the_consumer_reads_messages_in_order_split_anywhere_and_then_the_exit(workers):
    assert workers.reader.take(0) == []
    data = framed(Ready(0, 123)) + framed(Task(1, 1, -1)) + framed(Task(2, 2, 3))
    workers.send(0, data[:3])
    assert workers.reader.take(0) == []  # not a whole message yet
    workers.send(1, framed(Task(9, None, 0)))
    workers.send(0, data[3:20])
    workers.send(0, data[20:])
    workers.exit(0)
    taken = []
    while (0, EXITED) not in taken:
        taken += workers.reader.take(10.0)
    assert [pair for pair in taken if pair[0] == 1] == [(1, Task(9, None, 0))]
    assert [pair for pair in taken if pair[0] == 0] == [
        (0, Ready(0, 123)),
        (0, Task(1, 1, -1)),
        (0, Task(2, 2, 3)),
        (0, EXITED),
    ]
    assert workers.reader.take(0) == []  # an exit is reported once
    assert "lazyseq-test-reader" not in [t.name for t in threading.enumerate()]  # a consumer that only reads: no thread


def test_the_long_length_form_and_a_read_that_ends_inside_a_message(workers):
    long_form = encode(Task(7, 7, 1))
    long_form = b"\xff\xff\xff\xff" + len(long_form).to_bytes(8, "big") + long_form  # as written for 2 GiB and more
    data = framed(Ready(0, 5)) + long_form + framed(Task(8, 8, 2))
    for cut in (2, 6, len(framed(Ready(0, 5))) + 7, len(data) - 1):  # in a length, in a long length, in a message
        assert workers.reader.take(0) == []
        workers.send(0, data[:cut])
        taken = workers.reader.take(10.0)
        workers.send(0, data[cut:])
        while len(taken) < 3:
            taken += workers.reader.take(10.0)
        assert taken == [(0, Ready(0, 5)), (0, Task(7, 7, 1)), (0, Task(8, 8, 2))]


def test_a_consumer_away_between_reads_finds_them_read_by_the_thread(workers, monkeypatch):
    in_background(monkeypatch, workers.reader)
    signal = workers.reader.fds()[0]
    workers.send(1, framed(Task(4, 4, 0)) + framed(TaskFailed(5, -1, None)))
    workers.exit(1)
    arrived = []
    while len(arrived) < 3:
        assert select.select([signal], [], [], 10.0)[0] == [signal]  # the thread read them: it says so
        arrived += workers.reader.take(0)
    assert arrived == [(1, Task(4, 4, 0)), (1, TaskFailed(5, -1, None)), (1, EXITED)]


def test_a_thread_that_cannot_start_leaves_the_consumer_reading(workers, monkeypatch):
    # Python 3.12+ starts no thread once the interpreter exits: a daemon thread of the user's, reading a process
    # loader then, got "RuntimeError: can't create new thread at interpreter shutdown" and printed it at exit
    def refused(thread):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refused)
    in_background(monkeypatch, workers.reader)
    workers.send(1, framed(Task(4, 4, 0)))
    workers.exit(1)
    taken = []
    while len(taken) < 2:
        taken += workers.reader.take(10.0)
    assert taken == [(1, Task(4, 4, 0)), (1, EXITED)]


def test_bytes_that_are_not_a_message_are_reported_and_reading_goes_on(workers):
    workers.send(0, (3).to_bytes(4, "big") + b"zzz" + framed(Ready(0, 123)))
    taken = []
    while len(taken) < 2:
        taken += workers.reader.take(1.0)
    (k, error), ready = taken
    assert (k, type(error), str(error)) == (0, Unreadable, "a message from worker process 0 could not be read")
    assert str(error.__cause__) == "unknown message kind 0x7a"
    assert ready == (0, Ready(0, 123))


@pytest.mark.parametrize(
    "length",
    [-4, -5, -(2**31), 2**63],  # -4: read as it was, it moved nowhere, for ever; 2**63: waited for, for ever
)
def test_a_length_that_is_not_one_is_reported_and_nothing_after_it_is_read(workers, length):
    written = length.to_bytes(4, "big", signed=True) if length < 0 else b"\xff" * 4 + length.to_bytes(8, "big")
    workers.send(0, framed(Ready(0, 1)) + written + framed(Ready(0, 2)))
    taken = []
    while len(taken) < 2:
        taken += workers.reader.take(1.0)
    ready, (k, error) = taken
    assert (ready, k, type(error), str(error)) == (
        (0, Ready(0, 1)),
        0,
        Unreadable,
        "the messages of worker process 0 could not be read",
    )
    assert str(error.__cause__) == f"a message's length reads {length} bytes"
    workers.send(0, framed(Ready(0, 3)))
    workers.exit(0)
    assert workers.reader.take(10.0) == [(0, EXITED)]  # the pipe is read no further


def test_messages_are_unpacked_by_whichever_thread_reads_them(monkeypatch):
    threads = []

    def unpack(k, message):
        threads.append(threading.current_thread().name)
        if message.task == 13:
            raise ValueError("no slot 13")
        return (k, message.task * 10)

    workers = FakeWorkers(unpack)
    try:
        workers.send(0, framed(Task(1, 1, 0)))
        assert workers.reader.take(10.0) == [(0, (0, 10))]
        in_background(monkeypatch, workers.reader)
        workers.send(1, framed(Task(13, 13, 0)) + framed(Task(2, 2, 0)))
        arrived = []
        while len(arrived) < 2:
            select.select([workers.reader.fds()[0]], [], [], 10.0)
            arrived += workers.reader.take(0)
        (k, error), second = arrived
        assert (k, type(error), str(error.__cause__), second) == (1, Unreadable, "no slot 13", (1, (1, 20)))
        assert threads == ["MainThread", "lazyseq-test-reader", "lazyseq-test-reader"]
    finally:
        workers.close()


def test_the_away_time_policy():
    away = message_reader.AwayTime()
    # one read after a training step of 5 ms is enough to read in the background; 8 back to back, to stop
    changes = [away.returned(seconds) for seconds in [0.005] * 4 + [1e-6] * 10]
    assert changes == [True, False, False, False] + [False] * 8 + [True, False]


@pytest.mark.parametrize("background", [False, True])
def test_process_loaders_read_by_either_side_give_every_item_and_report_a_death(monkeypatch, background):
    if background:
        always_background(monkeypatch)
    data = lazyseq.smap(lambda i: np.full(3, i), range(40))
    with lazyseq.prefetch(data, nworkers=2, method="process", inline_below=0) as ahead:
        assert [int(item[0]) for item in ahead] == list(range(40))
    with lazyseq.prefetch(lazyseq.smap(dies_at_7, range(20)), nworkers=2, method="process") as ahead:
        with pytest.raises(lazyseq.WorkerDied) as info:
            list(ahead)
    message = str(info.value)
    assert message.startswith("prefetch: worker process ") and "died with exit code 3 while computing item" in message
    assert [t.name for t in threading.enumerate() if t.name.startswith("lazyseq-")] == []


def dies_at_7(i):
    if i == 7:
        os._exit(3)
    return i


def test_the_thread_of_a_process_loader_ends_with_it_closed_collected_or_interrupted(monkeypatch):
    always_background(monkeypatch)
    gc.collect()
    fds = len(os.listdir(f"/proc/{os.getpid()}/fd"))
    data = lazyseq.smap(lambda i: np.full(3, i), range(100))
    ahead = lazyseq.prefetch(data, nworkers=2, method="process", inline_below=0)
    items = iter(ahead)
    assert [int(next(items)[0]) for _ in range(3)] == [0, 1, 2]
    assert [t.name for t in threading.enumerate() if t.name.endswith("-reader")] == ["lazyseq-prefetch-reader"]
    del items, ahead
    gc.collect()
    assert [t.name for t in threading.enumerate() if t.name.startswith("lazyseq-")] == []
    with pytest.raises(KeyboardInterrupt):
        with lazyseq.prefetch(data, nworkers=2, method="process", inline_below=0) as ahead:
            items = iter(ahead)
            for _ in range(5):
                next(items)  # not kept: its slot is released once read
            reader = ahead._engine.workers.workers._reader
            assert select.select([reader.fds()[0]], [], [], 10.0)[0]  # the thread read results ahead: slots leased
            raise KeyboardInterrupt
    del reader  # ``ahead`` lives on (the test's frame, the exception's traceback): it must hold no slot
    assert [t.name for t in threading.enumerate() if t.name.startswith("lazyseq-")] == []
    assert multiprocessing.active_children() == []
    gc.collect()
    assert len(os.listdir(f"/proc/{os.getpid()}/fd")) <= fds

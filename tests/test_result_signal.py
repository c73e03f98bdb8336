"""The pipe that wakes a reader waiting on descriptors when a worker thread's result is ready."""

import os
import select
import threading

from lazyseq.loading.result_signal import ResultSignal


def readable(fds: list[int]) -> bool:
    return bool(select.select(fds, [], [], 0)[0])


def test_results_notified_before_a_clear_leave_one_byte_and_the_next_one_writes_again():
    signal = ResultSignal()
    try:
        [fd] = signal.fds()
        for _ in range(5):
            signal.notify()
        assert os.read(fd, 100) == b"r"  # one wake-up for the five (each byte cost the worker a system call)
        signal.clear()  # (the pipe is empty: the reader finds nothing more to read)
        assert not readable([fd])
        signal.notify()
        assert readable([fd])
        signal.clear()
        assert not readable([fd])
    finally:
        signal.close()


def test_a_clear_with_nothing_notified_reads_nothing():
    signal = ResultSignal()
    try:
        fds = signal.fds()
        signal.clear()
        signal.notify()
        signal.clear()
        signal.clear()
        assert not readable(fds)
    finally:
        signal.close()


def test_a_result_notified_while_the_pipe_is_read_does_not_silence_the_next_one(monkeypatch):
    signal = ResultSignal()
    try:
        fds = signal.fds()
        signal.notify()
        read = os.read

        def read_as_another_result_is_notified(fd: int, size: int) -> bytes:
            monkeypatch.setattr(os, "read", read)
            signal.notify()  # a worker thread's result, put in the queue the reader looks at next
            return read(fd, size)

        monkeypatch.setattr(os, "read", read_as_another_result_is_notified)
        signal.clear()
        assert not readable(fds)
        signal.notify()  # the next result wakes the reader
        assert readable(fds)
    finally:
        signal.close()


def test_no_notification_is_lost_between_threads():
    # A reader that clears, then looks for results, sees every result put before its notification; a result put after
    # the clear wakes it again. Several workers notify at once: once they are done and every result seen, the pipe is
    # empty, and the next result wakes the reader (no byte left unread, no flag left set over an empty pipe).
    signal = ResultSignal()
    fds = signal.fds()
    results: list[int] = []
    workers, count = 4, 5_000

    def produce() -> None:
        for k in range(count):
            results.append(k)
            signal.notify()

    producers = [threading.Thread(target=produce) for _ in range(workers)]
    for producer in producers:
        producer.start()
    seen = 0
    try:
        while seen < workers * count:
            assert select.select(fds, [], [], 10)[0], f"not woken, {workers * count - seen} results waiting"
            signal.clear()
            seen = len(results)
    finally:
        for producer in producers:
            producer.join()
    try:
        signal.clear()
        assert not readable(fds)
        signal.notify()
        assert readable(fds)
    finally:
        signal.close()

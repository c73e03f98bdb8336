"""debug and monitor_throughput: views that watch the reads going through them."""

import itertools
import pickle

import numpy as np
import pytest

import lazyseq
from lazyseq.views import instrument


@pytest.fixture
def clock(monkeypatch):
    """A clock that advances only when told to (``clock.now``), for both views' timings."""

    class Clock:
        now = 0.0

    fake = Clock()
    monkeypatch.setattr(instrument, "_clock", lambda: fake.now)
    monkeypatch.setattr(instrument, "_timer", lambda: fake.now)
    return fake


def test_debug_reports_every_read_with_its_index():
    seen = []
    watched = lazyseq.debug(lazyseq.smap(abs, [-1, 2, -3, 4]), lambda i, x: seen.append((i, x)))
    assert watched[-1] == 4 and list(watched[1:3]) == [2, 3]
    assert list(watched) == [1, 2, 3, 4]
    assert seen == [(3, 4), (1, 2), (2, 3), (0, 1), (1, 2), (2, 3), (3, 4)]
    assert watched.calls == 7


def test_debug_reports_each_item_of_a_batch():
    seen = []
    rows = lazyseq.debug(np.arange(6).reshape(3, 2), lambda i, x: seen.append((i, x.tolist())))
    batch = rows.gather([2, 0]).batch(2)[0]
    assert batch.tolist() == [[4, 5], [0, 1]]
    assert seen == [(2, [4, 5]), (0, [0, 1])]


def test_debug_limits(clock):
    seen = []
    limited = lazyseq.debug(range(10), lambda i, x: seen.append(i), max_calls=3)
    assert list(limited) == list(range(10)) and seen == [0, 1, 2] and limited.calls == 3
    seen.clear()
    rate = lazyseq.debug(range(10), lambda i, x: seen.append(i), max_rate=2)  # at most one call per 0.5 s
    for i in range(10):
        clock.now = i * 0.2
        rate[i]
    assert seen == [0, 3, 6, 9]  # at 0, 0.6, 1.2 and 1.8 seconds


def test_debug_shows_in_repr_writes_through_and_pickles():
    data = [1, 2, 3]
    watched = lazyseq.debug(data, print, max_calls=5, max_rate=10)
    assert repr(watched) == "debug(print, max_calls=5, max_rate=10)  [len 3]\n└─ list  [len 3]"
    watched[0] = 9
    assert data == [9, 2, 3]
    again = pickle.loads(pickle.dumps(lazyseq.debug(data, print, max_calls=5)))
    assert repr(again).splitlines()[0] == "debug(print, max_calls=5)  [len 3]" and again.calls == 0


def test_debug_errors():
    with pytest.raises(TypeError, match=r"^debug: func must be callable, got str$"):
        lazyseq.debug([1], "print")
    with pytest.raises(ValueError, match=r"^debug: max_calls must be a non-negative integer or None, got -1$"):
        lazyseq.debug([1], print, max_calls=-1)
    with pytest.raises(ValueError, match=r"^debug: max_rate must be a positive number of calls per second or None"):
        lazyseq.debug([1], print, max_rate=0)

    def fail(i, x):
        raise RuntimeError(f"cannot log {x}")

    with pytest.raises(lazyseq.EvaluationError) as info:
        lazyseq.debug(lazyseq.smap(abs, [-5, 6]), fail)[1]
    assert str(info.value) == "failed to compute debug[1]: RuntimeError: cannot log 6"


def test_debug_in_a_prefetch_thread():
    seen = []
    watched = lazyseq.debug(range(8), lambda i, x: seen.append(i))
    with lazyseq.prefetch(watched, nworkers=2, inline_below=0) as ahead:
        assert list(ahead) == list(range(8))
    assert sorted(seen) == list(range(8))


def test_monitor_throughput_counts_items_and_the_time_spent_reading_them(clock):
    def slow(x):
        clock.now += 0.5  # each item takes half a second
        return x

    monitored = lazyseq.monitor_throughput(lazyseq.smap(slow, range(10)))
    with pytest.raises(RuntimeError, match=r"^monitor_throughput: no item has been read yet$"):
        monitored.read_delay()
    assert repr(monitored).splitlines()[0] == "monitor_throughput(nothing read yet)  [len 10]"
    assert monitored[3] == 3
    assert list(lazyseq.batch(monitored, 4, collate_fn=list)[0]) == [0, 1, 2, 3]  # one read of 4 items
    for _ in monitored:
        clock.now += 7.0  # the reader's own time is not counted
    assert (monitored.items, monitored.seconds) == (15, 7.5)
    assert monitored.read_delay() == 0.5 and monitored.throughput() == 2.0
    assert repr(monitored).splitlines()[0] == "monitor_throughput(15 items read, 500 ms each)  [len 10]"
    monitored.seconds = 30.0
    assert repr(monitored).splitlines()[0] == "monitor_throughput(15 items read, 2 s each)  [len 10]"
    monitored.seconds = 15e-6
    assert repr(monitored).splitlines()[0] == "monitor_throughput(15 items read, 1 µs each)  [len 10]"
    monitored.reset()
    assert (monitored.items, monitored.seconds) == (0, 0.0)
    with pytest.raises(RuntimeError, match="no item has been read yet"):
        monitored.throughput()


def test_monitor_throughput_of_an_infinite_view_and_pickling():
    monitored = lazyseq.monitor_throughput(lazyseq.cycle([1, 2]))
    assert list(itertools.islice(monitored, 5)) == [1, 2, 1, 2, 1]
    assert monitored.items == 5 and monitored.is_infinite
    again = pickle.loads(pickle.dumps(monitored))
    assert again.items == 0 and again[3] == 2

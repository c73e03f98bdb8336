"""Loaders compute cheap items in the reader, and hand expensive ones to their worker threads or processes."""

import functools
import multiprocessing
import os
import pickle
import sys
import threading
import time

import numpy as np
import pytest

import lazyseq
from lazyseq.loading.item_cost import ItemCost, start_if_slow


def computed_by(x):
    return threading.current_thread().name


def computed_slowly_by(x):
    time.sleep(0.003)
    return threading.current_thread().name


def test_the_estimate_moves_between_reader_and_workers_with_hysteresis():
    cost = ItemCost(inline_below=1.0)
    assert cost.inline and cost.estimate is None
    cost.add(9.0)  # a first item under ten thresholds may just be cold: the reader times another
    assert cost.inline and cost.estimate == 9.0
    cost.add(1.5)  # the lesser of the first two; above the threshold, but not twice it: still in the reader
    assert cost.inline and cost.estimate == 1.5
    cost.add(4.0)  # median of 9, 1.5, 4 is 4: 1.5 + 0.2 * (4 - 1.5) = 2.0, not above twice the threshold yet
    assert cost.inline and cost.estimate == pytest.approx(2.0)
    cost.add(7.0)  # median 4: 2.4
    assert not cost.inline and cost.estimate == pytest.approx(2.4)
    cost.add(0.0)  # median of 4, 7, 0 is 4: one fast item is not a trend
    assert not cost.inline and cost.estimate == pytest.approx(2.72)
    for _ in range(4):
        cost.add(0.0)  # medians 0 from now on
    assert not cost.inline and cost.estimate == pytest.approx(2.72 * 0.8**4)  # 1.11: still above the threshold
    cost.add(0.0)
    assert not cost.inline and cost.estimate == pytest.approx(2.72 * 0.8**5)  # 0.89, but the latest 8 timings: 1.56
    cost.add(0.0), cost.add(0.0)
    assert cost.inline and cost.estimate == pytest.approx(2.72 * 0.8**7)  # and 0.875 on average: back to the reader
    assert not ItemCost(inline_below=0.0).inline  # 0: always the workers


def test_one_slow_item_among_cheap_ones_is_a_hiccup_two_in_a_row_a_change():
    cost = ItemCost(inline_below=1.0)
    for seconds in (0.1, 0.1, 0.1, 100.0, 0.1, 0.1, 100.0, 0.1):
        cost.add(seconds)
    assert cost.inline and cost.estimate == pytest.approx(0.1)
    cost.add(100.0)
    cost.add(100.0)
    assert not cost.inline


def test_items_alternating_between_cheap_and_slow_go_to_the_workers():
    cost = ItemCost(inline_below=1.0)
    for seconds in (0.1, 10.0) * 10:
        cost.add(seconds)
    assert not cost.inline


def test_slow_items_that_come_back_regularly_go_to_the_workers_and_stay_there():
    cost = ItemCost(inline_below=1.0)
    for seconds in (0.1, 0.1, 0.1, 10.0) * 2 + (0.1, 0.1, 0.1):  # the median of three says cheap; two slow: hiccups
        cost.add(seconds)
    assert cost.inline
    cost.add(10.0)
    assert not cost.inline  # 3 slow in the last 12, 2.6 on average: the reader would wait on each
    for seconds in (0.1, 0.1, 0.1, 10.0) * 4:
        cost.add(seconds)
        assert not cost.inline  # timed in the workers: the median alone would bring them back to the reader
    for _ in range(16):
        cost.add(0.1)
    assert cost.inline


def test_timings_added_by_several_threads_at_once_raise_nothing():
    # Worker threads time their items while the reader times its own: looking for slow items among the recent
    # timings while another thread added one raised "deque mutated during iteration" from the item's read.
    cost, errors = ItemCost(inline_below=1.0), []

    def add_timings():
        try:
            for _ in range(500):
                for seconds in (0.1,) * 15 + (60.0,):  # one slow among cheap ones: a look at the recent timings
                    cost.add(seconds)
        except Exception as error:
            errors.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns between any two steps
    try:
        threads = [threading.Thread(target=add_timings) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and cost.inline


def every_fourth_waits(i):
    if i % 4 == 3:
        time.sleep(0.005)  # a file read, say: the GIL is free meanwhile
    return threading.current_thread().name


def test_items_slow_one_time_in_four_are_computed_by_the_workers():
    with lazyseq.prefetch(lazyseq.smap(every_fourth_waits, range(200)), nworkers=2) as ahead:
        names = list(ahead)
    assert names[0] == threading.current_thread().name and names[-1].startswith("lazyseq-prefetch-")


def test_a_first_item_over_ten_thresholds_goes_to_the_workers_at_once():
    cost = ItemCost(inline_below=1.0)
    cost.add(10.5)
    assert not cost.inline


def test_cheap_items_are_computed_by_the_reader_and_others_by_the_workers():
    items = lazyseq.smap(computed_by, range(50))
    with lazyseq.prefetch(items, nworkers=2, inline_below=10.0) as ahead:
        assert set(ahead) == {threading.current_thread().name}
    with lazyseq.prefetch(items, nworkers=2, inline_below=0) as ahead:
        assert all(name.startswith("lazyseq-prefetch-") for name in ahead)
    with lazyseq.prefetch(items, nworkers=2, start_hook=lambda k: None) as ahead:
        assert all(name.startswith("lazyseq-prefetch-") for name in ahead)  # the hook may prepare worker state


def test_a_start_hook_and_an_explicit_inline_below_cannot_go_together():
    message = (
        "prefetch: inline_below=10.0 would compute items in the reader, where start_hook never ran; "
        "leave inline_below unset (or 0) with a start_hook"
    )
    with pytest.raises(ValueError) as raised:
        lazyseq.prefetch(range(3), nworkers=2, inline_below=10.0, start_hook=print)
    assert str(raised.value) == message
    with lazyseq.prefetch(range(3), nworkers=2, inline_below=0, start_hook=print) as ahead:
        assert ahead._options.inline_below == 0.0


def test_expensive_items_go_to_the_workers_after_the_first_one_is_timed():
    with lazyseq.prefetch(lazyseq.smap(computed_slowly_by, range(12)), nworkers=2) as ahead:
        names = list(ahead)
    assert names[0] == threading.current_thread().name
    assert all(name.startswith("lazyseq-prefetch-") for name in names[1:])


def timed_item(x):
    start = time.perf_counter()
    time.sleep(0.05)
    return threading.current_thread().name, start, time.perf_counter()


def test_worker_threads_start_on_the_next_items_while_a_slow_first_item_is_computed():
    with lazyseq.prefetch(lazyseq.smap(timed_item, range(6)), nworkers=2) as ahead:
        items = list(ahead)
    (first, _, first_end), (second, second_start, _) = items[:2]
    assert first == threading.current_thread().name and second.startswith("lazyseq-prefetch-")
    assert second_start < first_end  # sent once the first item had taken ten thresholds (2.5 ms), not after it


def test_load_buffers_threads_start_while_a_slow_first_batch_is_made():
    with lazyseq.load_buffers(functools.partial(timed_item, None), max_cached=3, nworkers=2) as batches:
        (first, _, first_end), *others = [next(batches) for _ in range(3)]
    assert first == threading.current_thread().name
    assert all(name.startswith("lazyseq-load_buffers-") for name, _, _ in others)
    assert min(start for _, start, _ in others) < first_end


def pid_of_item(x):
    if x < 20:
        time.sleep(0.005)
    return os.getpid()


def pid_of(_):
    return os.getpid()


def test_by_default_processes_compute_every_item_in_a_worker_however_cheap():
    with lazyseq.prefetch(lazyseq.smap(pid_of, range(50)), nworkers=2, method="process") as ahead:
        pids = set(ahead)
        workers = set(ahead._engine.workers.workers.pids)
    assert os.getpid() not in pids and pids <= workers
    with lazyseq.load_buffers(lambda: np.full(3, os.getpid()), nworkers=2, method="process") as batches:
        assert os.getpid() not in {int(next(batches)[0]) for _ in range(20)}


def test_with_processes_and_inline_below_cheap_items_never_start_a_worker():
    items = lazyseq.smap(computed_by, range(50))
    with lazyseq.prefetch(items, nworkers=2, method="process", inline_below=250e-6) as ahead:
        assert set(ahead) == {threading.current_thread().name}
        assert not ahead.workers_running and multiprocessing.active_children() == []
    cheap = lambda: np.full(3, os.getpid())  # noqa: E731
    with lazyseq.load_buffers(cheap, nworkers=2, method="process", inline_below=250e-6) as batches:
        assert {int(next(batches)[0]) for _ in range(20)} == {os.getpid()}
        assert multiprocessing.active_children() == []


def test_with_processes_and_inline_below_expensive_items_go_to_the_workers_and_come_back_when_cheap():
    items = lazyseq.smap(pid_of_item, range(100))
    with lazyseq.prefetch(items, nworkers=2, method="process", inline_below=250e-6) as ahead:
        pids = list(ahead)
        workers = set(ahead._engine.workers.workers.pids)
    assert pids[0] == os.getpid()  # timed in the reader: 5 ms, over ten thresholds
    assert len(workers) == 2 and set(pids[1:20]) <= workers
    assert set(pids[-20:]) == {os.getpid()}  # the workers' timings said items got cheap
    assert multiprocessing.active_children() == []


def test_load_buffers_makes_cheap_batches_in_the_reader():
    def batch():
        return np.zeros(3), threading.current_thread().name

    with lazyseq.load_buffers(batch, nworkers=2, inline_below=10.0) as batches:
        assert {next(batches)[1] for _ in range(20)} == {threading.current_thread().name}
    with lazyseq.load_buffers(batch, nworkers=2, inline_below=0) as batches:
        assert all(next(batches)[1].startswith("lazyseq-load_buffers-") for _ in range(20))


def test_errors_of_items_computed_by_the_reader_read_as_from_a_worker():
    def fail_on_two(x):
        if x == 2:
            raise ValueError("bad item")
        return x

    with lazyseq.prefetch(lazyseq.smap(fail_on_two, range(5)), nworkers=2, inline_below=10.0) as ahead:
        assert ahead[0] == 0
        with pytest.raises(
            lazyseq.EvaluationError, match=r"failed to compute prefetch\[2\] -> smap\(.*fail_on_two\)\[2\]: ValueError"
        ):
            ahead[2]
        assert list(ahead[3:]) == [3, 4]

    def broken():
        raise KeyError("no batch")

    with lazyseq.load_buffers(broken, inline_below=10.0) as batches:
        with pytest.raises(lazyseq.EvaluationError, match="failed to compute load_buffers batch 0: KeyError"):
            next(batches)


def test_bad_thresholds_and_pickling():
    expected = "inline_below must be a finite number of seconds >= 0 or None, got"
    with pytest.raises(ValueError, match=f"^prefetch: {expected} -1$"):
        lazyseq.prefetch(range(3), nworkers=1, inline_below=-1)
    with pytest.raises(ValueError, match=f"^load_buffers: {expected} nan$"):
        lazyseq.load_buffers(lambda: 1, inline_below=float("nan"))
    # Infinity was taken, then a timer thread failed on it with a traceback; True was taken as 1 second.
    with pytest.raises(ValueError, match=f"^prefetch: {expected} inf$"):
        lazyseq.prefetch(range(3), nworkers=1, inline_below=float("inf"))
    with pytest.raises(TypeError, match=f"^prefetch: {expected} True$"):
        lazyseq.prefetch(range(3), nworkers=1, inline_below=True)
    with pytest.raises(TypeError, match=f"^prefetch: {expected} '0.1'$"):
        lazyseq.prefetch(range(3), nworkers=1, inline_below="0.1")
    ahead = lazyseq.prefetch(range(3), nworkers=1, inline_below=0.5)
    assert pickle.loads(pickle.dumps(ahead))._options.inline_below == 0.5


def fail_slowly_on_zero(x):
    time.sleep(0.02)
    if x == 0:
        raise ValueError("bad first item")
    return threading.current_thread().name


def test_a_slow_first_item_that_fails_still_leaves_the_next_items_with_the_workers():
    with lazyseq.prefetch(lazyseq.smap(fail_slowly_on_zero, range(6)), nworkers=2) as ahead:
        with pytest.raises(lazyseq.EvaluationError, match="bad first item"):
            ahead[0]
        names = list(ahead[1:])
    assert len(names) == 5 and all(name.startswith("lazyseq-prefetch-") for name in names)


def timings_left_out(seconds, count=400, inline_below=1e-3):
    """The items left untimed after each of ``count`` timings of ``seconds``, from the third on."""
    cost = ItemCost(inline_below=inline_below)
    skips = []
    for _ in range(count):
        cost.add(seconds)
        skips.append(cost.untimed)
    assert cost.inline
    return skips[2:]


def test_items_far_below_the_threshold_are_timed_at_random_one_per_four_thresholds_worth():
    # Every n-th: items slow one time in two or four were never timed, and stayed in the reader.
    nearer = timings_left_out(2.5e-4)  # four thresholds: 16 items, one timed (a skip of 15 on average)
    assert set(nearer) == set(range(31)) and 14 < np.mean(nearer) < 16
    far = timings_left_out(1e-5)  # 400 items: one in 32 at most (a timing costs a few microseconds at most)
    assert set(far) == set(range(63)) and 30 < np.mean(far) < 32
    assert timings_left_out(6e-4, count=3) == [0]  # over half the threshold: every item is timed


def test_an_untimed_item_that_took_long_brings_the_next_timing_within_one_in_four():
    cost = ItemCost(inline_below=1e-3)
    skips = []
    for _ in range(400):
        cost.untimed = 30  # (as items at a hundredth of the threshold may leave)
        cost.untimed_was_slow()
        skips.append(cost.untimed)
    assert set(skips) == set(range(7)) and 2.5 < np.mean(skips) < 3.5
    # Each slow item drew again: the next timing came later than one in four (one in seven, for slow items only).
    left = []
    for _ in range(50):
        cost.untimed_was_slow()
        left.append(cost.untimed)
    assert left == sorted(left, reverse=True)  # never put off


def test_timings_of_zero_seconds_leave_items_untimed_as_the_cheapest():
    # A coarse clock (or a very cheap item) gave 0.0 seconds: "ZeroDivisionError: float division by zero" at the read.
    assert set(timings_left_out(0.0)) == set(range(63))  # one in 32, as items far below the threshold


@pytest.mark.parametrize("in_runs", [True, False], ids=["in runs", "one at a time"])
def test_untimed_items_still_go_to_the_workers_when_they_get_slow(in_runs, monkeypatch):
    if not in_runs:  # one in 32 items timed at most: an item that turned out slow brings back one in four
        monkeypatch.setattr("lazyseq.loading.item_cost.RUN_SECONDS", 0.0)

    def slow_after_40(x):
        if x >= 40:
            time.sleep(0.02)
        return threading.current_thread().name

    # A threshold well above a busy machine's stalls (which made cheap items look worth the workers), well below
    # the slow items' time.
    with lazyseq.prefetch(lazyseq.smap(slow_after_40, range(80)), nworkers=2, inline_below=0.005) as ahead:
        names = list(ahead)
    assert set(names[:40]) == {threading.current_thread().name}
    assert all(name.startswith("lazyseq-prefetch-") for name in names[60:])


@pytest.fixture
def long_runs(monkeypatch):
    """Runs of cheap items as long as RUN_ITEMS, whatever the machine's speed (a busy one's hiccups included)."""
    monkeypatch.setattr("lazyseq.loading.item_cost.RUN_SECONDS", 60.0)
    monkeypatch.setattr("lazyseq.loading.options.INLINE_BELOW", 1.0)  # no stall makes an item look worth the workers


def test_cheap_items_read_in_order_are_computed_a_run_at_a_time(long_runs):
    # Each read through the loader cost about a microsecond of bookkeeping: most of the time of items this cheap.
    log = []

    def logged(x):
        log.append(("computed", x))
        return x * x

    with lazyseq.prefetch(lazyseq.smap(logged, range(100)), nworkers=2, max_buffered=20) as ahead:
        for x in ahead:
            log.append(("read", x))
        assert [ahead[k] for k in (5, 4, 98)] == [25, 16, 9604]  # out of order: one at a time, as before
    assert log[:6] == [("computed", 0), ("read", 0), ("computed", 1), ("read", 1), ("computed", 2), ("read", 4)]
    runs = []
    for start in range(3, 100, 21):  # from the fourth item on (timed first): the item read and max_buffered ahead
        run = range(start, min(start + 21, 100))
        runs += [("computed", k) for k in run] + [("read", k * k) for k in run]
    assert log[6:] == runs + [("computed", 5), ("computed", 4), ("computed", 98)]


def inverse_of_x_minus_10(computed, x):
    computed.append(x)
    return 1 / (x - 10)


@pytest.mark.parametrize(("how", "computed_first"), [("long_runs", 11), ("one_at_a_time", 10)])
def test_an_item_that_fails_raises_at_its_own_read_after_the_items_before_it(how, computed_first, request):
    request.getfixturevalue(how)  # in runs, or one at a time
    computed = []
    view = lazyseq.smap(functools.partial(inverse_of_x_minus_10, computed), range(20))
    with lazyseq.prefetch(view, nworkers=2) as ahead:
        reads = iter(ahead)
        assert [next(reads) for _ in range(10)] == [1 / (x - 10) for x in range(10)]
        assert computed == list(range(computed_first))  # a run from item 3 stopped at item 10
        with pytest.raises(lazyseq.EvaluationError) as raised:
            next(reads)
        assert list(reads) == [1 / (x - 10) for x in range(11, 20)]
    assert str(raised.value) == (
        "failed to compute prefetch[10] -> smap(partial(inverse_of_x_minus_10))[10]: ZeroDivisionError: division by zero"
    )
    assert computed == list(range(20))  # item 10 once: its error was kept for its read


def shuffle_and_its_two_orders(n):
    """A shuffle of range(n) at epoch 0, and its items at epochs 0 and 1."""
    data = lazyseq.arange(n).shuffle(seed=3)
    epoch0 = list(data)
    data.set_epoch(1)
    epoch1 = list(data)
    data.set_epoch(0)
    return data, epoch0, epoch1


def test_the_items_of_a_run_are_not_read_once_an_epoch_was_set(long_runs):
    data, epoch0, epoch1 = shuffle_and_its_two_orders(50)
    with lazyseq.prefetch(data.smap(int), nworkers=2) as ahead:
        reads = iter(ahead)
        first = [next(reads) for _ in range(5)]  # items 3 to 49 were computed at the read of item 3
        data.set_epoch(1)  # on the shuffle below, between two reads
        rest = list(reads)
    assert first == epoch0[:5] and rest == epoch1[5:]


def test_a_run_stays_good_while_shuffles_elsewhere_are_made_and_given_epochs(long_runs):
    # Any shuffle made anywhere counted as an epoch set: each run was dropped, and its items computed again.
    computed = []
    items = lazyseq.smap(lambda x: computed.append(x) or x, range(60))
    with lazyseq.prefetch(items, nworkers=2) as ahead:
        for step, _ in enumerate(ahead):
            lazyseq.arange(5).shuffle(seed=step).set_epoch(1)
    assert computed == list(range(60))


def test_an_epoch_set_while_a_run_is_computed_makes_its_items_old(long_runs):
    data, epoch0, epoch1 = shuffle_and_its_two_orders(40)

    def read(x):
        if x == epoch0[6] and not data._epoch:  # as another thread would, while item 6 is computed
            data.set_epoch(1)
        return int(x)

    with lazyseq.prefetch(data.smap(read), nworkers=2) as ahead:
        reads = iter(ahead)
        first = [next(reads) for _ in range(4)]  # the read of item 3 computed items 3 to 13
        rest = list(reads)
    assert first == epoch0[:4] and rest == epoch1[4:]


def test_the_block_runs_where_no_thread_can_start(monkeypatch):
    # Python 3.12 on starts no thread once the program exits: a daemon thread of the program's reading then got
    # "RuntimeError: can't create new thread at interpreter shutdown" from its read, and printed it at exit
    def refused(thread):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Timer, "start", refused)
    ran, started = [], []
    with start_if_slow(0.0, lambda: started.append(True)):
        ran.append(True)
    assert ran == [True] and started == []


@pytest.fixture
def one_at_a_time(monkeypatch):
    """Items computed by the reader one at a time (no runs), whatever the machine's speed."""
    monkeypatch.setattr("lazyseq.loading.item_cost.RUN_SECONDS", 0.0)
    monkeypatch.setattr("lazyseq.loading.options.INLINE_BELOW", 1.0)


def test_reads_in_order_compute_their_items_at_once_without_the_loaders_other_steps(one_at_a_time):
    # A read through the loader took ten microseconds or more of bookkeeping with the caches cold after an item: reads
    # in order that follow one the reader computed now compute their item at once (InlineReads), and nothing else.
    log = []

    def logged(x):
        log.append(("computed", x, threading.current_thread().name))
        return x * x

    with lazyseq.prefetch(lazyseq.smap(logged, range(50)), nworkers=2) as ahead:
        reads = iter(ahead)
        squares = [next(reads) for _ in range(10)]
        assert type(ahead._run).__name__ == "InlineReads" and ahead._order.last == 9
        squares += list(reads)
        assert not ahead.workers_running
    assert squares == [x * x for x in range(50)]
    assert log == [("computed", x, threading.current_thread().name) for x in range(50)]


def test_reads_one_at_a_time_follow_an_epoch_set_between_them(one_at_a_time):
    data, epoch0, epoch1 = shuffle_and_its_two_orders(30)
    with lazyseq.prefetch(data.smap(int), nworkers=2) as ahead:
        reads = iter(ahead)
        first = [next(reads) for _ in range(8)]
        data.set_epoch(1)  # on the shuffle below, between two reads
        rest = list(reads)
    assert first == epoch0[:8] and rest == epoch1[8:]


def test_reads_one_at_a_time_go_on_after_the_loader_is_closed_between_them(one_at_a_time):
    with lazyseq.prefetch(lazyseq.smap(lambda x: x + 1, range(30)), nworkers=2) as ahead:
        reads = iter(ahead)
        first = [next(reads) for _ in range(8)]
        engine = ahead._engine
        ahead.close()
        rest = list(reads)
        assert ahead._engine is not engine  # read with a new one
    assert first + rest == list(range(1, 31))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_reads_one_at_a_time_with_a_loader_of_its_own(one_at_a_time):
    with lazyseq.prefetch(lazyseq.smap(lambda x: (x, os.getpid()), range(20)), nworkers=2) as ahead:
        reads = iter(ahead)
        assert [next(reads)[0] for _ in range(8)] == list(range(8))
        parent_engine = ahead._engine
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover (the child)
            try:
                items = list(reads)
                ok = [x for x, _ in items] == list(range(8, 20)) and {pid for _, pid in items} == {os.getpid()}
                ok = ok and ahead._engine is not parent_engine
                os.write(write_end, b"ok" if ok else repr(items).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as told:
            answer = told.read()
        os.waitpid(child, 0)
        assert answer == b"ok"
        assert [x for x, _ in reads] == list(range(8, 20))  # the parent's reads go on with its own
        assert ahead._engine is parent_engine


def test_an_items_keyboardinterrupt_among_reads_one_at_a_time_leaves_the_next_reads_to_a_new_loader(one_at_a_time):
    # The reads that followed used the loader the interrupt closed: LoaderClosed, after computing their item.
    computed = []

    def square_but_10(x):
        computed.append(x)
        if x == 10:
            raise KeyboardInterrupt
        return x * x

    with lazyseq.prefetch(lazyseq.smap(square_but_10, range(30)), nworkers=2) as ahead:
        assert [ahead[i] for i in range(10)] == [x * x for x in range(10)]
        assert type(ahead._run).__name__ == "InlineReads"
        with pytest.raises(KeyboardInterrupt):
            ahead[10]
        assert [ahead[i] for i in range(11, 14)] == [121, 144, 169]
    assert computed == list(range(14))


def test_an_items_systemexit_among_reads_one_at_a_time_ends_nothing_else(one_at_a_time):
    def exit_at_10(x):
        if x == 10:
            raise SystemExit(3)
        return x

    with lazyseq.prefetch(lazyseq.smap(exit_at_10, range(20)), nworkers=2) as ahead:
        reads = iter(ahead)
        assert [next(reads) for _ in range(10)] == list(range(10))
        with pytest.raises(SystemExit):
            next(reads)
        assert list(reads) == list(range(11, 20))


def test_a_read_that_finds_items_slow_leaves_the_next_ones_to_the_workers(monkeypatch):
    monkeypatch.setattr("lazyseq.loading.item_cost.RUN_SECONDS", 0.0)

    def slow_from_10(x):
        time.sleep(0.06 if x >= 10 else 0.003)  # over half the threshold: every item timed
        return threading.current_thread().name

    other = lazyseq.arange(5).shuffle(seed=0)
    with lazyseq.prefetch(lazyseq.smap(slow_from_10, range(14)), nworkers=2, inline_below=0.005) as ahead:
        reads = iter(ahead)
        names = [next(reads) for _ in range(11)]
        other.set_epoch(1)  # an epoch set anywhere: item 11 is read with every step of a read through the loader
        names.append(next(reads))  # its timing makes items too slow for the reader
        assert not ahead._cost.inline
        names += list(reads)
    me = threading.current_thread().name
    assert [k for k, name in enumerate(names) if name == me] == list(range(12))


def test_items_read_together_are_found_slow_by_their_average(monkeypatch):
    # An untimed read of 64 items was compared with what one item may take: 173 reads in 200 taken for slow.
    now = [0.0]
    monkeypatch.setattr("lazyseq.loading.engine.perf_counter", lambda: now[0])
    slow = []
    untimed_was_slow = ItemCost.untimed_was_slow
    monkeypatch.setattr(ItemCost, "untimed_was_slow", lambda cost: slow.append(True) or untimed_was_slow(cost))

    def ten_microseconds(x):
        now[0] += 10e-6
        return x

    with lazyseq.prefetch(lazyseq.smap(ten_microseconds, range(64 * 200)), nworkers=2) as ahead:
        batches = list(ahead.batch(64))
        assert ahead._cost.inline and ahead._cost.count < 100  # most reads left untimed
    assert len(batches) == 200 and batches[-1].tolist() == list(range(64 * 199, 64 * 200)) and slow == []


@pytest.mark.parametrize("method", ["thread", "process"])
def test_threads_reading_one_loader_take_turns_computing_items_in_the_reader(method, one_at_a_time):
    # Reads one at a time computed their item without the loader's lock: a source with one cursor (a file read with
    # seek, then read) gave other items' values to two threads reading the same loader.
    inside, overlaps = [0], []

    def one_at_once(i):
        inside[0] += 1
        time.sleep(0.0002)  # the GIL is free: another thread computing an item now would be inside too
        overlaps.append(inside[0] > 1)
        inside[0] -= 1
        return i

    ahead = lazyseq.prefetch(lazyseq.smap(one_at_once, range(200)), nworkers=1, method=method, inline_below=1.0)
    results = {}

    def read_all(k):
        results[k] = list(ahead)

    with ahead:
        threads = [threading.Thread(target=read_all, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert type(ahead._run).__name__ == "InlineReads" and not ahead.workers_running
    assert results == {0: list(range(200)), 1: list(range(200))}
    assert len(overlaps) == 400 and not any(overlaps)

"""max_buffered (max_cached) left out: the loader's number for threads and processes, three runs per Ray worker."""

import numpy as np
import pytest

import lazyseq
from lazyseq.loading.buffering import Buffering, run_length
from lazyseq.loading.engine import Engine
from lazyseq.loading.options import LoaderOptions


def zeros():
    return np.zeros(3)


def options(method, nworkers=2, owner="prefetch"):
    return LoaderOptions.check(owner, nworkers, method)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_the_default_for_threads_and_processes_is_a_fixed_number(method):
    for default in (10, 4, 2):  # prefetch and serve, evaluate, load_buffers
        buffering = Buffering.resolve(None, options(method), default)
        assert buffering == Buffering(default)
        assert [buffering.capacity(seconds) for seconds in (None, 1e-6, 1e-3, 1.0)] == [default] * 4


def test_the_default_for_ray_is_three_runs_per_worker_sized_from_the_timings():
    assert [run_length(seconds) for seconds in (None, 1.0, 0.05, 0.02, 1e-3, 1e-4, 1e-6, 0.0)] == [
        1,  # not timed yet
        1,
        1,
        2,
        50,  # about 50 ms of work
        256,  # at most 256 items
        256,
        256,
    ]
    buffering = Buffering.resolve(None, options("ray", nworkers=3), default=10)
    assert buffering == Buffering(None, ray_workers=3)
    assert [buffering.capacity(seconds) for seconds in (None, 1.0, 0.02, 1e-3, 1e-6)] == [9, 9, 18, 450, 2304]
    assert str(buffering) == "three runs per worker"
    no_workers = Buffering.resolve(None, options("ray", nworkers=0), default=10)  # nothing goes to Ray
    assert no_workers == Buffering(10)


@pytest.mark.parametrize("method", ["thread", "process", "ray"])
def test_an_explicit_number_is_obeyed(method):
    for given in (1, 10, 256):
        assert Buffering.resolve(given, options(method), default=10).capacity(1e-6) == given
    with pytest.raises(ValueError, match="^prefetch: max_buffered must be a positive integer, got 0$"):
        Buffering.resolve(0, options(method), default=10)
    with pytest.raises(ValueError, match="^load_buffers: max_cached must be a positive integer, got -1$"):
        Buffering.resolve(-1, options(method, owner="load_buffers"), 2, "max_cached")


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_number_beyond_any_use_is_refused_at_once(method):
    # max_cached=10**9 hung: the loader counted and sent a billion tasks before it knew what they would need.
    assert Buffering.resolve(2**16, options(method), default=10).size == 2**16
    assert Buffering.resolve(10**9, options(method), default=10, items=5).size == 10**9  # all of them: obeyed
    with pytest.raises(ValueError) as caught:
        lazyseq.load_buffers(lambda: np.zeros(10), max_cached=10**9, nworkers=2, method=method)
    assert str(caught.value) == (
        "load_buffers: max_cached must be at most 65,536 (items kept ahead of the reader), got 1000000000"
    )


def test_the_engine_follows_the_timings_for_ray_only():
    ray = Engine(abs, options("ray"), Buffering(None, ray_workers=2))
    fixed = Engine(abs, options("ray"), 10)
    try:
        assert (ray.capacity, ray.room(), fixed.capacity) == (6, 6, 10)
        for engine in (ray, fixed):
            engine.cost.add(1e-3)  # what the Ray workers report for each item
        assert (ray.capacity, ray.room(), fixed.capacity) == (300, 300, 10)
    finally:
        ray.close()
        fixed.close()


def test_the_loaders_resolve_their_defaults_when_made():
    squares = lazyseq.smap(np.square, np.arange(5))
    assert lazyseq.prefetch(squares, nworkers=2)._max_buffered == Buffering(10)
    assert lazyseq.prefetch(squares, nworkers=2, method="process")._max_buffered == Buffering(None, process_workers=2)
    assert lazyseq.prefetch(squares, nworkers=2, method="process", max_buffered=10)._max_buffered == Buffering(10)
    assert lazyseq.prefetch(squares, nworkers=2, max_buffered=3, method="ray")._max_buffered == Buffering(3)
    ahead = lazyseq.prefetch(squares, nworkers=2, method="ray")  # Ray starts only with the first item
    assert ahead._max_buffered == Buffering(None, ray_workers=2)
    assert repr(ahead).startswith("prefetch(2 Ray tasks, max_buffered=three runs per worker)  [len 5]")
    with lazyseq.load_buffers(zeros, nworkers=1) as batches:
        assert repr(batches) == "load_buffers(zeros, max_cached=2)  [0 batches delivered]"
        next(batches)
        assert repr(batches) == "load_buffers(zeros, max_cached=2)  [1 batch delivered]"
    ahead = lazyseq.prefetch(squares, nworkers=1)
    reading = iter(ahead)
    next(reading)
    assert repr(reading) == "iterator of prefetch(1 thread, max_buffered=10)  [next: item 1 of 5]"
    ahead.close()
    assert lazyseq.evaluate(np.sqrt, np.arange(9.0) ** 2, batch_size=2, nworkers=2).tolist() == list(range(9))


def test_the_default_for_processes_follows_the_timings_of_quick_items():
    buffering = Buffering.resolve(None, options("process"), 10, deepen=True)
    assert buffering == Buffering(None, process_workers=2)
    # 10 until timed and for items of 0.4 ms or more; enough for 2 ms of the two workers' work; 32 at most
    assert [buffering.capacity(seconds) for seconds in (None, 1.0, 4e-4, 2e-4, 1e-4, 1e-6)] == [10, 10, 10, 20, 32, 32]
    assert str(buffering) == "10 to 32"
    assert buffering.most == 32
    assert Buffering.resolve(None, options("thread"), 10, deepen=True) == Buffering(10)  # threads: a number
    assert Buffering.resolve(None, options("process", nworkers=0), 10, deepen=True) == Buffering(10)


def test_the_engine_follows_the_timings_of_quick_items_with_processes():
    engine = Engine(abs, options("process"), Buffering(None, process_workers=2))
    try:
        assert (engine.capacity, engine.room(), engine.inline) == (10, 10, False)
        engine.cost.add(2e-4)  # what the workers report for each item
        assert (engine.capacity, engine.room()) == (20, 20)
    finally:
        engine.close()


def test_quick_processes_read_the_right_items_with_as_many_ahead_as_their_slots_allow():
    from lazyseq.loading import buffering

    data = lazyseq.view(np.arange(40_000.0).reshape(400, 100)).batch(2)  # 1.6 kB items
    with lazyseq.prefetch(data, nworkers=2, method="process") as ahead:
        batches = list(ahead)
        engine = ahead._engine
        assert engine.capacity == 32  # items this quick: the most
        assert engine.workers.workers._slots.count == 34
    assert all((batch == data[b]).all() for b, batch in enumerate(batches))
    budget, buffering.SLOT_BUDGET = buffering.SLOT_BUDGET, 20 * 4096  # room for 20 slots of a page
    try:
        import lazyseq.loading.prefetch as prefetch_module

        prefetch_module.SLOT_BUDGET = buffering.SLOT_BUDGET
        with lazyseq.prefetch(data, nworkers=2, method="process") as ahead:
            batches, most = [], 0
            for batch in ahead:
                batches.append(batch.copy())  # its slot free again at the next read
                most = max(most, len(ahead._engine.ready) + len(ahead._engine.pending))
            assert ahead._engine.workers.workers._slots.count == 20
            assert ahead._engine.capacity == 18  # what 20 slots hold while the reader holds two items
            assert 10 <= most <= 18
    finally:
        buffering.SLOT_BUDGET = prefetch_module.SLOT_BUDGET = budget
    assert all((batch == data[b]).all() for b, batch in enumerate(batches))


def test_processes_keep_reading_ahead_when_the_consumer_keeps_every_item():
    data = lazyseq.view(np.arange(40_000.0).reshape(400, 100)).batch(2)
    with lazyseq.prefetch(data, nworkers=2, method="process") as ahead:
        kept, least = [], 64
        for b, batch in enumerate(ahead):
            kept.append(batch)  # every slot held from the 34th item on: the next results come back pickled
            if 40 <= b < 190:
                least = min(least, len(ahead._engine.pending) + len(ahead._engine.ready))
    assert least >= 2  # items read ahead still: never one at a time
    assert all((batch == data[b]).all() for b, batch in enumerate(kept))

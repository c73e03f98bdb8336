"""prefetch: a view like any other, whose items workers compute ahead, identical whatever the workers."""

import collections
import functools
import itertools
import multiprocessing
import os
import pickle
import threading
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loader_helpers import (
    check_a_forked_child_keeps_what_it_inherited,
    fail_on_seven,
    nested,
    noisy,
    prefetch,
    remember_worker,
    slow_in_worker_zero,
    square,
    worker_index,
)
from test_properties import check_view

import lazyseq

START_METHODS = [m for m in ("fork", "forkserver", "spawn") if m in multiprocessing.get_all_start_methods()]
WORKERS = [("thread", None)] + [("process", m) for m in START_METHODS]
FEW = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same(a, b):
    """Equal values, recursing into the structures a loader must carry."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("method, start_method", WORKERS)
def test_items_are_those_of_the_sequence_in_order(method, start_method):
    source = lazyseq.smap(nested, range(25))
    with prefetch(source, nworkers=2, method=method, start_method=start_method, max_buffered=4) as ahead:
        items = list(ahead)
        assert all(same(got, nested(i)) for i, got in enumerate(items))
        assert same(ahead[-1], nested(24))
        assert [int(x["x"][0, 0]) for x in ahead[::-5]] == [24, 19, 14, 9, 4]


@FEW
@given(st.data(), st.lists(st.integers(-100, 100), max_size=30), st.sampled_from(["thread", "process"]))
def test_a_prefetched_view_behaves_like_a_list(data, xs, method):
    with prefetch(lazyseq.smap(square, xs), nworkers=2, method=method, max_buffered=3) as ahead:
        check_view(data, ahead, [x * x for x in xs], depth=1)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_random_access_gets_the_right_items(method):
    order = np.random.default_rng(0).integers(-300, 300, size=400)
    with prefetch(lazyseq.smap(square, range(300)), nworkers=2, method=method) as ahead:
        assert [ahead[int(i)] for i in order] == [(i % 300) ** 2 for i in order.tolist()]
        assert list(reversed(ahead))[:3] == [299**2, 298**2, 297**2]


def test_an_empty_sequence_iterates_to_nothing():
    for method in ("thread", "process"):
        with prefetch([], nworkers=2, method=method) as ahead:
            assert list(ahead) == []
            assert not ahead.workers_running
            with pytest.raises(
                IndexError,
                match=r"^index 0 out of range for view prefetch\(2 (threads, max_buffered=10|processes, max_buffered=10 to 32)\) "
                r"of length 0$",
            ):
                ahead[0]


def test_zero_workers_compute_in_the_reader_and_negative_means_all_cores_but_n():
    ahead = prefetch(lazyseq.smap(square, range(5)), nworkers=0)
    assert list(ahead) == [0, 1, 4, 9, 16] and not ahead.workers_running
    assert repr(ahead).startswith("prefetch(synchronous)  [len 5]")
    cores = lazyseq.loading.options.available_cores()
    assert prefetch(range(3), nworkers=-1)._options.nworkers == max(1, cores - 1)
    assert prefetch(range(3), nworkers=-1000)._options.nworkers == 1


def test_bad_options_are_reported_when_the_view_is_made():
    with pytest.raises(ValueError, match="prefetch: method must be 'thread', 'process' or 'ray', got 'fiber'"):
        prefetch([1], nworkers=1, method="fiber")
    with pytest.raises(ValueError, match="prefetch: max_buffered must be a positive integer, got 0"):
        prefetch([1], nworkers=1, max_buffered=0)
    with pytest.raises(ValueError, match="prefetch: start_method only applies to method='process'"):
        prefetch([1], nworkers=1, start_method="spawn")
    with pytest.raises(ValueError, match="prefetch: start_method must be one of"):
        prefetch([1], nworkers=1, method="process", start_method="teleport")
    with pytest.raises(TypeError, match="prefetch: start_hook must be callable, got int"):
        prefetch([1], nworkers=1, start_hook=3)


def test_repr_shows_the_workers_and_the_pipeline():
    ahead = prefetch(lazyseq.smap(square, range(4)), nworkers=2, method="process")
    assert (
        repr(ahead)
        == "prefetch(2 processes, max_buffered=10 to 32)  [len 4]\n└─ smap(square)  [len 4]\n   └─ arange(0, 4, 1)  [len 4]"
    )
    explicit = prefetch(lazyseq.smap(square, range(4)), nworkers=2, method="process", max_buffered=10)
    assert repr(explicit).startswith("prefetch(2 processes, max_buffered=10)  [len 4]")
    for method, one in [("thread", "1 thread"), ("process", "1 process")]:  # said "1 processes"
        with prefetch([1], nworkers=1, method=method, max_buffered=3) as single:
            assert repr(single).startswith(f"prefetch({one}, max_buffered=3)  [len 1]")


@pytest.mark.parametrize("method, start_method", WORKERS)
def test_start_hook_runs_in_each_worker_with_its_index(method, start_method):
    source = lazyseq.smap(worker_index, range(40))
    with prefetch(source, nworkers=2, method=method, start_method=start_method, start_hook=remember_worker) as ahead:
        seen = set(ahead)
    assert seen <= {0, 1} and seen


def test_start_hook_runs_once_per_thread():
    calls = []
    with prefetch(range(50), nworkers=3, start_hook=calls.append) as ahead:
        assert list(ahead) == list(range(50))
    assert sorted(calls) == [0, 1, 2]


@pytest.mark.parametrize("nworkers, method", [(0, "thread"), (1, "thread"), (2, "thread"), (2, "process")])
def test_shuffled_random_transforms_give_the_same_items_whatever_the_workers(nworkers, method):
    pipeline = lazyseq.smap(noisy, lazyseq.shuffle(range(200), seed=3))
    expected = [noisy(i) for i in lazyseq.shuffle(range(200), seed=3)]
    with prefetch(pipeline, nworkers=nworkers, method=method) as ahead:
        assert list(ahead) == expected


@pytest.mark.parametrize("method", ["thread", "process"])
def test_iteration_resumes_from_a_saved_state(method):
    pipeline = lazyseq.smap(noisy, lazyseq.shuffle(range(50), seed=1, epoch=2))
    with prefetch(pipeline, nworkers=2, method=method) as ahead:
        first = iter(ahead)
        before = [next(first) for _ in range(17)]
        state = first.state_dict()
    assert state == {"position": 17, "length": 50, "shuffles": [[1, 2]]}
    with prefetch(pipeline, nworkers=2, method=method) as ahead:
        resumed = iter(ahead)
        resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
        assert before + list(resumed) == list(pipeline)
        with pytest.raises(ValueError, match="saved state is for a view of length 50, this one has length 3"):
            iter(prefetch(range(3), nworkers=1)).load_state_dict(state)
    # Loaded where the shuffle was at another epoch (or had another seed), it resumed another order: 4 items of 20
    # never came, others twice.
    for seed, epoch in [(1, 0), (2, 2)]:
        with pytest.raises(ValueError) as caught:
            iter(prefetch(lazyseq.shuffle(range(50), seed=seed, epoch=epoch), nworkers=1)).load_state_dict(state)
        assert str(caught.value) == (
            f"prefetch: the saved state is of shuffles with [seed, epoch] [[1, 2]], this view's are [[{seed}, {epoch}]]"
            ": set the epoch it was saved at (set_epoch) and the same seeds before loading it"
        )
    with pytest.raises(ValueError, match=r"^prefetch: a saved state is a dict from state_dict\(\), got list$"):
        iter(prefetch(range(3), nworkers=1)).load_state_dict([17, 50])


@pytest.mark.parametrize("position", [-3, 11, 2.0, True, "4", None])
def test_a_saved_position_outside_the_view_is_refused(position):
    # -3 delivered items 7, 8, 9, then 0 to 9 again; 100 ended at once
    with prefetch(range(10), nworkers=1) as ahead:
        with pytest.raises(ValueError) as caught:
            iter(ahead).load_state_dict({"position": position, "length": 10})
        assert str(caught.value) == f"prefetch: the saved position must be an integer from 0 to 10, got {position!r}"
        resumed = iter(ahead)
        resumed.load_state_dict({"position": np.int64(10), "length": 10})  # the end, as a checkpoint may hold it
        assert list(resumed) == []


def test_slices_and_batches_of_a_prefetched_view_read_through_its_workers():
    with prefetch(lazyseq.smap(square, range(100)), nworkers=2, inline_below=0) as ahead:  # cheap: force workers
        assert list(ahead[90:95]) == [x * x for x in range(90, 95)]
        assert list(ahead[::-30]) == [99**2, 69**2, 39**2, 9**2]
        np.testing.assert_array_equal(ahead.batch(8)[-1], [x * x for x in range(96, 100)])
        assert ahead.workers_running


@pytest.mark.parametrize("method", ["thread", "process"])
def test_items_read_together_through_a_gather_are_those_of_the_view(method):
    with prefetch(lazyseq.smap(square, range(40)), nworkers=2, method=method, inline_below=0) as ahead:
        expected = lazyseq.smap(square, range(40)).shuffle(seed=3).batch(6)
        assert [b.tolist() for b in ahead.shuffle(seed=3).batch(6)] == [b.tolist() for b in expected]
        # An item wanted twice is computed twice, as any view reads it.
        assert ahead[np.array([3, 1, 3, 39, -1])].batch(5)[0].tolist() == [9, 1, 9, 39**2, 39**2]
    with prefetch(lazyseq.smap(fail_on_seven, range(40)), nworkers=2, method=method, inline_below=0) as ahead:
        with pytest.raises(lazyseq.EvaluationError) as caught:
            ahead[np.array([3, 1, 7, 2])].batch(4)[0]
        assert str(caught.value) == (
            "failed to compute batch[0] -> gather[2] -> prefetch[7] -> smap(fail_on_seven)[7]: ValueError: bad value 7"
        )
        assert ahead[np.array([12, 5, 30])].batch(3)[0].tolist() == [12, 5, 30]  # the loader goes on


@pytest.mark.parametrize("method", ["thread", "process"])
def test_an_error_read_through_a_batch_names_the_item_as_without_a_loader(method):
    source = lazyseq.smap(fail_on_seven, range(40))
    with prefetch(source, nworkers=2, method=method) as ahead:
        for _ in range(2):  # the first reads (threads: computed by the reader), and once the workers run
            with pytest.raises(lazyseq.EvaluationError) as caught:
                ahead.batch(10)[0]
            assert str(caught.value).startswith("failed to compute batch[0] -> prefetch[7] -> smap(fail_on_seven)[7]")
            with pytest.raises(lazyseq.EvaluationError) as caught:
                ahead[np.array([3, 1, 7, 2])].batch(4)[0]
            assert str(caught.value).startswith("failed to compute batch[0] -> gather[2] -> prefetch[7] -> smap(")
            assert ahead.batch(10)[1].tolist() == list(range(10, 20))


@pytest.mark.parametrize("nworkers", [0, 2])
def test_an_error_met_iterating_a_view_over_a_loader_is_wrapped_once(nworkers):
    batches = lazyseq.batch(lazyseq.smap(fail_on_seven, range(10)), 2)
    with prefetch(batches, nworkers=nworkers, method="thread") as ahead:
        items = lazyseq.unbatch(ahead, 2)  # iterates the loader, as a view does
        with pytest.raises(lazyseq.EvaluationError) as caught:
            list(items)
        assert type(caught.value.__cause__) is ValueError
        assert str(caught.value) == (
            "failed to compute unbatch[6] -> prefetch[3] -> batch[3] -> smap(fail_on_seven)[7]: ValueError: bad value 7"
        )


def records(count):
    """Dicts in an array of Python objects: the array is the batch; the same dicts made one by one are collated."""
    array = np.empty(count, dtype=object)
    array[:] = [{"id": i} for i in range(count)]
    return array


def test_a_batch_is_the_same_whoever_computed_its_items():
    # A batch the reader read at once was the parent's chunk, one the workers computed the list of its items.
    positions = np.array([2, 4, 3, 6])
    expected = lazyseq.view(records(8))[positions].batch(4)[0]  # the records, as a slice of their array holds them
    assert expected.dtype == object and expected.tolist() == [{"id": 2}, {"id": 4}, {"id": 3}, {"id": 6}]
    with prefetch(lazyseq.view(records(8)), nworkers=2) as ahead:  # threads: the reader computes these
        batches = ahead[positions].batch(4)
        for _ in range(3):
            batch = batches[0]
            assert batch.dtype == object and batch.tolist() == expected.tolist()


def object_array(values):
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


@pytest.mark.parametrize(
    "source",
    [
        np.array(["a", "bb", "c", "dd", "e", "f"], dtype="<U5"),
        np.array([b"a", b"bb", b"c", b"dd", b"e", b"f"], dtype="S4"),
        np.arange(6, dtype=">f8"),
        np.arange(12, dtype=">i4").reshape(6, 2),
        object_array(["x", 1, None, (2, 3), [4], 5.0]),
        lazyseq.collate([np.array(list("abcdef")).astype("<U3"), object_array(list(range(6)))]),
        np.zeros(6, dtype=[("a", "<i4"), ("b", ">f4")]),
        np.array([(k, None) for k in range(6)], dtype=[("a", "<i4"), ("o", "O")]),
    ],
    ids=["str", "bytes", "big-endian", "big-endian rows", "objects", "collated", "structured", "structured objects"],
)
@pytest.mark.parametrize("how", ["reader", "thread", "process"])
def test_a_batch_above_a_loader_has_the_dtype_it_has_without_one(source, how):
    # Items read one by one and stacked: strings took the widest among them (<U2), numbers the machine's byte
    # order, and objects were collated (a list, a tuple of lists) where the source's slice keeps them as they are.
    options = {"reader": {}, "thread": {"inline_below": 0}, "process": {"method": "process"}}[how]
    with prefetch(source, nworkers=2, **options) as ahead:
        for positions in (slice(None), [5, 4, 3, 2, 1, 0]):  # read in order, and in a batch of a gather
            got = [lazyseq.batch(ahead[positions], 4)[b] for b in range(2)]
            want = [lazyseq.batch(lazyseq.view(source)[positions], 4)[b] for b in range(2)]
            for batch, same in zip(got, want):
                for field, field_expected in zip(*(b if isinstance(b, tuple) else (b,) for b in (batch, same))):
                    assert field.dtype.str == field_expected.dtype.str
                    assert field.tolist() == field_expected.tolist()


@pytest.mark.parametrize("how", ["reader", "thread", "process"])
def test_a_batch_above_a_loader_over_arrays_of_several_dtypes_has_the_dtype_it_has_without_one(how):
    # Within one part, a batch read without the loader takes that part's dtype (<U5, >f8); above it, the items'
    # stacked one (<U2, float64).
    options = {"reader": {}, "thread": {"inline_below": 0}, "process": {"method": "process"}}[how]
    for parts in (
        [np.array(["ab", "c", "d"], "U5"), np.array(["x", "y"], "U1")],
        [np.arange(3.0).astype(">f8"), np.arange(2.0)],
    ):
        source = lazyseq.concatenate(parts)
        with prefetch(source, nworkers=2, **options) as ahead:
            for through in (lambda v: v, lambda v: v.gather([2, 1, 0, 4, 3]), lambda v: v.shuffle(seed=0)):
                got = [through(ahead).batch(2)[b] for b in range(3)]  # one part, one part, or both
                want = [through(source).batch(2)[b] for b in range(3)]
                assert [(b.dtype.str, b.tolist()) for b in got] == [(b.dtype.str, b.tolist()) for b in want]


class _Listed(list):
    pass


def _kinds_of_item(i):
    counts = collections.defaultdict(int, {"n": i})
    return counts, _Listed([np.arange(3) + i]), (np.arange(2) + i).astype(">M8[ns]")


def test_every_result_of_worker_processes_comes_back_alike_whether_pickled_or_in_a_slot():
    # The first results, pickled before the slots exist, kept a defaultdict and a list's subclass, which those in
    # slots come back without; and their times of the other byte order came back in this one.
    with prefetch(lazyseq.smap(_kinds_of_item, range(12)), nworkers=2, method="process") as ahead:
        got = [(type(d), type(listed), times.dtype.str, d["n"], listed[0][0]) for d, listed, times in ahead]
    assert got == [(dict, list, ">M8[ns]", i, i) for i in range(12)]
    with lazyseq.load_buffers(functools.partial(_kinds_of_item, 1), nworkers=2, method="process") as batches:
        got = [(type(d), type(listed), times.dtype.str) for d, listed, times in itertools.islice(batches, 12)]
    assert got == [(dict, list, ">M8[ns]")] * 12
    # what pickle cannot send (a lambda) goes with cloudpickle, its containers rebuilt all the same
    pipeline = lazyseq.smap(lambda i: (_kinds_of_item(i)[0], lambda: i), range(4))
    with prefetch(pipeline, nworkers=2, method="process") as ahead:
        assert [(type(d), f()) for d, f in ahead] == [(dict, i) for i in range(4)]


@pytest.mark.parametrize(
    "source", [np.arange(24, dtype=">i4").reshape(12, 2)[::2], np.arange(12).astype(">M8[s]").reshape(6, 2)]
)
def test_a_pipeline_sent_to_spawned_workers_keeps_the_byte_order_of_its_arrays(source):
    # numpy pickled these as arrays of this machine's byte order: the workers' items had another dtype.
    with prefetch(lazyseq.view(source), nworkers=2, method="process", start_method="spawn") as ahead:
        assert [item.dtype.str for item in ahead] == [source.dtype.str] * 6


def test_an_item_wanted_twice_in_one_read_waits_for_its_turn():
    computed = []
    with prefetch(lazyseq.smap(computed.append, range(20)), nworkers=1, max_buffered=2, inline_below=0) as ahead:
        ahead[np.r_[0:20, 0:20]].batch(40, collate_fn=list)[0]
    assert computed == list(range(20)) * 2  # the second 0 was sent as soon as the first was read


def wait_for_the_other_worker(barrier, x):
    barrier.wait()
    return x


def test_items_read_together_through_a_gather_are_computed_together():
    barrier = threading.Barrier(2, timeout=30)  # two items that run at once pass it: one at a time never does
    source = lazyseq.smap(functools.partial(wait_for_the_other_worker, barrier), range(16))
    with prefetch(source, nworkers=2, inline_below=0) as ahead:
        assert [b.tolist() for b in ahead[np.arange(15, -1, -1)].batch(4)] == [
            [15, 14, 13, 12], [11, 10, 9, 8], [7, 6, 5, 4], [3, 2, 1, 0]
        ]  # fmt: skip


class CountingReads(lazyseq.views.base.View):
    """An array's rows that record how many are read at once."""

    def __init__(self, array):
        self._array = array
        self._len = len(array)
        self.sizes = []

    def _get(self, i):
        self.sizes.append(1)
        return self._array[i]

    def _get_many(self, idx):
        self.sizes.append(len(idx))
        return self._array[idx]


@pytest.mark.parametrize("nworkers", [0, 2])
def test_cheap_items_read_together_are_read_at_once_by_the_reader(nworkers):
    source = CountingReads(np.arange(40.0).reshape(20, 2))
    ahead = prefetch(source, nworkers=nworkers)  # threads, cheap items: computed by the reader
    batches = ahead[np.arange(19, -1, -1)].batch(5)
    np.testing.assert_array_equal(np.concatenate(list(batches)), source._array[::-1])
    np.testing.assert_array_equal(np.concatenate(list(ahead.batch(5))), source._array)
    # With threads the first two items are timed alone, to tell whether items are worth the workers.
    assert source.sizes == ([5] * 8 if nworkers == 0 else [1, 1, 3] + [5] * 7)
    assert not ahead.workers_running
    ahead.close()


def test_closing_stops_the_workers_and_reading_again_restarts_them():
    ahead = prefetch(lazyseq.smap(square, range(10)), nworkers=2, method="process")
    assert ahead[3] == 9 and ahead.workers_running
    ahead.close()
    ahead.close()  # idempotent
    assert not ahead.workers_running and multiprocessing.active_children() == []
    assert ahead[4] == 16 and ahead.workers_running
    ahead.close()


def test_a_slow_worker_process_gets_fewer_items():
    items = lazyseq.smap(slow_in_worker_zero, range(60))
    with prefetch(items, nworkers=2, method="process", start_method="fork", start_hook=remember_worker) as ahead:
        workers = list(ahead)
    # Each worker holds at most two items at a time, and the next goes to whichever answers first. In order,
    # worker 1 can run ahead of a slow item only by max_buffered (10) items: worker 0 computes about one item in
    # ten rather than one in two (13 here; 25 when each worker was sent its share up front).
    assert workers.count(0) <= 15 and workers.count(1) >= 45


def test_process_results_over_the_slot_size_are_pickled():
    sizes = [10, 10, 10_000, 10]  # the slots are sized from the first result
    source = lazyseq.smap(lambda n: np.ones(n), sizes)
    with prefetch(source, nworkers=1, method="process", start_method="fork") as ahead:
        assert [len(x) for x in ahead] == sizes
        assert ahead._engine.workers.workers._slots.slot_bytes < 10_000 * 8


def test_items_from_shared_slots_stay_valid_while_referenced():
    """A slot is reused only when nothing refers to its item: keeping every item gives correct items."""
    source = lazyseq.smap(lambda i: np.full(1000, i), range(60))
    with prefetch(source, nworkers=2, method="process", start_method="fork", max_buffered=3) as ahead:
        kept = list(ahead)
        kept += [ahead[i] for i in range(60)]
    assert [int(x[0]) for x in kept] == list(range(60)) * 2
    assert all((x == x[0]).all() for x in kept)


def test_a_forked_child_keeps_the_items_it_inherited_as_they_were_when_forked():
    # The slots stayed shared: the child saw the parent's later items in its copy, the parent the child's writes.
    rows = np.arange(60 * 1000).reshape(60, 1000)  # each row built in its slot
    with prefetch(lazyseq.view(rows), nworkers=2, method="process", start_method="fork") as ahead:
        check_a_forked_child_keeps_what_it_inherited(iter(ahead), rows)


def slots_resident_kib():
    """KiB of the loaders' shared-memory slots in this process's memory (Linux)."""
    total, in_slots = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if "-" in line.split(" ", 1)[0]:  # a mapping's first line
                in_slots = "lazyseq-slots" in line
            elif in_slots and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux only")
def test_an_item_kept_after_close_keeps_its_slot_not_the_pool():
    # A slice of one item kept the whole pool's memory (every slot written) until it went.
    with prefetch(lazyseq.smap(lambda i: np.full(1 << 17, i), range(20)), nworkers=2, method="process") as ahead:
        for x in ahead:
            x.sum()  # every slot's pages in this process too
        kept = x[:2]
        del x
        assert slots_resident_kib() >= 10 * 1024
    assert kept.tolist() == [19, 19]
    assert slots_resident_kib() <= 1024 + 8  # one slot of 1 MiB, and its header page


def test_memory_maps_travel_to_workers_as_file_locations(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(18_000 * 248, dtype=np.float64).reshape(18_000, 248))
    np.save(tmp_path / "b.npy", np.zeros((7, 248)))
    data = lazyseq.open_npy([tmp_path / "a.npy", tmp_path / "b.npy"])
    pipeline = data[100:][::-7].batch(16)
    assert len(pickle.dumps(pipeline)) < 4096  # 35 MB of rows, a few hundred bytes of pickle
    with prefetch(pipeline, nworkers=2, method="process", start_method="spawn") as ahead:
        for got, expected in zip(ahead, pipeline):
            np.testing.assert_array_equal(got, expected)


def test_a_memory_map_whose_file_was_replaced_is_refused_where_it_is_opened_again(tmp_path):
    # Workers that get the pipeline pickled (spawn, forkserver) open memory maps again by file name: they read
    # whatever file was there, while the consumer's maps showed the old one, and batches mixed the two silently.
    path = tmp_path / "rows.npy"
    np.save(path, np.arange(40.0).reshape(20, 2))
    rows = lazyseq.open_npy(path)
    np.save(tmp_path / "new.npy", np.zeros((20, 2)))
    os.replace(tmp_path / "new.npy", path)
    message = (
        f"{path} is not the file that the view's memory map showed: another file was put at that name since (a "
        "memory map travels to other processes by file name); make the view again over the new file, or keep the "
        "old one there while its loaders run"
    )
    with pytest.raises(OSError) as refused:
        pickle.loads(pickle.dumps(rows.batch(4)))
    assert str(refused.value) == message
    with prefetch(rows.batch(4), nworkers=1, method="process", start_method="spawn") as ahead:
        with pytest.raises(lazyseq.LoaderError) as failed:
            ahead[0]
    assert str(failed.value.__cause__) == message
    assert (
        str(failed.value)
        == f"prefetch: worker process 0 could not start: unpickling the pipeline failed: OSError: {message}"
    )
    assert rows[3].tolist() == [6.0, 7.0]  # the consumer still reads the file it mapped


def test_where_the_system_does_not_say_which_file_is_mapped_a_file_replaced_after_pickling_is_refused(
    tmp_path, monkeypatch
):
    path = tmp_path / "rows.npy"
    np.save(path, np.arange(40.0).reshape(20, 2))
    rows = lazyseq.open_npy(path)
    real_stat = os.stat

    def unprivileged_stat(name, *args, **kwargs):  # reading /proc/self/map_files needs CAP_SYS_ADMIN
        if str(name).startswith("/proc/self/map_files/"):
            raise PermissionError(1, "Operation not permitted", name)
        return real_stat(name, *args, **kwargs)

    monkeypatch.setattr(os, "stat", unprivileged_stat)
    pickled = pickle.dumps(rows)
    assert pickle.loads(pickled)[3].tolist() == [6.0, 7.0]
    np.save(tmp_path / "new.npy", np.zeros((20, 2)))
    os.replace(tmp_path / "new.npy", path)
    with pytest.raises(OSError, match="is not the file that the view's memory map showed"):
        pickle.loads(pickled)


def test_a_memory_map_whose_file_was_written_in_place_is_read_as_the_consumer_reads_it(tmp_path):
    path = tmp_path / "rows.npy"
    np.save(path, np.arange(40.0).reshape(20, 2))
    rows = lazyseq.open_npy(path)
    np.save(path, np.full((20, 2), 5.0))  # the same file, rewritten: the consumer's map shows the new values too
    with prefetch(rows.batch(4), nworkers=1, method="process", start_method="spawn") as ahead:
        assert [batch.tolist() for batch in ahead] == [batch.tolist() for batch in rows.batch(4)]
    assert rows[0].tolist() == [5.0, 5.0]


def structures():
    """Random results: arrays of assorted dtypes and shapes, strings, numbers, nested in tuples, lists, dicts."""
    dtypes = st.sampled_from(["int8", "uint16", "int64", "float32", "float64", "bool", "complex64", "U3"])
    arrays = st.builds(
        lambda dtype, shape, seed: np.random.default_rng(seed).integers(0, 50, size=shape).astype(dtype),
        dtypes,
        st.lists(st.integers(0, 4), max_size=3).map(tuple),
        st.integers(0, 1000),
    )
    leaves = arrays | st.text(max_size=5) | st.integers(-5, 5) | st.floats(allow_nan=False) | st.none()
    return st.recursive(
        leaves,
        lambda inner: (
            st.tuples(inner, inner)
            | st.lists(inner, max_size=3)
            | st.dictionaries(st.text("abc", min_size=1, max_size=2), inner, max_size=3)
        ),
        max_leaves=8,
    )


@FEW
@given(st.lists(structures(), min_size=1, max_size=6), st.sampled_from(WORKERS[:2]))
def test_random_nested_results_arrive_intact(items, workers):
    method, start_method = workers
    with prefetch(items, nworkers=2, method=method, start_method=start_method, max_buffered=2) as ahead:
        assert all(same(got, expected) for got, expected in zip(ahead, items))
        assert same(ahead[0], items[0])


def test_a_prefetched_view_inside_a_forked_worker_starts_workers_of_its_own():
    inner = prefetch(lazyseq.smap(square, range(20)), nworkers=1, inline_below=0)
    assert inner[0] == 0  # its thread runs in this process
    outer = lazyseq.smap(lambda i: inner[i] + 1, range(20))
    with prefetch(outer, nworkers=2, method="process", start_method="fork") as ahead:
        assert list(ahead) == [i * i + 1 for i in range(20)]
    assert inner[5] == 25 and inner.workers_running
    inner.close()


@pytest.mark.filterwarnings("ignore:prefetch. the pipeline reads an iterable")  # (tested below)
@pytest.mark.parametrize("method", ["thread", "process"])
def test_iteration_stops_where_data_of_unknown_length_ends(method):
    source = lazyseq.smap(square, lazyseq.uniter(ReiterableRange(7)))
    with prefetch(source, nworkers=2, method=method, start_method="fork" if method == "process" else None) as p:
        assert list(p) == [x * x for x in range(7)]


class ReiterableRange:
    """Iterable again and again, with no length (a uniter over it has an unknown length)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def test_processes_need_a_posix_system(monkeypatch):
    import select

    monkeypatch.delattr(select, "poll")
    with pytest.raises(NotImplementedError, match="method='process' needs a POSIX system"):
        prefetch(range(3), nworkers=1, method="process")


@pytest.mark.parametrize("method", ["thread", "process"])
def test_set_epoch_reaches_the_items_computed_ahead_and_the_workers(method):
    # worker processes kept their copy of epoch 0, and items computed ahead were of the old epoch
    shuffled = lazyseq.arange(40).shuffle(seed=0)
    with prefetch(shuffled, nworkers=2, method=method) as ahead:
        assert list(ahead) == list(lazyseq.shuffle(range(40), 0, 0))
        ahead.set_epoch(1)
        assert list(ahead) == list(lazyseq.shuffle(range(40), 0, 1))
        reading = iter(ahead)
        head = [next(reading) for _ in range(5)]
        ahead.set_epoch(2)
        assert (
            head + list(reading)
            == list(lazyseq.shuffle(range(40), 0, 1))[:5] + list(lazyseq.shuffle(range(40), 0, 2))[5:]
        )


def test_slots_are_sized_before_the_first_result_when_the_view_says_what_its_items_are():
    from lazyseq.loading.prefetch import slot_bytes_for_spec
    from lazyseq.loading.shared_slots import slot_bytes_for

    batches = lazyseq.view(np.zeros((100, 248))).batch(256 // 4)  # (the last one short: slots for a full one)
    assert slot_bytes_for_spec(batches._item_spec_at_most()) == slot_bytes_for(64 * 248 * 8)
    pairs = lazyseq.collate([np.zeros((10, 3), np.float32), np.arange(10)]).batch(2)
    assert slot_bytes_for_spec(pairs._item_spec()) == slot_bytes_for(64 + 64)  # each array aligned to 64 bytes
    assert slot_bytes_for_spec(lazyseq.smap(square, range(3))._item_spec()) == 0  # unknown: from the first result
    assert slot_bytes_for_spec(lazyseq.view(np.array([None, 1])).batch(2)._item_spec()) == 0  # objects: pickled


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_loader_follows_set_epoch_called_below_it_at_its_next_pass(method):
    # process workers kept their copy of the pipeline: every later pass gave epoch 0
    shuffled = lazyseq.shuffle(range(10), seed=3)
    with lazyseq.prefetch(shuffled.batch(5), nworkers=2, method=method) as loader:
        first = [b.tolist() for b in loader]
        shuffled.set_epoch(1)
        second = [b.tolist() for b in loader]
    expected = list(lazyseq.shuffle(range(10), seed=3, epoch=1))
    assert second == [expected[:5], expected[5:]] and second != first


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_loader_read_by_index_follows_set_epoch_called_below_it(method):
    # Only a new pass looked: reads by index, slices and batches over a process loader kept giving epoch 0.
    shuffled = lazyseq.shuffle(lazyseq.smap(int, range(20)), seed=1)
    with lazyseq.prefetch(shuffled, nworkers=2, method=method, inline_below=0) as loader:
        assert list(loader) == list(lazyseq.shuffle(range(20), seed=1))
        shuffled.set_epoch(1)
        expected = list(lazyseq.shuffle(range(20), seed=1, epoch=1))
        assert [loader[i] for i in range(20)] == expected
        shuffled.set_epoch(2)
        expected = list(lazyseq.shuffle(range(20), seed=1, epoch=2))
        assert list(loader[:10]) == expected[:10]
        assert [int(v) for b in loader.batch(5) for v in b] == expected


def test_items_computed_while_another_epoch_was_set_below_are_dropped_though_it_was_set_back():
    # The epoch was compared, 0 then 0: items the worker threads had computed in epoch 1's order meanwhile were kept.
    gate, computed = threading.Event(), threading.Event()

    def held(i):
        if i >= 1:  # item 0 first; the next ones, computed ahead, wait for the epoch to change
            gate.wait(10)
        return i

    def pick(_, x):
        computed.set()
        return int(x)

    shuffled = lazyseq.shuffle(range(12), seed=0)
    pipeline = lazyseq.smap(pick, lazyseq.smap(held, range(12)), shuffled)
    with prefetch(pipeline, nworkers=2, inline_below=0, max_buffered=4) as loader:
        reads = iter(loader)
        first = next(reads)
        computed.clear()
        shuffled.set_epoch(1)  # a validation pass on the same shuffle, say
        gate.set()
        assert computed.wait(10)  # items ahead computed in epoch 1's order
        shuffled.set_epoch(0)
        assert [first, *reads] == list(lazyseq.shuffle(range(12), seed=0))


def test_a_cache_drops_an_item_computed_while_another_epoch_was_set_below_though_it_was_set_back():
    inside, gate = threading.Event(), threading.Event()

    def held(i):
        if i == 5:
            inside.set()
            gate.wait(10)
        return i

    shuffled = lazyseq.shuffle(range(10), seed=0)
    cached = lazyseq.smap(lambda _, x: int(x), lazyseq.smap(held, range(10)), shuffled).add_cache(10)
    cached[0]
    reader = threading.Thread(target=lambda: cached[5])
    reader.start()
    assert inside.wait(10)
    shuffled.set_epoch(1)
    gate.set()
    reader.join()  # item 5 of epoch 1 cached
    shuffled.set_epoch(0)
    assert cached[5] == list(lazyseq.shuffle(range(10), seed=0))[5]


def test_the_pool_holds_no_more_slots_than_the_view_has_items_and_its_failure_is_the_loaders(monkeypatch):
    # max_buffered=100_000 for 5 items asked for 100,002 slots, and the failure read "failed to compute prefetch[0]".
    from lazyseq.loading import shared_slots

    data = np.arange(5 * 1000.0).reshape(5, 1000)
    with prefetch(data, nworkers=1, method="process", max_buffered=100_000) as ahead:
        assert np.array_equal(np.stack(list(ahead)), data)
        assert ahead._engine.workers.most_held() == 5  # slots, less the two that items being read hold
    monkeypatch.setattr(shared_slots, "available_shared_memory", lambda: 10_000)
    with prefetch(data, nworkers=1, method="process", max_buffered=3) as ahead:
        with pytest.raises(lazyseq.LoaderError) as caught:
            ahead[0]
    assert isinstance(caught.value, MemoryError)
    assert str(caught.value) == (
        "prefetch: the shared-memory pool needs 0.1 MiB (5 slots of 0.01 MiB) but only 0.0 MiB are available; "
        "lower the number of buffered items or the item size"
    )


@pytest.mark.parametrize("method", ["thread", "process"])
def test_an_item_read_out_of_turn_keeps_what_was_read_ahead(method):
    # Two threads reading a loader in turn (a thread loader over a process loader), the second one first: the read
    # order looked broken, and the items read ahead were dropped at every such read (1.8x slower than no loader).
    with prefetch(lazyseq.smap(square, range(30)), nworkers=2, method=method, inline_below=0, max_buffered=6) as ahead:
        assert [ahead[i] for i in (0, 1, 2, 4)] == [0, 1, 4, 16]
        engine = ahead._engine
        assert {5, 6, 7} <= set(engine.pending) | set(engine.ready)  # still on their way
        order = [3, 5, 7, 6, *range(8, 30)]
        assert [ahead[i] for i in order] == [i * i for i in order]


@pytest.mark.parametrize("method", ["process", "thread"])
def test_worker_processes_over_an_iterable_are_warned_of_the_work_done_over(method):
    # Each worker process iterated over every item before its own: 1.3x the time of no loader, and no word of why.
    source = lazyseq.uniter(range(10), size=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with prefetch(lazyseq.smap(int, source), nworkers=2, method=method) as ahead:
            assert list(ahead) == list(range(10))
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    if method == "thread":
        assert messages == []
    else:
        assert messages == [
            "prefetch: the pipeline reads an iterable (uniter): each worker process gets a copy of it, and iterates "
            "over every item before those it computes, so that the workers do the work several times over; use "
            "method='thread', or read the iterable with load_buffers"
        ]
        assert caught[0].filename == __file__


def test_many_items_read_at_once_from_process_workers_over_data_alone_are_read_with_one_call():
    # Each row of a batch above the loader went to a worker and back alone: 80 times the time of no loader.
    data = lazyseq.view(np.arange(40.0).reshape(20, 2))
    expected = np.asarray(data)[np.asarray(lazyseq.shuffle(range(20), seed=0))].reshape(5, 4, 2)
    with prefetch(lazyseq.collate([data, range(20)]), nworkers=2, method="process") as ahead:
        batches = list(lazyseq.batch(lazyseq.shuffle(ahead, seed=0), 4))
        assert not ahead.workers_running  # no code of the user's to isolate in the workers
    np.testing.assert_array_equal(np.stack([x for x, _ in batches]), expected)
    with prefetch(lazyseq.smap(np.negative, data), nworkers=2, method="process") as ahead:
        batches = list(lazyseq.batch(lazyseq.shuffle(ahead, seed=0), 4))
        assert ahead.workers_running  # a function: computed in the worker processes
    np.testing.assert_array_equal(np.stack(batches), -expected)


def test_closing_a_loader_that_a_worker_of_another_reads_costs_that_loader_nothing():
    # The outer loader's worker waited on the inner loader's item as the inner one closed: the item's outcome was
    # LoaderClosed, raised by a read of the outer loader, which nobody had closed.
    computing, release = threading.Event(), threading.Event()

    def held_at_one(x):
        if x == 1 and not release.is_set():
            computing.set()
            release.wait(timeout=60)
        return x

    inner = prefetch(lazyseq.smap(held_at_one, range(10)), nworkers=1, inline_below=0)
    outer = prefetch(lazyseq.smap(lambda x: x + 1, inner), nworkers=1, inline_below=0)
    try:
        assert outer[0] == 1
        assert computing.wait(timeout=60)  # the outer worker reads item 1 from the inner loader, which computes it
        engine = inner._engine
        closing = threading.Thread(target=inner.close)  # the close waits for the inner worker to end its item
        closing.start()
        while not engine.closed:  # the outer worker's read of item 1 ends now: the inner loader is closed
            closing.join(timeout=0.001)
        release.set()
        closing.join(timeout=60)
        assert outer[1] == 2 and outer.batch(4)[0].tolist() == [1, 2, 3, 4]
    finally:
        release.set()
        outer.close()
        inner.close()


def fortran_pair(i):
    return np.asfortranarray(np.full((100, 100), float(i))), (np.asfortranarray(np.arange(6.0).reshape(2, 3)) + i)


def test_arrays_in_fortran_order_come_back_from_worker_processes_in_c_order_first_to_last():
    # The first results (pickled: the slots did not exist yet) came back in Fortran order, the later ones in C order.
    with lazyseq.prefetch(lazyseq.smap(fortran_pair, range(8)), nworkers=2, method="process") as ahead:
        for i, (big, small) in enumerate(ahead):
            assert big.flags.c_contiguous and small.flags.c_contiguous and big.flags.writeable
            assert (big == i).all() and small.tolist() == (np.arange(6.0).reshape(2, 3) + i).tolist()

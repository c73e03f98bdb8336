"""Behaviour specific to single views: collapse of nested views, caching, uniter, shuffle, repr, write-through."""

import pickle
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import lazyseq
from lazyseq.views.concatenate import ConcatenateView
from lazyseq.views.gather import GatherView


def test_nested_slices_and_gathers_collapse_onto_the_base():
    base = lazyseq.view(list(range(100)))
    nested = base[10:90][::2][5:][[0, -1]][::-1]
    assert type(nested) is GatherView and nested._parent is base
    assert list(nested) == list(range(100))[10:90][::2][5:][::1][-1:-3:-1][::1] or list(nested) == [88, 20]
    assert list(nested) == [88, 20]


def test_nested_concatenations_flatten():
    joined = lazyseq.concatenate([lazyseq.concatenate([[1], [2]]), [], lazyseq.concatenate([[3], [4, 5]])])
    assert type(joined) is ConcatenateView and len(joined._parents) == 4
    assert list(joined) == [1, 2, 3, 4, 5]


def test_smap_and_collate_length_mismatch():
    with pytest.raises(ValueError, match="smap: all sequences must have the same length, got lengths 2, 3"):
        lazyseq.smap(max, [1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="collate: all sequences must have the same length, got lengths 1, 2"):
        lazyseq.collate([[1], [1, 2]])


def test_views_are_lazy():
    calls = []
    v = lazyseq.smap(calls.append, range(10)).gather([3, 4]).batch(1, collate_fn=list)
    assert calls == []
    v[1]
    assert calls == [4]


def test_add_cache_evicts_least_recently_used():
    calls = []

    def f(x):
        calls.append(x)
        return x

    v = lazyseq.add_cache(lazyseq.smap(f, range(10)), cache_size=2)
    for i in [1, 2, 1, 3, 1, 2]:  # 2 is evicted by 3 (1 was used more recently)
        v[i]
    assert calls == [1, 2, 3, 2]


def test_uniter_restarts_reiterables_and_caches():
    class Counting:
        starts = 0

        def __iter__(self):
            Counting.starts += 1
            return iter(range(100))

    v = lazyseq.uniter(Counting(), cache_size=3, n_parallel=2, size=100)
    assert [v[i] for i in (5, 50, 6, 51, 5, 0)] == [5, 50, 6, 51, 5, 0]
    assert Counting.starts == 3  # two parallel iterators, then a restart for item 0
    assert list(v[98:]) == [98, 99]


def test_uniter_one_shot_iterator_cannot_go_back():
    v = lazyseq.uniter(iter(range(10)))
    assert v[4] == 4 and v[2] == 2  # drawn on the way to 4, kept until read
    with pytest.raises(lazyseq.EvaluationError, match="uniter cannot go back to item 2: the iterable is a one-shot"):
        v[2]
    cached = lazyseq.uniter(iter(range(10)), cache_size=3)
    assert cached[4] == 4 and cached[2] == 2


def test_uniter_keeps_the_items_it_passed_over_until_read_in_any_order():
    # Worker threads reading in turn may ask for item 11 before item 5: drawn on the way, item 5 was dropped.
    v = lazyseq.uniter(iter(range(200)))
    order = [5, 0, 3, 11, 1, 2, 4, 6, 10, 9, 7, 8, 12]
    assert [v[i] for i in order] == order
    assert v[100] == 100 and [v[i] for i in range(36, 100)] == list(range(36, 100))  # the last 64 passed over
    with pytest.raises(
        lazyseq.EvaluationError,
        match=r"uniter cannot go back to item 35: the iterable is a one-shot iterator, already at item 101, and item "
        r"35 is not kept \(read before and not cached, or one of more than 64 passed over on the way to later items\)",
    ):
        v[35]


def test_uniter_of_a_reiterable_keeps_nothing_it_passes_over():
    # another iterator draws it again: kept, 64 items, large ones perhaps, would be held for nothing
    class Counting:
        def __iter__(self):
            return iter(range(100))

    v = lazyseq.uniter(Counting(), size=100)
    assert v[50] == 50 and not v._passed and v[10] == 10


def failing_at(n, end=30):
    for i in range(end):
        if i == n:
            raise OSError(f"the disk is gone at item {n}")
        yield i


def test_a_one_shot_iterator_that_failed_on_the_way_to_a_later_item_fails_that_item_and_ends_there():
    # The failure was raised for the later item, the cursor dropped: every read after it said "cannot go back".
    v = lazyseq.uniter(failing_at(7))
    with pytest.raises(IndexError, match="^uniter index 11 out of range: the iterable ended after 8 items$"):
        v[11]
    with pytest.raises(
        lazyseq.EvaluationError, match=r"^failed to compute uniter\[7\]: OSError: the disk is gone at item 7$"
    ):
        v[7]
    assert v[3] == 3
    with pytest.raises(IndexError, match="^uniter index 8 out of range"):
        v[8]


def test_worker_threads_reading_a_one_shot_iterator_that_fails_report_the_item_that_failed_and_end():
    got, failures = [], []
    with lazyseq.prefetch(lazyseq.uniter(failing_at(20, 100)), nworkers=4, method="thread") as ahead:
        reading = iter(ahead)
        while True:
            try:
                got.append(next(reading))
            except StopIteration:
                break
            except lazyseq.EvaluationError as error:
                failures.append(str(error))
    assert got == list(range(20))
    assert failures == ["failed to compute prefetch[20] -> uniter[20]: OSError: the disk is gone at item 20"]


@pytest.mark.parametrize("nworkers", [2, 4])
def test_worker_threads_read_a_one_shot_iterator_in_any_order(nworkers):
    def slowly(n):
        for i in range(n):
            time.sleep(0.001)  # an iterable whose items take a moment (a file, a socket, a served stream)
            yield i

    with lazyseq.prefetch(lazyseq.uniter(slowly(100)), nworkers=nworkers, method="thread") as ahead:
        assert list(ahead) == list(range(100))


def test_uniter_without_size_reads_to_the_end():
    v = lazyseq.uniter(x for x in "abc")
    with pytest.raises(TypeError, match="uniter view has no known length"):
        len(v)
    assert list(v) == ["a", "b", "c"]
    w = lazyseq.uniter(x for x in "abc")
    with pytest.raises(IndexError, match="uniter index 5 out of range: the iterable ended after 3 items"):
        w[5]


def test_a_slice_of_a_uniter_ends_where_its_data_does():
    # its length was stop - start, and reading past the data raised
    data = lazyseq.uniter(iter(range(5)), cache_size=10)
    assert list(data[:10]) == [0, 1, 2, 3, 4] and [b.tolist() for b in data[2:10].batch(3)] == [[2, 3, 4]]
    assert list(data[1:10:2]) == [1, 3] and list(data[3:15][1:]) == [4] and list(data[2:4]) == [2, 3]
    with pytest.raises(TypeError, match="slice view has no known length"):
        len(data[:10])


def test_a_pickled_uniter_over_a_one_shot_iterator_goes_on_from_where_it_stood():
    # the copy's item i was the original's item i + 2
    data = lazyseq.uniter(iter([10, 20, 30, 40, 50]), cache_size=5, size=5)
    assert data[1] == 20
    copy = pickle.loads(pickle.dumps(data))
    assert [copy[i] for i in range(5)] == [data[i] for i in range(5)] == [10, 20, 30, 40, 50]
    uncached = lazyseq.uniter(iter([10, 20, 30]))
    assert uncached[1] == 20
    copy = pickle.loads(pickle.dumps(uncached))
    assert copy[2] == 30 and copy[0] == 10  # item 0, drawn on the way to 1 and not read, came with the copy
    with pytest.raises(lazyseq.EvaluationError, match="uniter cannot go back to item 0"):
        copy[0]


def test_uniter_size_larger_than_data():
    with pytest.raises(lazyseq.EvaluationError, match="ended after 2 items, but its size was given as 3"):
        list(lazyseq.uniter([1, 2], size=3))


def test_shuffle_is_reproducible_and_changes_per_epoch():
    a = lazyseq.shuffle(range(50), seed=3)
    assert sorted(a) == list(range(50))
    assert list(a) == list(lazyseq.shuffle(range(50), seed=3))
    epoch1 = list(lazyseq.shuffle(range(50), seed=3, epoch=1))
    assert epoch1 != list(a)
    pipeline = a.batch(10)
    pipeline.set_epoch(1)
    assert np.concatenate(list(pipeline)).tolist() == epoch1
    assert a.epoch == 1


def test_shuffle_writes_through():
    data = [0, 0, 0]
    s = lazyseq.shuffle(data, seed=1)
    s[0] = 7
    assert data[int(s.permutation[0])] == 7


def test_repr_shows_the_pipeline():
    def normalize(x):
        return x

    pipeline = lazyseq.view(np.zeros((10, 3), dtype=np.float32)).smap(normalize).shuffle(seed=2).batch(4)
    assert repr(pipeline) == "\n".join(
        [
            "batch(4)  [len 3]",
            "└─ shuffle(seed=2, epoch=0)  [len 10]",
            "   └─ smap(test_repr_shows_the_pipeline.<locals>.normalize)  [len 10]",
            "      └─ array float32 (10, 3)  [len 10]",
        ]
    )
    assert repr(lazyseq.cycle([1])) == "cycle  [infinite]\n└─ list  [len 1]"


def test_repr_of_many_parts_is_shortened():
    text = repr(lazyseq.concatenate([[i] for i in range(20)]))
    assert text.splitlines()[-1] == "└─ ... 15 more"


def test_write_through_to_arrays_and_read_only_memmaps(tmp_path):
    data = np.zeros(6)
    v = lazyseq.concatenate([data[:3], data[3:]])
    v[2:5] = [1, 2, 3]
    v[[0, -1]] = [9, 8]
    assert data.tolist() == [9, 0, 1, 2, 3, 8]
    with pytest.raises(ValueError, match="cannot assign 1 values to a slice of 2 items"):
        v[:2] = [1]
    np.save(tmp_path / "a.npy", np.zeros(3))
    mapped = lazyseq.open_npy(tmp_path / "a.npy")
    with pytest.raises(ValueError, match="read-only"):
        mapped[0] = 1


def test_smap_is_read_only():
    with pytest.raises(TypeError, match="smap views are read-only"):
        lazyseq.smap(abs, [1])[0] = 2


def test_view_rejects_non_sequences():
    # A dict was pointed to uniter(), which gives its keys; a number too, which is no iterable.
    base = re.escape("by position) is needed")
    with pytest.raises(
        TypeError, match=rf"^cannot make a view of dict: .*{base}; for a dict of columns of one length, "
    ):
        lazyseq.view({"a": 1})
    with pytest.raises(TypeError, match=rf"{base}; use lazyseq.uniter\(\) for an iterable$"):
        lazyseq.view(x for x in [])
    with pytest.raises(TypeError, match=rf"^cannot make a view of int: .*{base}$"):
        lazyseq.view(5)


def test_all_is_sorted_and_complete():
    assert lazyseq.__all__ == sorted(lazyseq.__all__)
    for name in lazyseq.__all__:
        assert hasattr(lazyseq, name)


def test_import_does_not_load_extras():
    code = "import sys, lazyseq; print(sorted(m for m in ('torch', 'sklearn', 'zmq', 'ray', 'tqdm', 'seqtools', 'cloudpickle', 'threadpoolctl') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_concatenated_arrays_of_every_layout_gather_the_same_rows():
    base = np.arange(120.0).reshape(10, 3, 4)
    layouts = {
        "contiguous": base,
        "fortran": np.asfortranarray(base),
        "strided": np.arange(240.0).reshape(20, 3, 4)[::2],
        "zero-width": np.zeros((10, 0)),
        "one-dimensional": np.arange(10),
        "structured": np.array([(i, 2.0 * i) for i in range(10)], dtype=[("a", "i4"), ("b", "f8")]),
    }
    positions = [19, 0, 3, 11, 10, 9, 3]
    for name, array in layouts.items():
        joined = lazyseq.concatenate([array, array.copy()])
        expected = np.concatenate([array, array])[positions]
        got = joined.gather(positions).batch(len(positions))[0]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected, err_msg=name)


def test_slice_assignment_between_overlapping_views_of_rows_reads_values_first():
    # The values were rows of the same memory, read as views: the writes changed them before they were written.
    data, model = np.arange(12).reshape(6, 2), np.arange(12).reshape(6, 2)
    lazyseq.view(data)[1:] = lazyseq.view(data)[:-1]
    model[1:] = model[:-1].copy()
    assert data.tolist() == model.tolist()
    data = np.arange(8).reshape(4, 2)
    rows = lazyseq.view(data)
    rows[::-1] = rows
    assert data.tolist() == [[6, 7], [4, 5], [2, 3], [0, 1]]
    x, y = np.arange(8.0).reshape(4, 2), np.arange(4) * 10
    pairs = lazyseq.collate([x, y])
    pairs[1:] = pairs[:-1]
    assert x.tolist() == [[0, 1], [0, 1], [2, 3], [4, 5]] and y.tolist() == [0, 0, 10, 20]


def test_a_zero_dimensional_integer_array_is_an_index():
    values = [10, 20, 30]
    assert lazyseq.view(values)[np.array(1)] == values[np.array(1)] == 20  # was IndexError: "must be 1-D"
    assert lazyseq.view(np.arange(5.0))[np.array(-1)] == 4.0
    with pytest.raises(
        TypeError, match="^sequence indices must be integers, slices or integer arrays, not numpy.ndarray$"
    ):
        lazyseq.view(values)[np.array(1.0)]


def test_an_empty_array_of_floats_is_refused_as_an_index_as_numpy_refuses_it():
    message = "^sequence indices must be integers, slices or integer arrays, not an array of float64$"
    with pytest.raises(TypeError, match=message):
        lazyseq.view([1, 2])[np.array([], dtype=float)]
    assert len(lazyseq.view([1, 2])[[]]) == 0  # an empty list is no positions (np.asarray makes it floats)


@pytest.mark.parametrize("key", [[[0], [1, 2]], [0, [1, 2]]], ids=["lists of two lengths", "a list beside a number"])
def test_an_unevenly_nested_index_list_is_an_index_error(key):
    # numpy's ValueError ("inhomogeneous shape") came out, where a nested list of one length is an IndexError
    with pytest.raises(IndexError) as caught:
        lazyseq.view(np.arange(5))[key]
    assert str(caught.value) == "array: an index array must be 1-D, got a list nested unevenly"
    with pytest.raises(IndexError) as caught:
        lazyseq.gather(np.arange(5), key)
    assert str(caught.value) == "gather: an index array must be 1-D, got a list nested unevenly"


@pytest.mark.parametrize("key", [np.True_, np.array(True)], ids=["scalar", "0-d array"])
def test_a_numpy_boolean_is_no_index_whatever_the_numpy(key):
    # numpy before 2.3 read it as 1, with a DeprecationWarning; from 2.3 on, it refuses it
    with pytest.raises(TypeError) as caught:
        lazyseq.view([10, 20, 30])[key]
    # named as numpy names it: "not bool", where True is taken (as a list takes it), read as a riddle
    assert (
        str(caught.value)
        == f"sequence indices must be integers, slices or integer arrays, not numpy.{type(key).__name__}"
    )
    assert lazyseq.view([10, 20, 30])[True] == 20  # a Python bool is an int, as for a list


def test_add_cache_forgets_the_items_of_another_epoch():
    cached = lazyseq.arange(10).shuffle(seed=0).add_cache(10)
    assert list(cached) == list(lazyseq.shuffle(range(10), 0, 0))
    cached.set_epoch(1)  # the cached items of epoch 0 kept coming back
    assert list(cached) == list(lazyseq.shuffle(range(10), 0, 1))


@pytest.mark.parametrize("loader", [None, "thread", "process"])
def test_add_cache_forgets_the_items_of_another_epoch_set_on_a_shuffle_below_it(loader):
    # Only set_epoch called through the cache cleared it: a prefetch above it, which follows the shuffle, read old items.
    shuffled = lazyseq.shuffle(range(10), seed=0)
    cached = lazyseq.add_cache(shuffled, cache_size=10)
    read = cached if loader is None else lazyseq.prefetch(cached, nworkers=2, method=loader)
    try:
        assert list(read) == list(lazyseq.shuffle(range(10), seed=0, epoch=0))
        shuffled.set_epoch(1)
        assert list(read) == list(lazyseq.shuffle(range(10), seed=0, epoch=1))
    finally:
        if loader is not None:
            read.close()


def test_add_cache_uniter_and_copy_on_write_maps_pickle(tmp_path):
    import pickle

    # add_cache and uniter failed on their lock; a copy-on-write map travelled as its file, without its changes
    assert list(pickle.loads(pickle.dumps(lazyseq.view([1, 2, 3]).add_cache(2)))) == [1, 2, 3]
    assert list(pickle.loads(pickle.dumps(lazyseq.uniter([1, 2, 3])))) == [1, 2, 3]
    np.save(tmp_path / "x.npy", np.zeros((4, 2)))
    changed = np.load(tmp_path / "x.npy", mmap_mode="c")
    changed[0] = 7
    assert pickle.loads(pickle.dumps(lazyseq.view(changed)))[0].tolist() == [7.0, 7.0]


def test_interleave_refuses_a_sequence_of_unknown_length():
    # the other sequences' items after its end were dropped silently
    with pytest.raises(TypeError, match=r"^interleave: sequence 0 has no known length \(uniter\): give it a size"):
        lazyseq.interleave(lazyseq.uniter(iter([1, 2])), [10, 20, 30, 40])
    assert list(lazyseq.interleave(lazyseq.uniter(iter([1, 2]), size=2), [10, 20, 30, 40])) == [1, 10, 2, 20, 30, 40]


def test_unbatch_of_batches_of_unknown_length_ends_with_the_data():
    assert [int(x) for x in lazyseq.uniter(x for x in range(5)).batch(2).unbatch(2, 1)] == [0, 1, 2, 3, 4]
    again = lazyseq.uniter(range(5)).batch(2).unbatch(2, 1)
    assert [int(x) for x in again] == [0, 1, 2, 3, 4]


def test_arguments_that_other_functions_refuse_are_refused_here_too():
    # each was taken silently: 'no' as True, True as one cut, -1 as the last branch, a dict's keys as sequences
    with pytest.raises(TypeError, match=r"^shard: contiguous must be True or False, got 'no'$"):
        lazyseq.shard(range(6), 0, 2, contiguous="no")
    with pytest.raises(TypeError, match=r"^split: edges must be a number of cuts, not a bool, got True$"):
        lazyseq.split(range(6), True)
    with pytest.raises(lazyseq.EvaluationError) as caught:
        list(lazyseq.case([0, -1], "ab", "AB", "xy"))
    assert str(caught.value).endswith(
        "ValueError: case: selector[1] is -1, but it must be the number of one of the 3 sequences, an integer from 0 to 2"
    )
    assert list(lazyseq.case(np.array([2, 0]), "ab", "AB", "xy")) == ["x", "b"]
    with pytest.raises(TypeError, match=r"^concatenate: sequences must be a list of sequences, got a dict"):
        lazyseq.concatenate({"ab": [1]})
    with pytest.raises(TypeError, match=r"^gather's indexes needs a length, but cycle view is infinite$"):
        lazyseq.gather("abc", lazyseq.cycle([0]))  # read for ever


def test_a_cached_item_written_while_it_is_read_is_not_cached_stale():
    # the read finished after the write and put the old value back in the cache, for good
    data = [0, 1]
    cached = None

    def write_while_read(i, x):
        if i == 0 and data[0] == 0:
            cached[0] = 99  # writes through to data and forgets item 0, while this read goes on

    cached = lazyseq.add_cache(lazyseq.debug(data, write_while_read), 2)
    assert cached[0] == 0  # the value read before the write
    assert data[0] == 99 and cached[0] == 99  # not the stale one kept


def test_a_cache_below_every_shuffle_keeps_its_items_across_epochs():
    calls = []
    decoded = lazyseq.smap(lambda x: calls.append(x) or x * 10, range(6)).add_cache(6)
    pipeline = decoded.shuffle(seed=0)
    for epoch in range(3):
        pipeline.set_epoch(epoch)
        assert sorted(pipeline) == [0, 10, 20, 30, 40, 50]
    assert len(calls) == 6  # decoded once, not once per epoch
    above = lazyseq.shuffle(range(6), seed=0).add_cache(6)
    first = list(above)
    above.set_epoch(1)
    assert list(above) == list(lazyseq.shuffle(range(6), seed=0, epoch=1)) != first  # a cache above: forgotten


def test_a_shuffle_pickles_without_its_permutation():
    shuffled = lazyseq.shuffle(range(10**6), seed=1)
    first = shuffled[0]  # draws the permutation: 8 MB
    copy = pickle.loads(pickle.dumps(shuffled))
    assert len(pickle.dumps(shuffled)) < 1000 and copy[0] == first and copy.epoch == shuffled.epoch


def test_a_view_of_unknown_length_is_false_when_it_has_no_item():
    # It was always True, as if it could not end (and len() raises for it).
    assert not lazyseq.uniter(iter([]))
    assert not lazyseq.uniter(iter(range(3)))[5:]
    assert lazyseq.uniter(iter(range(3)))[2:]
    assert lazyseq.cycle([1])  # infinite


def test_an_arange_too_long_to_index_says_so():
    with pytest.raises(ValueError) as caught:
        lazyseq.arange(2**70)
    assert str(caught.value) == "arange: 1180591620717411303424 items, more than a view can index (2**63 - 1 at most)"
    with pytest.raises(ValueError, match=r"^arange: 9223372036854775808 items"):
        lazyseq.arange(2**63, 0, -1)
    assert len(lazyseq.arange(2**62)) == 2**62 and len(lazyseq.arange(2**63 - 1)) == 2**63 - 1


def read_after_an_epoch_change(shuffled, cached, end):
    shuffled.set_epoch(1)
    end.send([cached[i] for i in range(10)])


def test_a_cache_forked_while_another_thread_followed_an_epoch_change_still_follows_one():
    # The watch's lock, held by the parent's other thread at the fork, stayed held in the child: its reads hung.
    import multiprocessing

    shuffled = lazyseq.shuffle(range(10), seed=0)
    cached = lazyseq.add_cache(shuffled, cache_size=10)
    list(cached)
    fork = multiprocessing.get_context("fork")
    ends = fork.Pipe()
    with cached._epoch_watch._lock:  # as a thread following a change holds it
        child = fork.Process(target=read_after_an_epoch_change, args=(shuffled, cached, ends[1]))
        child.start()
    assert ends[0].poll(60), "the forked child's read hung"
    assert ends[0].recv() == list(lazyseq.shuffle(range(10), seed=0, epoch=1))
    child.join()


def test_concatenate_takes_dict_items_whose_keys_come_in_another_order():
    x, y = np.arange(3), np.arange(3.0)
    joined = lazyseq.concatenate([lazyseq.collate({"a": x, "b": y}), lazyseq.collate({"b": y, "a": x})])
    assert len(joined) == 6 and joined[4] == {"a": 1, "b": 1.0}
    whole = joined.batch(6)[0]
    assert list(whole) == ["a", "b"] and whole["a"].dtype == np.int64 and whole["b"].dtype == np.float64
    assert whole["a"].tolist() == [0, 1, 2, 0, 1, 2] and whole["b"].tolist() == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    for batch in (joined[3:].batch(3)[0], joined[[5, 0]].batch(2)[0]):  # from the second part, or both
        assert list(batch) == ["a", "b"]  # the first part's order
    assert joined[[5, 0]].batch(2)[0]["a"].tolist() == [2, 0]
    other_keys = lazyseq.concatenate([lazyseq.collate({"a": x, "b": y}), lazyseq.collate({"a": x, "c": y})])
    assert other_keys[4] == {"a": 1, "c": 1.0}  # items as a list's; a batch of both parts says how they differ
    with pytest.raises(lazyseq.EvaluationError) as caught:
        other_keys.batch(6)[0]
    assert str(caught.value) == (
        "failed to compute batch[0]: ValueError: cannot collate dicts with different keys: "
        "item 0 has ['a', 'b'], item 3 has ['a', 'c']"
    )


def test_a_reversed_slice_shows_as_the_slice_that_gives_its_items():
    backwards = lazyseq.view([1, 2, 3])[::-1]
    assert repr(backwards).splitlines()[0] == "slice(2, None, -1)  [len 3]"
    with pytest.raises(IndexError) as caught:
        backwards[5]
    assert str(caught.value) == "index 5 out of range for view slice(2, None, -1) of length 3"
    every_third = lazyseq.view(list(range(10)))[::3][::-1]
    assert repr(every_third).splitlines()[0] == "slice(9, None, -3)  [len 4]"
    assert list(every_third) == list(range(10))[slice(9, None, -3)] == [9, 6, 3, 0]


def test_a_view_of_a_list_keeps_the_length_it_had_when_made():
    items = [1, 2, 3]
    v = lazyseq.view(items)
    items.append(4)
    assert len(v) == 3 and list(v) == [1, 2, 3] and list(reversed(v)) == [3, 2, 1]
    assert 4 not in v and v.count(4) == 0 and list(v.smap(lambda x: x)) == [1, 2, 3]
    with pytest.raises(ValueError, match=r"^4 is not in sequence view$"):
        v.index(4)
    del items[1:]  # the items past its end are read as an index reads them: not silently fewer
    uses = [(lambda: v[1], 1), (lambda: list(v), 1), (lambda: 5 in v, 1), (lambda: v.count(1), 1)]
    for use, missing in uses + [(lambda: list(reversed(v)), 2), (lambda: v[2], 2)]:
        with pytest.raises(lazyseq.EvaluationError) as caught:
            use()
        assert str(caught.value) == f"failed to compute sequence[{missing}]: IndexError: list index out of range"


@pytest.mark.parametrize("contiguous", [True, False])
def test_shards_with_drop_last_all_have_the_same_length_and_share_no_item(contiguous):
    # Without it, the ranks of a distributed training got 4 and 3 batches: the one with 4 waited for ever.
    for n in range(0, 23):
        for world in range(1, 6):
            shards = [lazyseq.shard(range(n), r, world, contiguous, drop_last=True) for r in range(world)]
            items = [i for s in shards for i in s]
            assert {len(s) for s in shards} == {n // world}
            assert len(set(items)) == len(items) == n // world * world
    with pytest.raises(TypeError, match="shard with drop_last"):
        lazyseq.shard(lazyseq.cycle([1, 2]), 0, 2, contiguous=False, drop_last=True)


def test_batches_through_case_and_switch_keep_the_dtype_their_sequences_share():
    # Their items were stacked as new values: <U1 for strings of a <U5 array, float64 for big-endian floats.
    words, floats, mixed = (
        np.array(["a", "b"], dtype="<U5"),
        np.array([1.0, 2.0], dtype=">f8"),
        np.array([1, "s"], dtype=object),
    )
    assert lazyseq.batch(lazyseq.case([0, 1], words, words), 2)[0].dtype == np.dtype("<U5")
    assert lazyseq.batch(lazyseq.switch([True, False], floats, floats), 2)[0].dtype == np.dtype(">f8")
    assert lazyseq.batch(lazyseq.case([0, 0], mixed), 2)[0].dtype == np.dtype(object)
    assert lazyseq.batch(lazyseq.case([0, 1], words, np.array(["c", "d"])), 2)[0].dtype == np.dtype(
        "<U1"
    )  # they differ


def test_a_permutation_drawn_as_another_thread_sets_the_epoch_is_not_kept_for_that_epoch(monkeypatch):
    # A read that drew epoch 1's permutation as set_epoch(0) ran stored it after: the whole epoch 0 came in epoch 1's
    # order (a loader's workers reading as a validation pass set the epoch back, say).
    shuffled = lazyseq.shuffle(range(12), seed=0)
    epoch_0 = list(shuffled)
    shuffled.set_epoch(1)
    epoch_1 = list(shuffled)
    assert epoch_1 != epoch_0
    draw = np.random.default_rng

    def drawn_as_the_epoch_is_set_back(seed):
        monkeypatch.setattr(np.random, "default_rng", draw)
        shuffled.set_epoch(0)  # another thread, between this read's look at the epoch and its keeping what it drew
        return draw(seed)

    shuffled.set_epoch(1)  # its permutation drawn anew at the next read
    monkeypatch.setattr(np.random, "default_rng", drawn_as_the_epoch_is_set_back)
    assert shuffled[0] == epoch_1[0]  # read as the epoch was set: of epoch 1
    assert list(shuffled) == epoch_0


def test_a_view_of_unknown_length_is_not_called_infinite_by_its_list_keys():
    class Five:  # an iterable read again from the start each time
        def __iter__(self):
            return iter(range(5))

    view = lazyseq.uniter(Five())
    for key, what in (([-1], "negative index -1"), ([True] * 5, "a boolean mask")):
        with pytest.raises(TypeError) as caught:
            view[key]
        assert str(caught.value) == f"uniter: {what} needs a length, but the view has no known length"


def test_a_failure_in_a_batch_of_list_items_names_the_item():
    items = [0, 1, 2, 3]
    view = lazyseq.view(items)
    del items[2:]  # (the list shrank after the view was made)
    with pytest.raises(lazyseq.EvaluationError) as caught:
        lazyseq.batch(lazyseq.concatenate([view, [9]]), 5)[0]
    assert str(caught.value) == (
        "failed to compute batch[0] -> concatenate[2] -> sequence[2]: IndexError: list index out of range"
    )


def test_reprs_of_a_long_array_repeated_one_part_and_an_unbatch_with_a_last_size():
    assert repr(lazyseq.repeat(np.zeros((100, 100)), 3)).splitlines()[0] == (
        "repeat(array float64 (100, 100))  [len 3]"
    )
    assert repr(lazyseq.concatenate([[1, 2]])).splitlines()[0].startswith("concatenate(1 part)  [len 2")
    assert (
        repr(lazyseq.unbatch(lazyseq.batch(np.arange(6), 4), 4, 2)).splitlines()[0]
        == "unbatch(4, 2)  [len 6, items int64]"
    )

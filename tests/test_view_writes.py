"""Assignment through views: what it writes, and that a refused one writes nothing."""

import copy
import re

import numpy as np
import pytest

import lazyseq
from lazyseq.views.errors import EndOfData


class Reiterable:
    """An iterable without len(): its view has no known length."""

    def __iter__(self):
        return iter([100, 101, 102])


def test_a_write_through_a_cache_is_seen_at_every_position_showing_that_item():
    data = [10, 20, 30]
    cycled = lazyseq.view(data).cycle(6).add_cache(6)  # positions 0 and 3 are both data[0]
    assert list(cycled) == [10, 20, 30, 10, 20, 30]
    cycled[0] = 99
    assert data == [99, 20, 30]
    assert cycled[3] == 99 and list(cycled) == [99, 20, 30, 99, 20, 30]
    array = np.arange(4)
    repeated = lazyseq.view(array).gather([1, 1]).add_cache(2)
    assert [int(repeated[0]), int(repeated[1])] == [1, 1]
    repeated[1] = 7
    assert int(repeated[0]) == 7 and array.tolist() == [0, 7, 2, 3]


def test_a_slice_with_a_stop_of_data_of_unknown_length_refuses_writes_past_it():
    data = list(range(10))
    joined = lazyseq.concatenate([data, lazyseq.uniter(Reiterable())])
    two = joined[0:2]
    message = "slice index 5 out of range: the slice ends at item 2 of its parent"
    with pytest.raises(EndOfData) as read:
        two[5]
    assert str(read.value) == message
    with pytest.raises(EndOfData) as written:
        two[5] = 99
    assert str(written.value) == message
    with pytest.raises(EndOfData, match=r"^slice index 7 out of range: the slice ends at item 2 of its parent$"):
        two[[7]] = [77]
    with pytest.raises(EndOfData, match=r"^slice index 7 out of range"):
        two[[1, 7]] = [-1, 77]  # the item within the slice is not written either
    assert data == list(range(10))
    two[1] = -1
    assert data[:3] == [0, -1, 2]


def test_the_short_last_batch_of_a_slice_of_data_of_unknown_length_takes_what_reading_it_gives():
    data = list(range(10))
    batches = lazyseq.concatenate([data, lazyseq.uniter(Reiterable())])[0:3].batch(2)  # [0, 1] and [2]
    with pytest.raises(ValueError, match=r"^batch 1 has 1 items, cannot assign 2 values$"):
        batches[1] = [-1, -2]
    assert data == list(range(10))
    with pytest.raises(EndOfData, match=r"^batch index 2 out of range: the data ended before item 4$"):
        batches[2] = [-1]
    batches[1] = batches[1] * 10
    assert data == [0, 1, 20, 3, 4, 5, 6, 7, 8, 9]
    padded = lazyseq.concatenate([data, lazyseq.uniter(Reiterable())])[0:3].batch(2, pad=0)
    padded[1] = padded[1] + 1  # two values, as reading gives: the padding is not written
    assert data == [0, 1, 21, 3, 4, 5, 6, 7, 8, 9]


def test_writing_one_item_through_unbatch_writes_only_that_item_as_it_is():
    numbers = [0, 1, 2, 3]
    flat = lazyseq.batch(numbers, 2).unbatch(2)
    flat[1] = 2.7
    assert numbers == [0, 2.7, 2, 3] and [type(x) for x in numbers] == [int, float, int, int]
    mixed = [1, 2.5, 3, 4]
    lazyseq.batch(mixed, 2)[::-1].add_cache(2).unbatch(2)[3] = 7.5  # through views that reorder or keep batches
    assert mixed == [1, 7.5, 3, 4] and [type(x) for x in mixed] == [int, float, int, int]
    cached = lazyseq.batch(mixed, 2).add_cache(2)
    assert cached[0].tolist() == [1.0, 7.5]
    lazyseq.unbatch(cached, 2)[0] = 0
    assert mixed == [0, 7.5, 3, 4] and cached[0].tolist() == [0.0, 7.5]  # the batch kept is forgotten


def test_a_refused_assignment_changes_nothing():
    labels = [0, 0, 0]
    pairs = lazyseq.collate([labels, range(3)])  # the range is read-only
    with pytest.raises(TypeError, match=r"^arange views are read-only: they cannot be assigned to$"):
        pairs[0] = (7, 7)
    with pytest.raises(TypeError, match=r"^arange views are read-only: they cannot be assigned to$"):
        pairs[:] = [(7, 7)] * 3
    assert labels == [0, 0, 0]
    data = [0, 0, 0]
    both = lazyseq.concatenate([data, (5, 6)])  # the tuple is read-only
    with pytest.raises(TypeError, match=r"^'tuple' object does not support item assignment$"):
        both[:] = [1, 2, 3, 4, 5]
    with pytest.raises(TypeError, match=r"^'tuple' object does not support item assignment$"):
        both[[0, 4]] = [1, 5]
    assert data == [0, 0, 0]
    frozen = np.zeros(2)
    frozen.flags.writeable = False
    values = np.zeros(2)
    with pytest.raises(ValueError, match=r"^assignment destination is read-only$"):
        lazyseq.concatenate([values, frozen])[1:3] = [1.0, 1.0]
    with pytest.raises(TypeError, match=r"^smap views are read-only: they cannot be assigned to$"):
        lazyseq.unbatch(lazyseq.batch(lazyseq.concatenate([data, lazyseq.smap(abs, [1])]), 2), 2)[3] = 9
    assert values.tolist() == [0, 0] and data == [0, 0, 0]
    both[:3] = [1, 2, 3]
    assert data == [1, 2, 3]


def test_an_assignment_through_slices_and_gathers_of_one_array_is_one_numpy_write(monkeypatch):
    # Item by item: 200,000 values took 90 ms (checked, then written one by one); as numpy writes them, 14 ms.
    from lazyseq.views.sources import ArraySource

    monkeypatch.setattr(ArraySource, "_set", lambda *_: pytest.fail("written item by item"))
    data = np.arange(10.0)
    view = lazyseq.view(data)
    view[2:8] = view[2:8][::-1]  # read before written, as numpy and lists do
    assert data.tolist() == [0.0, 1.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 8.0, 9.0]
    picked = np.arange(5)
    lazyseq.gather(picked, [3, 1, 3])[:] = [7, 8, 9]  # a position given twice takes the last value, as in numpy
    assert picked.tolist() == [0, 8, 2, 9, 4]
    whole = np.zeros(3, int)
    lazyseq.view(whole)[::-1] = [2.7, 1.2, 3.9]  # cast as one by one
    assert whole.tolist() == [3, 1, 2]
    monkeypatch.undo()
    ragged = np.zeros((2, 2))
    lazyseq.view(ragged)[:] = [[1.0, 2.0], 5.0]  # rows of several shapes: written one by one, as before
    assert ragged.tolist() == [[1.0, 2.0], [5.0, 5.0]]
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="^assignment destination is read-only$"):
        lazyseq.view(frozen)[:] = [1, 2, 3]


def test_writing_into_a_file_opened_for_reading_says_how_to_write_into_it(tmp_path):
    # numpy's bare "assignment destination is read-only", for a view of open_npy
    path = tmp_path / "labels.npy"
    np.save(path, np.arange(3))
    message = (
        "assignment destination is read-only: a memory map of a file opened for reading (open_npy opens them so); "
        "to write into the file, view np.load(path, mmap_mode='r+')"
    )
    for key in (0, slice(None)):
        with pytest.raises(ValueError) as refused:
            lazyseq.open_npy(path)[key] = [7, 8, 9] if key != 0 else 7
        assert str(refused.value) == message
    lazyseq.view(np.load(path, mmap_mode="r+"))[0] = 7
    assert np.load(path).tolist() == [7, 1, 2]


def test_an_assignment_reads_pieces_and_structured_rows_of_the_same_data_before_writing():
    # The values were views (a split's pieces) or rows pointing into the arrays written: read after the first writes.
    a = np.array([1, 2, 3, 4, 5, 6])
    halves = lazyseq.split(a, 1)
    halves[:] = halves[::-1]
    rows = np.array([(1, 1.0), (2, 2.0)], dtype=[("a", "<i4"), ("b", "<f4")])
    more = np.array([(3, 3.0), (4, 4.0)], dtype=rows.dtype)
    both = lazyseq.concatenate([rows, more])
    both[:] = both[::-1]
    assert a.tolist() == [4, 5, 6, 1, 2, 3]
    assert (rows.tolist(), more.tolist()) == ([(4, 4.0), (3, 3.0)], [(2, 2.0), (1, 1.0)])


def test_values_written_into_an_array_of_objects_stay_as_they_are():
    a = np.array([None, None, None], dtype=object)
    lazyseq.view(a)[0:2] = ["x", 5]  # made one array first: ["x", "5"]
    assert a.tolist() == ["x", 5, None] and type(a[1]) is int
    lazyseq.view(a)[[0, 1]] = [1, 2.5]
    assert a.tolist() == [1, 2.5, None] and type(a[0]) is int
    lazyseq.view(a)[0:2] = [np.int64(7), np.int64(8)]  # numpy scalars of one dtype too: not made Python ints
    assert [type(x) for x in a[:2]] == [np.int64, np.int64]
    lazyseq.view(a)[0:2] = [np.array([1, 2]), np.array([3])]  # arrays of several shapes: each stored as it is
    assert [x.tolist() for x in a[:2]] == [[1, 2], [3]]


def test_rows_of_one_dtype_and_several_shapes_are_written_one_by_one():
    # Each one is broadcast into its row, as item by item; np.asarray of them all raised ValueError.
    a = np.zeros((3, 2), int)
    lazyseq.view(a)[0:2] = [np.array([1, 2]), np.array([3])]
    assert a.tolist() == [[1, 2], [3, 3], [0, 0]]


def test_a_value_refused_as_it_is_written_leaves_every_item_as_it_was():
    a, b = [0, 0], np.zeros(2, dtype=np.int64)
    with pytest.raises(ValueError, match="invalid literal for int"):
        lazyseq.concatenate([a, b])[:] = [1, 2, 3, "x"]
    assert a == [0, 0] and b.tolist() == [0, 0]
    rows, numbers = np.array([(1, 1.0), (2, 2.0)], dtype=[("a", "<i4"), ("b", "<f4")]), np.array([10, 20])
    pairs = lazyseq.concatenate([lazyseq.collate([rows[:1], numbers[:1]]), lazyseq.collate([rows[1:], numbers[1:]])])
    with pytest.raises(ValueError, match="invalid literal for int"):
        pairs[:] = [((9, 9.0), 90), ((8, 8.0), "x")]  # what was there: rows in tuples, kept as copies
    assert (rows.tolist(), numbers.tolist()) == ([(1, 1.0), (2, 2.0)], [10, 20])


def test_unbatch_writes_one_item_where_its_batch_is_read_and_only_it():
    x = [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match=r"unbatch: batch 1 holds 2 items, not 3 \(batch_size=3\)"):
        lazyseq.unbatch(lazyseq.batch(x, 2), 3)[3] = 99  # written at x[2], where no read would have found item 3
    a = [1, 2]
    items = lazyseq.unbatch(lazyseq.batch(lazyseq.concatenate([a, lazyseq.repeat(0, 2)]), 4), 4)
    items[1] = 20  # its batch holds read-only items too, which are not written
    assert x == [0, 1, 2, 3, 4, 5] and a == [1, 20]


def test_a_batch_of_tuples_or_dicts_takes_back_what_it_gave():
    x, y = np.arange(4), np.arange(4) * 10
    pairs = lazyseq.batch(lazyseq.collate([x, y]), 3)
    pairs[0] = pairs[0]
    pairs[-1] = tuple(field + 1 for field in pairs[-1])  # as the README says: b[-1] = f(b[-1])
    assert (x.tolist(), y.tolist()) == ([0, 1, 2, 4], [0, 10, 20, 31])
    named = lazyseq.batch(lazyseq.collate({"x": x, "y": y}), 2)
    named[0] = {"x": np.array([7, 8]), "y": np.array([70, 80])}
    named[1] = ({"x": 5, "y": 50}, {"x": 6, "y": 60})  # a tuple of items, not of fields
    rows = [(1, 2), (3, 4)]
    lazyseq.batch(rows, 2)[0] = ((5, 6), (7, 8))
    lists = [[1, 2], [3, 4]]
    by_list = lazyseq.batch(lists, 2)
    by_list[0] = by_list[0]  # read field by field: [array([1, 3]), array([2, 4])]
    assert (x.tolist(), y.tolist(), rows) == ([7, 8, 5, 6], [70, 80, 50, 60], [(5, 6), (7, 8)])
    assert lists == [[1, 2], [3, 4]]


def test_a_batch_whose_items_hold_tuples_takes_back_what_it_gave():
    pairs = [(0, (0.5, "a")), (1, (1.5, "b"))]
    nested = lazyseq.batch(pairs, 2)
    nested[0] = nested[0]  # (array([0, 1]), (array([0.5, 1.5]), ['a', 'b'])): fields of fields
    assert pairs == [(0, (0.5, "a")), (1, (1.5, "b"))]


def test_a_slice_assignment_writes_batches_that_cannot_be_read_as_an_item_assignment_does():
    data = [0, np.zeros(2), 5, 6]  # the first batch does not stack: shapes () and (2,)
    lazyseq.batch(data, 2)[0:1] = [[1, 2]]
    assert data == [1, 2, 5, 6]


def test_an_assignment_reads_pieces_held_in_tuples_before_writing():
    a = np.array([1, 2, 3, 4, 5, 6])
    pairs = lazyseq.collate([lazyseq.split(a, 1)])  # items: (a[0:3],), (a[3:6],)
    pairs[:] = pairs[::-1]
    assert a.tolist() == [4, 5, 6, 1, 2, 3]


@pytest.mark.parametrize(
    ("dtype", "key", "values"),
    [
        (np.int8, slice(0, 1), [300]),  # out of range: refused, as numpy refuses it
        (np.uint8, slice(0, 2), [-1, 1]),
        (bool, [0, 1], [0, "zz"]),  # each value made a bool, not all of them strings first
        (bool, slice(None), [False, "False"]),
        ("<U3", slice(0, 2), [True, 1]),
        (np.int64, slice(0, 2), [1.5, "2"]),
        (np.int8, slice(0, 2), np.array([1.0, 1e10])),  # an array: cast array to array, as numpy assigns it
        (np.int32, [0, 2], np.array([2**40, 1])),
        # numpy scalars of several dtypes: each converted on its own, not promoted together first (to float64, <U32)
        (np.int64, slice(0, 2), [np.int64(2**60 + 1), np.float64(1.5)]),
        ("<U4", slice(0, 2), [np.int64(1), np.float64(2.5)]),
        (np.float64, slice(0, 2), [np.datetime64("2021-03-04"), np.timedelta64(5, "s")]),
        # an array of dates: refused as numpy refuses it, not cut short into strings value by value
        ("<U3", slice(0, 2), np.array([np.datetime64("2021-03-04"), np.datetime64("2022-01-01")])),
    ],
)
def test_an_assignment_of_several_values_into_an_array_converts_them_as_numpy_does(dtype, key, values):
    expected, written = np.array([1, 1, 1], dtype=dtype), np.array([1, 1, 1], dtype=dtype)
    with np.errstate(invalid="ignore"):  # a float out of an integer's range: numpy warns, and casts
        try:
            expected[key] = values
        except Exception as refused:
            with pytest.raises(type(refused)):
                lazyseq.view(written)[key] = values
        else:
            lazyseq.view(written)[key] = values
    assert written.tolist() == expected.tolist()


@pytest.mark.parametrize(
    "through",
    [
        lambda a: lazyseq.view(a),
        lambda a: lazyseq.view(a)[::-1],
        lambda a: lazyseq.view(a).shuffle(seed=0),
        lambda a: lazyseq.concatenate([a[:1], a[1:]]),
        lambda a: lazyseq.add_cache(a),
        lambda a: lazyseq.cycle(a, 8)[:4],
        lambda a: lazyseq.concatenate([a[:1], a[1:]]).shuffle(seed=1).add_cache(),
        lambda a: lazyseq.interleave(a[:2], a[2:]),
        lambda a: lazyseq.case([0, 1, 1, 0], a, a.copy()),
    ],
)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_an_array_assigned_through_views_over_arrays_converts_as_one_numpy_assignment(through, dtype):
    # Written one by one (numpy scalars), its values converted as scalars: 300 into int8 raised, into uint8 wrapped.
    values = np.array([1, 300, 2, 7])
    written = through(np.zeros(4, dtype))
    written[:] = values
    assert [int(x) for x in written] == values.astype(dtype).tolist()


def test_whether_parts_share_memory_is_found_in_one_sweep():
    from lazyseq.views.base import _may_share_data

    data = np.zeros(10)
    assert _may_share_data([lazyseq.view(data[0:4]), lazyseq.view(data[5:8]), lazyseq.view(data[3:6])])
    assert not _may_share_data([lazyseq.view(data[0:4]), lazyseq.view(data[4:8]), lazyseq.view(np.zeros(3))])
    assert _may_share_data(
        [lazyseq.concatenate([data[:2], np.zeros(2)]), lazyseq.view(np.zeros(2)), lazyseq.view(data[1:3])]
    )
    many = lazyseq.concatenate([np.zeros(2) for _ in range(5000)])  # pairs: 12.5 million checks (27 s for 10,000)
    many[:] = np.arange(10000.0)
    assert many[9999] == 9999.0


def test_an_array_assigned_through_views_over_one_array_twice_is_written_item_by_item():
    # Each value converted as numpy converts one (as data[1] = np.int64(300)), and of two written to one place the
    # last stays, as in a list.
    data = np.zeros(4, np.int8)
    with pytest.raises(OverflowError, match="^Python integer 300 out of bounds for int8$"):
        lazyseq.interleave(data, data)[:] = np.array([1, 300, 2, 7] * 2)
    assert data.tolist() == [0, 0, 0, 0]
    for make in (np.zeros, lambda n: [0.0] * n):
        twice = make(3)
        lazyseq.concatenate([twice, twice])[[3, 0]] = [1.0, 2.0]  # (parts written one after the other: 1.0 stayed)
        assert list(twice) == [2.0, 0.0, 0.0]
        twice = make(2)
        lazyseq.concatenate([twice, twice]).shuffle(seed=3)[:] = [1.0, 2.0, 3.0, 4.0]
        assert list(twice) == [4.0, 3.0]


@pytest.mark.parametrize("key", [slice(None, 2), [0, 1]])
def test_the_values_of_an_array_assigned_into_a_list_are_what_iterating_the_array_gives(key):
    # As list slice assignment: numpy scalars (hashable, comparable), not 0-d arrays.
    items = [1, 2, 3]
    lazyseq.view(items)[key] = np.array([7, 8])
    assert items == [7, 8, 3] and [type(x) for x in items] == [np.int64, np.int64, int]
    words = ["a", "b"]
    lazyseq.view(words).shuffle(seed=0)[:] = np.array(["x", "y"])
    assert sorted(words) == ["x", "y"] and {type(x) for x in words} == {np.str_}


@pytest.mark.parametrize("through", [lazyseq.add_cache, lambda a: lazyseq.concatenate([a[:1], a[1:]])])
def test_an_object_array_assigned_through_views_keeps_its_objects(through):
    data = np.array([1, 2, 3], dtype=object)
    through(data)[:] = np.array([7, "x", None], dtype=object)
    assert data.tolist() == [7, "x", None]


def test_an_assignment_refused_in_a_later_part_of_a_concatenation_writes_no_part():
    first, second = np.zeros(4), np.zeros(2, np.int8)
    with pytest.raises(ValueError, match="invalid literal for int"):
        lazyseq.concatenate([first, second])[:] = ["1", "2", "3", "4", "5", "x"]
    assert first.tolist() == [0, 0, 0, 0] and second.tolist() == [0, 0]
    lazyseq.concatenate([first, second])[:] = np.arange(6) * 100  # each part cast as numpy casts the array
    assert first.tolist() == [0, 100, 200, 300] and second.tolist() == [-112, -12]


@pytest.mark.skipif(np.lib.NumpyVersion(np.__version__) < "2.0.0", reason="numpy 1 crashes casting these")
@pytest.mark.parametrize("key", [slice(None), [1, 0]])
def test_bytes_that_are_no_dates_are_refused_as_numpy_refuses_them(key):
    # numpy's own indexed assignment of these returns with its error set: a SystemError, where a slice's is refused
    with pytest.raises(ValueError, match='^Error parsing datetime string "x" at position 0$'):
        lazyseq.view(np.zeros(2, "M8[D]"))[key] = np.array([b"x", b"a"])


def test_unbatch_writes_its_items_alone_whatever_the_rest_of_their_batch():
    s = [1, 2, 3, 4]
    items = lazyseq.unbatch(lazyseq.batch(s, 2), 2)
    items[0:2] = [(9, "t"), (8, "t")]  # the batch [(9, "t"), 2] does not stack: not read to write item 1
    assert s == [(9, "t"), (8, "t"), 3, 4]


@pytest.mark.parametrize(
    "write",
    [
        lambda a, b: lazyseq.collate([a, b]).__setitem__(0, (5, "x")),
        lambda a, b: lazyseq.collate({"x": a, "y": b}).__setitem__(0, {"x": 5, "y": "x"}),
        lambda a, b: lazyseq.unbatch(lazyseq.batch(lazyseq.collate([a, b]), 2), 2).__setitem__(0, (5, "x")),
    ],
    ids=["tuple", "dict", "unbatch"],
)
def test_an_item_of_fields_refused_part_way_is_put_back(write):
    # Its first field stayed written (a[0] == 5), where a slice assignment of the same value wrote nothing.
    a, b = np.arange(4), np.arange(4) * 10
    with pytest.raises(ValueError, match="invalid literal for int"):
        write(a, b)
    assert a.tolist() == [0, 1, 2, 3] and b.tolist() == [0, 10, 20, 30]
    with pytest.raises(ValueError, match="invalid literal for int"):
        write(a, a)  # fields over the same data: what the second read before the first was written is put back
    assert a.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "items, k",
    [([[7, (1, 2)], [4, (1, 2)]], 2), ([[7, [1, "a"]]], 1), ([[7, {"x": 1}], [4, {"x": 2}]], 2)],
    ids=["tuple", "list", "dict"],
)
def test_a_batch_of_list_items_with_nested_fields_written_back_as_read_leaves_them_as_they_were(items, k):
    # Written as items: [array([7, 4]), (array([1, 1]), array([2, 2]))], or refused ("has 1 items").
    data = copy.deepcopy(items)
    batches = lazyseq.batch(data, k)
    batches[0] = batches[0]
    assert plain(data) == items and type(plain(data)[0][1]) is type(items[0][1])


def plain(value):
    """``value`` with its numpy scalars as Python numbers (a batch written back holds the numpy ones)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


@pytest.mark.parametrize("k", [2, 3])
def test_a_batch_of_list_items_with_strings_written_back_as_read_leaves_them_as_they_were(k):
    # Read field by field ([array([1, 2]), ['a', 'b']]), it was written back as two items: [1, 2] and ['a', 'b'];
    # with 3 items, refused. A refused assignment that put such a batch back corrupted the data the same way.
    data = [[1, "a"], [2, "b"], [3, "c"]][:k]
    batches = lazyseq.batch(data, k)
    batches[0] = batches[0]
    assert [[int(number), text] for number, text in data] == [[1, "a"], [2, "b"], [3, "c"]][:k]
    numbers = np.zeros(k, int)
    both = lazyseq.batch(lazyseq.concatenate([data, numbers]), k)
    with pytest.raises(ValueError, match="invalid literal for int"):
        both[:] = [[[5, "x"]] * k, ["y"] * k]  # the second batch is refused: the first is put back
    assert [[int(number), text] for number, text in data] == [[1, "a"], [2, "b"], [3, "c"]][:k]
    assert numbers.tolist() == [0] * k


def padded_items(taken_apart):
    """Items of data batched with padding and taken apart again (once, or batches of batches twice); the data."""
    if taken_apart == "once":
        data = np.arange(5)
        return lazyseq.unbatch(lazyseq.batch(data, 2, pad=-1), 2), data  # 0 1 2 3 4 -1
    data = np.arange(7)
    batches = lazyseq.batch(lazyseq.batch(data, 2, pad=-1), 2, pad=np.array([-2, -2]))  # [[0 1] [2 3]], [[4 5] [6 -1]]
    return lazyseq.unbatch(lazyseq.unbatch(batches, 2), 2), data  # 0 1 2 3 4 5 6 -1


@pytest.mark.parametrize("taken_apart, batch", [("once", 2), ("twice", 3)])
def test_a_padding_item_is_refused_as_a_read_only_one(taken_apart, batch):
    # Taken apart twice, the write was silently dropped: the item read -1 still.
    items, data = padded_items(taken_apart)
    last, before = len(items) - 1, data.tolist()
    with pytest.raises(TypeError) as caught:
        items[last] = 70  # it would read -1 still
    assert str(caught.value) == (
        f"batch: element 1 of batch {batch} is padding (pad=-1), not an item of the data: it cannot be assigned to"
    )
    with pytest.raises(TypeError):
        items[last - 1 :] = [60, 70]
    assert data.tolist() == before and items[last] == -1
    items[last - 1] = 60  # an item of the data, beside the padding
    assert items[last - 1] == 60 and data[-1] == 60


def test_a_padding_item_reached_through_a_switch_is_refused_too():
    a, b = np.arange(3), np.arange(3) * 10
    chosen = lazyseq.switch([True, False], lazyseq.batch(a, 2, pad=-1), lazyseq.batch(b, 2, pad=-1))
    items = lazyseq.unbatch(chosen, 2)  # 0 1 20 -1
    with pytest.raises(TypeError, match=r"^batch: element 1 of batch 1 is padding \(pad=-1\)"):
        items[3] = 7
    items[2] = 7  # an item of the data: written where it came from
    assert list(items) == [0, 1, 7, -1] and b.tolist() == [0, 10, 7]


def test_an_item_of_a_batch_made_by_a_collate_fn_is_refused():
    a = np.arange(4)
    reversed_pairs = lazyseq.unbatch(lazyseq.batch(a, 2, collate_fn=lambda xs: np.stack(xs[::-1])), 2)  # 1 0 3 2
    with pytest.raises(TypeError) as caught:
        reversed_pairs[0] = 100  # it would have gone to a[0], which the view reads as item 1
    assert str(caught.value).endswith(
        "<lambda> made cannot be assigned to (what the function made of the items cannot be undone); assign to the "
        "batched sequence's items, or a whole batch as a sequence of items"
    )
    as_lists = lazyseq.unbatch(lazyseq.batch(a, 2, collate_fn=list), 2)  # a list of the items: they are its elements
    as_lists[1] = 100
    assert a.tolist() == [0, 100, 2, 3]


def test_a_refused_write_leaves_what_a_cache_below_holds_as_it_was():
    objects, numbers = np.array(["p"], dtype=object), np.array([1, 2])
    pairs = lazyseq.batch(lazyseq.concatenate([objects, numbers]), 2)  # batch 0: ['p', 1], a list
    items = lazyseq.unbatch(lazyseq.add_cache(lazyseq.switch([True, True], pairs, pairs), 4), 2, 1)
    assert list(items) == ["p", 1, 2]  # batch 0 cached
    with pytest.raises(ValueError, match="invalid literal for int"):
        items[1] = "x"  # the batch read was changed in place, then its write refused: the cache kept the change
    assert list(items) == ["p", 1, 2] and numbers.tolist() == [1, 2]


def test_a_batch_assignment_refused_part_way_changes_nothing():
    a = np.zeros(4, dtype=int)
    with pytest.raises(ValueError, match="invalid literal for int"):
        lazyseq.batch(a, 2)[0] = [1, "x"]
    five = np.zeros(5, dtype=int)
    items = lazyseq.unbatch(lazyseq.batch(five, 3), 3)  # says 6 items; its last batch holds 2
    with pytest.raises(ValueError, match=r"^unbatch: batch 1 \(the last: see last_batch_size\) holds 2 items"):
        lazyseq.batch(items, 4)[0] = [1, 1, 1, 1]  # items 0 to 2 were written before item 3 was refused
    assert a.tolist() == [0, 0, 0, 0] and five.tolist() == [0, 0, 0, 0, 0]


def _read_only_array():
    data = np.zeros(2)
    data.flags.writeable = False
    return data


@pytest.mark.parametrize(
    ("target", "error", "message"),
    [
        (lambda: lazyseq.smap(abs, [1, 2])[2:], TypeError, "smap views are read-only: they cannot be assigned to"),
        (lambda: lazyseq.repeat(1, 3)[:0], TypeError, "repeat views are read-only: they cannot be assigned to"),
        (lambda: lazyseq.view((1, 2))[:0], TypeError, "'tuple' object does not support item assignment"),
        (lambda: lazyseq.view(_read_only_array())[:0], ValueError, "assignment destination is read-only"),
        # its selector is never written; every field of collate is
        (lambda: lazyseq.case([0, 0], _read_only_array())[:0], ValueError, "assignment destination is read-only"),
        (lambda: lazyseq.collate(([0, 0], _read_only_array()))[:0], ValueError, "assignment destination is read-only"),
    ],
)
def test_assigning_no_items_where_none_can_be_written_is_refused_as_python_and_numpy_refuse_it(target, error, message):
    # As (1, 2)[2:] = [] and a read-only array's [:0] = []: nothing was said.
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        target()[:] = []


def test_assigning_no_items_where_items_can_be_written_is_taken():
    items = [1, 2]
    lazyseq.view(items)[2:] = []
    lazyseq.concatenate([(1, 2), items])[:0] = []  # one part takes writes
    lazyseq.view(np.zeros(3)).batch(2)[5:] = []
    lazyseq.case((0, 0), items)[:0] = []  # (a tuple as selector)
    assert items == [1, 2]


@pytest.mark.parametrize("value", [0, np.float64(1.5), np.array(2.0)], ids=["int", "numpy scalar", "0-d array"])
def test_one_value_for_several_items_is_refused_saying_how_to_give_it_to_each(value):
    # "to a gather, not int", for a mask; a 0-d array raised "len() of unsized object".
    data = np.arange(10.0).reshape(5, 2)
    name = f"numpy.{type(value).__name__}" if isinstance(value, np.generic | np.ndarray) else type(value).__name__
    with pytest.raises(TypeError) as refused:
        lazyseq.view(data)[data[:, 0] > 3] = value
    assert str(refused.value) == (
        "can only assign an iterable of values to the 3 items that a slice, mask or index list selects (one value "
        f"per item, as to a slice of a list), not {name}; for one value in all, assign [value] * 3"
    )
    lazyseq.view(data)[data[:, 0] > 3] = [value] * 3
    assert data[2:].tolist() == [[float(value)] * 2] * 3 and data[:2].tolist() == [[0, 1], [2, 3]]

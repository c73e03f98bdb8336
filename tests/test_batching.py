"""batch and unbatch: partial, dropped and padded last batches; default collation."""

import copy
import pickle
from collections import namedtuple

import numpy as np
import pytest

import lazyseq
from lazyseq.views.errors import EndOfData

Point = namedtuple("Point", "x y")


def test_partial_last_batch_by_default():
    b = lazyseq.batch(range(10), 4)
    assert len(b) == 3
    assert [batch.tolist() for batch in b] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_numbers_of_several_dtypes_are_promoted_together_as_np_stack_does():
    # np.asarray promotes numpy scalars two at a time: int8 and uint16 made int32, and with float32, float64.
    scalars = [np.int8(1), np.uint16(2), np.float32(0.5)]
    assert lazyseq.default_collate(scalars).dtype == np.stack(scalars).dtype == np.float32
    parts = [np.array([1], np.int8), np.array([2], np.uint16), np.array([0.5], np.float32)]
    batch = lazyseq.concatenate(parts).batch(3)[0]
    assert batch.dtype == np.float32 and batch.tolist() == [1.0, 2.0, 0.5]


def test_durations_and_dates_are_refused_together_as_np_stack_refuses_them():
    # np.asarray made the durations dates, in the dates' unit (1 s became 1 ms after 1970).
    durations, dates = np.array([1, 2], "m8[s]"), np.array([0], "M8[ms]")
    with pytest.raises(lazyseq.EvaluationError) as refused:
        lazyseq.concatenate([durations, dates]).batch(3)[0]
    assert type(refused.value.__cause__) is TypeError
    assert str(refused.value.__cause__) == (
        "Cannot cast array data from dtype('<m8[s]') to dtype('<M8[ms]') according to the rule 'same_kind'"
    )
    with pytest.raises(TypeError, match="could not be promoted"):  # durations and floats: no common dtype either
        lazyseq.default_collate([np.timedelta64(1, "s"), np.float64(1.5)])
    with pytest.raises(TypeError, match="Cannot cast array data from dtype"):  # a date first: its dtype was taken
        lazyseq.default_collate([np.datetime64(0, "ms"), np.timedelta64(1, "s")])
    mixed = lazyseq.default_collate([np.timedelta64(1, "s"), np.str_("x")])  # with strings: a list, as for numbers
    assert type(mixed) is list and mixed == [np.timedelta64(1, "s"), "x"]


def test_drop_last():
    b = lazyseq.batch(range(10), 4, drop_last=True)
    assert len(b) == 2
    with pytest.raises(IndexError, match=r"^index 2 out of range for view batch\(4, drop_last=True\) of length 2$"):
        b[2]


def test_pad_fills_only_last_batch_to_k_items_with_same_type_and_dtype():
    data = np.arange(10, dtype=np.int8).reshape(5, 2)
    b = lazyseq.batch(data, 2, pad=0)
    full, last = b[0], b[2]
    assert type(last) is type(full) is np.ndarray
    assert last.dtype == full.dtype == np.int8
    np.testing.assert_array_equal(last, [[8, 9], [0, 0]])
    # no padding when the length is a multiple of k
    assert lazyseq.batch(range(4), 2, pad=-1)[-1].tolist() == [2, 3]


def test_a_padded_batch_keeps_the_byte_order_of_its_items():
    # numpy's concatenate gave the padded last batch the machine's byte order.
    for dtype in (">f4", ">U3", ">M8[h]"):
        source = np.zeros(3, dtype)
        batches = lazyseq.batch(source, 2, pad=source[0])
        assert batches[0].dtype.str == batches[1].dtype.str == np.dtype(dtype).str


def test_pad_on_collated_items_pads_each_field():
    pairs = lazyseq.collate([np.arange(3.0), np.array([1, 2, 3], dtype=np.int32)])
    x, y = lazyseq.batch(pairs, 2, pad=(-1.0, 0))[1]
    np.testing.assert_array_equal(x, [2.0, -1.0])
    assert y.dtype == np.int32 and y.tolist() == [3, 0]
    with pytest.raises(lazyseq.EvaluationError, match="pad must be a tuple of 2 values"):
        lazyseq.batch(pairs, 2, pad=0)[1]


def test_pad_with_collate_fn_list():
    assert lazyseq.batch("abc", 2, pad="-", collate_fn=list)[1] == ["c", "-"]


def test_drop_last_and_pad_exclude_each_other():
    with pytest.raises(ValueError, match="drop_last and pad cannot be used together"):
        lazyseq.batch(range(3), 2, drop_last=True, pad=0)


@pytest.mark.parametrize("k", [0, -1])
def test_k_must_be_positive(k):
    with pytest.raises(ValueError, match="k must be a positive integer"):
        lazyseq.batch(range(3), k)


def test_default_collation_of_structures():
    items = [(Point(1, 2.0), {"a": np.ones(2) * i, "s": str(i)}) for i in range(3)]
    points, fields = lazyseq.batch(items, 3)[0]
    assert isinstance(points, Point)
    np.testing.assert_array_equal(points.x, [1, 1, 1])
    assert points.y.dtype == np.float64
    np.testing.assert_array_equal(fields["a"], [[0, 0], [1, 1], [2, 2]])
    assert fields["s"] == ["0", "1", "2"]


def test_vectorized_batch_equals_stacked_items():
    rng = np.random.default_rng(0)
    chunks = [rng.random((5, 3)).astype(np.float32) for _ in range(3)]
    labels = np.arange(15)
    pairs = lazyseq.collate([lazyseq.concatenate(chunks), labels])
    order = rng.permutation(15)
    for x, y in lazyseq.batch(lazyseq.gather(pairs, order), 4):
        expected = [pairs[int(i)] for i in order[: len(y)]]
        order = order[len(y) :]
        np.testing.assert_array_equal(x, np.stack([e[0] for e in expected]))
        assert x.dtype == np.float32
        np.testing.assert_array_equal(y, [e[1] for e in expected])


def test_batch_of_array_is_a_copy_not_a_view_of_the_data():
    data = np.zeros((4, 2))
    first = lazyseq.batch(data, 2)[0]
    first[:] = 1
    assert data.sum() == 0


def test_batch_assignment_writes_through():
    data = list(range(5))
    b = lazyseq.batch(data, 2)
    b[1] = ["a", "b"]
    b[2] = ["z"]
    assert data == [0, 1, "a", "b", "z"]
    with pytest.raises(ValueError, match="batch 0 has 2 items, cannot assign 3 values"):
        b[0] = [1, 2, 3]


def test_unbatch_inverts_batch():
    b = lazyseq.batch(list(range(7)), 3, collate_fn=list)
    flat = lazyseq.unbatch(b, 3, last_batch_size=1)
    assert len(flat) == 7
    assert list(flat) == list(range(7))
    assert [flat[i] for i in range(-7, 7)] == list(range(7)) * 2
    assert len(lazyseq.unbatch([], 3)) == 0


@pytest.mark.parametrize(
    "source", [np.array(["a", "bcd"]), np.array([1, 2.5, 3, 4], dtype=object), np.array([1, 2, 3, 4], dtype=">i2")]
)
def test_batches_of_items_taken_apart_by_unbatch_keep_the_source_dtype(source):
    items = lazyseq.unbatch(lazyseq.batch(source, 2), 2)
    batches = lazyseq.batch(items, 1)  # of one item: a '<U1' string, a Python int made int64, before
    assert [b.dtype for b in batches] == [source.dtype] * len(source)
    assert [b.tolist() for b in batches] == [[x] for x in source.tolist()]
    ragged = np.empty(2, dtype=object)
    ragged[:] = [np.arange(2), np.arange(3)]
    again = lazyseq.batch(lazyseq.unbatch(lazyseq.batch(ragged, 2), 2), 2)[0]  # stacked, before: refused
    assert again.dtype == object and [x.tolist() for x in again] == [[0, 1], [0, 1, 2]]


@pytest.mark.parametrize(
    "source", [np.array([1, 2], dtype=">i2"), np.array(["abc", "d", "ef", "g"]), np.array(["x", None], dtype=object)]
)
def test_a_concatenation_batches_items_taken_apart_by_unbatch_as_those_of_their_source(source):
    first = np.arange(2, dtype=np.int8)
    items = lazyseq.unbatch(lazyseq.batch(source, 2), 2)
    via, direct = lazyseq.concatenate([first, items]), lazyseq.concatenate([first, source])
    for k in (2, 3):  # a batch of items of both parts is a list (int8 numbers and strings or objects do not stack)
        for ours, theirs in zip(lazyseq.batch(via, k), lazyseq.batch(direct, k)):
            assert type(ours) is type(theirs) and getattr(ours, "dtype", None) == getattr(theirs, "dtype", None)
            assert list(ours) == list(theirs)
    ours, theirs = lazyseq.batch(via[2:], 2)[0], lazyseq.batch(direct[2:], 2)[0]
    assert ours.dtype == theirs.dtype and ours.tolist() == theirs.tolist()


def test_unbatch_inverts_batch_of_tuples_and_dicts():
    # A batch of tuples or dicts holds them field by field: unbatch gave whole fields, or raised KeyError
    pairs = lazyseq.collate([np.arange(4) * 10, np.arange(4)])
    flat = lazyseq.unbatch(lazyseq.batch(pairs, 2), 2)
    assert [tuple(map(int, x)) for x in flat] == [(0, 0), (10, 1), (20, 2), (30, 3)]
    assert tuple(map(int, flat[2])) == (20, 2) and [tuple(map(int, x)) for x in flat[1:3]] == [(10, 1), (20, 2)]
    named = lazyseq.collate({"x": np.arange(5.0), "label": np.arange(5)})
    flat = lazyseq.unbatch(lazyseq.batch(named, 3), 3, last_batch_size=2)
    assert [{k: int(v) for k, v in x.items()} for x in flat] == [{"x": k, "label": k} for k in range(5)]
    assert list(lazyseq.unbatch([(1, 2), (3, 4)], 2)) == [1, 2, 3, 4]  # tuples of items stay items


def plain(value):
    """``value`` with numpy numbers as Python numbers, to compare with the items."""
    if isinstance(value, dict):
        return {key: plain(v) for key, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(plain(v) for v in value)
    return value.item() if isinstance(value, np.generic) else value


@pytest.mark.parametrize(
    "items",
    [
        [[k, 10 * k] for k in range(5)],
        [(k, (k, -k)) for k in range(5)],
        [{"x": [k, 10 * k], "name": f"n{k}"} for k in range(5)],
        [[f"a{k}", [k, (k, "b")]] for k in range(5)],
    ],
    ids=["lists", "nested tuples", "dicts of lists", "deep"],
)
def test_unbatch_inverts_the_default_collation_of_lists_and_nested_fields(items):
    # A batch of lists is a list of fields, read as a list of items: columns came back, silently when k items.
    for k in (2, 3, 5):
        batches = lazyseq.batch(items, k)
        assert [plain(x) for x in lazyseq.unbatch(batches, k, len(items) % k)] == items
        assert [plain(x) for x in lazyseq.unbatch(batches[::-1][::-1], k, len(items) % k)] == items
    assert list(lazyseq.unbatch(lazyseq.batch(items, 2, collate_fn=list), 2, 1)) == items  # lists of items


def test_unbatch_assignment_writes_through_or_says_why_not():
    data = np.zeros(6)
    flat = lazyseq.unbatch(lazyseq.batch(data, 2), 2)
    flat[3] = 4.0  # was written into a batch made for the read, and lost
    assert data.tolist() == [0, 0, 0, 4, 0, 0]
    with pytest.raises(TypeError, match="^smap views are read-only"):
        lazyseq.unbatch(lazyseq.smap(np.copy, lazyseq.batch(data, 2)), 2)[1] = 1.0
    fields = [np.zeros(4), np.zeros(4)]
    pairs = lazyseq.unbatch(lazyseq.batch(lazyseq.collate(fields), 2), 2)
    pairs[1] = (1.0, 2.0)  # the item that batch() put in the batch field by field
    assert [field.tolist() for field in fields] == [[0, 1, 0, 0], [0, 2, 0, 0]]
    by_field = lazyseq.unbatch([{"x": np.zeros(2)}], 2)  # batches given field by field: nowhere to write one item
    with pytest.raises(TypeError, match=r"^unbatch: cannot assign item 1: its batch holds tuples or dicts field"):
        by_field[1] = {"x": 1.0}


def test_unbatch_checks_that_each_batch_holds_batch_size_items():
    with pytest.raises(lazyseq.EvaluationError) as caught:
        list(lazyseq.unbatch([[1, 2], [3]], 2))
    assert str(caught.value).endswith(
        "ValueError: unbatch: batch 1 (the last: see last_batch_size) holds 1 item, not 2 (batch_size=2)"
    )
    with pytest.raises(lazyseq.EvaluationError) as caught:  # was item 7, silently: batches of 3 read as of 2
        lazyseq.unbatch(lazyseq.batch(np.arange(10), 3), 2)[5]
    assert str(caught.value).endswith("ValueError: unbatch: batch 2 holds 3 items, not 2 (batch_size=2)")
    with pytest.raises(
        lazyseq.EvaluationError, match="TypeError: unbatch: batch 0 is of type int64, not a batch of items"
    ):
        lazyseq.unbatch(np.arange(10), 2)[0]


def test_batches_of_dicts_need_the_same_keys():
    # 'b' was dropped silently, or a bare KeyError raised
    for items, theirs in (([{"a": 1}, {"a": 2, "b": 3}], "['a', 'b']"), ([{"a": 1, "b": 0}, {"a": 2}], "['a']")):
        with pytest.raises(lazyseq.EvaluationError) as caught:
            lazyseq.batch(items, 2)[0]
        assert str(caught.value).endswith(f"item 1 has {theirs}")
        assert "ValueError: cannot collate dicts with different keys: item 0 has" in str(caught.value)


@pytest.mark.parametrize(
    ("pad", "message"),
    [
        ([1, 2], "ValueError: batch: pad has shape (2,), but the items have shape (): pad is one item (or a number)"),
        (2.5, "TypeError: batch: pad 2.5 cannot be held as the items' dtype int64 without a change"),
        ("x", "TypeError: batch: pad 'x' cannot be held as the items' dtype int64 without a change"),
    ],
)
def test_a_pad_the_items_cannot_be_is_refused(pad, message):
    # [1, 2] was spread over the padding rows, 2.5 became 2
    with pytest.raises(lazyseq.EvaluationError) as caught:
        lazyseq.batch(np.arange(10), 3, pad=pad)[3]
    assert str(caught.value).endswith(message)
    with pytest.raises(lazyseq.EvaluationError) as caught:  # items made one by one: the last batch became floats
        lazyseq.batch(list(range(10)), 3, pad=pad)[3]
    assert str(caught.value).endswith(message)
    assert lazyseq.batch(np.arange(10, dtype=np.uint8), 3, pad=0)[3].tolist() == [9, 0, 0]
    assert lazyseq.batch(np.arange(12).reshape(6, 2), 4, pad=[7, 8])[1].tolist() == [[8, 9], [10, 11], [7, 8], [7, 8]]


def test_a_pad_for_items_made_one_by_one_is_made_like_them():
    last = lazyseq.batch([(1, 2.0), (3, 4.0), (5, 6.0)], 2, pad=(0, 0.5))[1]
    assert [field.dtype for field in last] == [np.int64, np.float64] and [f.tolist() for f in last] == [
        [5, 0],
        [6, 0.5],
    ]
    with pytest.raises(lazyseq.EvaluationError, match="pad 1000000.0 cannot be held as the items' dtype float16"):
        lazyseq.batch([np.float16(1)] * 3, 2, pad=1e6)[1]  # was inf
    assert lazyseq.batch([0, 1, 2], 2, pad=-1, collate_fn=list)[1] == [2, -1]  # a collate_fn gets the pad as it is


def test_unbatch_rejects_bad_sizes():
    with pytest.raises(ValueError, match=r"^unbatch: last_batch_size must be between 0 and 3, got 4$"):
        lazyseq.unbatch([[1]], 3, last_batch_size=4)
    with pytest.raises(ValueError, match=r"^unbatch: last_batch_size must be between 0 and 3, got -1$"):
        lazyseq.unbatch([[1]], 3, last_batch_size=-1)
    with pytest.raises(ValueError, match=r"^unbatch: batch_size must be a positive integer, got 0$"):
        lazyseq.unbatch([[1]], 0)
    with pytest.raises(TypeError, match=r"^unbatch: batch_size must be a positive integer, got 2.0$"):
        lazyseq.unbatch([[1]], 2.0)


def test_unbatch_last_batch_size_zero_means_full_batches():
    """``unbatch(b, k, n % k)`` for any ``n``: 0 (``n`` a multiple of ``k``) means every batch is full, like None."""
    batches = lazyseq.batch(range(6), 3)
    for n in (6, 7):
        assert list(lazyseq.unbatch(lazyseq.batch(range(n), 3), 3, n % 3)) == list(range(n))
    assert len(lazyseq.unbatch(batches, 3, 0)) == 6
    assert list(lazyseq.unbatch([], 3, 0)) == []


def test_the_default_collation_of_mixed_items():
    # Numbers first made every item a string; a tuple then a number, or a number then an array, raised numpy's
    # or Python's own words.
    assert lazyseq.batch([3, "unknown", 7], 3)[0] == [3, "unknown", 7]
    assert lazyseq.default_collate([1.5, "x"]) == [1.5, "x"]
    assert lazyseq.default_collate([np.str_("a"), np.str_("bc")]).dtype == np.dtype("<U2")
    with pytest.raises(lazyseq.EvaluationError) as caught:
        lazyseq.batch([(1, 2), 3], 2)[0]
    assert str(caught.value) == (
        "failed to compute batch[0]: TypeError: cannot collate item 1 (int) with item 0 (tuple); "
        "batch(..., collate_fn=list) gives such items as a list"
    )
    with pytest.raises(lazyseq.EvaluationError) as caught:  # a number then a tuple of an array said numpy's words
        lazyseq.batch([np.int64(1), (np.zeros(2), 3j)], 2)[0]
    assert str(caught.value) == (
        "failed to compute batch[0]: TypeError: cannot collate item 1 (tuple) with item 0 (int64); "
        "batch(..., collate_fn=list) gives such items as a list"
    )

    class Column:  # what makes an array (a torch tensor, a pandas Series), after a number: told by its shape
        def __array__(self, dtype=None, copy=None):
            return np.zeros(2)

    for array in (np.zeros(2), Column()):
        with pytest.raises(lazyseq.EvaluationError) as caught:
            lazyseq.batch([1, array], 2)[0]
        assert str(caught.value) == (
            "failed to compute batch[0]: ValueError: cannot stack items of different shapes into one array: item 0 "
            "(sequence[0]) has shape (), item 1 (sequence[1]) has shape (2,); batch(..., collate_fn=list) gives such "
            "items as a list"
        )


@pytest.mark.parametrize(
    "items, kind",
    [
        ([np.zeros(2), None], "NoneType"),
        ([np.array(1.0), None], "NoneType"),
        ([np.zeros(2), "ab"], "str"),
        ([np.zeros(2), {"a": 1}], "dict"),
        ([np.zeros(2), np.str_("ab")], "str_"),
        ([np.array(1.0), "a"], "str"),  # (numpy made both strings)
        ([np.zeros(2), [1, "a"]], "list"),
    ],
    ids=repr,
)
def test_an_array_then_what_is_no_array_is_named_by_its_type(items, kind):
    # None after an array said "item 1 has shape ()"; after a 0-d array, it made an array of objects; numbers became
    # strings beside one
    with pytest.raises(TypeError) as caught:
        lazyseq.default_collate(items)
    assert str(caught.value) == (
        f"cannot collate item 1 ({kind}) with item 0 (ndarray); batch(..., collate_fn=list) gives such items as a list"
    )
    assert lazyseq.default_collate([np.zeros(2), [1, 2]]).tolist() == [[0, 0], [1, 2]]  # a list of numbers is an array
    strings = lazyseq.default_collate([np.array(["a", "b"]), np.array(["c", "dd"])])
    assert strings.tolist() == [["a", "b"], ["c", "dd"]]
    records = np.zeros(3, dtype=[("a", "i4"), ("b", "f8")])
    for alike in ([np.array(["a", "b"]), np.str_("c")], [records[:2], records[0]]):  # told apart by their shapes
        with pytest.raises(ValueError, match=r"item 0 has shape \(2,\), item 1 has shape \(\)"):
            lazyseq.default_collate(alike)


def test_items_of_different_lengths_name_the_item_and_the_way_out():
    with pytest.raises(lazyseq.EvaluationError) as caught:
        lazyseq.batch([["ab", "cd"], ["ef", "gh"], ["ij", "kl", "mn"]], 3)[0]
    assert str(caught.value) == (
        "failed to compute batch[0]: ValueError: cannot collate items of different lengths field by field: item 0 has "
        "2 fields, item 2 has 3; batch(..., collate_fn=list) gives such items as a list"
    )


@pytest.mark.parametrize("items", [[np.str_("a"), 1], [1, np.str_("a")], [1, None], [None, 1]], ids=repr)
def test_numbers_mixed_with_other_objects_collate_into_a_list_whatever_their_order(items):
    # A numpy string first made the number a string ('1'); a number first made an array of objects of [1, None].
    batch = lazyseq.default_collate(items)
    assert type(batch) is list and batch == items
    numbers = lazyseq.default_collate([2**70, 1])  # numbers only, too large for int64: still one array
    assert numbers.dtype == object and numbers.tolist() == [2**70, 1]


def test_a_batch_view_pickled_before_its_first_read_reads_the_same():
    # The mark of a spec not looked up yet, an object of its own, came back from pickle as another object: a spec.
    batches = lazyseq.batch(lazyseq.smap(float, range(5)), 2)
    for copied in (pickle.loads(pickle.dumps(batches)), copy.deepcopy(batches)):
        assert [b.tolist() for b in copied] == [[0.0, 1.0], [2.0, 3.0], [4.0]]


def test_objects_padded_read_one_by_one_as_in_a_slice():
    # Items read one by one had the pad made like the first (an int64): 'p' was refused, and 0 became np.int64(0).
    source = np.empty(5, dtype=object)
    source[:] = [1, "x", None, 3, 5]
    for pad in ("p", 0):
        expected = lazyseq.batch(source, 2, pad=pad)[2]
        one_by_one = lazyseq.batch(lazyseq.add_cache(source), 2, pad=pad)[2]
        assert expected.dtype == one_by_one.dtype == object and one_by_one.tolist() == expected.tolist() == [5, pad]
        assert type(one_by_one[1]) is type(pad)


@pytest.mark.parametrize(
    "through", [lambda a: a, lazyseq.add_cache, lambda a: lazyseq.interleave(a[:2], a[2:]), lambda a: list(a)]
)
@pytest.mark.parametrize(
    ("words", "pad"), [(["a", "bcd", "e"], "zz"), ([b"a", b"bcd", b"e"], b"zz"), (["a", "bcd", "e"], 1.5)]
)
def test_a_string_pad_wider_than_the_first_item_of_a_batch_read_one_by_one_is_taken(through, words, pad):
    # Made as wide as the batch's first item ('e', <U1): 'zz' was refused, where the array's rows took it.
    source = np.array(words)
    items = through(source)
    last = lazyseq.batch(items, 2, pad=pad)[1]
    assert last.tolist() == [items[2].item(), np.asarray(pad).astype(source.dtype.kind).item()]


@pytest.mark.parametrize("through", [lambda a: a, lazyseq.add_cache, lambda a: lazyseq.interleave(a[:2], a[2:])])
def test_a_string_pad_wider_than_the_arrays_dtype_is_refused_however_its_rows_are_read(through):
    with pytest.raises(lazyseq.EvaluationError) as refused:
        lazyseq.batch(through(np.array(["ab", "cd", "ef"])), 2, pad="wxyz")[1]
    assert str(refused.value).endswith(
        "TypeError: batch: pad 'wxyz' cannot be held as the items' dtype <U2 without a change"
    )


def test_a_short_batch_among_batches_is_padded_with_an_item_of_its_own_shape():
    # The pad took the shape the items have at most: (2, 2) beside the short batch's (1, 2), refused.
    batches = lazyseq.view(np.arange(10.0).reshape(5, 2)).batch(2)
    assert batches.batch(2, pad=0)[1].tolist() == [[[8.0, 9.0]], [[0.0, 0.0]]]


def test_a_pad_for_objects_that_are_lists_is_one_item_however_they_are_read():
    # From the array, [0] was taken for a row of one value and refused for its shape.
    source = np.empty(3, dtype=object)
    source[:] = [[1], [2], [3]]
    for items in (source, lazyseq.add_cache(source)):
        last = lazyseq.batch(items, 2, pad=[0])[1]
        assert last.dtype == object and last.tolist() == [[3], [0]]


def test_with_a_collate_fn_the_pad_is_given_as_it_is_however_the_items_are_stored():
    # An array's items had the pad cast to their dtype (refused: 'x' in int64); a collate's insisted on a tuple.
    for source in ([0, 1, 2], np.arange(3)):
        assert lazyseq.batch(source, 2, pad="x", collate_fn=list)[1] == [2, "x"]
    pairs = lazyseq.collate([np.arange(3), np.arange(3)])
    assert lazyseq.batch(pairs, 2, pad="x", collate_fn=list)[1] == [(2, 2), "x"]


@pytest.mark.parametrize("empty", [(), {}, []], ids=repr)
def test_unbatch_gives_back_items_with_no_fields(empty):
    # A batch of empty tuples is an empty tuple: its length was read from its first field, which it does not have.
    assert list(lazyseq.unbatch(lazyseq.batch([empty] * 3, 2), 2, 1)) == [empty] * 3
    with pytest.raises(
        lazyseq.EvaluationError, match=r"ValueError: unbatch: batch 0 holds items with no fields, which"
    ):
        list(lazyseq.unbatch(lazyseq.batch(lazyseq.uniter(iter([empty] * 3)), 2), 2))
    # a first field with no fields, a second with rows: counted by the second (was an IndexError)
    items = [((), np.array([k])) for k in range(3)]
    with pytest.raises(lazyseq.EvaluationError, match=r"ValueError: unbatch: batch 1 \(the last: see last_batch_size"):
        list(lazyseq.unbatch(lazyseq.batch(items, 2), 2, 2))


def test_masked_arrays_keep_their_masks_or_are_refused():
    # The mask was dropped: masked values read as data.
    masked = np.ma.masked_array([[1, 2], [3, 4]], mask=[[False, True], [False, False]])
    with pytest.raises(TypeError) as caught:
        lazyseq.view(masked)
    assert str(caught.value) == (
        "view() of a masked array would lose its mask; view its values and mask side by side, "
        "lazyseq.collate([array.data, np.ma.getmaskarray(array)]), or array.filled(value)"
    )
    batch = lazyseq.batch([masked[0], masked[1]], 2)[0]
    assert isinstance(batch, np.ma.MaskedArray)
    assert batch.mask.tolist() == [[False, True], [False, False]] and batch.data.tolist() == [[1, 2], [3, 4]]


def test_pad_of_items_collated_into_a_list_is_used_as_it_is():
    # It was checked against the dtype numpy gives the first item: '<U1' refused "<pad>".
    assert lazyseq.batch(["a", "b", "c"], 2, pad="<pad>")[-1] == ["c", "<pad>"]
    last = lazyseq.batch([("a", 1), ("b", 2), ("c", 3)], 2, pad=("<pad>", 0))[-1]
    assert last[0] == ["c", "<pad>"] and last[1].tolist() == [3, 0]


class Reiterable:
    """An iterable without len(): its view has no known length."""

    def __iter__(self):
        return iter([10, 11, 12, 13, 14])


def test_a_batch_read_through_unbatch_past_the_end_of_data_of_unknown_length_is_an_index_error():
    items = lazyseq.uniter(Reiterable()).batch(2).unbatch(2)
    past = items[[4, 5]]
    message = r"^unbatch index 5 out of range: the data ended in batch 2$"
    with pytest.raises(EndOfData, match=message):
        past[1]
    with pytest.raises(EndOfData, match=message):
        past.batch(2)[0]  # read as one batch: it was numpy's IndexError, wrapped in an EvaluationError
    assert items[[3, 4]].batch(2)[0].tolist() == [13, 14]


def test_batches_whose_last_is_short_are_not_taken_for_alike():
    # batch described every batch as a full one, and concatenate, trusting that, stacked a part's batches: a read
    # of several items taking in the short last batch failed (MixedShapes), even with collate_fn=list.
    batches = lazyseq.batch(np.arange(21.0).reshape(7, 3), 4)
    both = lazyseq.concatenate([batches, batches])
    got = lazyseq.batch(both, 4, collate_fn=list)[0]
    assert [b.shape for b in got] == [(4, 3), (3, 3), (4, 3), (3, 3)]
    assert all(np.array_equal(g, e) for g, e in zip(got, list(both), strict=True))
    assert lazyseq.batch(lazyseq.concatenate([batches]), 2, collate_fn=list)[0][1].tolist() == batches[1].tolist()
    assert repr(batches).splitlines()[0] == "batch(4)  [len 2, items float64 (4, 3), the last of 3]"
    assert repr(lazyseq.unbatch(batches, 4, 3)).splitlines()[0] == "unbatch(4, 3)  [len 7, items float64 (3,)]"
    for alike in (lazyseq.batch(np.zeros((8, 3)), 4), lazyseq.batch(np.zeros((7, 3)), 4, drop_last=True)):
        assert repr(alike).splitlines()[0].endswith("items float64 (4, 3)]")


def test_views_of_batches_whose_last_is_short_still_size_buffers_for_a_full_batch():
    # Only the batch view itself said how large its batches are: a shuffle, a slice, a collate of it, a batch of
    # it sized a process loader's slots (or a served view's pool) from the first batch read, the short one perhaps.
    from lazyseq.loading.prefetch import slot_bytes_for_spec
    from lazyseq.loading.shared_slots import slot_bytes_for

    batches = lazyseq.view(np.zeros((10, 3), ">f4")).batch(4)  # 4, 4 and 2 rows
    full = slot_bytes_for(4 * 3 * 4)
    for above in (batches.shuffle(seed=0), batches[1:], lazyseq.concatenate([batches, batches]), batches.cycle()):
        assert above._item_spec() is None and slot_bytes_for_spec(above._item_spec_at_most()) == full
    pairs = lazyseq.collate([batches, batches])
    assert pairs._item_spec() is None and pairs._item_spec_at_most() == ("tuple", (batches._item_spec_at_most(),) * 2)
    assert repr(lazyseq.unbatch(batches.shuffle(seed=0), 4, 2)).splitlines()[0].endswith("items >f4 (3,)]")
    assert batches.batch(2, drop_last=True)[0].dtype == np.dtype(">f4")  # (was float32: the dtype lost)
    with lazyseq.prefetch(batches.shuffle(seed=0), nworkers=1, method="process") as ahead:
        assert sorted(len(b) for b in ahead) == [2, 4, 4]


def test_a_batch_of_list_items_is_read_once_and_fails_with_one_traceback():
    calls = []

    class Files(list):  # a list whose reads have effects (files opened, say)
        def __getitem__(self, i):
            calls.append(i)
            if i == 3:
                raise OSError(f"cannot read file {i}")
            return super().__getitem__(i)

    with pytest.raises(lazyseq.EvaluationError, match=r"^failed to compute batch\[0\] -> sequence\[3\]: OSError"):
        lazyseq.view(Files(range(8))).batch(4, collate_fn=list)[0]
    assert calls == [0, 1, 2, 3]
    items = [0, 1, 2]
    view = lazyseq.view(items)
    del items[1:]
    with pytest.raises(lazyseq.EvaluationError) as caught:
        view.batch(3)[0]
    assert caught.value.__cause__.__context__ is None  # (not raised again while handling the first IndexError)

"""Infinite views follow the same rules as finite ones; what needs a length fails clearly."""

import itertools

import pytest

import lazyseq


@pytest.fixture
def forever():
    return lazyseq.cycle([0, 1, 2])


def test_len_raises_type_error(forever):
    with pytest.raises(TypeError, match=r"^cycle view is infinite: it has no len\(\)$"):
        len(forever)
    assert bool(forever) is True
    assert forever.is_infinite


def test_positive_indexing_and_slices(forever):
    assert forever[10**12] == 10**12 % 3
    assert list(forever[2:8:2]) == [2, 1, 0]
    tail = forever[4::5]
    assert tail.is_infinite
    assert list(itertools.islice(tail, 4)) == [1, 0, 2, 1]
    assert list(itertools.islice(tail[1::2], 3)) == [0, 1, 2]


@pytest.mark.parametrize(
    "operation, message",
    [
        (lambda v: v[-1], "negative index -1 needs a length, but cycle view is infinite"),
        (lambda v: v[-3:], r"slice slice\(-3, None, None\) needs a length"),
        (lambda v: v[::-1], "needs a length"),
        (lambda v: reversed(v).__next__(), r"reversed\(\) needs a length"),
        (lambda v: 5 in v, "'in' needs a length"),
        (lambda v: v.index(1), r"index\(\) needs a length"),
        (lambda v: v.count(1), r"count\(\) needs a length"),
        (lambda v: v[[0, -1]], "negative index -1 needs a length"),
        (lambda v: lazyseq.shuffle(v, 0), "shuffle needs a length"),
        (lambda v: lazyseq.split(v, 2), "split needs a length"),
        (lambda v: lazyseq.cycle(v), "cycle needs a length"),
    ],
)
def test_operations_needing_a_length(forever, operation, message):
    with pytest.raises(TypeError, match=message):
        operation(forever)


def test_list_of_infinite_view_raises_instead_of_looping():
    # list() would exhaust memory; len() is what tells it apart from a finite view
    with pytest.raises(TypeError):
        len(lazyseq.repeat(1))


def test_infinite_combinations():
    numbers = lazyseq.smap(lambda a, b: a * b, lazyseq.cycle([1, 2]), lazyseq.repeat(10))
    assert list(itertools.islice(numbers, 4)) == [10, 20, 10, 20]
    batches = lazyseq.batch(lazyseq.cycle([1, 2, 3]), 2)
    assert batches.is_infinite
    assert batches[1].tolist() == [3, 1]
    mixed = lazyseq.interleave([1, 2], lazyseq.repeat(0))
    assert list(itertools.islice(mixed, 6)) == [1, 0, 2, 0, 0, 0]
    joined = lazyseq.concatenate([[7], lazyseq.repeat(8)])
    assert joined.is_infinite and joined[0] == 7 and joined[10] == 8


def test_only_last_concatenated_part_may_be_infinite():
    with pytest.raises(
        ValueError, match=r"only the last sequence may have no length, but sequence 0 \(repeat view\) is infinite$"
    ):
        lazyseq.concatenate([lazyseq.repeat(1), [2]])
    with pytest.raises(ValueError, match=r"but sequence 1 \(uniter view\) has no known length$"):  # said "infinite"
        lazyseq.concatenate([[1], lazyseq.uniter(iter([2])), [3]])
    with pytest.raises(ValueError, match="collate: all sequences must have the same length, got lengths unknown, 2"):
        lazyseq.collate([lazyseq.uniter(iter([1, 2])), [3, 4]])


def test_smap_finite_with_infinite_is_a_length_mismatch():
    with pytest.raises(ValueError, match="smap: all sequences must have the same length, got lengths 2, infinite"):
        lazyseq.smap(max, [1, 2], lazyseq.repeat(1))


@pytest.mark.parametrize(
    "make, owner",
    [
        (lambda: lazyseq.cycle([1, 2], 2**63), "cycle"),
        (lambda: lazyseq.repeat(0, 2**64), "repeat"),
        (lambda: lazyseq.concatenate([lazyseq.repeat(0, 2**62), lazyseq.repeat(0, 2**62)]), "concatenate"),
        (lambda: lazyseq.interleave(lazyseq.repeat(0, 2**62), lazyseq.repeat(0, 2**62)), "interleave"),
        (lambda: lazyseq.unbatch(lazyseq.repeat(0, 2**62), 4), "unbatch"),
    ],
)
def test_a_view_longer_than_an_index_can_count_is_refused_when_made(make, owner):
    # It was made, then len() and slices raised OverflowError.
    with pytest.raises(ValueError, match=rf"^{owner}: \d+ items, more than a view can index \(2\*\*63 - 1 at most\)$"):
        make()
    assert len(lazyseq.cycle([1, 2], 2**63 - 1)[1:]) == 2**63 - 2


def test_reversed_and_del_fail_as_they_do_on_a_sequence_that_cannot_do_them():
    # reversed() of an infinite view gave a generator that failed at its first item; del raised AttributeError.
    with pytest.raises(TypeError, match=r"^reversed\(\) needs a length, but cycle view is infinite$"):
        reversed(lazyseq.cycle([1]))
    with pytest.raises(TypeError, match=r"^sequence view does not support item deletion"):
        del lazyseq.view([1, 2])[0]
    with pytest.raises(TypeError, match=r"^cycle: a boolean mask needs a length, but the view is infinite$"):
        lazyseq.cycle([1])[[True, False]]


def test_cycle_limits():
    assert len(lazyseq.cycle([], limit=0)) == 0
    with pytest.raises(ValueError, match="cannot repeat an empty sequence"):
        lazyseq.cycle([], limit=3)
    with pytest.raises(ValueError, match="cannot repeat an empty sequence"):
        lazyseq.cycle([])
    with pytest.raises(ValueError, match="^cycle: limit must be a non-negative integer or None, got -1$"):
        lazyseq.cycle([1], limit=-1)


def test_repeat_zero_and_one():
    assert list(lazyseq.repeat("x", 0)) == []
    assert list(lazyseq.repeat("x", 1)) == ["x"]
    with pytest.raises(IndexError):
        lazyseq.repeat("x", 1)[1]


def test_a_view_of_unknown_length_is_not_infinite():
    # uniter ends where its data ends: it was reported infinite, and so were views over it
    items = lazyseq.uniter(iter(range(5)))
    batches = lazyseq.batch(items, 2)
    assert not items.is_infinite and not batches.is_infinite
    assert repr(batches).splitlines() == ["batch(2)  [length unknown]", "└─ uniter(range_iterator)  [length unknown]"]
    with pytest.raises(TypeError, match=r"^batch view has no known length: it has no len\(\)$"):
        len(batches)
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    with pytest.raises(lazyseq.EvaluationError, match="one-shot iterator, already at its end, and item 0 is not"):
        items[0]


def test_the_truth_of_a_view_of_unknown_length_whose_first_item_fails_is_that_failure():
    class Values:  # iterable again and again, of no known length
        def __iter__(self):
            return iter([0, 1])

    def inverse(x):
        return 1 / x

    inverses = lazyseq.smap(inverse, lazyseq.uniter(Values()))
    for read in (lambda: inverses[0], lambda: bool(inverses)):  # bool() let the ZeroDivisionError out as it was
        with pytest.raises(lazyseq.EvaluationError) as caught:
            read()
        assert str(caught.value).endswith(".<locals>.inverse)[0]: ZeroDivisionError: division by zero")
    assert bool(lazyseq.uniter(Values())) is True and bool(lazyseq.uniter(iter([]))) is False


def test_deep_and_shared_pipelines_without_a_length_are_told_at_once():
    # one call per path: 20 levels over a shared parent took seconds, 400 levels overflowed the recursion limit
    shared = lazyseq.cycle([1, 2])
    for _ in range(20):
        shared = lazyseq.smap(max, shared, shared)
    deep = lazyseq.cycle([1, 2])
    for _ in range(400):
        deep = deep.smap(abs)
    assert shared.is_infinite and deep.is_infinite and deep.endless == "is infinite"
    assert not lazyseq.smap(abs, lazyseq.uniter(iter([1]))).is_infinite


def test_a_slice_of_an_infinite_view_with_more_items_than_a_view_can_index_says_so():
    message = r"^slice: 99999999999999999995 items, more than a view can index \(2\*\*63 - 1 at most\)$"
    with pytest.raises(ValueError, match=message):
        lazyseq.cycle([1])[5 : 10**20]
    with pytest.raises(ValueError, match=message):
        lazyseq.gather(lazyseq.cycle("ab"), range(5, 10**20))
    assert len(lazyseq.cycle([1])[1 : 2**63]) == 2**63 - 1


def test_reading_past_the_end_through_a_slice_of_data_of_unknown_length_names_the_slices_index():
    # The error named the parent's index alone: "uniter index 12 out of range", for items[2:][10].
    items = lazyseq.uniter(iter(range(5)))[2:]
    with pytest.raises(lazyseq.views.errors.EndOfData) as ended:
        items[10]
    assert str(ended.value) == (
        "slice index 10 out of range: uniter index 12 out of range: the iterable ended after 5 items"
    )
    assert list(lazyseq.uniter(iter(range(5)))[2:]) == [2, 3, 4]

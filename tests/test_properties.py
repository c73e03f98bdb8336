"""Property-based tests: every view against the same computation on plain Python lists.

Each test builds a view and the list it should be equal to, then checks the
whole sequence protocol against that list: ``len``, every valid positive and
negative index, ``IndexError`` on both sides, arbitrary slices (out-of-range
bounds and negative steps included) and slices of slices, integer lists and
numpy integer arrays as keys, iteration and ``reversed``. Views that write
through are driven with the same assignments as a model of their underlying
lists, which Python mutates the way list assignment would.
"""

from __future__ import annotations

import copy
import itertools
import operator
import re
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyseq
from lazyseq import View

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ITEMS = st.integers(-50, 50) | st.text(alphabet="abc", max_size=2)
NUMBERS = st.integers(-1000, 1000)
HUGE = 10**18


# -- exact comparison -----------------------------------------------------------


def assert_same(actual, expected):
    """Exact equality: same type and value; arrays also same dtype and shape; a view equals the list of its items."""
    if isinstance(actual, View):
        assert isinstance(expected, list), f"got a view, expected {expected!r}"
        assert len(actual) == len(expected)
        assert_items(list(actual), expected)
        return
    if isinstance(expected, np.ndarray):
        assert type(actual) is np.ndarray, f"expected an ndarray, got {type(actual).__name__}: {actual!r}"
        assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
        assert actual.shape == expected.shape, (actual.shape, expected.shape)
        assert np.array_equal(actual, expected), (actual, expected)
        return
    assert type(actual) is type(expected), (
        f"{actual!r} ({type(actual).__name__}) != {expected!r} ({type(expected).__name__})"
    )
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), (actual, expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    else:
        assert actual == expected, (actual, expected)


def assert_items(actual, expected):
    """``actual`` and ``expected`` hold the same items in the same order."""
    actual, expected = list(actual), list(expected)
    assert len(actual) == len(expected), (actual, expected)
    for a, e in zip(actual, expected):
        assert_same(a, e)


# -- strategies -------------------------------------------------------------------


def fits_int64(key: slice) -> bool:
    return all(x is None or -(2**63) < x < 2**63 for x in (key.start, key.stop, key.step))


def slices_for(n: int):
    """Any slice, including bounds far outside ``0..n`` and negative or huge steps.

    Values beyond 64 bits (which ``st.slices`` draws for small sizes) have a
    test of their own, ``test_slices_with_steps_beyond_64_bits``.
    """
    bound = st.none() | st.integers(-2 * n - 3, 2 * n + 3) | st.sampled_from([-HUGE, HUGE])
    step = st.none() | st.integers(-n - 2, n + 2).filter(bool) | st.sampled_from([-HUGE, HUGE])
    return st.slices(n).filter(fits_int64) | st.builds(slice, bound, bound, step)


def positions_for(n: int, max_size: int = 8):
    """A list of valid indexes for a length ``n`` (negative ones and repeats included)."""
    if n == 0:
        return st.just([])
    return st.lists(st.integers(-n, n - 1), max_size=max_size)


INDEX_DTYPES = st.sampled_from([np.intp, np.int64, np.int32, np.int16, np.int8])


# -- the sequence protocol ---------------------------------------------------------


def check_view(data, v, expected, depth: int = 2):
    """``v`` behaves exactly like the list ``expected`` for every read operation."""
    expected = list(expected)
    n = len(expected)
    assert len(v) == n
    assert bool(v) is (n > 0)
    assert v.is_infinite is False
    for i in range(-n, n):
        assert_same(v[i], expected[i])
    past = data.draw(st.integers(0, 3) | st.just(HUGE), label="past the end")
    for bad in (n + past, -n - 1 - past):
        with pytest.raises(
            IndexError, match=rf"^index {bad} out of range for view {re.escape(v._describe())} of length {n}$"
        ):
            v[bad]
    assert_items(v, expected)
    assert_items(iter(v), expected)  # iterating twice gives the same items
    assert_items(reversed(v), expected[::-1])
    if n:
        i = data.draw(st.integers(-n, n - 1), label="numpy scalar index")
        assert_same(v[np.int64(i)], expected[i])
        assert_same(v[np.int32(i)], expected[i])
    if depth == 0:
        return
    if depth == 2:
        check_many(data, v, expected)

    key = data.draw(slices_for(n), label="slice")
    sliced = v[key]
    assert isinstance(sliced, View)
    check_view(data, sliced, expected[key], depth - 1)

    positions = data.draw(positions_for(n), label="positions")
    picked = [expected[j] for j in positions]
    check_view(data, v[positions], picked, depth - 1)
    dtype = data.draw(INDEX_DTYPES, label="index dtype")
    check_view(data, v[np.array(positions, dtype=dtype)], picked, depth - 1)

    mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="mask")
    assert_items(v[np.array(mask, dtype=bool)], [e for e, m in zip(expected, mask) if m])

    wrong = data.draw(st.sampled_from([n, n + 3, -n - 1]), label="bad position")
    with pytest.raises(
        IndexError, match=rf"^index {wrong} out of range for view {re.escape(v._describe())} of length {n}$"
    ):
        v[[*positions, wrong]]
    with pytest.raises(
        IndexError, match=rf"^index {wrong} out of range for view {re.escape(v._describe())} of length {n}$"
    ):
        v[np.array([*positions, wrong])]
    with pytest.raises(ValueError, match="slice step cannot be zero"):
        v[::0]


def check_many(data, v, expected):
    """Reading many items at once (what ``batch`` does) gives the same items as reading them one by one.

    Batches of a slice or a gather of ``v`` go through the vectorized path of
    every view below them, with ranges of any step and index arrays.
    """
    n = len(expected)
    if data.draw(st.booleans(), label="slice or positions"):
        key = data.draw(slices_for(n), label="batched slice")
        part = expected[key]
    else:
        key = data.draw(positions_for(n, max_size=12), label="batched positions")
        part = [expected[j] for j in key]
    k = data.draw(st.integers(1, 5), label="k")
    assert_items(lazyseq.batch(v[key], k, collate_fn=list), chunks_of(part, k))


def check_search(data, v, expected):
    """``in``, ``index`` (with start and stop) and ``count`` agree with ``list``."""
    candidates = list(expected[:3]) + ["absent", -999]
    value = data.draw(st.sampled_from(candidates), label="searched value")
    assert (value in v) == (value in expected)
    assert v.count(value) == expected.count(value)
    start = data.draw(st.integers(-len(expected) - 2, len(expected) + 2), label="index start")
    stop = data.draw(st.none() | st.integers(-len(expected) - 2, len(expected) + 2), label="index stop")
    try:
        want = expected.index(value, start, len(expected) if stop is None else stop)
    except ValueError:
        with pytest.raises(ValueError, match="is not in"):
            v.index(value, start, stop)
    else:
        assert v.index(value, start, stop) == want


def check_infinite(data, v, item_at):
    """An infinite view: item ``i`` is ``item_at(i)``; whatever needs a length is a ``TypeError``."""
    assert v.is_infinite and bool(v) is True
    with pytest.raises(TypeError, match="no len"):
        len(v)
    for i in [*range(7), data.draw(st.integers(0, HUGE), label="far index")]:
        assert_same(v[i], item_at(i))
    assert_items(itertools.islice(v, 9), [item_at(i) for i in range(9)])
    negative = data.draw(st.integers(-HUGE, -1), label="negative index")
    with pytest.raises(TypeError, match=f"negative index {negative} needs a length"):
        v[negative]
    with pytest.raises(TypeError, match="needs a length"):
        next(reversed(v))
    start, stop = sorted(data.draw(st.lists(st.integers(0, 40), min_size=2, max_size=2), label="bounds"))
    step = data.draw(st.integers(1, 5), label="step")
    assert_items(v[start:stop:step], [item_at(i) for i in range(start, stop, step)])
    assert_items(v[stop:start], [])
    tail = v[start::step]
    assert tail.is_infinite
    assert_items(itertools.islice(tail, 6), [item_at(start + j * step) for j in range(6)])
    assert_items(itertools.islice(tail[2::3], 4), [item_at(start + (2 + 3 * j) * step) for j in range(4)])
    positions = data.draw(st.lists(st.integers(0, 100), max_size=6), label="positions")
    assert_items(v[positions], [item_at(j) for j in positions])
    for key in (slice(-1, None), slice(None, -1), slice(None, None, -1), slice(5, 1, -1)):
        with pytest.raises(TypeError, match="needs a length"):
            v[key]


# -- write-through: a model of the underlying lists ------------------------------------
#
# Item ``i`` of a writable view is a *cell* ``(store, position)`` of one of the
# underlying lists, or a compound ``("tuple" | "list", [cells], size)`` for views
# whose items hold several cells (collate, batch, split); ``("padded", [cells],
# size, pad)`` is a padded last batch, whose padding is read but never written. Assigning to the view
# must do to the lists what assigning to those cells does.


def is_leaf(cell) -> bool:
    return isinstance(cell[0], int)


def model_set(stores, cell, value):
    if is_leaf(cell):
        store, position = cell
        stores[store][position] = value
        return
    _, cells, size = cell[:3]
    if len(value) != size:
        raise ValueError(f"{size} cells, {len(value)} values")
    for c, v in zip(cells, value):
        model_set(stores, c, v)


def model_get(stores, cell):
    if is_leaf(cell):
        store, position = cell
        return stores[store][position]
    kind, cells, size = cell[:3]
    items = [model_get(stores, c) for c in cells]
    if kind == "padded":  # a padded last batch: real items, then copies of the pad
        items += [cell[3]] * (size - len(cells))
    return tuple(items) if kind == "tuple" else items


def materialize(item):
    """Items of split views are views: compare them as lists."""
    return list(item) if isinstance(item, View) else item


def fresh_values():
    counter = itertools.count(1)
    return lambda: f"new{next(counter)}"


def fresh_for(cell, fresh):
    """A new value of the right shape for ``cell``."""
    if is_leaf(cell):
        return fresh()
    kind, _, size = cell[:3]
    values = [fresh() for _ in range(size)]
    return tuple(values) if kind == "tuple" else values


def check_writes(data, v, stores, cells):
    """Random assignments through ``v`` do to ``stores`` what they do to a model of them.

    ``stores`` are the plain lists the view reads from (mutated in place);
    ``cells[i]`` says where item ``i`` of the view lives in them.
    """
    model = copy.deepcopy(stores)
    fresh = fresh_values()
    n = len(cells)
    assert len(v) == n
    for _ in range(data.draw(st.integers(1, 4), label="number of assignments")):
        operation = data.draw(
            st.sampled_from(
                ["item", "numpy item", "slice", "positions", "array", "mask", "sub-slice", "bad slice", "out of range"]
            ),
            label="operation",
        )
        if operation in ("item", "numpy item", "out of range") and n == 0:
            operation = "slice"
        if operation in ("item", "numpy item"):
            i = data.draw(st.integers(-n, n - 1), label="index")
            value = fresh_for(cells[i], fresh)
            v[i if operation == "item" else np.int64(i)] = value
            model_set(model, cells[i], value)
        elif operation == "mask":
            mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="mask")
            targets = [j for j in range(n) if mask[j]]
            values = [fresh_for(cells[j], fresh) for j in targets]
            v[np.array(mask, dtype=bool)] = values
            for j, value in zip(targets, values):
                model_set(model, cells[j], value)
        elif operation == "out of range":
            bad = data.draw(st.sampled_from([n, n + 5, -n - 1, -n - 7]), label="bad index")
            with pytest.raises(
                IndexError, match=rf"^index {bad} out of range for view {re.escape(v._describe())} of length {n}$"
            ):
                v[bad] = fresh_for(cells[0], fresh)
        elif operation in ("slice", "bad slice"):
            key = data.draw(slices_for(n), label="slice")
            targets = range(n)[key]
            values = [fresh_for(cells[t], fresh) for t in targets]
            if operation == "bad slice":
                if values and data.draw(st.booleans(), label="shorter"):
                    values.pop()
                else:
                    values.append(fresh())
                with pytest.raises(ValueError, match="views cannot change length"):
                    v[key] = values
            else:
                if data.draw(st.booleans(), label="as tuple"):
                    values = tuple(values)
                v[key] = values
                for t, value in zip(targets, values):
                    model_set(model, cells[t], value)
        elif operation in ("positions", "array"):
            positions = data.draw(positions_for(n), label="positions")
            values = [fresh_for(cells[j], fresh) for j in positions]
            key = positions if operation == "positions" else np.array(positions, dtype=np.intp)
            v[key] = values
            for j, value in zip(positions, values):
                model_set(model, cells[j], value)
        elif operation == "sub-slice":
            key = data.draw(slices_for(n), label="slice")
            targets = range(n)[key]
            sub = v[key]
            if len(targets):
                j = data.draw(st.integers(-len(targets), len(targets) - 1), label="index in slice")
                value = fresh_for(cells[targets[j]], fresh)
                sub[j] = value
                model_set(model, cells[targets[j]], value)
        assert stores == model, operation
        assert [materialize(item) for item in v] == [model_get(model, c) for c in cells]


def leaf_cells(store: int, positions) -> list:
    return [(store, p) for p in positions]


def check_read_only(v):
    """Views that compute their items cannot be assigned to."""
    with pytest.raises(TypeError, match="read-only"):
        v[0] = 1
    with pytest.raises(TypeError, match="read-only"):
        v[-1] = 1
    with pytest.raises(TypeError, match="read-only"):
        v[:1] = [1]
    with pytest.raises(TypeError, match="read-only"):
        v[[0]] = [1]


# -- sources ------------------------------------------------------------------------


@SETTINGS
@given(st.data(), st.lists(ITEMS, max_size=20))
def test_view_of_list_tuple_and_str(data, xs):
    check_view(data, lazyseq.view(xs), xs)
    check_search(data, lazyseq.view(xs), xs)
    check_view(data, lazyseq.view(tuple(xs)), xs, depth=1)
    text = "".join(str(x) for x in xs)
    check_view(data, lazyseq.view(text), list(text), depth=1)


@SETTINGS
@given(st.data(), st.lists(ITEMS, max_size=20))
def test_view_of_list_writes_through(data, xs):
    check_writes(data, lazyseq.view(xs), [xs], leaf_cells(0, range(len(xs))))


# -- smap and starmap ---------------------------------------------------------------


def affine(x):
    return 3 * x - 1


@SETTINGS
@given(st.data(), st.lists(NUMBERS, max_size=20))
def test_smap_one_sequence(data, xs):
    v = lazyseq.smap(affine, xs)
    check_view(data, v, [affine(x) for x in xs])
    check_view(data, lazyseq.view(xs).smap(affine), [affine(x) for x in xs], depth=1)
    if xs:
        check_read_only(v)


@SETTINGS
@given(st.data(), st.integers(0, 15))
def test_smap_two_sequences(data, n):
    xs = data.draw(st.lists(NUMBERS, min_size=n, max_size=n), label="xs")
    ys = data.draw(st.lists(ITEMS, min_size=n, max_size=n), label="ys")
    v = lazyseq.smap(lambda x, y: (y, x), xs, ys)
    check_view(data, v, [(y, x) for x, y in zip(xs, ys)])
    with pytest.raises(ValueError, match=f"smap: all sequences must have the same length, got lengths {n}, {n + 1}"):
        lazyseq.smap(operator.add, xs, [*ys, 0])


@SETTINGS
@given(st.data(), st.lists(st.tuples(NUMBERS, NUMBERS), max_size=20))
def test_starmap(data, pairs):
    v = lazyseq.starmap(operator.sub, pairs)
    check_view(data, v, [a - b for a, b in pairs])
    check_view(data, lazyseq.view(pairs).starmap(max), [max(a, b) for a, b in pairs], depth=1)
    if pairs:
        check_read_only(v)


# -- gather / take ----------------------------------------------------------------


@st.composite
def list_and_positions(draw, max_size=15):
    xs = draw(st.lists(ITEMS, max_size=max_size), label="xs")
    positions = draw(positions_for(len(xs), max_size=12), label="gathered positions")
    return xs, positions


@SETTINGS
@given(st.data(), list_and_positions())
def test_gather(data, case):
    xs, idx = case
    expected = [xs[j] for j in idx]
    check_view(data, lazyseq.gather(xs, idx), expected)
    check_view(data, lazyseq.take(xs, np.array(idx, dtype=np.int64)), expected, depth=1)
    check_view(data, lazyseq.view(xs).gather(tuple(idx)), expected, depth=1)
    check_search(data, lazyseq.gather(xs, idx), expected)
    # gathers of gathers
    outer = data.draw(positions_for(len(idx)), label="outer positions")
    check_view(data, lazyseq.gather(lazyseq.gather(xs, idx), outer), [expected[j] for j in outer], depth=1)


@SETTINGS
@given(
    st.data(), st.lists(ITEMS, max_size=15), st.integers(-20, 20), st.integers(-20, 20), st.integers(-4, 4).filter(bool)
)
def test_gather_with_a_range(data, xs, start, stop, step):
    n = len(xs)
    positions = range(start, stop, step)
    if all(-n <= j < n for j in positions):
        check_view(data, lazyseq.gather(xs, positions), [xs[j] for j in positions], depth=1)
    else:
        bad = next(j for j in positions if not -n <= j < n)
        with pytest.raises(IndexError, match=rf"^index {bad} out of range for gather's sequence of length {n}$"):
            lazyseq.gather(xs, positions)


@SETTINGS
@given(st.lists(ITEMS, max_size=10), st.data())
def test_gather_rejects_out_of_range_positions_when_built(xs, data):
    n = len(xs)
    bad = data.draw(st.sampled_from([n, n + 4, -n - 1, -n - 9]), label="bad")
    with pytest.raises(IndexError, match=rf"^index {bad} out of range for gather's sequence of length {n}$"):
        lazyseq.gather(xs, [0, bad] if n else [bad])


@SETTINGS
@given(st.data(), list_and_positions())
def test_gather_writes_through(data, case):
    xs, idx = case
    n = len(xs)
    check_writes(data, lazyseq.gather(xs, idx), [xs], leaf_cells(0, [j % n for j in idx] if n else []))


# -- concatenate -------------------------------------------------------------------


PARTS = st.lists(st.lists(ITEMS, max_size=5), max_size=5)


@st.composite
def nested_parts(draw):
    """Parts to concatenate, some of them concatenations themselves; and the flat list of lists."""
    parts, flat = [], []
    for _ in range(draw(st.integers(0, 4), label="number of parts")):
        if draw(st.booleans(), label="nested"):
            inner = draw(PARTS, label="inner parts")
            parts.append(lazyseq.concatenate(inner))
            flat.extend(inner)
        else:
            part = draw(st.lists(ITEMS, max_size=5), label="part")
            parts.append(part)
            flat.append(part)
    return parts, flat


@SETTINGS
@given(st.data(), nested_parts())
def test_concatenate(data, case):
    parts, flat = case
    expected = [x for part in flat for x in part]
    v = lazyseq.concatenate(parts)
    check_view(data, v, expected)
    check_search(data, v, expected)


@SETTINGS
@given(st.data(), PARTS)
def test_concatenate_writes_through(data, parts):
    v = lazyseq.concatenate(parts)
    cells = [(k, j) for k, part in enumerate(parts) for j in range(len(part))]
    check_writes(data, v, parts, cells)


@SETTINGS
@given(st.data(), PARTS, st.lists(ITEMS, max_size=5))
def test_concatenate_of_slices_and_fluent_form(data, parts, last):
    slices = [data.draw(slices_for(len(p)), label="slice of part") for p in parts]
    views = [lazyseq.view(p)[s] for p, s in zip(parts, slices)]
    expected = [x for p, s in zip(parts, slices) for x in p[s]] + last
    check_view(data, lazyseq.concatenate([*views, last]), expected, depth=1)
    check_view(data, lazyseq.view([]).concatenate(*views, last), expected, depth=1)


# -- collate -----------------------------------------------------------------------


@SETTINGS
@given(st.data(), st.integers(0, 12), st.integers(1, 3))
def test_collate(data, n, width):
    columns = [data.draw(st.lists(ITEMS, min_size=n, max_size=n), label="column") for _ in range(width)]
    v = lazyseq.collate(columns)
    check_view(data, v, list(zip(*columns)))
    check_writes(data, v, columns, [("tuple", [(k, i) for k in range(width)], width) for i in range(n)])
    if n:
        with pytest.raises(ValueError, match=f"collate item 0 has {width} fields, cannot assign {width + 1} values"):
            v[0] = (0,) * (width + 1)
    with pytest.raises(ValueError, match="collate: all sequences must have the same length"):
        lazyseq.collate([*columns, [0] * (n + 1)])


# -- batch and unbatch --------------------------------------------------------------


def chunks_of(xs, k, drop_last=False, pad=None):
    """``xs`` cut into lists of ``k`` items, the way batch does it."""
    chunks = [list(xs[i : i + k]) for i in range(0, len(xs), k)]
    if chunks and len(chunks[-1]) < k:
        if drop_last:
            chunks.pop()
        elif pad is not None:
            chunks[-1] = chunks[-1] + [pad] * (k - len(chunks[-1]))
    return chunks


BATCH_OPTIONS = st.sampled_from(["plain", "drop_last", "pad"])


@SETTINGS
@given(st.data(), st.lists(NUMBERS, max_size=25), st.integers(1, 6), BATCH_OPTIONS)
def test_batch_with_collate_fn_list(data, xs, k, option):
    drop_last, pad = option == "drop_last", (-1 if option == "pad" else None)
    v = lazyseq.batch(xs, k, drop_last=drop_last, pad=pad, collate_fn=list)
    check_view(data, v, chunks_of(xs, k, drop_last, pad))
    check_view(
        data,
        lazyseq.view(xs).batch(k, drop_last, pad, sum),
        [sum(c) for c in chunks_of(xs, k, drop_last, pad)],
        depth=1,
    )


@SETTINGS
@given(
    st.data(),
    st.lists(NUMBERS, max_size=25) | st.lists(st.floats(-1e6, 1e6), max_size=25) | st.lists(st.booleans(), max_size=25),
    st.integers(1, 6),
    BATCH_OPTIONS,
)
def test_batch_default_collation_stacks_numbers_into_arrays(data, xs, k, option):
    drop_last = option == "drop_last"
    pad = (type(xs[0])(0) if xs else 0) if option == "pad" else None
    v = lazyseq.batch(xs, k, drop_last=drop_last, pad=pad)
    expected = [np.asarray(chunk) for chunk in chunks_of(xs, k, drop_last, pad)]
    check_view(data, v, expected)
    for b in v:
        assert b.dtype == {int: np.int64, float: np.float64, bool: np.bool_}[type(xs[0])]


Pair = namedtuple("Pair", "number word")


@SETTINGS
@given(st.data(), st.lists(st.tuples(NUMBERS, st.text(alphabet="xy", max_size=2)), max_size=12), st.integers(1, 4))
def test_batch_default_collation_of_tuples_is_field_by_field(data, pairs, k):
    expected = [(np.asarray([a for a, _ in c]), [b for _, b in c]) for c in chunks_of(pairs, k)]
    check_view(data, lazyseq.batch(pairs, k), expected, depth=1)
    named = [Pair(*p) for p in pairs]
    expected_named = [Pair(np.asarray([p.number for p in c]), [p.word for p in c]) for c in chunks_of(named, k)]
    assert_items(lazyseq.batch(named, k), expected_named)
    numbers = [p[0] for p in pairs]
    words = [p[1] for p in pairs]
    assert_items(lazyseq.batch(lazyseq.collate([numbers, words]), k), expected)


@SETTINGS
@given(st.data(), st.lists(NUMBERS, max_size=20), st.integers(1, 5), st.booleans())
def test_batch_writes_through(data, xs, k, padded):
    pad = 0 if padded else None
    v = lazyseq.batch(xs, k, pad=pad, collate_fn=list)
    spans = [range(i, min(i + k, len(xs))) for i in range(0, len(xs), k)]
    cells = [
        ("padded", leaf_cells(0, span), k, 0) if padded else ("list", leaf_cells(0, span), len(span)) for span in spans
    ]
    check_writes(data, v, [xs], cells)
    if xs:
        with pytest.raises(ValueError, match=f"batch 0 has {len(spans[0]) if not padded else k} items, cannot assign"):
            v[0] = [0] * (k + 1)


def test_batch_assignment_to_a_padded_last_batch_writes_only_real_items():
    xs = [1, 2, 3]
    v = lazyseq.batch(xs, 2, pad=0, collate_fn=list)
    v[-1] = [30, 40]
    assert xs == [1, 2, 30]
    assert v[-1] == [30, 0]
    with pytest.raises(ValueError, match="batch 1 has 2 items, cannot assign 1 values"):
        v[1] = [5]


@st.composite
def batches_of(draw):
    size = draw(st.integers(1, 4), label="batch_size")
    count = draw(st.integers(0, 5), label="number of batches")
    last = draw(st.integers(1, size), label="last_batch_size")
    batches = [draw(st.lists(ITEMS, min_size=size, max_size=size)) for _ in range(max(count - 1, 0))]
    if count:
        batches.append(draw(st.lists(ITEMS, min_size=last, max_size=last)))
    return batches, size, last


@SETTINGS
@given(st.data(), batches_of())
def test_unbatch(data, case):
    batches, size, last = case
    expected = [x for b in batches for x in b]
    v = lazyseq.unbatch(batches, size, last)
    check_view(data, v, expected)
    cells = [(b, r) for b in range(len(batches)) for r in range(len(batches[b]))]
    check_writes(data, v, batches, cells)


@SETTINGS
@given(st.data(), st.lists(NUMBERS, max_size=20), st.integers(1, 5))
def test_unbatch_inverts_batch(data, xs, k):
    last = len(xs) % k or k
    check_view(data, lazyseq.unbatch(lazyseq.batch(xs, k, collate_fn=list), k, last), xs)
    arrays = lazyseq.unbatch(lazyseq.batch(np.array(xs, dtype=np.int32), k), k, last)
    check_view(data, arrays, list(np.array(xs, dtype=np.int32)), depth=1)


# -- split -------------------------------------------------------------------------


@st.composite
def split_cases(draw):
    """A list, edges in one of the three forms, and the expected pieces."""
    form = draw(st.sampled_from(["cuts", "edges", "spans"]), label="form")
    if form == "cuts":
        parts, size = draw(st.integers(1, 5), label="parts"), draw(st.integers(0, 4), label="size")
        xs = draw(st.lists(ITEMS, min_size=parts * size, max_size=parts * size))
        return xs, parts - 1, [(k * size, (k + 1) * size) for k in range(parts)]
    xs = draw(st.lists(ITEMS, max_size=15))
    n = len(xs)
    if form == "edges":
        edges = sorted(draw(st.lists(st.integers(0, n), max_size=5), label="edges"))
        bounds = [0, *edges, n]
        return xs, edges, list(zip(bounds[:-1], bounds[1:]))
    spans = [
        tuple(sorted(p))
        for p in draw(st.lists(st.lists(st.integers(0, n), min_size=2, max_size=2), min_size=1, max_size=5))
    ]
    return xs, spans, spans


@SETTINGS
@given(st.data(), split_cases())
def test_split(data, case):
    xs, edges, spans = case
    expected = [xs[a:b] for a, b in spans]
    v = lazyseq.split(xs, edges)
    check_view(data, v, expected)
    if expected:
        k = data.draw(st.integers(-len(expected), len(expected) - 1), label="piece")
        check_view(data, v[k], expected[k], depth=1)


@SETTINGS
@given(st.data(), split_cases())
def test_split_with_numpy_edges(data, case):
    """Edges may come as numpy arrays (``np.cumsum(lengths)[:-1]``, ``np.array(spans)``), like any sequence of ints."""
    xs, edges, spans = case
    if isinstance(edges, int):
        edges = np.int64(edges)
    else:
        edges = np.array(edges, dtype=np.int64).reshape(len(edges), -1 if edges and isinstance(edges[0], tuple) else 1)
        edges = edges[:, 0] if edges.shape[1] == 1 else edges
    check_view(data, lazyseq.split(xs, edges), [xs[a:b] for a, b in spans], depth=1)


@SETTINGS
@given(st.data(), split_cases())
def test_split_writes_through(data, case):
    xs, edges, spans = case
    v = lazyseq.split(xs, edges)
    check_writes(data, v, [xs], [("list", leaf_cells(0, range(a, b)), b - a) for a, b in spans])
    if spans and spans[0][1] > spans[0][0]:
        piece = v[0]
        piece[-1] = "tail"  # a piece is itself a writable view
        assert xs[spans[0][1] - 1] == "tail"


@SETTINGS
@given(st.lists(ITEMS, max_size=12), st.data())
def test_split_rejects_bad_edges(xs, data):
    n = len(xs)
    with pytest.raises(ValueError, match=rf"split: span \(0, {n + 1}\) is not within 0..{n}"):
        lazyseq.split(xs, [(0, n + 1)])
    with pytest.raises(ValueError, match=r"split: span \(-1, 0\) is not within"):
        lazyseq.split(xs, [(-1, 0)])
    if n >= 2:
        with pytest.raises(ValueError, match=r"^split: edges must not decrease, got 1 after 2$"):
            lazyseq.split(xs, [2, 1])
    with pytest.raises(ValueError, match=rf"^split: edge {n + 1} is not within 0..{n}$"):
        lazyseq.split(xs, [n + 1])
    parts = data.draw(st.integers(2, 5), label="parts")
    if n % parts:
        with pytest.raises(
            ValueError, match=f"split: {parts - 1} cuts must divide the length {n} into {parts} equal parts"
        ):
            lazyseq.split(xs, parts - 1)
    with pytest.raises(ValueError, match="^split: a number of cuts must be 0 or more, got -1$"):
        lazyseq.split(xs, -1)


# -- interleave --------------------------------------------------------------------


def round_robin(sequences):
    longest = max((len(s) for s in sequences), default=0)
    return [s[depth] for depth in range(longest) for s in sequences if depth < len(s)]


@SETTINGS
@given(st.data(), st.lists(st.lists(ITEMS, max_size=6), min_size=1, max_size=4))
def test_interleave(data, sequences):
    expected = round_robin(sequences)
    v = lazyseq.interleave(*sequences)
    check_view(data, v, expected)
    order = [(k, depth) for depth in range(max(map(len, sequences))) for k, s in enumerate(sequences) if depth < len(s)]
    check_writes(data, v, sequences, order)


# -- cycle and repeat ----------------------------------------------------------------


@SETTINGS
@given(st.data(), st.lists(ITEMS, min_size=1, max_size=6), st.integers(0, 25))
def test_cycle_with_limit(data, xs, limit):
    n = len(xs)
    v = lazyseq.cycle(xs, limit)
    check_view(data, v, [xs[i % n] for i in range(limit)])
    check_writes(data, v, [xs], leaf_cells(0, [i % n for i in range(limit)]))


@SETTINGS
@given(st.data(), st.lists(ITEMS, min_size=1, max_size=6))
def test_cycle_forever(data, xs):
    check_infinite(data, lazyseq.cycle(xs), lambda i: xs[i % len(xs)])
    with pytest.raises(ValueError, match="cycle: cannot repeat an empty sequence"):
        lazyseq.cycle([])
    with pytest.raises(ValueError, match="^cycle: limit must be a non-negative integer or None, got -1$"):
        lazyseq.cycle(xs, -1)
    assert len(lazyseq.cycle([], 0)) == 0


@SETTINGS
@given(st.data(), ITEMS, st.integers(0, 20))
def test_repeat(data, value, times):
    v = lazyseq.repeat(value, times)
    check_view(data, v, [value] * times)
    if times:
        check_read_only(v)
    check_infinite(data, lazyseq.repeat(value), lambda i: value)
    with pytest.raises(ValueError, match="^repeat: times must be a non-negative integer or None, got -2$"):
        lazyseq.repeat(value, -2)


def test_repeat_gives_the_same_object():
    value = [1, 2]
    v = lazyseq.repeat(value, 3)
    assert all(item is value for item in v) and v[-1] is value and v[1:][0] is value


# -- arange ------------------------------------------------------------------------


@SETTINGS
@given(st.data(), st.integers(-30, 30), st.none() | st.integers(-30, 30), st.none() | st.integers(-7, 7).filter(bool))
def test_arange(data, start, stop, step):
    if stop is None:
        v, expected = lazyseq.arange(start), list(range(start))
    else:
        v, expected = lazyseq.arange(start, stop, step), list(range(start, stop, 1 if step is None else step))
    check_view(data, v, expected)
    check_search(data, v, expected)
    if expected:
        check_read_only(v)
    with pytest.raises(ValueError):
        lazyseq.arange(0, 10, 0)


# -- case and switch -----------------------------------------------------------------


@SETTINGS
@given(st.data(), st.integers(0, 12), st.integers(1, 3))
def test_case(data, n, branches):
    selector = data.draw(st.lists(st.integers(0, branches - 1), min_size=n, max_size=n), label="selector")
    values = [data.draw(st.lists(ITEMS, min_size=n, max_size=n), label="values") for _ in range(branches)]
    expected = [values[s][i] for i, s in enumerate(selector)]
    check_view(data, lazyseq.case(selector, *values), expected)
    check_view(data, lazyseq.case(np.array(selector, dtype=np.int64), *values), expected, depth=1)
    stores = [selector, *values]
    check_writes(data, lazyseq.case(selector, *values), stores, [(1 + s, i) for i, s in enumerate(selector)])
    with pytest.raises(ValueError, match="case: all sequences must have the same length"):
        lazyseq.case(selector, *values, [0] * (n + 1))


@SETTINGS
@given(st.data(), st.integers(0, 12))
def test_switch(data, n):
    condition = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="condition")
    x = data.draw(st.lists(ITEMS, min_size=n, max_size=n), label="x")
    y = data.draw(st.lists(ITEMS, min_size=n, max_size=n), label="y")
    v = lazyseq.switch(condition, x, y)
    check_view(data, v, [a if c else b for c, a, b in zip(condition, x, y)])
    check_writes(data, v, [x, y], [(0 if c else 1, i) for i, c in enumerate(condition)])


# -- add_cache ----------------------------------------------------------------------


@SETTINGS
@given(st.data(), st.lists(NUMBERS, max_size=15), st.integers(1, 4))
def test_add_cache(data, xs, size):
    calls = []

    def traced(x):
        calls.append(x)
        return affine(x)

    v = lazyseq.add_cache(lazyseq.smap(traced, xs), size)
    check_view(data, v, [affine(x) for x in xs])
    if xs:
        i = data.draw(st.integers(-len(xs), len(xs) - 1), label="index")
        v[i]
        calls.clear()
        assert v[i] == affine(xs[i]) and calls == []  # the item just read is cached


@SETTINGS
@given(st.data(), st.lists(ITEMS, max_size=15), st.integers(1, 4))
def test_add_cache_writes_through_and_forgets_the_old_item(data, xs, size):
    v = lazyseq.add_cache(xs, size)
    list(v)  # fill the cache
    check_writes(data, v, [xs], leaf_cells(0, range(len(xs))))


# -- shuffle -----------------------------------------------------------------------


@SETTINGS
@given(st.data(), st.lists(ITEMS, max_size=20), st.integers(0, 2**63), st.integers(0, 5))
def test_shuffle_is_a_reproducible_permutation(data, xs, seed, epoch):
    v = lazyseq.shuffle(xs, seed, epoch)
    permutation = [int(p) for p in v.permutation]
    assert sorted(permutation) == list(range(len(xs)))
    expected = [xs[p] for p in permutation]
    check_view(data, v, expected)
    assert list(lazyseq.shuffle(xs, seed, epoch)) == expected
    assert list(lazyseq.view(xs).shuffle(seed=seed, epoch=epoch)) == expected
    other = data.draw(st.integers(0, 5), label="other epoch")
    v.set_epoch(other)
    assert v.epoch == other
    assert list(v) == list(lazyseq.shuffle(xs, seed, other))
    check_writes(data, v, [xs], leaf_cells(0, [int(p) for p in v.permutation]))


# -- uniter ------------------------------------------------------------------------


class Reiterable:
    """Iterable again and again, with no length."""

    def __init__(self, items):
        self.items = items
        self.starts = 0

    def __iter__(self):
        self.starts += 1
        yield from self.items


@SETTINGS
@given(st.data(), st.lists(ITEMS, max_size=15), st.integers(0, 4), st.integers(1, 3))
def test_uniter_with_a_known_length(data, xs, cache_size, n_parallel):
    check_view(data, lazyseq.uniter(Reiterable(xs), cache_size, n_parallel, size=len(xs)), xs)
    check_view(data, lazyseq.uniter(xs, cache_size, n_parallel), xs, depth=1)
    if xs:
        check_read_only(lazyseq.uniter(xs))


@SETTINGS
@given(st.data(), st.lists(ITEMS, max_size=15), st.integers(0, 4), st.integers(1, 3))
def test_uniter_without_a_length(data, xs, cache_size, n_parallel):
    n = len(xs)
    v = lazyseq.uniter(Reiterable(xs), cache_size, n_parallel)
    order = data.draw(st.permutations(range(n)), label="reading order")
    for i in order:
        assert_same(v[i], xs[i])
    assert_items(v, xs)
    with pytest.raises(IndexError, match=f"uniter index {n + 2} out of range: the iterable ended after {n} items"):
        v[n + 2]
    with pytest.raises(TypeError, match="has no len"):
        len(v)
    with pytest.raises(TypeError, match="negative index -1 needs a length, but uniter view has no known length"):
        v[-1]
    start, stop = sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=2), label="bounds"))
    assert_items(v[start:stop], xs[start:stop])


# -- infinite views -------------------------------------------------------------------


@SETTINGS
@given(st.data(), st.lists(ITEMS, min_size=1, max_size=5), st.lists(ITEMS, max_size=5))
def test_infinite_compositions(data, xs, ys):
    """Views built on infinite views are infinite and read the right items."""
    n = len(xs)
    forever = lazyseq.cycle(xs)
    check_infinite(data, lazyseq.concatenate([ys, forever]), lambda i: ys[i] if i < len(ys) else xs[(i - len(ys)) % n])
    check_infinite(data, lazyseq.smap(lambda a, b: (a, b), forever, lazyseq.repeat("r")), lambda i: (xs[i % n], "r"))
    check_infinite(data, lazyseq.collate([forever, lazyseq.arange(10**6).cycle()]), lambda i: (xs[i % n], i % 10**6))
    k = data.draw(st.integers(1, 4), label="k")
    check_infinite(data, forever.batch(k, collate_fn=list), lambda b: [xs[j % n] for j in range(b * k, b * k + k)])
    check_infinite(data, lazyseq.unbatch(forever.batch(k, collate_fn=list), k), lambda i: xs[i % n])

    def interleaved(i):  # ys and the cycle alternate; once ys runs out, the cycle goes on alone
        if i < 2 * len(ys):
            return xs[(i // 2) % n] if i % 2 else ys[i // 2]
        return xs[(i - len(ys)) % n]

    check_infinite(data, lazyseq.interleave(ys, forever), interleaved)
    check_infinite(data, lazyseq.add_cache(forever, 2), lambda i: xs[i % n])
    check_infinite(data, lazyseq.case(lazyseq.repeat(1), lazyseq.repeat(0), forever), lambda i: xs[i % n])
    selector = lazyseq.cycle([True, False])
    check_infinite(
        data, lazyseq.switch(selector, forever, lazyseq.repeat("no")), lambda i: "no" if i % 2 else xs[i % n]
    )


@SETTINGS
@given(st.data(), st.lists(ITEMS, min_size=1, max_size=5))
def test_infinite_cycle_writes_through(data, xs):
    model = list(xs)
    forever = lazyseq.cycle(xs)
    i = data.draw(st.integers(0, 10**6), label="index")
    forever[i] = "new"
    model[i % len(model)] = "new"
    forever[i + 1 :: 2][0] = "newer"
    model[(i + 1) % len(model)] = "newer"
    assert xs == model


FAR = [2**62 + 3, 2**63 + 1, 2**64 + 5]


@pytest.mark.parametrize("far", FAR)
def test_far_items_of_an_infinite_view_by_index_and_slice(far):
    """Any non-negative index is valid on an infinite view, however large."""
    forever = lazyseq.cycle([0, 1, 2])
    assert forever[far] == far % 3
    assert list(forever[far : far + 3]) == [far % 3, (far + 1) % 3, (far + 2) % 3]
    assert list(itertools.islice(forever[far::2], 2)) == [far % 3, (far + 2) % 3]


@pytest.mark.parametrize("far", FAR)
def test_far_items_of_an_infinite_view_by_list_key(far):
    """``v[[j]]`` is ``[v[j]]``: on an infinite view that holds for every non-negative ``j``."""
    forever = lazyseq.cycle([0, 1, 2])
    assert list(forever[[far, 0]]) == [far % 3, 0]


@pytest.mark.parametrize("far", FAR)
def test_far_batches_of_an_infinite_view(far):
    """Batch ``b`` of an infinite view holds items ``b*k`` to ``b*k + k - 1``, however large ``b`` is."""
    batches = lazyseq.batch(lazyseq.cycle([0, 1, 2]), 2)
    b = far // 2
    np.testing.assert_array_equal(batches[b], [(2 * b) % 3, (2 * b + 1) % 3])


@pytest.mark.parametrize("key", [[2**64 - 1], [10**20], [0, -(10**20)], [0, 2**63]])
def test_list_keys_beyond_64_bits_are_out_of_range(key):
    """``v[[j]]`` holds ``v[j]`` for each ``j``: an index no int64 can hold is out of range, not wrapped around."""
    v = lazyseq.view([1, 2, 3])
    with pytest.raises(IndexError, match="out of range"):
        v[key[-1]]
    with pytest.raises(IndexError, match="out of range"):
        v[key]


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda u: u, [1, 2, 3]),
        (lambda u: lazyseq.smap(abs, u), [1, 2, 3]),
        (lambda u: lazyseq.add_cache(u, 2), [1, 2, 3]),
        (lambda u: u[1:], [2, 3]),
        (lambda u: lazyseq.concatenate([[0], u]), [0, 1, 2, 3]),
        (lambda u: lazyseq.batch(u, 2, collate_fn=list), [[1, 2], [3]]),
    ],
    ids=["uniter", "smap", "add_cache", "slice", "concatenate", "batch"],
)
def test_iteration_over_a_uniter_without_length_stops_at_its_end(build, expected):
    """Like Python's own iteration over a ``__getitem__`` sequence, iterating a view that reads a
    uniter of unknown length stops where the iterable ends, instead of raising its IndexError."""
    v = build(lazyseq.uniter(Reiterable([1, 2, 3])))
    assert list(itertools.islice(v, 10)) == expected


# -- numpy-backed data ----------------------------------------------------------------


DTYPES = st.sampled_from([np.int8, np.uint16, np.int32, np.int64, np.float32, np.float64, np.bool_])
ROW_SHAPES = st.sampled_from([(), (2,), (2, 3)])


@st.composite
def arrays(draw, max_rows=12, dtype=None, row_shape=None):
    n = draw(st.integers(0, max_rows), label="rows")
    dtype = draw(DTYPES) if dtype is None else dtype
    row_shape = draw(ROW_SHAPES) if row_shape is None else row_shape
    offset = draw(st.integers(0, 50), label="offset")
    values = np.arange(offset, offset + n * int(np.prod(row_shape)))
    if dtype is np.bool_:
        values = values % 3 == 0
    return values.reshape((n, *row_shape)).astype(dtype)


def expected_batches(rows, k, drop_last=False, pad=None, dtype=None):
    """``np.stack`` of each group of ``k`` rows; padding rows have the data's dtype."""
    if pad is not None:
        pad = np.broadcast_to(np.asarray(pad, dtype=dtype), rows[0].shape if rows else ())
    return [np.stack(chunk) for chunk in chunks_of(rows, k, drop_last, pad)]


@pytest.fixture(scope="module")
def memmaps(tmp_path_factory):
    """Two read-write memory maps of the same dtype, of 7 and 5 rows."""
    folder = tmp_path_factory.mktemp("memmaps")
    maps = []
    for k, rows in enumerate((7, 5)):
        m = np.lib.format.open_memmap(folder / f"part{k}.npy", mode="w+", dtype=np.float32, shape=(rows, 3))
        m[:] = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + 100 * k
        m.flush()
        maps.append(m)
    return maps


@SETTINGS
@given(st.data(), arrays())
def test_view_and_gather_of_an_array(data, array):
    rows = [array[i] for i in range(len(array))]
    check_view(data, lazyseq.view(array), rows)
    idx = data.draw(positions_for(len(array)), label="positions")
    check_view(data, lazyseq.gather(array, idx), [rows[j] for j in idx])


@SETTINGS
@given(st.data(), st.lists(arrays(max_rows=5, dtype=np.int16, row_shape=(2,)), max_size=4))
def test_concatenate_arrays(data, parts):
    rows = [row for part in parts for row in part]
    check_view(data, lazyseq.concatenate(parts), rows)


@SETTINGS
@given(st.data(), arrays(max_rows=20), st.integers(1, 6), BATCH_OPTIONS)
def test_batch_of_an_array_equals_stacked_rows(data, array, k, option):
    rows = [array[i] for i in range(len(array))]
    drop_last, pad = option == "drop_last", (1 if option == "pad" else None)
    expected = expected_batches(rows, k, drop_last, pad, array.dtype)
    check_view(data, lazyseq.batch(array, k, drop_last=drop_last, pad=pad), expected)
    idx = data.draw(positions_for(len(array), max_size=15), label="gathered")
    gathered = [rows[j] for j in idx]
    check_view(data, lazyseq.view(array).gather(idx).batch(k), expected_batches(gathered, k), depth=1)


@SETTINGS
@given(st.data(), st.lists(arrays(max_rows=5, row_shape=(2,)), min_size=1, max_size=4), st.integers(1, 5))
def test_batch_across_concatenated_arrays_equals_stacked_rows(data, parts, k):
    """Parts may differ in dtype: a batch that spans them is ``np.stack`` of its items, promotion included."""
    rows = [row for part in parts for row in part]
    check_view(data, lazyseq.concatenate(parts).batch(k), expected_batches(rows, k), depth=1)
    scalars = [part[:, 0] for part in parts]
    items = [x for part in scalars for x in part]
    check_view(data, lazyseq.concatenate(scalars).batch(k), expected_batches(items, k), depth=1)


@FEW
@given(st.data(), st.integers(1, 6), BATCH_OPTIONS)
def test_memmaps(memmaps, data, k, option):
    arrays_ = [np.array(m) for m in memmaps]
    rows = [row for a in arrays_ for row in a]
    joined = lazyseq.concatenate([lazyseq.view(m) for m in memmaps])
    check_view(data, joined, rows)
    idx = data.draw(positions_for(len(rows)), label="positions")
    check_view(data, joined.gather(idx), [rows[j] for j in idx], depth=1)
    drop_last, pad = option == "drop_last", (-1 if option == "pad" else None)
    expected = expected_batches(rows, k, drop_last, pad, np.float32)
    check_view(data, lazyseq.batch(joined, k, drop_last=drop_last, pad=pad), expected, depth=1)
    for batch in lazyseq.batch(joined, k):
        assert type(batch) is np.ndarray and not isinstance(batch, np.memmap)


def test_numpy_writes_through(memmaps):
    array = np.arange(12, dtype=np.int64).reshape(6, 2)
    model = array.copy()
    v = lazyseq.view(array)
    v[-1] = [50, 51]
    v[1:4:2] = [[10, 11], [30, 31]]
    lazyseq.gather(array, [0, -2])[1] = [40, 41]
    model[-1], model[1:4:2], model[-2] = [50, 51], [[10, 11], [30, 31]], [40, 41]
    np.testing.assert_array_equal(array, model)
    joined = lazyseq.concatenate([lazyseq.view(m) for m in memmaps])
    before = [np.array(m) for m in memmaps]
    joined[6:8] = [np.full(3, -1.0, dtype=np.float32), np.full(3, -2.0, dtype=np.float32)]
    np.testing.assert_array_equal(memmaps[0][6], [-1, -1, -1])
    np.testing.assert_array_equal(memmaps[1][0], [-2, -2, -2])
    lazyseq.batch(joined, 4)[0] = np.zeros((4, 3), dtype=np.float32)
    np.testing.assert_array_equal(memmaps[0][:4], 0)
    for m, b in zip(memmaps, before):  # leave the module fixture as it was
        m[:] = b


# -- Python list semantics beyond reading --------------------------------------------


@pytest.mark.parametrize("key", [1.0, "1", None, (0,), 1j])
def test_bad_keys_are_type_errors_like_lists(key):
    xs = [1, 2, 3]
    with pytest.raises(TypeError):
        xs[key]
    with pytest.raises(TypeError, match="indices must be integers, slices or integer arrays"):
        lazyseq.view(xs)[key]
    with pytest.raises(TypeError, match="indices must be integers, slices or integer arrays"):
        lazyseq.smap(abs, xs)[key]


@SETTINGS
@given(st.data(), st.lists(NUMBERS, min_size=1, max_size=12))
def test_slice_assignment_from_an_overlapping_view_reads_values_first(data, xs):
    """Like ``lst[a:b] = lst[c:d]`` (and numpy), values are read before any is written, even from a view of the same data."""
    n = len(xs)
    target = data.draw(slices_for(n), label="target")
    size = len(range(n)[target])
    source = data.draw(
        st.sampled_from([slice(0, size), slice(n - size, n), slice(size - 1, None, -1) if size else slice(0, 0)]),
        label="source",
    )
    model = list(xs)
    model[target] = model[source]
    v = lazyseq.view(xs)
    v[target] = v[source]
    assert xs == model


@SETTINGS
@given(st.data(), st.lists(ITEMS, max_size=12))
def test_slice_assignment_accepts_any_iterable_of_the_right_length(data, xs):
    """``lst[s] = iterable`` accepts any iterable (a generator too), as long as an extended slice gets the right count."""
    n = len(xs)
    key = data.draw(slices_for(n), label="slice")
    values = [f"v{j}" for j in range(len(range(n)[key]))]
    model = list(xs)
    model[key] = iter(values)
    lazyseq.view(xs)[key] = iter(values)
    assert xs == model


@pytest.mark.parametrize("step", [2**63, -(2**63), 10**30])
@pytest.mark.parametrize(
    "make", [lambda xs: lazyseq.view(xs), lambda xs: lazyseq.smap(str, xs), lambda xs: lazyseq.gather(xs, [0, 1, 2])]
)
def test_slices_with_steps_beyond_64_bits(make, step):
    """``lst[::step]`` works for any Python int; so does every key on the slice it gives."""
    xs = [1, 2, 3]
    v = make(xs)
    expected = [make(xs)[j] for j in range(3)[::step]]
    sliced = v[::step]
    assert list(sliced) == expected
    assert list(sliced[0:1]) == expected[0:1]
    assert list(sliced[[0]]) == [expected[0]]
    assert list(sliced[np.array([-1])]) == [expected[-1]]


def test_batches_of_a_one_shot_generator_end_where_it_ends():
    batches = lazyseq.batch(lazyseq.uniter(x for x in range(5)), 2, collate_fn=list)
    assert list(batches) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("far", FAR)
def test_far_items_of_a_concatenation_ending_in_an_infinite_view(far):
    """Item ``j`` past the finite head is ``(j - 2) % 3``, whatever the size of ``j``, by index, list key or slice."""
    joined = lazyseq.concatenate([[10, 11], lazyseq.cycle([0, 1, 2])])
    assert joined[far] == (far - 2) % 3
    assert list(joined[[far, 0, 1, 2]]) == [(far - 2) % 3, 10, 11, 0]
    expected = [(far + k * 2**63 - 2) % 3 for k in range(3)]
    assert list(itertools.islice(joined[far :: 2**63], 3)) == expected

"""Gathering rows of several arrays in one call (``concatenate``'s fast path over arrays alike)."""

import gc
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq
from lazyseq.views.concatenate import ConcatenateView
from lazyseq.views.row_window import RowWindow

ROW_SHAPES = [(), (3,), (2, 4)]
DTYPES = [np.float64, np.int16, np.dtype(">i4"), np.dtype([("a", "<f4"), ("b", "u1")])]


def parts(dtype, row_shape, lengths=(5, 1, 7, 3), seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    out = []
    for n in lengths:
        raw = rng.integers(0, 100, size=(n, *row_shape, dtype.itemsize), dtype=np.uint8)
        out.append(raw.view(dtype).reshape((n, *row_shape)))
    return out


@pytest.mark.parametrize("row_shape", ROW_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_from_every_part_in_request_order(dtype, row_shape):
    arrays = parts(dtype, row_shape)
    whole = np.concatenate(arrays).astype(arrays[0].dtype)  # numpy would turn >i4 into native int32
    positions = np.random.default_rng(1).integers(0, len(whole), size=40)
    view = lazyseq.concatenate(arrays)
    assert view._window is not None
    assert [row.tobytes() for row in view[positions]] == [row.tobytes() for row in whole[positions]]
    batch = lazyseq.batch(lazyseq.gather(view, positions), 8)[2]
    want = whole[positions[16:24]]
    assert batch.dtype == want.dtype and batch.shape == want.shape
    assert batch.tobytes() == want.tobytes()


def test_a_batch_is_a_new_writable_array():
    arrays = parts(np.float64, (3,))
    batch = lazyseq.concatenate(arrays).gather([0, 6, 12]).batch(3)[0]
    assert batch.flags.writeable and batch.flags.c_contiguous and batch.flags.aligned
    assert not any(np.shares_memory(batch, a) for a in arrays)
    batch[:] = -1
    assert (np.concatenate(arrays) >= 0).all()


def test_positions_outside_every_part_raise_index_error_not_other_memory():
    window = RowWindow.over(parts(np.float64, (3,)))
    for bad in ([-1], [16], [17], [1000], [5, 16]):
        with pytest.raises(IndexError):
            window.rows(np.array(bad, dtype=np.intp))
    assert window.rows(np.array([], dtype=np.intp)).shape == (0, 3)


def test_reads_see_later_writes_to_the_arrays():
    arrays = parts(np.int16, ())
    view = lazyseq.concatenate(arrays).gather([0, 5, 6])
    arrays[1][0] = 999
    assert view.batch(3)[0].tolist() == [arrays[0][0], 999, arrays[2][0]]


def test_the_window_keeps_its_arrays_alive():
    view = lazyseq.concatenate(parts(np.float64, (2,), lengths=(1000, 1000)))
    want = np.concatenate(parts(np.float64, (2,), lengths=(1000, 1000)))
    gc.collect()
    for _ in range(3):
        np.ones((2000, 2))  # reuse freed memory, if any had been freed
    assert np.array_equal(view.batch(2000)[0], want)


@pytest.mark.parametrize(
    "arrays",
    [
        [np.arange(12.0).reshape(4, 3)[:, ::2], np.arange(6.0).reshape(3, 2)],  # a non-contiguous part
        [np.array([1, "a", None], dtype=object), np.array([2.5], dtype=object)],  # references
        [np.zeros((2, 0)), np.zeros((3, 0))],  # rows of no bytes
    ],
    ids=["strided", "object", "empty-rows"],
)
def test_layouts_without_a_window_read_the_same_items(arrays):
    view = lazyseq.concatenate(arrays)
    assert view._window is None
    positions = [3, 0, 2, 1]
    want = np.concatenate(arrays)[positions]
    got = view.gather(positions).batch(2)
    assert np.array_equal(np.concatenate([got[0], got[1]]), want)


def test_memory_maps_read_through_the_window_and_pickle_small(tmp_path):
    for k, array in enumerate(parts(np.float32, (16,), lengths=(300, 200))):
        np.save(tmp_path / f"part{k}.npy", array)
    view = lazyseq.open_npy(str(tmp_path / "part*.npy"))
    assert isinstance(view, ConcatenateView) and view._window is not None
    whole = np.concatenate(parts(np.float32, (16,), lengths=(300, 200)))
    positions = np.random.default_rng(2).permutation(500)
    assert np.array_equal(lazyseq.gather(view, positions).batch(500)[0], whole[positions])
    copy = pickle.loads(pickle.dumps(view))
    assert len(pickle.dumps(view)) < 2000  # file locations, not the data
    assert np.array_equal(lazyseq.gather(copy, positions).batch(500)[0], whole[positions])


@st.composite
def array_parts(draw):
    """Arrays of one dtype and row shape, some of them empty or strided; and their positions to read."""
    dtype = draw(st.sampled_from([np.uint8, np.float64, np.dtype(">i2"), np.dtype([("x", "<i4"), ("y", "u1")])]))
    row_shape = draw(st.sampled_from([(), (1,), (3,), (2, 3)]))
    arrays = []
    for k, n in enumerate(draw(st.lists(st.integers(0, 6), min_size=1, max_size=5), label="lengths")):
        raw = np.arange((2 * n + k) * int(np.prod(row_shape)) * np.dtype(dtype).itemsize, dtype=np.uint8) + 10 * k
        array = raw.view(dtype).reshape((2 * n + k, *row_shape))
        arrays.append(array[:: 2 if draw(st.booleans(), label="strided") else 1][:n])
    total = sum(len(a) for a in arrays)
    positions = draw(st.lists(st.integers(0, max(total - 1, 0)), max_size=20 if total else 0), label="positions")
    return arrays, positions


@settings(max_examples=200, deadline=None)
@given(array_parts())
def test_gathered_batches_equal_numpy_whatever_the_layout(case):
    arrays, positions = case
    want = np.concatenate(arrays).astype(arrays[0].dtype)[positions]
    view = lazyseq.concatenate(arrays)
    got = view.gather(positions).batch(max(len(positions), 1))
    if positions:
        assert got[0].dtype == want.dtype and got[0].tobytes() == want.tobytes()
    else:
        assert len(got) == 0


def test_a_part_of_one_row_with_any_stride():
    single = np.arange(8.0).reshape(4, 2)[::3][:1]  # one row, stride of 3 rows: contiguous all the same
    view = lazyseq.concatenate([single, np.array([[9.0, 9.5]])])
    assert view._window is not None
    assert view.gather([1, 0, 1]).batch(3)[0].tolist() == [[9.0, 9.5], [0.0, 1.0], [9.0, 9.5]]

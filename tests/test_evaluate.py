"""evaluate: chunked evaluation with exact results, bounded memory, outputs on disk, clear errors."""

import ast
import collections
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import tracemalloc

import numpy as np
import pytest
from loader_helpers import ENDED_ITSELF, die_on

import lazyseq
from lazyseq import output_arrays


def labelled(n=100, width=3):
    x = lazyseq.view(np.arange(n * width, dtype=np.float64).reshape(n, width))
    y = lazyseq.view(np.arange(n) % 4)
    return lazyseq.collate([x, y])


@pytest.mark.parametrize("batch_size", [1, 7, 64, 100, 1000])
@pytest.mark.parametrize("nworkers,method", [(0, "thread"), (2, "thread"), (2, "process")])
def test_results_are_concatenated_in_order(batch_size, nworkers, method):
    data = labelled()
    sums, targets = lazyseq.evaluate(
        lambda b: (b[0].sum(axis=1), b[1]), data, batch_size=batch_size, nworkers=nworkers, method=method
    )
    expected = np.arange(300.0).reshape(100, 3).sum(axis=1)
    np.testing.assert_array_equal(sums, expected)
    np.testing.assert_array_equal(targets, np.arange(100) % 4)


def test_dicts_lists_namedtuples_and_multi_dimensional_rows():
    from collections import namedtuple

    Pair = namedtuple("Pair", "first second")
    result = lazyseq.evaluate(lambda b: {"rows": b[0], "parts": [Pair(b[1], b[1] * 2)]}, labelled(10), batch_size=4)
    np.testing.assert_array_equal(result["rows"], np.arange(30.0).reshape(10, 3))
    assert type(result["parts"][0]) is Pair
    np.testing.assert_array_equal(result["parts"][0].second, (np.arange(10) % 4) * 2)


def test_an_sklearn_model_and_a_torch_model():
    from sklearn.naive_bayes import GaussianNB

    data = labelled(40)
    x, y = np.arange(120.0).reshape(40, 3), np.arange(40) % 4
    model = GaussianNB().fit(x, y)
    predictions, targets = lazyseq.evaluate(lambda b: (model.predict(b[0]), b[1]), data, batch_size=16)
    np.testing.assert_array_equal(predictions, model.predict(x))
    np.testing.assert_array_equal(targets, y)

    torch = pytest.importorskip("torch")
    layer = torch.nn.Linear(3, 2, dtype=torch.float64)
    scores = lazyseq.evaluate(lambda b: layer(torch.from_numpy(b[0])), data, batch_size=16)  # requires grad
    assert scores.dtype == np.float64 and scores.shape == (40, 2)
    np.testing.assert_array_equal(scores, layer(torch.from_numpy(x)).detach().numpy())


def test_memory_stays_bounded_by_the_batch_not_the_data(tmp_path):
    rows, width, batch_size = 4096, 256, 64
    path = tmp_path / "big.npy"
    np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(rows, width))[:] = 1.0
    data = lazyseq.open_npy(str(path))
    batch_bytes = batch_size * width * 8
    assert rows * width * 8 == 64 * batch_bytes  # the data is 64 batches
    for nworkers in (0, 2):
        tracemalloc.start()
        try:
            for _ in range(3):  # several passes: nothing accumulates
                totals = lazyseq.evaluate(lambda b: b.sum(axis=1), data, batch_size=batch_size, nworkers=nworkers)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        np.testing.assert_array_equal(totals, np.full(rows, 256.0))
        in_flight = 1 if nworkers == 0 else 4 + nworkers + 1  # max_buffered=4 ahead, one per worker, the current one
        assert peak < (in_flight + 2) * batch_bytes, (nworkers, peak, batch_bytes)


def test_shards_evaluated_separately_cover_every_item_exactly_once():
    n = 103
    data = lazyseq.collate([lazyseq.arange(n), labelled(n)])
    for contiguous in (True, False):
        seen = []
        for rank in range(4):
            part = lazyseq.shard(data, rank, 4, contiguous=contiguous)
            positions, sums = lazyseq.evaluate(lambda b: (b[0], b[1][0].sum(axis=1)), part, batch_size=8)
            seen.append(positions)
            np.testing.assert_array_equal(sums, np.arange(n * 3.0).reshape(n, 3).sum(axis=1)[positions])
        np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(n))


def test_outputs_written_to_arrays_and_npy_files(tmp_path):
    data = labelled(10)
    out = np.zeros(10)
    assert lazyseq.evaluate(lambda b: b[0][:, 0], data, batch_size=3, out=out) is out
    np.testing.assert_array_equal(out, np.arange(0.0, 30.0, 3.0))

    result = lazyseq.evaluate(
        lambda b: (b[0], b[1]), data, batch_size=4, out=(str(tmp_path / "x.npy"), tmp_path / "y.npy")
    )
    assert isinstance(result[0], np.memmap)
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), np.arange(30.0).reshape(10, 3))
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.arange(10) % 4)

    both = lazyseq.evaluate(lambda b: {"x": b[0], "y": b[1]}, data, batch_size=4, out={"x": None, "y": out})
    np.testing.assert_array_equal(both["y"], np.arange(10) % 4)


def test_owned_outputs_widen_when_later_batches_need_it():
    words = lazyseq.view(["a", "bb", "ccc", "dddd"])
    result = lazyseq.evaluate(lambda b: np.array(b), words, batch_size=2)
    assert result.tolist() == ["a", "bb", "ccc", "dddd"]
    numbers = lazyseq.evaluate(lambda b: np.array(b) if b[0] < 2 else np.array(b) + 0.5, [0, 1, 2, 3], batch_size=2)
    assert numbers.tolist() == [0.0, 1.0, 2.5, 3.5]


def test_widening_keeps_the_kind_of_every_value():
    # int64 then uint64 made floats (2**62 + 1 read back as 2**62), numbers then strings made strings
    for first, later, name in [
        (np.array([2**62 + 1]), np.array([2**64 - 1], np.uint64), "uint64"),
        (np.array([0]), np.array(["x"]), "<U1"),
        (np.array(["2026-01-01"], "datetime64[D]"), np.array([3]), "int64"),
    ]:
        with pytest.raises(TypeError) as caught:
            lazyseq.evaluate(lambda b, first=first, later=later: first if b[0] == 0 else later, [0, 1], batch_size=1)
        assert str(caught.value).startswith(f"evaluate: fn returned {name} results for batch 1, but {first.dtype} ones")
    wider = lazyseq.evaluate(lambda b: b.astype(np.uint8) if b[0] == 0 else b.astype(np.int8) - 1, [0, 1], batch_size=1)
    assert wider.dtype == np.int16 and wider.tolist() == [0, 0]  # integers that an integer dtype holds together


def test_records_of_other_fields_are_named_by_their_fields():
    # The later ones were named |V8, and the reason given was that of numbers and strings.
    def records(b):
        return np.zeros(len(b), [("a", "<i4")] if b[0] == 0 else [("a", "<i8")])

    with pytest.raises(TypeError) as caught:
        lazyseq.evaluate(records, lazyseq.view(np.arange(8)), batch_size=4)
    assert str(caught.value) == (
        "evaluate: fn returned [('a', '<i8')] results for batch 1, but [('a', '<i4')] ones before, and no dtype holds "
        "both as they are (records convert neither to plain values nor to records of other fields): return one "
        "dtype, with .astype in fn"
    )


def test_widening_to_a_finer_unit_of_time_keeps_the_earlier_times_or_says_it_cannot():
    # the dates of the year 2500 of batch 0 were rewritten in nanoseconds: 1915-06-14
    late = np.array(["2500-01-01"], "datetime64[s]")
    with pytest.raises(TypeError) as caught:
        lazyseq.evaluate(lambda b: late if b[0] == 0 else np.zeros(1, "datetime64[ns]"), [0, 1], batch_size=1)
    assert str(caught.value) == (
        "evaluate: fn returned datetime64[ns] results for batch 1, but datetime64[s] ones before, some of which "
        "datetime64[ns] cannot hold as they are (times outside the range of its unit): return one dtype, with .astype "
        "in fn"
    )
    near = np.array(["2020-01-01"], "datetime64[s]")
    finer = lazyseq.evaluate(
        lambda b: near if b[0] == 0 else near.astype("datetime64[ns]") + np.timedelta64(1, "ns"), [0, 1], batch_size=1
    )
    assert finer.dtype == np.dtype("datetime64[ns]") and finer.tolist() == [1577836800000000000, 1577836800000000001]


def test_the_same_output_twice_is_refused(tmp_path):
    shared = np.empty(4)
    for out in [(shared, shared), (shared[:4], shared), (tmp_path / "p.npy", str(tmp_path / "p.npy"))]:
        with pytest.raises(ValueError, match=r"^evaluate: out gives the same (file|memory) for results 0 and 1"):
            lazyseq.evaluate(lambda b: (b, 2 * b), np.arange(4.0), batch_size=2, out=out)


def test_an_output_path_in_a_missing_directory_is_named(tmp_path):
    # the error named the hidden file evaluate makes beside it: '.../missing/.p.npy.49abe1a5.tmp'
    with pytest.raises(FileNotFoundError) as caught:
        lazyseq.evaluate(lambda b: b, np.arange(4.0), batch_size=2, out=tmp_path / "missing" / "p.npy")
    assert str(caught.value) == (
        f"evaluate: out {str(tmp_path / 'missing' / 'p.npy')!r} is in a directory that does not exist: make it first"
    )


def test_an_output_of_python_objects_takes_any_result():
    out = np.empty(4, object)
    lazyseq.evaluate(lambda b: b * 2, np.arange(4.0), batch_size=3, out=out)
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_columns_of_one_table_are_outputs_of_their_own():
    # refused as "the same memory": they share none of it
    table = np.zeros((4, 2))
    lazyseq.evaluate(lambda b: (b, 2 * b), np.arange(4.0), batch_size=3, out=(table[:, 0], table[:, 1]))
    assert table.tolist() == [[0.0, 0.0], [1.0, 2.0], [2.0, 4.0], [3.0, 6.0]]


def test_a_read_only_output_is_refused_before_fn_runs(tmp_path):
    # fn ran on a whole batch first, then numpy said "assignment destination is read-only".
    np.save(tmp_path / "p.npy", np.zeros(4))
    read_only = np.zeros(4)
    read_only.flags.writeable = False
    calls = []

    def fn(batch):
        calls.append(batch)
        return batch

    cases = [
        (read_only, "a read-only array"),
        ({"p": np.load(tmp_path / "p.npy", mmap_mode="r")}, "a memory map opened read-only"),
    ]
    for out, kind in cases:
        with pytest.raises(ValueError) as caught:
            lazyseq.evaluate(fn, np.arange(4.0), batch_size=2, out=out)
        assert str(caught.value) == f"evaluate: out is {kind}; give one it can write into (a memory map: mode='r+')"
    assert calls == []


@pytest.mark.parametrize("nworkers", [0, 2])
def test_an_exception_in_fn_is_raised_as_it_is_naming_the_batch(nworkers):
    def fails_on_the_second(batch):
        if batch[0] >= 3:
            raise ZeroDivisionError("no")
        return batch

    with pytest.raises(ZeroDivisionError) as caught:
        lazyseq.evaluate(fails_on_the_second, np.arange(8), batch_size=3, nworkers=nworkers)
    assert caught.value.__notes__ == ["raised on batch 1 (items 3 to 5) in evaluate"]


def test_a_stop_iteration_from_fn_is_an_error_not_the_end_of_the_callers_loop():
    def model(batch):
        if batch[0] >= 20:
            next(iter([]))  # a bug in the model
        return batch * 2

    datasets = [np.arange(10.0), np.arange(20.0, 30.0)]
    with pytest.raises(RuntimeError) as caught:
        list(map(lambda data: lazyseq.evaluate(model, data, batch_size=4), datasets))  # was: one result, no error
    assert str(caught.value) == "evaluate: fn raised StopIteration on batch 0 (items 0 to 3) in evaluate"
    assert type(caught.value.__cause__) is StopIteration


def test_errors():
    data = labelled(10)
    with pytest.raises(TypeError, match="evaluate: fn must be callable, got int"):
        lazyseq.evaluate(3, data)
    with pytest.raises(ValueError, match="evaluate: data is empty, so there is nothing to call fn on"):
        lazyseq.evaluate(len, [])
    with pytest.raises(TypeError, match=r"evaluate\(\) needs a length, but cycle view is infinite"):
        lazyseq.evaluate(len, lazyseq.cycle([1, 2]))
    with pytest.raises(
        ValueError, match=r"evaluate: fn returned an array of shape \(\) for batch 0 of 4 items: it must have one row"
    ):
        lazyseq.evaluate(lambda b: b[0].sum(), data, batch_size=4)
    with pytest.raises(ValueError, match=r"evaluate: fn returned an array of shape \(3,\) for batch 0 of 4 items"):
        lazyseq.evaluate(lambda b: b[1][:3], data, batch_size=4)
    with pytest.raises(TypeError, match="evaluate: fn returned a str for batch 0: it must return arrays"):
        lazyseq.evaluate(lambda b: "label", data, batch_size=4)
    with pytest.raises(
        ValueError,
        match=r"evaluate: fn returned rows of shape \(2,\) for batch 1, but rows of shape \(3,\) before",
    ):
        lazyseq.evaluate(lambda b: b[0] if b[0][0, 0] == 0 else b[0][:, :2], data, batch_size=4)
    with pytest.raises(ValueError, match=r"evaluate: out has shape \(3,\), but the results need \(10,\)"):
        lazyseq.evaluate(lambda b: b[1], data, out=np.zeros(3))
    with pytest.raises(
        TypeError, match="^evaluate: cannot write the float64 results of batch 0 into the int64 output:"
    ):
        lazyseq.evaluate(lambda b: b[0][:, 0], data, out=np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match="evaluate: out must be a tuple of 2 entries, like fn's results"):
        lazyseq.evaluate(lambda b: (b[0], b[1]), data, out=[np.zeros(10)])
    with pytest.raises(ValueError, match=r"evaluate: out must be a dict with keys \['a'\], like fn's results"):
        lazyseq.evaluate(lambda b: {"a": b[1]}, data, out={"b": None})


def test_an_error_in_fn_stops_the_workers_and_propagates():
    def fail_on_second(b):
        if b[1][0] != 0 or len(b[1]) < 4:
            raise RuntimeError("model broke")
        return b[1]

    for method in ("thread", "process"):
        with pytest.raises(RuntimeError, match="model broke"):
            lazyseq.evaluate(fail_on_second, labelled(10), batch_size=5, nworkers=2, method=method)
        assert [t.name for t in threading.enumerate() if t.name.startswith("lazyseq-")] == []
        assert multiprocessing.active_children() == []


def test_progress_bar(capfd):
    pytest.importorskip("tqdm")
    lazyseq.evaluate(lambda b: b[1], labelled(10), batch_size=5, progress=True, description="testing")
    err = capfd.readouterr().err
    assert "testing" in err and "2/2" in err and "batch" in err
    lazyseq.evaluate(lambda b: b[1], labelled(10), batch_size=5, progress=False)
    assert capfd.readouterr().err == ""


def test_a_progress_bar_leaves_no_thread_running():
    # tqdm's monitor thread, started with the first bar, ran to the end of the program: every worker process forked
    # later was forked from a process with a thread running (a DeprecationWarning from Python 3.12 on).
    pytest.importorskip("tqdm")
    code = (
        "import threading, lazyseq\n"
        "lazyseq.evaluate(lambda b: b, list(range(10)), batch_size=5, progress=True)\n"
        "print([thread.name for thread in threading.enumerate()])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout == "['MainThread']\n" and "2/2" in run.stderr


@pytest.mark.parametrize(
    "fn, kind",
    [
        (lambda b: list(b * 2), "float64"),
        (lambda b: [float(x) for x in b], "float"),
        (lambda b: (b, [int(x) for x in b]), "int"),
    ],
)
def test_a_list_of_numbers_is_named_as_a_list(fn, kind):
    with pytest.raises(TypeError) as info:
        lazyseq.evaluate(fn, np.arange(10.0), batch_size=4)
    assert str(info.value) == (
        f"evaluate: fn returned a list of 4 {kind} values for batch 0 of 4 items, but a list is read like a tuple, "
        "as several results, each with one row per item: return np.asarray(...) of the list to make it one result"
    )


NAMES = ["a", "b", "c", "elephant", "giraffe", "hippopotamus"]


def names_of(batch):
    return np.array([NAMES[i] for i in batch])  # the first batch is <U1, the second <U12


def test_an_output_file_widens_like_an_array_evaluate_makes(tmp_path):
    # The file took the first batch's dtype: the later names were cut to one letter, silently.
    path = tmp_path / "names.npy"
    got = lazyseq.evaluate(names_of, np.arange(6), batch_size=3, out=path)
    assert got.tolist() == np.load(path).tolist() == NAMES
    assert os.path.samefile(got.filename, path)  # not the temporary file it was widened in, gone since
    mixed = lazyseq.evaluate(lambda b: b if b[0] == 0 else b + 0.5, np.arange(6), batch_size=3, out=tmp_path / "m.npy")
    assert np.load(tmp_path / "m.npy").tolist() == mixed.tolist() == [0, 1, 2, 3.5, 4.5, 5.5]
    assert sorted(os.listdir(tmp_path)) == ["m.npy", "names.npy"]


def test_integers_too_large_for_the_floats_and_times_outside_a_finer_unit_are_refused():
    # Integers became inf in a float16 output; a date of 2900 in days wrapped to 1730 in a nanoseconds output
    # (a cast numpy calls safe), given or made by evaluate after a first batch in nanoseconds.
    with pytest.raises(TypeError, match=r"^evaluate: the int64 results of batch 0 do not fit the float16 output"):
        lazyseq.evaluate(lambda b: b * 100_000, np.arange(4), batch_size=2, out=np.zeros(4, np.float16))
    hundreds = lazyseq.evaluate(lambda b: b * 100, np.arange(4), batch_size=2, out=np.zeros(4, np.float16))
    assert hundreds.tolist() == [0, 100, 200, 300]
    with pytest.raises(TypeError, match=r"^evaluate: the int64 results of batch 0 do not fit the float16 output"):
        lazyseq.evaluate(lambda b: b + 2049, np.arange(2), batch_size=2, out=np.zeros(2, np.float16))  # 2050 rounded

    def dates(b):
        return np.datetime64("2900-01-01", "D") + b.astype("m8[D]")

    with pytest.raises(TypeError, match=r"^evaluate: the datetime64\[D\] results of batch 0 do not fit the "):
        lazyseq.evaluate(dates, np.arange(4), batch_size=2, out=np.zeros(4, "M8[ns]"))

    def nanoseconds_then_days(b):
        return np.datetime64("2000-01-01", "ns") + b.astype("m8[ns]") if b[0] == 0 else dates(b)

    with pytest.raises(TypeError, match=r"^evaluate: fn returned datetime64\[D\] results for batch 1, but "):
        lazyseq.evaluate(nanoseconds_then_days, np.arange(4), batch_size=2)


def test_a_namedtuple_class_made_in_each_call_is_named_as_the_change():
    # "fn returned S(a=rows of shape ()) for batch 1, but S(a=rows of shape ()) before": the same words.
    def fn(b):
        S = collections.namedtuple("S", "a")
        return S(b)

    with pytest.raises(ValueError) as caught:
        lazyseq.evaluate(fn, np.arange(4), batch_size=2)
    assert str(caught.value).endswith(
        "before: the structure and row shapes must not change (namedtuples of two classes of one name: define the "
        "class once, outside fn)"
    )


def test_integers_that_floats_would_round_are_refused():
    # int64 results widened to float64 for a later batch of floats, or written into a float64 output: 2**60 + 1
    # became 2**60, silently (while int64 with uint64, which would be floats, was refused).
    ids = np.arange(4, dtype=np.int64) + 2**60 + 1
    with pytest.raises(TypeError) as caught:
        lazyseq.evaluate(lambda b: b if b[0] == ids[0] else b.astype(float), ids, batch_size=2)
    assert str(caught.value) == (
        "evaluate: fn returned float64 results for batch 1, but int64 ones before, some of which float64 cannot hold "
        "as they are (integers beyond the precision of its floats): return one dtype, with .astype in fn"
    )
    with pytest.raises(TypeError, match=r"^evaluate: the int64 results of batch 0 do not fit the float64 output "):
        lazyseq.evaluate(lambda b: b, ids, batch_size=2, out=np.zeros(4))
    with pytest.raises(TypeError) as caught:  # an output of evaluate's own: fn's to keep in one dtype
        lazyseq.evaluate(lambda b: b.astype(float) if b[0] == ids[0] else b, ids, batch_size=2)
    assert str(caught.value) == (
        "evaluate: fn returned int64 results for batch 1, but float64 ones before, which cannot hold some of them as "
        "they are (integers beyond the precision of its floats): return one dtype, with .astype in fn"
    )
    exact = np.array([0, 2**53, -(2**53), 2**60])  # held as they are
    np.testing.assert_array_equal(lazyseq.evaluate(lambda b: b, exact, batch_size=2, out=np.zeros(4)), exact)
    mixed = lazyseq.evaluate(lambda b: b if b[0] == 0 else b + 0.5, np.arange(3), batch_size=1)  # widened
    assert mixed.dtype == np.float64 and mixed.tolist() == [0.0, 1.5, 2.5]


def test_an_output_you_give_refuses_values_it_cannot_hold():
    # Strings were cut and integers wrapped (200 into int8 gave -56), silently.
    with pytest.raises(TypeError) as caught:
        lazyseq.evaluate(names_of, np.arange(6), batch_size=3, out=np.empty(6, "U2"))
    assert str(caught.value) == (
        "evaluate: the <U12 results of batch 1 do not fit the <U2 output (strings longer than it holds, integers "
        "outside its range, numbers too large for its floats, integers beyond their precision, or times outside the "
        "range of its unit): give an output "
        "of a wider dtype"
    )
    with pytest.raises(TypeError, match=r"^evaluate: the float64 results of batch 0 do not fit the float32 output"):
        lazyseq.evaluate(lambda b: b * 1e39, np.arange(4.0), batch_size=2, out=np.empty(4, np.float32))  # was inf
    with pytest.raises(TypeError, match=r"^evaluate: the int64 results of batch 1 do not fit the int8 output"):
        lazyseq.evaluate(lambda b: b * 100, np.arange(4), batch_size=2, out=np.empty(4, np.int8))
    small = lazyseq.evaluate(lambda b: b * 10, np.arange(4), batch_size=2, out=np.empty(4, np.int8))
    assert small.dtype == np.int8 and small.tolist() == [0, 10, 20, 30]  # a cast of the same kind that fits
    floats = lazyseq.evaluate(lambda b: b / 3, np.arange(4), batch_size=2, out=np.empty(4, np.float32))
    assert floats.dtype == np.float32


def test_dicts_may_give_their_keys_in_any_order():
    def keys_turn(batch):
        return {"a": batch, "b": -batch} if batch[0] == 0 else {"b": -batch, "a": batch}

    got = lazyseq.evaluate(keys_turn, np.arange(4), batch_size=2)  # was a ValueError: "the structure ... changed"
    assert list(got) == ["a", "b"] and got["b"].tolist() == [0, -1, -2, -3]


def test_sparse_results_are_stacked_into_one_sparse_matrix():
    # "fn returned a csr_matrix ... it must return arrays": a vectorizer's transform could not be evaluated.
    sparse = pytest.importorskip("scipy.sparse")
    data = np.arange(35.0).reshape(7, 5)  # batch 0 is the one whose first value is 0
    for kind in (sparse.csr_matrix, sparse.csc_array):
        for nworkers in (0, 2):
            stacked = lazyseq.evaluate(kind, data, batch_size=3, nworkers=nworkers)
            assert type(stacked) is type(kind(data)) and stacked.format == kind(data).format
            np.testing.assert_array_equal(stacked.toarray(), data)
    refusals = [
        (
            TypeError,
            "out= holds dense rows: with out=None its results are stacked",
            sparse.csr_matrix,
            np.zeros((7, 5)),
        ),
        (
            TypeError,
            "for batch 1, but a sparse csr_matrix of float64 results before: return one kind",
            lambda b: sparse.csr_matrix(b) if b[0, 0] == 0 else b,
            None,
        ),
        (
            ValueError,
            r"of shape \(3, 4\) for batch 1, where \(3, 5\) was expected: a row per item, as many columns",
            lambda b: sparse.csr_matrix(b if b[0, 0] == 0 else b[:, :4]),
            None,
        ),
        (
            TypeError,
            "for batch 0 where evaluate gathers dense arrays .sparse results are stacked",
            lambda b: (sparse.csr_matrix(b), b),
            None,
        ),
        (
            TypeError,
            "for batch 1 where evaluate gathers dense arrays",
            lambda b: b if b[0, 0] == 0 else sparse.csr_matrix(b),
            None,
        ),
    ]
    refusals += [  # converted by the stack: int64 values beyond 2**53 rounded, matrices made arrays
        (
            TypeError,
            "sparse csr_matrix of float64 for batch 1, but a sparse csr_matrix of int64 results before",
            lambda b: sparse.csr_matrix(b.astype(int) if b[0, 0] == 0 else b),
            None,
        ),
        (
            TypeError,
            "sparse csr_array of float64 for batch 1, but a sparse csr_matrix of float64 results",
            lambda b: (sparse.csr_matrix if b[0, 0] == 0 else sparse.csr_array)(b),
            None,
        ),
    ]
    for error, message, fn, out in refusals:
        with pytest.raises(error, match=message):
            lazyseq.evaluate(fn, data, batch_size=3, out=out)
    with pytest.raises(TypeError, match=r"^cannot make a view of a sparse csr_array: views read dense rows; "):
        lazyseq.view(sparse.csr_array(np.eye(3)))  # scipy's "sparse array length is ambiguous"


def test_a_masked_array_is_refused_rather_than_losing_its_mask():
    with pytest.raises(TypeError, match=r"^evaluate: fn returned a masked array for batch 0, whose mask would be lost"):
        lazyseq.evaluate(lambda b: np.ma.masked_array(b, mask=b > 3), np.arange(10.0), batch_size=3)


def test_a_failed_call_leaves_the_file_at_an_out_path_as_it_was(tmp_path):
    # The file was made at its path from the first batch: a failure left zeros in place of the earlier results.
    path = tmp_path / "predictions.npy"
    x = lazyseq.view(np.arange(100.0))
    lazyseq.evaluate(lambda b: b * 2, x, batch_size=10, out=path)

    def blows_up_halfway(b):
        if b[0] >= 50:
            raise ValueError("model blew up")
        return b * 3

    with pytest.raises(ValueError, match="model blew up"):
        lazyseq.evaluate(blows_up_halfway, x, batch_size=10, out=path)
    assert np.load(path).tolist() == (np.arange(100.0) * 2).tolist()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.npy"]  # no hidden file left either
    done = lazyseq.evaluate(lambda b: b.astype(str), x, batch_size=10, out=path)  # widened, then in place
    assert done.filename == str(path) and np.load(path)[99] == "99.0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.npy"]


KILLED_MID_WAY = """
import sys, time
import numpy as np, lazyseq

def slow_after_three_batches(b):
    if b[0] == 30:  # the output file exists, made anew for float64 at batch 2 (then held under its new name)
        print("writing", flush=True)
        time.sleep(60)
    return b * 2 if b[0] >= 20 else (b * 2).astype(np.float32)

lazyseq.evaluate(slow_after_three_batches, np.arange(100.0), batch_size=10, out=sys.argv[1])
"""


def test_the_hidden_file_of_a_run_killed_mid_way_is_removed_by_the_next_run_to_that_path(tmp_path):
    # A run killed (SIGKILL, the out-of-memory killer) left its hidden file, as large as the output, for good.
    path = tmp_path / "predictions.npy"
    killed = subprocess.Popen([sys.executable, "-c", KILLED_MID_WAY, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout.readline() == "writing\n"
    finally:
        killed.kill()
        killed.wait()
        killed.stdout.close()
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".predictions.npy.") and left[0].endswith(".tmp")
    lazyseq.evaluate(lambda b: b * 2, np.arange(100.0), batch_size=10, out=path)
    assert np.load(path).tolist() == (np.arange(100.0) * 2).tolist()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.npy"]


def test_the_hidden_file_of_a_run_at_work_is_kept_by_another_run_to_the_same_path(tmp_path):
    path = tmp_path / "predictions.npy"
    started, go_on = threading.Event(), threading.Event()

    def waits_after_three_batches(b):
        if b[0] == 30:  # its file made anew for float64 at batch 2: held under its new name too
            started.set()
            go_on.wait(30)
        return b * 2 if b[0] >= 20 else (b * 2).astype(np.float32)

    first = threading.Thread(
        target=lazyseq.evaluate,
        args=(waits_after_three_batches, np.arange(100.0)),
        kwargs={"batch_size": 10, "out": path},
    )
    first.start()
    try:
        assert started.wait(30)
        lazyseq.evaluate(lambda b: b * 3, np.arange(50.0), batch_size=10, out=path)  # (the last one to end wins)
        assert len([p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]) == 1  # the first run's, kept
    finally:
        go_on.set()
        first.join()
    assert np.load(path).tolist() == (np.arange(100.0) * 2).tolist()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.npy"]


def test_an_out_path_that_is_a_link_writes_its_target_and_a_file_keeps_its_permissions(tmp_path):
    target = tmp_path / "real.npy"
    np.save(target, np.zeros(3))
    target.chmod(0o640)
    link = tmp_path / "link.npy"
    link.symlink_to(target)
    lazyseq.evaluate(lambda b: b + 1, lazyseq.view(np.arange(3.0)), batch_size=2, out=link)
    assert link.is_symlink() and np.load(target).tolist() == [1.0, 2.0, 3.0]
    assert target.stat().st_mode & 0o777 == 0o640


@pytest.fixture
def shared_folder():
    """A folder that any user may write in (pytest's tmp_path is its owner's alone)."""
    folder = os.path.realpath(tempfile.mkdtemp())
    os.chmod(folder, 0o777)
    yield folder
    for root, names, _ in os.walk(folder):
        for name in names:
            os.chmod(os.path.join(root, name), 0o755)
    shutil.rmtree(folder)


def evaluate_writing_to(out):
    """What ``lazyseq.evaluate`` writing to ``out`` raises (or ``returned``), and how many times fn ran."""
    calls = []
    try:
        lazyseq.evaluate(lambda b: calls.append(b) or b * 2, np.arange(10.0), batch_size=4, out=out)
    except Exception as error:
        return [f"{type(error).__name__}: {error}", len(calls)]
    return ["returned", len(calls)]


def evaluate_unprivileged(out):
    """:func:`evaluate_writing_to` as a user whom file permissions bind: root ignores them, so as nobody there."""
    if os.geteuid() != 0:
        return evaluate_writing_to(out)
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import test_evaluate; "
        f"print(test_evaluate.evaluate_writing_to({out!r}))"
    )
    as_nobody = {"user": 65534, "group": 65534, "extra_groups": []}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, **as_nobody)
    except PermissionError as error:  # this Python lies where only root may read (/root/.pyenv, say)
        pytest.skip(f"nobody may run this Python: {error}")
    if done.returncode != 0 and "Permission denied" in done.stderr:  # nor read these tests, or lazyseq
        pytest.skip(f"nobody may read what this test runs: {done.stderr.splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout)


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="file permissions of POSIX")
def test_a_read_only_file_at_an_out_path_is_refused_before_fn_runs_and_kept(shared_folder):
    # The file was replaced by the new results, then numpy could not open it for writing: a PermissionError after
    # every batch had run, and the protected results gone.
    path = os.path.join(shared_folder, "predictions.npy")
    np.save(path, np.full(3, 7.0))
    os.chmod(path, 0o444)
    assert evaluate_unprivileged(path) == [
        f"PermissionError: evaluate: out {path!r} is a file this process may not read and write (mode 0o444), which "
        "evaluate would replace: make it writable, or give another path",
        0,
    ]
    assert np.load(path).tolist() == [7.0, 7.0, 7.0] and os.stat(path).st_mode & 0o777 == 0o444
    assert os.listdir(shared_folder) == ["predictions.npy"]


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="file permissions of POSIX")
def test_an_out_path_in_a_read_only_directory_is_refused_before_fn_runs_naming_it(shared_folder):
    # The error named the hidden file made beside the path ('.../.p.npy.32088c53.tmp'), after fn ran on a batch.
    folder = os.path.join(shared_folder, "results")
    os.mkdir(folder, 0o555)
    os.chmod(folder, 0o555)
    path = os.path.join(folder, "predictions.npy")
    assert evaluate_unprivileged(path) == [
        f"PermissionError: evaluate: out {path!r} is in a directory this process may not write in ({folder!r}): "
        "give a path in another one",
        0,
    ]


def test_two_out_paths_to_one_file_through_a_link_are_refused(tmp_path):
    # Both results were written to the one file, which kept the second alone.
    np.save(tmp_path / "p.npy", np.zeros(1))
    (tmp_path / "alias.npy").symlink_to(tmp_path / "p.npy")
    with pytest.raises(ValueError) as caught:
        lazyseq.evaluate(
            lambda b: (b * 100, b), np.arange(6.0), batch_size=4, out=(tmp_path / "p.npy", tmp_path / "alias.npy")
        )
    assert str(caught.value) == (
        "evaluate: out gives the same file for results 0 and 1: each would overwrite the other; give each result its own"
    )
    assert np.load(tmp_path / "p.npy").tolist() == [0.0]


def test_out_arrays_whose_overlap_is_too_long_to_tell_are_taken_as_overlapping(monkeypatch):
    # numpy before 1.25 has no np.exceptions: telling them apart raised AttributeError there.
    monkeypatch.setattr(output_arrays, "SHARED_MEMORY_WORK", 0)  # numpy gives up at once on strided arrays
    table = np.zeros(20)
    with pytest.raises(ValueError) as caught:
        lazyseq.evaluate(lambda b: (b, b), np.arange(3.0), batch_size=2, out=(table[::3][:3], table[1::7]))
    assert str(caught.value) == (
        "evaluate: out gives the same memory for results 0 and 1: each would overwrite the other; give each result "
        "its own"
    )


def test_python_objects_for_an_out_path_are_refused_naming_the_batch_and_the_output(tmp_path):
    # numpy's "Array can't be memory-mapped: Python objects in dtype." named neither, after fn ran.
    path = tmp_path / "p.npy"
    np.save(path, np.ones(2))

    def missing_from_batch_2(b):
        return b if b[0] < 8 else np.array([None] * len(b))

    with pytest.raises(TypeError) as caught:
        lazyseq.evaluate(missing_from_batch_2, np.arange(10.0), batch_size=4, out=path)
    assert str(caught.value) == (
        f"evaluate: fn returned Python objects (dtype object) for batch 2, but the output is the .npy file "
        f"{str(path)!r}, which cannot hold them: return them in memory (out=None for this result), or as numbers or "
        "strings (.astype in fn)"
    )
    with pytest.raises(TypeError) as caught:
        lazyseq.evaluate(
            lambda b: {"p": np.array([{"v": v} for v in b])}, np.arange(4.0), batch_size=4, out={"p": path}
        )
    assert str(caught.value).startswith(
        "evaluate: fn returned Python objects (dtype object) for batch 0, but the output ['p'] is the .npy file "
    )
    assert np.load(path).tolist() == [1.0, 1.0] and os.listdir(tmp_path) == ["p.npy"]


@pytest.mark.parametrize(
    "fn, listed",
    [
        (lambda b: [f"class {int(row[0])}" for row in b], "a list of 4 str values"),
        (lambda b: [row * 2 for row in b], "a list of 4 values of shape (3,)"),
    ],
)
def test_a_list_with_a_value_per_item_is_named_as_a_list(fn, listed):
    # A list of strings was "a str: it must return arrays"; a list of rows "an array of shape (3,) ... must have one
    # row per item".
    with pytest.raises(TypeError) as caught:
        lazyseq.evaluate(fn, np.arange(30.0).reshape(10, 3), batch_size=4)
    assert str(caught.value) == (
        f"evaluate: fn returned {listed} for batch 0 of 4 items, but a list is read like a tuple, as several results, "
        "each with one row per item: return np.asarray(...) of the list to make it one result"
    )


def test_a_refused_cast_names_the_batch_and_the_output_and_writes_nothing_of_that_batch():
    # "cannot write float64 results into the int64 output" named neither, and batch 3's scores were written
    # beside no labels.
    out = {"score": np.zeros(10, np.float32), "label": np.zeros(10, np.int64)}

    def labels_turn_to_floats(b):
        label = (b > 4).astype(np.int64)
        return {"score": b + 1, "label": label if b[0] < 6 else label.astype(np.float64)}

    with pytest.raises(TypeError) as caught:
        lazyseq.evaluate(labels_turn_to_floats, np.arange(10.0), batch_size=2, out=out)
    assert str(caught.value) == (
        "evaluate: cannot write the float64 results of batch 3 into the int64 output ['label']: return int64 results "
        "(with .astype in fn), or give an output of a dtype that holds them"
    )
    assert out["score"].tolist() == [1, 2, 3, 4, 5, 6, 0, 0, 0, 0]
    assert out["label"].tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0]


def test_an_empty_shard_is_refused_saying_what_to_do():
    # "data is empty, so there is nothing to call fn on", for the shard recipe the guide gives.
    part = lazyseq.shard(np.arange(3.0), 3, 4)
    with pytest.raises(ValueError) as caught:
        lazyseq.evaluate(lambda b: b * 2, part)
    assert str(caught.value) == (
        "evaluate: data is empty, so there is nothing to call fn on; a shard (lazyseq.shard) of fewer items than "
        "ranks is empty: skip the call where len(data) == 0"
    )


def test_a_worker_process_that_dies_is_named_by_its_batch_and_items():
    # "died with exit code 3 while computing item 9": batch 9, items 144 to 159.
    data = lazyseq.smap(die_on(150, "exit"), np.arange(200.0))
    with pytest.raises(lazyseq.WorkerDied) as caught:
        lazyseq.evaluate(lambda b: b, data, batch_size=16, nworkers=2, method="process")
    assert str(caught.value).endswith(" died with exit code 3 while computing batch 9" + ENDED_ITSELF)
    assert caught.value.suspects == (9,)
    assert caught.value.__notes__ == ["computing batch 9 (items 144 to 159) in evaluate"]
    assert multiprocessing.active_children() == []


def test_collate_fn_gives_fn_the_items_of_a_batch():
    # dicts of different keys, which a batch cannot collate field by field
    features = [{"a": 1}, {"b": 2, "c": 3}, {}, {"d": 4}]
    counts = lazyseq.evaluate(lambda b: np.array([len(f) for f in b]), features, batch_size=3, collate_fn=list)
    assert counts.tolist() == [1, 2, 0, 1]
    with pytest.raises(TypeError, match=r"^evaluate: collate_fn must be callable, got int$"):
        lazyseq.evaluate(len, features, collate_fn=3)


def test_a_batch_like_the_first_is_checked_all_the_same():
    # arrays like the first batch's are copied without the usual checks: still none that does not fit
    with pytest.raises(ValueError, match=r"^evaluate: fn returned an array of shape \(4,\) for batch 2 of 2 items"):
        lazyseq.evaluate(lambda b: np.zeros(4), np.arange(10.0), batch_size=4)
    out = np.zeros(10, np.int8)
    with pytest.raises(TypeError, match=r"^evaluate: the int64 results of batch 1 do not fit the int8 output"):
        lazyseq.evaluate(lambda b: b * 40, np.arange(10), batch_size=4, out=out)
    assert out.tolist() == [0, 40, 80, 120, 0, 0, 0, 0, 0, 0]


def test_data_that_is_no_sequence_is_named_with_what_to_do():
    # It said "cannot make a view of int" and, for a generator, to use lazyseq.uniter(), which evaluate then
    # refused for want of a length unless given size=.
    with pytest.raises(TypeError) as caught:
        lazyseq.evaluate(np.asarray, 5)
    assert str(caught.value) == "evaluate: data must be a sequence (with __len__ and __getitem__ by position), not int"
    with pytest.raises(TypeError) as caught:
        lazyseq.evaluate(np.asarray, (i for i in range(3)))
    assert str(caught.value).endswith(
        "not generator: lazyseq.uniter(iterable, size=n) where its length n is known, or list(iterable) where it "
        "ends and fits in memory"
    )
    assert lazyseq.evaluate(np.asarray, lazyseq.uniter((i for i in range(3)), size=3)).tolist() == [0, 1, 2]
    with pytest.raises(
        TypeError,
        match=r"not dict: lazyseq.collate\(d\) for the rows of a dict of columns, list\(d\.values\(\)\) for its values$",
    ):
        lazyseq.evaluate(np.asarray, {"a": 1})


FILLS_THE_DISK = """
import sys
import numpy as np, lazyseq

try:
    lazyseq.evaluate(lambda b: b, np.zeros((4000, 64)), batch_size=100, out=sys.argv[1])
except OSError as error:
    print(type(error).__name__, error.errno, error)
"""


@pytest.fixture
def small_disk(tmp_path):
    """A folder on a file system of 1 MiB (a tmpfs; where this process may not mount one, the test is skipped)."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small file system here (mount needs root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_an_output_with_no_room_on_its_disk_is_an_os_error_and_leaves_the_old_file(small_disk):
    # The output was made sparse and written through a memory map: the process died of SIGBUS, no exception.
    path = small_disk / "old.npy"
    np.save(path, np.arange(5))
    done = subprocess.run(
        [sys.executable, "-c", FILLS_THE_DISK, str(path)], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        f"OSError 28 [Errno 28] evaluate: no room for out {str(path)!r} on its disk: it takes 2,048,128 bytes "
        "(No space left on device)\n"
    )
    assert np.load(path).tolist() == [0, 1, 2, 3, 4] and sorted(p.name for p in small_disk.iterdir()) == ["old.npy"]


def test_the_room_an_output_takes_is_claimed_before_anything_is_computed(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    calls = []
    with pytest.raises(OSError, match=r"^\[Errno 28\] evaluate: no room for out .* it takes 8,128 bytes") as refused:
        lazyseq.evaluate(lambda b: calls.append(1) or b, np.zeros(1000), batch_size=100, out=tmp_path / "x.npy")
    assert calls == [1] and list(tmp_path.iterdir()) == []  # the first batch tells the dtype; the file is made then
    # With the error still held (a notebook keeps the last one), the removed file is no longer mapped: what was
    # claimed of the disk went back to it.
    with open("/proc/self/maps") as maps:
        mapped = maps.read()
    assert refused.value is not None and str(tmp_path) not in mapped

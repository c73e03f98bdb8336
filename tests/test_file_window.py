"""Rows of several memory-mapped files gathered straight into given memory (a worker's shared slot)."""

import gc
import multiprocessing
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import lazyseq
from lazyseq.loading.jobs import ReadItem
from lazyseq.views.chunks import writing_into
from lazyseq.views.file_window import FileWindow
from lazyseq.views.row_window import RowWindow

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the files are mapped side by side on Linux only"
)

CASES = [
    (np.float64, (248,), (500, 300, 7)),  # rows of 1984 bytes: 64 divides both rows and headers
    (np.uint8, (7,), (13, 1, 40)),  # odd rows: any page is aligned to some row
    (np.float32, (3, 5), (9, 2)),
    (np.dtype([("a", "<f4"), ("b", "u1")]), (), (11, 4, 6)),
]


def write_parts(folder, dtype, row_shape, lengths, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    paths = []
    for k, n in enumerate(lengths):
        raw = rng.integers(0, 256, size=(n, *row_shape, dtype.itemsize), dtype=np.uint8)
        paths.append(os.path.join(folder, f"part{k}.npy"))
        np.save(paths[-1], raw.view(dtype).reshape((n, *row_shape)))
    return paths


def mapped_count(path):
    with open("/proc/self/maps") as maps:
        return sum(line.rstrip().endswith(path) for line in maps)


@pytest.mark.parametrize(("dtype", "row_shape", "lengths"), CASES)
def test_a_batch_is_gathered_into_the_buffer_with_the_rows_asked_for(tmp_path, dtype, row_shape, lengths):
    paths = write_parts(str(tmp_path), dtype, row_shape, lengths)
    whole = np.concatenate([np.load(p) for p in paths])
    positions = np.random.default_rng(1).integers(0, len(whole), size=64)
    batches = lazyseq.open_npy(paths).gather(positions).batch(16)
    job = ReadItem(batches)
    buffer = np.zeros(1 << 16, np.uint8)
    for b in range(4):
        batch = job.write_into(b, buffer)
        assert np.shares_memory(batch, buffer)
        assert batch.dtype == whole.dtype and batch.shape == (16, *row_shape)
        assert batch.tobytes() == whole[positions[16 * b : 16 * b + 16]].tobytes()
        assert batches[b].tobytes() == batch.tobytes()  # read without a buffer: the same rows, in new memory


def test_the_files_are_mapped_again_once_and_let_go_with_the_view(tmp_path):
    paths = write_parts(str(tmp_path), np.float64, (248,), (500, 300, 7))
    view = lazyseq.open_npy(paths).gather([3, 600, 806]).batch(3)
    assert [mapped_count(p) for p in paths] == [1, 1, 1]  # open_npy's memory maps
    for _ in range(2):
        ReadItem(view).write_into(0, np.zeros(1 << 14, np.uint8))
    assert [mapped_count(p) for p in paths] == [2, 2, 2]
    del view
    gc.collect()
    assert [mapped_count(p) for p in paths] == [0, 0, 0]


def test_positions_outside_the_rows_raise_index_error(tmp_path):
    paths = write_parts(str(tmp_path), np.float64, (3,), (5, 1, 7))
    arrays = [np.load(p, mmap_mode="r") for p in paths]
    window = RowWindow.over([np.asarray(a) for a in arrays], arrays)
    with writing_into(np.zeros(4096, np.uint8)):
        for bad in ([-1], [13], [1000], [5, 13], [1 << 61], [-(1 << 61)]):
            with pytest.raises(IndexError, match="^positions out of range for 13 rows$"):
                window.rows(np.array(bad, dtype=np.intp))
        assert window.rows(np.array([12, 0], dtype=np.intp)).tolist() == [arrays[2][6].tolist(), arrays[0][0].tolist()]


def test_no_window_over_more_files_than_the_mappings_allowed_can_spare(tmp_path, monkeypatch):
    arrays = [np.load(p, mmap_mode="r") for p in write_parts(str(tmp_path), np.float64, (3,), (5, 4, 2))]
    monkeypatch.setattr("lazyseq.views.file_window._max_map_count", lambda: 48)  # room for 3 files
    assert FileWindow.over(arrays) is not None
    monkeypatch.setattr("lazyseq.views.file_window._max_map_count", lambda: 47)
    assert FileWindow.over(arrays) is None


def test_windows_held_together_leave_the_process_most_of_its_mappings(tmp_path, monkeypatch):
    # Views held side by side each kept a window within the limit, and together took every mapping the process
    # may have: the next np.load(mmap_mode="r") failed with "Cannot allocate memory".
    arrays = [np.load(p, mmap_mode="r") for p in write_parts(str(tmp_path), np.float64, (3,), (5, 4, 2))]
    monkeypatch.setattr("lazyseq.views.file_window._max_map_count", lambda: 80)  # room for 5 files
    first = FileWindow.over(arrays)
    assert first is not None
    assert FileWindow.over(arrays) is None  # 3 files more would take 12 mappings
    assert FileWindow.over(arrays[:1]) is not None  # 1 file: 8, and it is let go at once
    del first
    gc.collect()
    assert FileWindow.over(arrays) is not None


def test_no_window_where_the_maps_may_differ_from_the_files(tmp_path):
    paths = write_parts(str(tmp_path), np.float64, (3,), (5, 4))
    assert FileWindow.over([np.load(p) for p in paths]) is None  # in memory: no file
    assert FileWindow.over([np.load(p, mmap_mode="c") for p in paths]) is None  # copy-on-write
    arrays = [np.load(p, mmap_mode="r") for p in paths]
    assert FileWindow.over(arrays) is not None
    os.replace(paths[0], paths[0] + ".old")  # another file at that name, its first and last rows the same
    changed = np.load(paths[0] + ".old")
    changed[2] = -1.0
    np.save(paths[0], changed)
    assert FileWindow.over(arrays) is None


def test_a_pipeline_sent_to_another_process_still_gathers_into_the_buffer(tmp_path):
    paths = write_parts(str(tmp_path), np.float64, (248,), (500, 300, 7))
    view = lazyseq.open_npy(paths).gather([0, 799, 806, 500]).batch(4)
    for _ in range(2):  # and sent on from there
        view = pickle.loads(pickle.dumps(view))
    buffer = np.zeros(1 << 14, np.uint8)
    batch = ReadItem(view).write_into(0, buffer)
    assert np.shares_memory(batch, buffer)
    assert batch.tobytes() == np.concatenate([np.load(p) for p in paths])[[0, 799, 806, 500]].tobytes()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_process_workers_deliver_the_rows_of_several_files(tmp_path, start_method):
    paths = write_parts(str(tmp_path), np.float64, (248,), (500, 300, 7))
    whole = np.concatenate([np.load(p) for p in paths])
    positions = np.random.default_rng(2).integers(0, len(whole), size=40 * 32)
    view = lazyseq.open_npy(paths).gather(positions).batch(32)
    with lazyseq.prefetch(view, nworkers=2, method="process", start_method=start_method) as ahead:
        got = [batch.copy() for batch in ahead]
    assert np.concatenate(got).tobytes() == whole[positions].tobytes()  # random bits: NaNs among them


def test_forked_workers_inherit_the_window_made_once_by_the_consumer(tmp_path, monkeypatch):
    # Each worker made its own at its first batch, reading the list of the process's mappings: milliseconds where
    # many libraries are loaded (torch, scipy), at every start of the workers.
    paths = write_parts(str(tmp_path), np.float64, (248,), (500, 300, 7))
    whole = np.concatenate([np.load(p) for p in paths])
    made = multiprocessing.get_context("fork").Value("i", 0)  # counted wherever it is made
    real_over = FileWindow.over.__func__

    def counted_over(cls, arrays):
        with made.get_lock():
            made.value += 1
        return real_over(cls, arrays)

    monkeypatch.setattr(FileWindow, "over", classmethod(counted_over))
    data = lazyseq.open_npy(paths)
    for start in range(3):  # the window stays with the data: workers started again inherit it too
        positions = np.random.default_rng(start).integers(0, len(whole), size=40 * 32)
        with lazyseq.prefetch(data.gather(positions).batch(32), 2, "process", start_method="fork") as ahead:
            got = [batch.copy() for batch in ahead]
        assert np.concatenate(got).tobytes() == whole[positions].tobytes()
    assert made.value == 1


def test_a_file_cut_short_since_it_was_mapped_gives_no_window_and_no_crash(tmp_path):
    paths = write_parts(str(tmp_path), np.float64, (248,), (500, 300))
    script = f"""
import numpy as np
from lazyseq.views.file_window import FileWindow
arrays = [np.load(p, mmap_mode="r") for p in {paths!r}]
with open({paths[1]!r}, "r+b") as file:
    file.truncate(4096)
print(FileWindow.over(arrays))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "None\n", "")

"""write_npy: shards byte-identical whatever the workers, atomic files, resuming after a kill, open_npy of a directory."""

import contextlib
import errno
import json
import multiprocessing
import os
import pickle
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from shard_helpers import contents, pipeline, rows

import lazyseq
import lazyseq.io.shard_directory
import lazyseq.io.shard_files
import lazyseq.io.shard_sync
import lazyseq.io.shard_writers
import lazyseq.io.shards
from lazyseq.io.checksum import Sum64
from lazyseq.views.base import View

HELPERS = Path(__file__).resolve().parent / "shard_helpers.py"
N = 57  # 6 shards of 10 rows, the last one 7


def expected(n=N):
    x = rows(n)
    return 2 * x + 1, np.arange(n, dtype=np.int32)


def temporaries(directory):
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


def edit_manifest(directory, change):
    """``change(manifest)`` applied to the manifest of ``directory``, as a damaged or an older one would be."""
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def open_error(directory):
    """The message of the ValueError that opening ``directory`` raises."""
    with pytest.raises(ValueError) as info:
        lazyseq.open_npy(directory)
    return str(info.value)


@pytest.fixture
def reference(tmp_path_factory):
    """An uninterrupted synchronous run, the output every other run must match byte for byte."""
    directory = tmp_path_factory.mktemp("reference")
    lazyseq.write_npy(pipeline(N), directory, rows_per_shard=10)
    return contents(directory)


# -- what is written ---------------------------------------------------------------


def test_output_is_byte_identical_for_any_workers_and_method(tmp_path, reference):
    for nworkers, method in [(1, "thread"), (2, "thread"), (1, "process"), (2, "process")]:
        directory = tmp_path / f"{nworkers}-{method}"
        lazyseq.write_npy(pipeline(N), directory, rows_per_shard=10, nworkers=nworkers, method=method)
        assert contents(directory) == reference, (nworkers, method)


def test_shards_are_plain_npy_files_and_the_manifest_describes_them(tmp_path):
    written = lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    x, index = expected()
    names = sorted(os.listdir(tmp_path))
    assert names == [f"f{j}-{k:05d}.npy" for j in (0, 1) for k in range(6)] + ["manifest.json"]
    for k in range(6):
        np.testing.assert_array_equal(np.load(tmp_path / f"f0-{k:05d}.npy"), x[10 * k : 10 * k + 10])
        np.testing.assert_array_equal(np.load(tmp_path / f"f1-{k:05d}.npy"), index[10 * k : 10 * k + 10])
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert {key: manifest[key] for key in manifest if key != "shards"} == {
        "format": "lazyseq.write_npy",
        "version": 2,
        "item": "tuple",
        "fields": [
            {"name": "f0", "dtype": "<f8", "row_shape": [4]},
            {"name": "f1", "dtype": "<i4", "row_shape": []},
        ],
        "length": 57,
        "rows_per_shard": 10,
        "parameters": {"rows_per_shard": 10, "bytes_per_shard": 256 * 2**20},
    }
    assert [shard["rows"] for shard in manifest["shards"]] == [10, 10, 10, 10, 10, 7]
    last = manifest["shards"][5]
    assert last["shard"] == 5
    for field, file in zip(("f0", "f1"), last["files"]):
        data = (tmp_path / f"{field}-00005.npy").read_bytes()
        assert file == {"name": f"{field}-00005.npy", "bytes": len(data), "sum64": Sum64(data).hexdigest()}
    x_read, index_read = lazyseq.batch(written, N)[0]
    np.testing.assert_array_equal(x_read, x)
    np.testing.assert_array_equal(index_read, index)
    assert isinstance(written[3], tuple)
    assert all(isinstance(part.source, np.memmap) for field in written._parents for part in field._parents)


def test_array_items_and_bytes_per_shard(tmp_path):
    data = np.arange(100 * 6, dtype=np.float32).reshape(100, 6)  # 24 bytes a row
    written = lazyseq.write_npy(data, tmp_path, bytes_per_shard=24 * 30 + 5)
    assert sorted(os.listdir(tmp_path)) == [f"data-{k:05d}.npy" for k in range(4)] + ["manifest.json"]
    assert [len(np.load(tmp_path / f"data-{k:05d}.npy")) for k in range(4)] == [30, 30, 30, 10]
    np.testing.assert_array_equal(written[:], data)
    np.testing.assert_array_equal(written.batch(64)[1], data[64:])


def test_dict_items_get_one_set_of_files_per_key(tmp_path):
    items = lazyseq.smap(lambda i: {"image": np.full((2, 3), i, np.uint8), "label": i % 3}, range(25))
    written = lazyseq.write_npy(items, tmp_path, rows_per_shard=10, nworkers=2)
    assert sorted(os.listdir(tmp_path)) == (
        ["image-00000.npy", "image-00001.npy", "image-00002.npy", "label-00000.npy", "label-00001.npy"]
        + ["label-00002.npy", "manifest.json"]
    )
    assert np.load(tmp_path / "image-00002.npy").shape == (5, 2, 3)
    item = written[12]
    assert list(item) == ["image", "label"]
    np.testing.assert_array_equal(item["image"], np.full((2, 3), 12, np.uint8))
    assert item["label"] == 0
    batch = written.batch(8)[1]
    np.testing.assert_array_equal(batch["label"], np.arange(8, 16) % 3)
    assert batch["image"].shape == (8, 2, 3)


def test_numbers_become_one_dimensional_files(tmp_path):
    written = lazyseq.write_npy(lazyseq.smap(lambda i: i * 0.5, range(7)), tmp_path, rows_per_shard=4)
    np.testing.assert_array_equal(np.load(tmp_path / "data-00001.npy"), [2.0, 2.5, 3.0])
    assert written[6] == 3.0


class CountingReads(View):
    """An array's rows that record how they are read."""

    def __init__(self, array):
        self._array = array
        self._len = len(array)
        self.single, self.many = [], []

    def _get(self, i):
        self.single.append(i)
        return self._array[i]

    def _get_many(self, idx):
        self.many.append(idx)
        return self._array[idx.start : idx.stop]


def test_shards_are_read_in_vectorized_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr("lazyseq.io.shard_layout.BLOCK_BYTES", 4 * 8)  # blocks of 4 rows of 8 bytes
    source = CountingReads(np.arange(30, dtype=np.float64))
    lazyseq.write_npy(source, tmp_path, rows_per_shard=10)
    assert source.single == []
    assert source.many == [range(0, 1)] + [
        range(start, min(start + 4, stop)) for stop in (10, 20, 30) for start in range(stop - 10, stop, 4)
    ]


def test_with_worker_threads_every_shard_is_written_by_a_worker(tmp_path):
    # A shard is never cheap enough to be computed by the caller while the workers wait (the first one was).
    threads = {}

    def record(i):
        threads.setdefault(threading.current_thread().name, []).append(i)
        return np.full(3, i, dtype=np.int64)

    lazyseq.write_npy(lazyseq.smap(record, range(40)), tmp_path, rows_per_shard=10, nworkers=2)
    caller = threads.pop(threading.current_thread().name)
    assert caller == [0]  # the first item alone, read to learn the layout
    assert sorted(i for rows in threads.values() for i in rows) == list(range(40))
    assert all(name.startswith("lazyseq-write_npy-") for name in threads)


def test_rows_that_arrays_hold_are_written_from_where_they_are(tmp_path, monkeypatch):
    monkeypatch.setattr("lazyseq.io.shard_layout.BLOCK_BYTES", 4 * 8)  # blocks of 4 rows of 8 bytes
    for k, part in enumerate(np.split(np.arange(30, dtype=np.float64), [10, 22])):
        np.save(tmp_path / f"part-{k}.npy", part)
    source = lazyseq.open_npy(sorted(str(p) for p in tmp_path.glob("part-*.npy")))[1:]
    copies = []
    many = type(source)._get_many
    monkeypatch.setattr(type(source), "_get_many", lambda self, idx: copies.append(idx) or many(self, idx))
    written = lazyseq.write_npy(source, tmp_path / "out", rows_per_shard=10)
    assert copies == [range(0, 1), range(8, 10), range(20, 24)]  # the first item, and blocks across two files
    np.testing.assert_array_equal(
        np.concatenate([np.load(p) for p in sorted((tmp_path / "out").glob("*.npy"))]), np.arange(1, 30)
    )
    assert len(written) == 29


# -- atomic and resumable ----------------------------------------------------------


def test_a_shard_too_few_for_the_workers_is_written_in_pieces_by_all_of_them(tmp_path):
    # One shard of 1000 rows, two worker threads: each writes pieces of it at their places in its files.
    threads = {}

    def record(i):
        threads.setdefault(threading.current_thread().name, []).append(i)
        return np.full(3, i, dtype=np.int64), np.float32(i) / 3

    source = lazyseq.smap(record, range(1000))
    lazyseq.write_npy(source, tmp_path / "alone", nworkers=0)
    threads.clear()
    written = lazyseq.write_npy(source, tmp_path / "shared", nworkers=2)
    threads.pop(threading.current_thread().name)  # item 0, read to learn the layout
    assert len(threads) == 2 and sorted(i for rows in threads.values() for i in rows) == list(range(1000))
    assert contents(tmp_path / "shared") == contents(tmp_path / "alone")
    assert os.listdir(tmp_path / "shared") == os.listdir(tmp_path / "alone") and temporaries(tmp_path / "shared") == []
    np.testing.assert_array_equal(written[999][0], [999] * 3)


@pytest.mark.parametrize(
    "writer, resumer",
    [
        ((0, "thread", "sync"), (2, "thread")),
        ((2, "process", "sync"), (1, "thread")),
        ((0, "thread", "-"), (0, "thread")),
    ],
)
def test_a_writer_killed_mid_shard_is_resumed_by_another_worker_count(tmp_path, reference, writer, resumer):
    nworkers, method, sync = writer
    child = subprocess.Popen(
        [sys.executable, str(HELPERS), str(tmp_path), str(N), "34", str(nworkers), method, sync],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its worker processes go down with it, as in a power loss
    )
    try:
        line = child.stdout.readline()
        assert line == "blocked at 34\n", child.stderr.read()
        assert temporaries(tmp_path), "the writer was killed between two shards"
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stderr.close()
    assert "manifest.json" not in os.listdir(tmp_path)
    computed = []
    nworkers, method = resumer
    written = lazyseq.write_npy(
        pipeline(N, computed=computed), tmp_path, rows_per_shard=10, nworkers=nworkers, method=method
    )
    assert contents(tmp_path) == reference
    assert temporaries(tmp_path) == []
    if writer[:2] == (0, "thread"):  # shards 0 to 2 were finished and recorded before item 34 blocked
        assert sorted(computed) == [0, *range(30, N)]
    np.testing.assert_array_equal(written[56][0], expected()[0][56])


STALE_WORKER = """
import ctypes, os, sys
import numpy as np
import lazyseq

class PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]

def item(i):
    if i == 5:
        fifo = PollFd(os.open(sys.argv[2], os.O_RDONLY | os.O_NONBLOCK), 1, 0)
        print("blocked", os.getpid(), flush=True)
        ctypes.PyDLL(None).poll(ctypes.byref(fifo), 1, 60_000)  # until a byte comes (60 s at most), the GIL held
    return np.full(3, float(i))

lazyseq.write_npy(lazyseq.smap(item, range(20)), sys.argv[1], rows_per_shard=10, nworkers=1, method="process")
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits for a process that is not its child (Linux)")
def test_a_run_waits_for_the_worker_processes_of_a_run_killed_before_it(tmp_path, monkeypatch):
    # A writer killed let go of the directory at once, but its worker processes went on for up to a quarter of a
    # second: a run started meanwhile found their temporary files, or a shard of theirs in place of its own.
    out, fifo = tmp_path / "out", tmp_path / "fifo"
    os.mkfifo(fifo)
    child = subprocess.Popen(
        [sys.executable, "-c", STALE_WORKER, str(out), str(fifo)], stdout=subprocess.PIPE, text=True
    )
    try:
        worker = os.pidfd_open(int(child.stdout.readline().split()[1]))  # a worker process, in item 5
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    try:
        monkeypatch.setattr(lazyseq.io.shard_writers, "STALE_WAIT_SECONDS", 0.1)
        values = lazyseq.smap(lambda i: np.full(3, float(i)), range(20))
        with pytest.raises(BlockingIOError) as caught:  # (the worker cannot notice its consumer is gone yet)
            lazyseq.write_npy(values, out, rows_per_shard=10)
        assert str(caught.value) == (
            f"write_npy: worker processes of an earlier run into {out}, which was killed, still write there 0.1 s "
            "later: wait until they end (kill them if they hang), then call again"
        )
        unblock = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(unblock, b"x")  # the worker goes on, and ends once it sees its consumer gone
        os.close(unblock)
        assert select.select([worker], [], [], 30)[0] == [worker]
    finally:
        with contextlib.suppress(ProcessLookupError):  # (this test failing: it would wait up to a minute)
            signal.pidfd_send_signal(worker, signal.SIGKILL)
        os.close(worker)
    written = lazyseq.write_npy(values, out, rows_per_shard=10)
    np.testing.assert_array_equal(np.asarray(written), np.repeat(np.arange(20.0), 3).reshape(20, 3))
    assert temporaries(out) == []


def test_a_failing_item_is_named_with_its_shard_and_leaves_no_manifest(tmp_path, reference):
    for nworkers, method in [(0, "thread"), (2, "thread"), (2, "process")]:
        with pytest.raises(lazyseq.EvaluationError) as info:
            lazyseq.write_npy(pipeline(N, fail_at=43), tmp_path, rows_per_shard=10, nworkers=nworkers, method=method)
        assert str(info.value) == (
            f"write_npy: shard 4 of {tmp_path} failed at item 43 (smap(Transform)[43]): ValueError: row 43 is bad"
        )
        assert isinstance(info.value.__cause__, ValueError)
        names = os.listdir(tmp_path)
        assert "manifest.json" not in names and "progress.jsonl" in names
        assert temporaries(tmp_path) == []
    computed = []
    lazyseq.write_npy(pipeline(N, computed=computed), tmp_path, rows_per_shard=10)
    assert contents(tmp_path) == reference
    assert sorted(computed) == [0, *range(40, N)]  # shards 0 to 3 were done and kept


class FileEvents:
    """Records, in order, each file synced to disk and each rename, by file name (Linux: through /proc)."""

    def __init__(self, monkeypatch):
        self.events = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(descriptor):
            real_fsync(descriptor)
            self.events.append(("sync", os.path.basename(os.readlink(f"/proc/self/fd/{descriptor}"))))

        def replace(source, target):
            real_replace(source, target)
            self.events.append(("rename", os.path.basename(target)))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def synced(self):
        return [name for what, name in self.events if what == "sync"]

    def before_manifest(self):
        """The files synced before the manifest got its name, and after the last shard did."""
        end = self.events.index(("rename", "manifest.json"))
        renames = [k for k, (what, name) in enumerate(self.events[:end]) if what == "rename" and "-" in name]
        last_shard = max(renames, default=0)
        synced = {name for what, name in self.events[:end] if what == "sync"}
        after_last_shard = {name for what, name in self.events[last_shard:end] if what == "sync"}
        return synced, after_last_shard


on_linux = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="file names of descriptors through /proc")


@on_linux
@pytest.mark.parametrize("nworkers", [0, 2])
def test_every_shard_is_synced_before_the_manifest_and_sync_false_syncs_nothing(tmp_path, reference, nworkers):
    shards = [f"f{j}-{k:05d}.npy" for j in (0, 1) for k in range(6)]
    events = FileEvents(monkeypatch := pytest.MonkeyPatch())
    try:
        lazyseq.write_npy(pipeline(N), tmp_path / "synced", rows_per_shard=10, nworkers=nworkers)
        synced, after_last_shard = events.before_manifest()
        assert set(shards) <= synced
        assert "synced" in after_last_shard  # the directory: every rename lasts before the manifest's
        events.events.clear()
        lazyseq.write_npy(pipeline(N), tmp_path / "unsynced", rows_per_shard=10, nworkers=nworkers, sync=False)
        assert events.synced() == []
        events.events.clear()
        computed = []  # a run that syncs, over a complete one that did not: keeps the shards and syncs them
        lazyseq.write_npy(pipeline(N, computed=computed), tmp_path / "unsynced", rows_per_shard=10, nworkers=nworkers)
        assert computed == [0]
        assert set(shards) <= set(events.synced()) and events.synced()[-1] == "unsynced"  # the directory last
        assert [name for what, name in events.events if what == "rename"] == []  # nothing written
    finally:
        monkeypatch.undo()
    assert contents(tmp_path / "synced") == contents(tmp_path / "unsynced") == reference


def dies_at_77(i):
    if i == 77:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
    return np.full(3, i, np.float32)


def test_a_worker_process_that_dies_is_reported_with_its_shard(tmp_path):
    with pytest.raises(
        lazyseq.WorkerDied, match=r"died with signal SIGKILL while computing shards? (\d+, )*7\b"
    ) as info:
        lazyseq.write_npy(
            lazyseq.smap(dies_at_77, range(200)), tmp_path, rows_per_shard=10, nworkers=2, method="process"
        )
    assert "item" not in str(info.value)  # the loader's tasks are shards here
    assert not [name for name in os.listdir(tmp_path) if name.endswith((".tmp", "manifest.json"))]


def test_a_worker_process_that_dies_on_a_piece_is_reported_with_its_rows_and_shard(tmp_path):
    # One shard of 200 rows for 2 workers: 7 pieces of 32 rows (the last 8); row 77 is in piece 2.
    with pytest.raises(
        lazyseq.WorkerDied, match=r"died with signal SIGKILL while computing pieces? (\d+, )*2\b"
    ) as info:
        lazyseq.write_npy(lazyseq.smap(dies_at_77, range(200)), tmp_path, nworkers=2, method="process")
    assert "piece 2 is rows 64 to 95 of shard 0 (its piece 3 of 7)" in info.value.__notes__
    assert not [name for name in os.listdir(tmp_path) if name.endswith((".tmp", "manifest.json"))]


def test_a_progress_log_left_beside_a_manifest_is_removed_by_the_next_run(tmp_path):
    # A run stopped between writing its manifest and removing its progress log (a Ctrl-C there) left both.
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    (tmp_path / "progress.jsonl").write_text("")
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    assert "progress.jsonl" not in os.listdir(tmp_path)


def lazyseq_threads():
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("lazyseq-")]


@pytest.mark.parametrize("nworkers", [0, 2])
@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_a_failing_write_leaves_no_thread(tmp_path, monkeypatch, nworkers, error):
    seen = set()  # the names of the threads that synced files
    sync_file = lazyseq.io.shard_sync.sync_file
    monkeypatch.setattr(
        "lazyseq.io.shard_sync.sync_file", lambda path: seen.add(threading.current_thread().name) or sync_file(path)
    )

    def row(i):
        if i == 5:
            raise error(f"row {i} is bad")
        return np.full(40_000, i, np.float64)

    expected = lazyseq.EvaluationError if error is ValueError else KeyboardInterrupt
    with pytest.raises(expected):
        lazyseq.write_npy(lazyseq.smap(row, range(8)), tmp_path, rows_per_shard=2, nworkers=nworkers)
    assert lazyseq_threads() == []
    assert "manifest.json" not in os.listdir(tmp_path) and temporaries(tmp_path) == []
    if error is ValueError or not nworkers:  # an interrupt in a worker thread stops everything as it comes
        assert "lazyseq-write_npy-sync" in seen


@pytest.mark.parametrize(("length", "second", "size"), [(8000, 1000, 1000), (2000, 256, 256)], ids=["shards", "pieces"])
def test_a_shard_being_written_by_a_worker_thread_stops_at_its_next_block_when_the_run_fails(
    tmp_path, length, second, size
):
    # 8 shards of 1000 rows for 2 workers: whole shards; 2 shards: pieces of 256 rows. The second task (``size``
    # rows from row ``second``) stops after its first block. (The worker that failed may start the third task.)
    second_task_began, computed = threading.Event(), []

    def row(i):
        computed.append(i)
        if i == 5:
            second_task_began.wait(timeout=30)
            raise ValueError(f"row {i} is bad")
        if i >= second:
            second_task_began.set()
            if i == second:  # the first block of the second task ends once the loader is stopping
                lazyseq.loading.thread_workers._this_worker.stopping.wait(timeout=30)
        return float(i)

    with pytest.raises(lazyseq.EvaluationError, match=r"failed at item 5 .*row 5 is bad$"):
        lazyseq.write_npy(lazyseq.smap(row, range(length)), tmp_path, rows_per_shard=1000, nworkers=2)
    first_block = list(range(second, second + lazyseq.io.shard_layout.FIRST_BLOCK_ROWS))
    assert [i for i in computed if second <= i < second + size] == first_block
    names = os.listdir(tmp_path)  # a third task, begun meanwhile, may have ended: a shard that the next run redoes
    assert "manifest.json" not in names and temporaries(tmp_path) == [] and lazyseq_threads() == []


def longdouble_with_noise(i):
    """Extended-precision values whose unused bytes (x87: 6 in 16) hold noise, as memory left them."""
    values = np.arange(4, dtype=np.longdouble) / (i + 3)
    values.view(np.uint8).reshape(4, 16)[:, 10:] = np.random.default_rng().integers(256, size=(4, 6), dtype=np.uint8)
    return values


@pytest.mark.skipif(
    np.finfo(np.longdouble).nmant != 63 or np.dtype(np.longdouble).itemsize != 16,
    reason="longdouble is not x87 extended precision in 16 bytes here",
)
def test_extended_precision_numbers_make_the_same_files_whatever_their_unused_bytes(tmp_path):
    source = lazyseq.smap(longdouble_with_noise, range(30))
    written = []
    for k, options in enumerate([{}, {"nworkers": 2}, {"nworkers": 2, "method": "process"}]):
        lazyseq.write_npy(source, tmp_path / str(k), rows_per_shard=8, **options)
        written.append(contents(tmp_path / str(k)))
    assert written[0] == written[1] == written[2]
    stored = np.load(tmp_path / "0" / "data-00000.npy")
    assert not stored.view(np.uint8).reshape(-1, 16)[:, 10:].any()
    np.testing.assert_array_equal(stored[3], np.arange(4, dtype=np.longdouble) / 6)


@pytest.mark.parametrize("nworkers", [0, 2])
def test_a_full_disk_is_an_os_error_naming_the_shard_not_a_failure_of_its_items(tmp_path, monkeypatch, nworkers):
    def no_space(path, mode):  # for the shards' files (the progress log is written first)
        if "data-" in os.path.basename(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return open(path, mode)

    def no_space_at(descriptor, data, offset):  # shards written in pieces (two shards for two workers)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lazyseq.io.shard_files, "open", no_space, raising=False)
    monkeypatch.setattr(os, "pwrite", no_space_at)
    with pytest.raises(OSError) as caught:  # was "EvaluationError: ... failed at items 0 to 9: OSError: ..."
        lazyseq.write_npy(lazyseq.smap(float, range(20)), tmp_path, rows_per_shard=10, nworkers=nworkers)
    assert type(caught.value) is OSError and caught.value.errno == errno.ENOSPC
    assert caught.value.__notes__[-1] == f"while writing shard 0 of {tmp_path}"
    assert temporaries(tmp_path) == [] and lazyseq_threads() == []


@on_linux
def test_a_sync_that_fails_names_the_file_and_leaves_no_manifest(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def fsync(descriptor):
        if os.readlink(f"/proc/self/fd/{descriptor}").endswith("data-00001.npy"):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError) as caught:
        lazyseq.write_npy(lazyseq.smap(float, range(20)), tmp_path, rows_per_shard=10)
    assert caught.value.errno == errno.EIO
    assert caught.value.__notes__ == [f"while syncing {tmp_path / 'data-00001.npy'} to disk"]
    assert "manifest.json" not in os.listdir(tmp_path) and temporaries(tmp_path) == []


def test_a_failing_first_item_changes_nothing(tmp_path):
    with pytest.raises(lazyseq.EvaluationError) as info:
        lazyseq.write_npy(pipeline(N, fail_at=0), tmp_path, rows_per_shard=10)
    assert str(info.value) == (
        f"write_npy: shard 0 of {tmp_path} failed at item 0 (smap(Transform)[0]): ValueError: row 0 is bad"
    )
    assert os.listdir(tmp_path) == []


def test_a_finished_directory_is_checked_not_recomputed(tmp_path, reference):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    computed = []
    lazyseq.write_npy(pipeline(N, computed=computed), tmp_path, rows_per_shard=10, nworkers=2)
    assert computed == [0]  # the first item, which tells the layout
    assert contents(tmp_path) == reference
    lazyseq.write_npy(pipeline(N, computed=computed), tmp_path, rows_per_shard=10, resume=False)
    assert sorted(computed) == [0, 0, *range(N)]
    assert contents(tmp_path) == reference


def test_a_truncated_shard_is_reported_on_open_and_redone_on_resume(tmp_path, reference):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    shard = tmp_path / "f0-00002.npy"
    size = shard.stat().st_size
    os.truncate(shard, size - 8)
    with pytest.raises(ValueError) as info:
        lazyseq.open_npy(tmp_path)
    assert str(info.value) == (
        f"open_npy: {shard} holds {size - 8} bytes, but {tmp_path / 'manifest.json'} says {size}: the shard is "
        "truncated or was replaced; call write_npy again with the same arguments to redo it"
    )
    computed = []
    lazyseq.write_npy(pipeline(N, computed=computed), tmp_path, rows_per_shard=10)
    assert sorted(computed) == [0, *range(20, 30)]
    assert contents(tmp_path) == reference


def test_a_corrupt_shard_is_redone_on_resume_and_a_bad_header_reported_on_open(tmp_path, reference):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    shard = tmp_path / "f1-00004.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, same header: only the checksum tells
    shard.write_bytes(bytes(data))
    computed = []
    lazyseq.write_npy(pipeline(N, computed=computed), tmp_path, rows_per_shard=10, nworkers=2)
    assert sorted(computed) == [0, *range(40, 50)]
    assert contents(tmp_path) == reference
    other = tmp_path / "f0-00001.npy"
    np.save(other, np.zeros((10, 4), np.float32))  # another dtype, so another size too: rewrite the size
    edit_manifest(tmp_path, lambda manifest: manifest["shards"][1]["files"][0].update(bytes=other.stat().st_size))
    assert open_error(tmp_path) == (
        f"open_npy: {other} holds float32 values of shape (10, 4), but {tmp_path / 'manifest.json'} says float64 "
        "of shape (10, 4): call write_npy again with the same arguments to redo it (with overwrite=True if "
        f"{tmp_path / 'manifest.json'} is what was changed)"
    )


def test_a_shard_whose_header_says_its_values_begin_elsewhere_is_reported_on_open(tmp_path):
    rows = np.arange(60, dtype=np.float32).reshape(20, 3)
    lazyseq.write_npy(rows, tmp_path, rows_per_shard=10)
    shard = tmp_path / "data-00001.npy"
    data = bytearray(shard.read_bytes())
    header = int.from_bytes(data[8:10], "little")
    data[8:10] = (header - 30).to_bytes(2, "little")  # its values would be read 30 bytes early: the same size
    shard.write_bytes(bytes(data))
    assert open_error(tmp_path) == (
        f"open_npy: {shard} has a header of {header - 20} bytes, but its {len(data)} bytes hold 120 bytes of values "
        f"after a header of {header + 10}: its values would be read from the wrong place; call write_npy again with "
        "the same arguments to redo it"
    )


# An unclosed "{" is a TokenError of Python's tokenize before Python 3.12, then a SyntaxError of its parser.
@pytest.mark.parametrize(
    ("damage", "raised", "error"),
    [(b"{", b"z", "TokenError" if sys.version_info < (3, 12) else "SyntaxError"), (b"'<f4'", b"',f4'", "SyntaxError")],
    ids=["TokenError", "SyntaxError"],
)
def test_a_shard_whose_header_text_is_damaged_is_a_value_error_naming_it(tmp_path, damage, raised, error):
    rows = np.arange(60, dtype=np.float32).reshape(20, 3)
    lazyseq.write_npy(rows, tmp_path, rows_per_shard=10)
    shard = tmp_path / "data-00001.npy"
    shard.write_bytes(shard.read_bytes().replace(damage, raised, 1))
    message = open_error(tmp_path)
    assert message.startswith(
        f"open_npy: {shard} has a header that cannot be read (its header cannot be parsed: {error}: "
    )
    with pytest.raises(ValueError, match=f"^open_npy: cannot memory-map {re.escape(str(shard))}: its header"):
        lazyseq.open_npy(shard)


def test_a_directory_written_by_version_1_with_crc32s_is_read_and_resumed(tmp_path, reference):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)

    def as_version_1(manifest):
        manifest["version"] = 1
        for shard in manifest["shards"]:
            for file in shard["files"]:
                del file["sum64"]
                file["crc32"] = zlib.crc32((tmp_path / file["name"]).read_bytes())

    edit_manifest(tmp_path, as_version_1)
    x, index = expected()
    np.testing.assert_array_equal(lazyseq.batch(lazyseq.open_npy(tmp_path), N)[0][0], x)
    shard = tmp_path / "f1-00004.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # found by its CRC-32
    shard.write_bytes(bytes(data))
    computed = []
    lazyseq.write_npy(pipeline(N, computed=computed), tmp_path, rows_per_shard=10)
    assert sorted(computed) == [0, *range(40, 50)]
    shards = {name: digest for name, digest in reference.items() if name != "manifest.json"}
    assert {name: digest for name, digest in contents(tmp_path).items() if name != "manifest.json"} == shards
    rewritten = json.loads((tmp_path / "manifest.json").read_text())
    assert rewritten["version"] == 2
    assert [sorted(file) for file in rewritten["shards"][3]["files"]] == [["bytes", "crc32", "name"]] * 2  # kept
    assert [sorted(file) for file in rewritten["shards"][4]["files"]] == [["bytes", "name", "sum64"]] * 2  # redone
    computed.clear()
    lazyseq.write_npy(pipeline(N, computed=computed), tmp_path, rows_per_shard=10)
    assert computed == [0]


def test_a_record_with_a_garbled_checksum_is_refused_or_redone(tmp_path, reference):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    not_a_manifest = f"open_npy: {tmp_path / 'manifest.json'} is not a write_npy manifest: ValueError: "
    edit_manifest(tmp_path, lambda manifest: manifest["shards"][2]["files"][0].update(sum64="ab:cd"))
    assert open_error(tmp_path) == not_a_manifest + "the checksum of f0-00002.npy is 'ab:cd', not 32 hexadecimal digits"
    edit_manifest(tmp_path, lambda manifest: manifest["shards"][2]["files"][0].pop("sum64"))
    assert open_error(tmp_path) == not_a_manifest + "the record of f0-00002.npy has no checksum"


def test_a_garbled_record_in_the_progress_log_is_redone(tmp_path, reference):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["shards"][3]["files"][1]["sum64"] = 12
    header = {key: value for key, value in manifest.items() if key != "shards"}
    lines = [json.dumps(header)] + [json.dumps(shard) for shard in manifest["shards"]]
    (tmp_path / "progress.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "manifest.json").unlink()
    computed = []
    lazyseq.write_npy(pipeline(N, computed=computed), tmp_path, rows_per_shard=10)
    assert sorted(computed) == [0, *range(30, 40)]
    assert contents(tmp_path) == reference


def test_a_directory_of_an_unknown_version_is_refused(tmp_path):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    edit_manifest(tmp_path, lambda manifest: manifest.update(version=3))
    assert open_error(tmp_path) == (
        f"open_npy: {tmp_path / 'manifest.json'} is not a write_npy manifest: ValueError: it is version 3 of the "
        "format; this lazyseq reads versions 1 and 2"
    )


def test_shards_open_as_memory_maps_that_travel_like_np_load_s(tmp_path):
    written = lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    for field in written._parents:
        for part in field._parents:
            loaded = np.load(part.source.filename, mmap_mode="r")
            assert (part.source.filename, part.source.offset, part.source.mode) == (
                loaded.filename,
                loaded.offset,
                loaded.mode,
            )
            travelled = pickle.loads(pickle.dumps(part))
            assert isinstance(travelled.source, np.memmap)
            np.testing.assert_array_equal(travelled.source, loaded)
    x, index = expected()
    np.testing.assert_array_equal(lazyseq.batch(written, N)[0][1], index)


def test_a_shard_cut_short_under_a_manifest_that_agrees_is_named_on_open(tmp_path):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    shard = tmp_path / "f0-00001.npy"
    os.truncate(shard, shard.stat().st_size - 8)
    edit_manifest(tmp_path, lambda manifest: manifest["shards"][1]["files"][0].update(bytes=shard.stat().st_size))
    message = open_error(tmp_path)
    assert message.startswith(f"open_npy: {shard} has a header that cannot be read (")
    assert message.endswith("); call write_npy again with the same arguments to redo it")


def test_a_shard_overwritten_with_what_looks_like_a_zip_archive_is_named_on_open(tmp_path):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    shard = tmp_path / "f0-00001.npy"
    size = shard.stat().st_size
    shard.write_bytes((b"PK\x03\x04" + bytes(size))[:size])
    message = open_error(tmp_path)
    assert message.startswith(f"open_npy: {shard} has a header that cannot be read ({shard} is not a .npy file (it")
    assert message.endswith("); call write_npy again with the same arguments to redo it")


def test_a_missing_shard_is_named_on_open(tmp_path):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    os.remove(tmp_path / "f1-00003.npy")
    with pytest.raises(FileNotFoundError) as info:
        lazyseq.open_npy(tmp_path)
    assert str(info.value) == (
        f"open_npy: {tmp_path / 'f1-00003.npy'} is missing, but {tmp_path / 'manifest.json'} lists it: call "
        "write_npy again with the same arguments to redo it"
    )


def test_a_rows_per_shard_cut_to_an_earlier_length_is_not_called_another(tmp_path):
    lazyseq.write_npy(pipeline(5), tmp_path, rows_per_shard=10)  # (one shard of 5 rows)
    with pytest.raises(FileExistsError, match=r"other parameters \(length: 57, was 5\):"):
        lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)


def test_other_parameters_are_refused_unless_overwrite(tmp_path):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    with pytest.raises(FileExistsError) as info:
        lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=20)
    assert str(info.value) == (
        f"write_npy: {tmp_path} holds shards written with other parameters (rows_per_shard: 20, was 10: "
        "rows_per_shard=10 goes on with them): pass overwrite=True to replace them, or choose another directory"
    )
    with pytest.raises(FileExistsError, match=r"\(rows_per_shard: 57, was 10: rows_per_shard=10 goes on with them\)"):
        lazyseq.write_npy(pipeline(N), tmp_path)  # sized from bytes_per_shard: one shard
    with pytest.raises(FileExistsError, match=r"\(items: arrays, were tuples of 2; length: 30, was 57\)"):
        lazyseq.write_npy(rows(30), tmp_path, rows_per_shard=10)
    with pytest.raises(FileExistsError, match=r"\(length: 5, was 57\)"):  # (not rows_per_shard, cut to the length)
        lazyseq.write_npy(pipeline(5), tmp_path, rows_per_shard=10)
    with pytest.raises(FileExistsError, match=r"\(length: 40, was 57; rows_per_shard: 20, was 10\)"):
        lazyseq.write_npy(pipeline(40), tmp_path, rows_per_shard=20)  # (no other rows_per_shard goes on with them)
    with pytest.raises(FileExistsError, match=r"\(dtype of field 'f0': float32, was float64\)"):
        lazyseq.write_npy(pipeline(N).smap(lambda t: (t[0].astype(np.float32), t[1])), tmp_path, rows_per_shard=10)
    assert len(os.listdir(tmp_path)) == 13  # untouched
    written = lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=20, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == [f"f{j}-{k:05d}.npy" for j in (0, 1) for k in range(3)] + ["manifest.json"]
    np.testing.assert_array_equal(written[45][0], expected()[0][45])


def test_shard_files_without_a_manifest_are_not_overwritten(tmp_path):
    np.save(tmp_path / "data-00000.npy", np.zeros(3))
    (tmp_path / "notes.txt").write_text("kept")
    with pytest.raises(FileExistsError) as info:
        lazyseq.write_npy(np.arange(5.0), tmp_path)
    assert str(info.value) == (
        f"write_npy: {tmp_path} holds files named like shards (data-00000.npy) but no manifest.json: pass "
        "overwrite=True to replace them, or choose another directory"
    )
    lazyseq.write_npy(np.arange(5.0), tmp_path, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["data-00000.npy", "manifest.json", "notes.txt"]
    np.testing.assert_array_equal(np.load(tmp_path / "data-00000.npy"), np.arange(5.0))


def test_open_npy_of_shards_whose_manifest_is_gone_says_how_to_read_each_field(tmp_path):
    # It said the directory was not written by write_npy, and suggested one glob over all its .npy files: the
    # fields' files end to end, as one view.
    lazyseq.write_npy(lazyseq.collate([np.arange(4.0), np.arange(4.0) * 100]), tmp_path, rows_per_shard=2)
    os.remove(tmp_path / "manifest.json")
    with pytest.raises(FileNotFoundError) as info:
        lazyseq.open_npy(tmp_path)
    assert str(info.value) == (
        f"open_npy: {tmp_path} has no manifest.json, but holds 4 files named like write_npy's shards (fields f0, "
        "f1): without the manifest they cannot be checked; write them again (write_npy with overwrite=True), or "
        f"open each field's files with a glob pattern ({str(tmp_path / 'f0-*.npy')!r}, "
        f"{str(tmp_path / 'f1-*.npy')!r}) and lazyseq.collate them"
    )


def test_open_npy_of_a_directory_without_a_finished_run(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        lazyseq.open_npy(tmp_path)
    assert str(info.value) == (
        f"open_npy: {tmp_path} has no manifest.json: it was not written by write_npy (open its files with a glob "
        f"pattern such as {str(tmp_path / '*.npy')!r})"
    )
    with pytest.raises(lazyseq.EvaluationError):
        lazyseq.write_npy(pipeline(N, fail_at=25), tmp_path, rows_per_shard=10)
    with pytest.raises(FileNotFoundError) as info:
        lazyseq.open_npy(tmp_path)
    assert str(info.value) == (
        f"open_npy: {tmp_path} holds shards of a write_npy run that did not finish (no manifest.json, only "
        "progress.jsonl): call write_npy again with the same arguments to finish it"
    )
    with lazyseq.io.shard_directory.writing_alone(str(tmp_path)):  # as a run writing there holds it
        with pytest.raises(FileNotFoundError) as info:
            lazyseq.open_npy(tmp_path)
    assert str(info.value) == (  # was told to call write_npy, which the other run would have refused
        f"open_npy: {tmp_path} is being written by a write_npy run that has not finished (no manifest.json yet): "
        "open it once that run has ended"
    )


# -- items that cannot be written --------------------------------------------------


def test_items_that_change_shape_or_dtype_are_named(tmp_path):
    def grows(i):
        return np.zeros(3 if i < 23 else 4)

    with pytest.raises(lazyseq.EvaluationError) as info:
        lazyseq.write_npy(lazyseq.smap(grows, range(40)), tmp_path / "a", rows_per_shard=10)
    assert str(info.value) == (
        f"write_npy: shard 2 of {tmp_path / 'a'} failed at item 23: ValueError: rows of shape (4,), but item 0 has "
        "rows of shape (3,)"
    )
    with pytest.raises(lazyseq.EvaluationError) as info:  # a batch view's short last batch: said what to do
        lazyseq.write_npy(lazyseq.batch(np.zeros((10, 3)), 4), tmp_path / "short")
    assert str(info.value) == (
        f"write_npy: shard 0 of {tmp_path / 'short'} failed at item 2: ValueError: rows of shape (2, 3), but item 0 "
        "has rows of shape (4, 3); a short last batch? batch(..., drop_last=True) leaves it out (or write the samples "
        "unbatched)"
    )

    def widens(i):
        return np.zeros(3, np.int8 if i < 15 else np.float32)

    with pytest.raises(lazyseq.EvaluationError) as info:
        lazyseq.write_npy(lazyseq.smap(widens, range(40)), tmp_path / "b", rows_per_shard=10)
    assert str(info.value) == (
        f"write_npy: shard 1 of {tmp_path / 'b'} failed at item 15: ValueError: float32 values, which do not fit "
        "the int8 of item 0: make every item the same dtype (.astype in the pipeline)"
    )
    with pytest.raises(TypeError) as info:
        lazyseq.write_npy(["a", "b"], tmp_path / "c")
    assert str(info.value) == (
        "write_npy: item 0: items must be arrays or numbers, or tuples or dicts of them, but these collate into a list"
        "; make strings numpy arrays of a fixed-width string dtype (np.str_, np.bytes_, np.array(s, 'U20'))"
    )
    with pytest.raises(TypeError) as info:
        lazyseq.write_npy([{"name": "abc", "x": 1}], tmp_path / "c2")
    assert str(info.value) == (
        "write_npy: field 'name' of item 0 collates into a list, not an array: items must be arrays or numbers, or "
        "tuples or dicts of them (not nested); make strings numpy arrays of a fixed-width string dtype (np.str_, "
        "np.bytes_, np.array(s, 'U20'))"
    )
    structured = np.zeros(2, [("a", "<i4"), ("b", "<f8")])
    with pytest.raises(TypeError, match=r"structured dtype .* make each of its fields a key of a dict item"):
        lazyseq.write_npy(structured, tmp_path / "c3")
    with pytest.raises(TypeError, match=r"must be strings of ASCII letters, digits and '_\.\+=-'.* got 'größe'"):
        lazyseq.write_npy([{"größe": 1}], tmp_path / "c4")
    with pytest.raises(TypeError, match=r"dict keys name the files of their field, .* got 'a/b'"):
        lazyseq.write_npy([{"a/b": 1}], tmp_path / "d")
    with pytest.raises(TypeError) as info:  # its temporary file's name would not fit in 255 bytes
        lazyseq.write_npy([{"k" * 240: 1}], tmp_path / "e")
    assert str(info.value) == (
        "write_npy: item 0: dict keys name the files of their field, so they must be at most 200 characters long "
        "(a file name holds 255), got one of 240: kkkkkkkkkkkkkkkkkkkk..."
    )
    assert not os.path.exists(tmp_path / "e")  # refused before the directory is touched


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # (np.asmatrix)
@pytest.mark.parametrize("rows_per_shard", [None, 4])
def test_a_masked_array_or_a_matrix_is_refused_naming_its_item_not_written_without_its_mask(tmp_path, rows_per_shard):
    # A masked array was written as its data: the values it masked were read back as values.
    masked = np.ma.masked_array([1.0, -999.0], mask=[False, True])
    lost = ", and what the subclass adds (a masked array's mask) would be lost; write np.asarray(value), or its parts"
    for name, odd, at in [("first", masked, 0), ("later", {"x": masked}, 6), ("matrix", np.asmatrix([[1.0, 2.0]]), 2)]:
        items = [{"x": np.ones(2)} if name == "later" else np.ones(2) for _ in range(8)]
        items[at] = odd
        with pytest.raises(lazyseq.EvaluationError) as info:
            lazyseq.write_npy(items, tmp_path / name, rows_per_shard=rows_per_shard, progress=False)
        kind = "numpy.matrix" if name == "matrix" else "numpy.ma.MaskedArray"
        assert (
            f"failed at item {at}: TypeError: a {kind}, a subclass of numpy arrays: a .npy file keeps its values alone"
            in str(info.value)
        )
        assert lost in str(info.value)


@pytest.mark.parametrize("rows_per_shard", [None, 1, 2, 3])
def test_what_is_accepted_and_how_it_is_named_does_not_depend_on_the_blocks(tmp_path, rows_per_shard):
    # int16 and uint16 each fit float32, but stacked together they make int32, which does not
    items = [np.ones(2, np.float32), np.ones(2, np.float32), np.ones(2, np.int16), np.ones(2, np.uint16)]
    written = lazyseq.write_npy(items, tmp_path / "cast", rows_per_shard=rows_per_shard)
    assert np.asarray(written).dtype == np.float32 and np.asarray(written).tolist() == [[1.0, 1.0]] * 4
    # dicts with the same keys in another order
    keyed = [{"a": np.float32(k), "b": k} if k % 2 else {"b": k, "a": np.float32(k)} for k in range(4)]
    written = lazyseq.write_npy(keyed, tmp_path / "keys", rows_per_shard=rows_per_shard)
    assert [(float(item["a"]), int(item["b"])) for item in written] == [(k, k) for k in range(4)]
    # an item unlike item 0 is named, whichever block it falls in
    for name, odd, message in [
        ("dtype", np.ones(2, np.float64), "ValueError: float64 values, which do not fit the float32 of item 0"),
        ("keys", {"b": np.ones(2)}, "TypeError: item 3 is a dict with keys ['b'], but item 0 is an array"),
        ("length", (np.ones(2), np.ones(2)), "TypeError: item 3 is a tuple of 2, but item 0 is an array"),
        ("kind", (1.0, 1.0), "TypeError: item 3 is a tuple of 2, but item 0 is an array"),  # stacks as a row would
    ]:
        with pytest.raises(lazyseq.EvaluationError, match=rf"failed at item 3: {re.escape(message)}") as info:
            lazyseq.write_npy(items[:3] + [odd], tmp_path / f"odd-{name}", rows_per_shard=rows_per_shard)
        assert "manifest.json" not in os.listdir(tmp_path / f"odd-{name}"), info.value
    message = "TypeError: item 3 is an array, but item 0 is a tuple of 2"
    with pytest.raises(lazyseq.EvaluationError, match=rf"failed at item 3: {re.escape(message)}"):
        lazyseq.write_npy([(1, 2)] * 3 + [np.array([1, 2])], tmp_path / "odd-array", rows_per_shard=rows_per_shard)


def _as_it_is(item):
    return item


@pytest.mark.parametrize("rows_per_shard", [None, 1, 3])
def test_numbers_among_strings_and_times_out_of_a_finer_units_range_are_refused(tmp_path, rows_per_shard):
    # numpy calls both casts safe, and stacks such items so: they were written as "3" and "True", and as dates of 1915
    labels = [np.array("cat", "U5"), np.array("dog", "U5"), np.int8(3), np.True_]
    dates = [np.datetime64("2020-01-01", "ns"), np.datetime64("2021-01-01", "D"), np.datetime64("2500-01-01", "D")]
    fields = [(np.float32(k), np.datetime64("2020-01-01", "ns")) for k in range(2)]
    fields.append((np.float32(2), np.datetime64("2500-01-01", "D")))
    for name, items, message in [
        ("labels", labels, "failed at item 2: ValueError: int8 values, which do not fit the <U5 of item 0"),
        ("dates", dates, "failed at item 2: ValueError: datetime64[D] values, which do not fit the datetime64[ns]"),
        ("fields", fields, "failed at item 2: ValueError: field 'f1': datetime64[D] values, which do not fit"),
    ]:
        with pytest.raises(lazyseq.EvaluationError, match=re.escape(message)):
            lazyseq.write_npy(lazyseq.smap(_as_it_is, items), tmp_path / name, rows_per_shard=rows_per_shard)
    with pytest.raises(lazyseq.EvaluationError) as caught:  # longer strings: how to give them all one width
        lazyseq.write_npy(lazyseq.smap(np.str_, ["a", "bb"]), tmp_path / "widths", rows_per_shard=rows_per_shard)
    assert str(caught.value).endswith(
        "ValueError: <U2 values, which do not fit the <U1 of item 0: give every item one width that holds the longest "
        "(.astype('U20'), say)"
    )
    written = lazyseq.write_npy(
        lazyseq.smap(_as_it_is, dates[:2]), tmp_path / "in-range", rows_per_shard=rows_per_shard
    )
    assert list(written) == [np.datetime64("2020-01-01", "ns"), np.datetime64("2021-01-01", "ns")]


@pytest.mark.parametrize("rows_per_shard", [None, 1, 2])
def test_integers_that_the_floats_of_item_0_would_round_are_refused_whichever_block_they_fall_in(
    tmp_path, rows_per_shard
):
    # numpy stacks int64 among float64 as float64 (it calls that cast safe): 2**53 + 1 was written as 2**53
    big = 2**53 + 1
    for name, items in [
        ("arrays", [np.array([1.0]), np.array([big]), np.array([2.0]), np.array([big])]),
        ("numbers", [1.0, big, 2.0, big]),
        ("fields", [(np.float64(k), k) if k % 2 == 0 else (np.int64(big), k) for k in range(4)]),
        ("unsigned", [np.array([1], np.uint64), np.array([-1]), np.array([1], np.uint64), np.array([-1])]),
    ]:
        with pytest.raises(lazyseq.EvaluationError, match=r"failed at item 1: ValueError: .*(int64|uint64) values"):
            lazyseq.write_npy(items, tmp_path / name, rows_per_shard=rows_per_shard)
    # what fits goes through, cast to item 0's dtype
    written = lazyseq.write_npy([1.0, 2**53, np.int32(2**31 - 1)], tmp_path / "exact", rows_per_shard=rows_per_shard)
    assert np.asarray(written).dtype == np.float64 and list(written) == [1.0, 2.0**53, 2.0**31 - 1]


def test_only_its_own_temporary_files_are_removed(tmp_path):
    os.makedirs(tmp_path / "out")
    for name in [".data-00000.npy.0123abcd.tmp", ".manifest.json.89abcdef.tmp", ".notes.txt.0123abcd.tmp"]:
        (tmp_path / "out" / name).write_bytes(b"left by someone")
    lazyseq.write_npy(np.zeros((3, 2)), tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == [".notes.txt.0123abcd.tmp", "data-00000.npy", "manifest.json"]
    # a complete directory, which a run writes nothing into, is cleaned too (its temporary file was kept)
    (tmp_path / "out" / ".data-00000.npy.deadbeef.tmp").write_bytes(b"half a shard")
    lazyseq.write_npy(np.zeros((3, 2)), tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == [".notes.txt.0123abcd.tmp", "data-00000.npy", "manifest.json"]


def test_a_directory_removed_during_a_run_is_the_error_that_names_the_shard(tmp_path):
    # The cleanup after the failure listed the missing directory: a bare FileNotFoundError naming only it.
    out = tmp_path / "out"

    def removing(i):
        if i == 5:
            shutil.rmtree(out)
        return np.float32(i)

    with pytest.raises(FileNotFoundError) as caught:
        lazyseq.write_npy(lazyseq.smap(removing, range(20)), out, rows_per_shard=10, sync=False)
    assert caught.value.__notes__ == [f"while writing shard 0 of {out}"]


def test_a_run_resumed_with_dict_keys_in_another_order_keeps_what_was_written(tmp_path):
    def first(i):
        return {"x": np.full(2, i, np.float32), "y": np.int64(i)}

    def second(i):
        return {"y": np.int64(i), "x": np.full(2, i, np.float32)}

    lazyseq.write_npy(lazyseq.smap(first, range(6)), tmp_path, rows_per_shard=2)
    before = contents(tmp_path)
    os.remove(tmp_path / "x-00001.npy")
    written = lazyseq.write_npy(lazyseq.smap(second, range(6)), tmp_path, rows_per_shard=2)
    assert contents(tmp_path) == before  # refused as other parameters before, the same files now
    assert list(written[5]) == ["x", "y"] and int(written[5]["y"]) == 5


def test_arguments_are_checked(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="write_npy: the sequence is empty, so there is nothing to write"):
        lazyseq.write_npy([], tmp_path)
    with pytest.raises(TypeError, match="write_npy needs a length, but cycle view is infinite"):
        lazyseq.write_npy(lazyseq.cycle([1.0]), tmp_path)
    with pytest.raises(ValueError, match="write_npy: rows_per_shard must be a positive integer, got 0"):
        lazyseq.write_npy([1.0], tmp_path, rows_per_shard=0)
    with pytest.raises(ValueError, match="write_npy: method must be .*, got 'fork'"):
        lazyseq.write_npy([1.0], tmp_path, method="fork")
    for name in ("resume", "overwrite", "sync"):  # overwrite="False" replaced a directory written otherwise
        with pytest.raises(TypeError, match=f"^write_npy: {name} must be True or False, got 'False'$"):
            lazyseq.write_npy([1.0], tmp_path, **{name: "False"})
    assert os.listdir(tmp_path) == []
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^write_npy: the directory is an empty path; give '\.' for the current "):
        lazyseq.write_npy([1.0], "")  # it wrote into the current directory
    with pytest.raises(TypeError, match=r"^write_npy: directory must be a path \(a str or an os.PathLike\), got None$"):
        lazyseq.write_npy([1.0], None)  # (os.fsdecode's message, naming no argument)
    assert os.listdir(tmp_path) == []


def test_more_shards_than_the_process_may_open_are_refused_before_any_is_written(tmp_path):
    # Every shard was written, then the view returned (which maps them all) failed: again at each run, after a check.
    script = (
        "import resource, sys, numpy as np, lazyseq\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))\n"
        "try:\n"
        "    lazyseq.write_npy(np.arange(300, dtype='u1'), sys.argv[1], rows_per_shard=1)\n"
        "except OSError as error:\n"
        "    print(error)\n"
    )
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=120)
    assert re.fullmatch(
        r"write_npy: mapping 300 files keeps 300 files open, and this process may have 200 open at most \(its hard "
        r"limit; \d+ are open\): raise it \(ulimit -Hn\), or write fewer, larger shards\n",
        done.stdout,
    ), done.stdout + done.stderr
    assert not out.exists()


def test_list_items_are_written_as_tuples(tmp_path):
    written = lazyseq.write_npy(lazyseq.view([[np.zeros(2), 1], [np.ones(2), 2]]), tmp_path, sync=False)
    assert sorted(os.listdir(tmp_path)) == ["f0-00000.npy", "f1-00000.npy", "manifest.json"]
    (x, label) = written[1]
    assert (x.tolist(), int(label)) == ([1.0, 1.0], 2)


@pytest.mark.parametrize(("item", "kind"), [((), "tuple"), ({}, "dict")])
def test_empty_items_are_refused_before_anything_is_written(tmp_path, item, kind):
    with pytest.raises(TypeError) as raised:
        lazyseq.write_npy(lazyseq.view([item, item]), tmp_path, sync=False)
    assert str(raised.value) == f"write_npy: item 0 is an empty {kind}: there is nothing to write"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rows_per_shard": 5},
            "records shard 2 with 2 rows, but its length (10) and rows_per_shard (5) make 2 shards: the manifest was "
            "edited or damaged; call write_npy again with overwrite=True to rewrite the directory",
        ),
        (
            {"length": 9},
            "records shard 2 with 2 rows, but its length (9) and rows_per_shard (4) make 3 shards and give shard 2 1 "
            "rows: the manifest was edited or damaged; call write_npy again with overwrite=True to rewrite the "
            "directory",
        ),
        (  # more rows than len() counts
            {"length": 2**70, "rows_per_shard": 2**70},
            f"records shard 1 with 4 rows, but its length ({2**70}) and rows_per_shard ({2**70}) make 1 shards: the "
            "manifest was edited or damaged",
        ),
        ({"length": -1}, "is not a write_npy manifest: ValueError: length -1 and rows_per_shard 4 must be at least 1"),
        ({"rows_per_shard": 0}, "is not a write_npy manifest: ValueError: length 10 and rows_per_shard 0 must be at "),
    ],
)
def test_a_manifest_whose_layout_disagrees_with_its_records_is_refused(tmp_path, change, message):
    lazyseq.write_npy(np.arange(10.0), tmp_path, rows_per_shard=4, sync=False)
    edit_manifest(tmp_path, lambda manifest: manifest.update(change))
    assert message in open_error(tmp_path)


def test_a_manifest_missing_shards_of_its_length_is_refused_at_once(tmp_path):
    # 2.5e11 shards: the first missing is found before a set of them, or room for their files, is made
    lazyseq.write_npy(np.arange(12.0), tmp_path, rows_per_shard=4, sync=False)
    edit_manifest(tmp_path, lambda manifest: manifest.update(length=10**12))
    assert open_error(tmp_path).endswith(
        "has no record of shard 3, of the 250000000000 shards that its length (1000000000000) and rows_per_shard "
        "(4) make: the manifest was edited or damaged; call write_npy again with overwrite=True to rewrite the "
        "directory"
    )


def test_a_manifest_whose_dtype_numpy_reads_as_python_is_refused(tmp_path):
    lazyseq.write_npy(np.arange(10.0), tmp_path, rows_per_shard=4, sync=False)
    edit_manifest(tmp_path, lambda manifest: manifest["fields"][0].update(dtype="|S,|,1"))  # numpy's SyntaxError
    assert open_error(tmp_path).startswith(
        f"open_npy: {tmp_path / 'manifest.json'} is not a write_npy manifest: ValueError: '|S,|,1' is not a dtype ("
    )
    with pytest.raises(ValueError, match=re.escape("is not a write_npy manifest: ValueError: '|S,|,1' is not a dtype")):
        lazyseq.write_npy(np.arange(10.0), tmp_path, rows_per_shard=4, sync=False)


def test_a_manifest_nested_too_deep_for_json_is_refused(tmp_path):
    lazyseq.write_npy(np.arange(10.0), tmp_path, rows_per_shard=4, sync=False)
    (tmp_path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    assert open_error(tmp_path).startswith(
        f"open_npy: {tmp_path / 'manifest.json'} is not a write_npy manifest: RecursionError: "
    )


def test_a_manifest_recording_a_negative_shard_is_refused_without_giving_it_rows(tmp_path):
    # The message said that the layout would "give shard -1 4 rows" (the last shard's, read from the end).
    lazyseq.write_npy(np.arange(10.0), tmp_path, rows_per_shard=4, sync=False)
    edit_manifest(tmp_path, lambda manifest: manifest["shards"][0].update(shard=-1))
    assert open_error(tmp_path).endswith(
        "records shard -1 with 4 rows, but its length (10) and rows_per_shard (4) make 3 shards: the manifest was "
        "edited or damaged; call write_npy again with overwrite=True to rewrite the directory"
    )


@pytest.mark.parametrize("name", ["../outside-00000.npy", "/tmp/outside-00000.npy", "sub/data-00000.npy"])
def test_a_manifest_naming_files_outside_its_directory_is_refused(tmp_path, name):
    directory = tmp_path / "written"
    lazyseq.write_npy(np.arange(10.0), directory, rows_per_shard=4, sync=False)
    np.save(tmp_path / "outside-00000.npy", np.full(4, 42.0))
    edit_manifest(directory, lambda manifest: manifest["shards"][0]["files"][0].update(name=name))
    assert open_error(directory).endswith(
        f"is not a write_npy manifest: ValueError: {name!r} is not the name of a shard file"
    )


def test_a_manifest_with_an_infinite_length_or_that_is_a_folder_is_refused_by_name(tmp_path):
    # int(inf) raised a bare OverflowError, and opening a folder a bare IsADirectoryError, naming nothing.
    lazyseq.write_npy(np.arange(10.0), tmp_path, rows_per_shard=4, sync=False)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"length": 10', '"length": 1e999'))
    assert open_error(tmp_path) == (
        f"open_npy: {manifest} is not a write_npy manifest: OverflowError: cannot convert float infinity to integer"
    )
    manifest.unlink()
    manifest.mkdir()
    assert open_error(tmp_path).startswith(f"open_npy: {manifest} is not a write_npy manifest: IsADirectoryError: ")


def test_a_second_run_into_a_directory_being_written_is_refused_and_the_first_goes_on(tmp_path):
    # Each run removed the other's temporary files: both failed on a file gone.
    reached, release = threading.Event(), threading.Event()

    def gated(i):
        if i == 5:
            reached.set()
            release.wait(30)
        return np.full(3, float(i))

    done = []
    first = threading.Thread(
        target=lambda: done.append(lazyseq.write_npy(lazyseq.smap(gated, range(12)), tmp_path, rows_per_shard=4))
    )
    first.start()
    try:
        assert reached.wait(30)
        with pytest.raises(BlockingIOError) as raised:
            lazyseq.write_npy(np.arange(12.0), tmp_path, rows_per_shard=4)
        assert str(raised.value) == (
            f"write_npy: another run is writing into {tmp_path}; wait until it ends (a run that was killed lets go "
            "at once), or write elsewhere"
        )
    finally:
        release.set()
        first.join()
    assert [float(x[0]) for x in done[0]] == [float(i) for i in range(12)]
    again = lazyseq.write_npy(lazyseq.smap(gated, range(12)), tmp_path, rows_per_shard=4)  # the lock went with it
    assert len(again) == 12


def test_a_process_forked_during_a_run_does_not_keep_the_directory_locked(tmp_path):
    # It inherited the lock's descriptor: the next run into the directory was refused while it lived.
    fork = multiprocessing.get_context("fork")
    done, children = fork.Event(), []

    def forks_a_child(i):
        if i == 5 and not children:  # while the run holds the lock (item 0 is read before, for the layout)
            children.append(fork.Process(target=done.wait, args=(30,)))
            children[0].start()
        return np.full(2, float(i))

    try:
        lazyseq.write_npy(lazyseq.smap(forks_a_child, range(8)), tmp_path, rows_per_shard=4)
        again = lazyseq.write_npy(np.arange(8.0), tmp_path / "other", rows_per_shard=4)
        assert len(again) == 8 and children[0].is_alive()
        rewritten = lazyseq.write_npy(np.full((8, 2), 7.0), tmp_path, rows_per_shard=4, overwrite=True)
        assert rewritten[7].tolist() == [7.0, 7.0]
    finally:
        done.set()
        for child in children:
            child.join()


def test_a_directory_that_cannot_be_made_is_named(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_bytes(b"mine")
    with pytest.raises(FileExistsError) as raised:
        lazyseq.write_npy(np.arange(4.0), a_file, sync=False)
    assert str(raised.value) == f"write_npy: {a_file} is a file; write_npy writes into a directory"
    with pytest.raises(NotADirectoryError) as raised:
        lazyseq.write_npy(np.arange(4.0), a_file / "sub", sync=False)
    assert str(raised.value) == f"write_npy: cannot make the directory {a_file / 'sub'}: Not a directory"
    assert a_file.read_bytes() == b"mine"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "",
            "cannot be read (Expecting value: line 1 column 1 (char 0)): the machine crashed while a run with "
            "sync=False was writing it, or it was edited",
        ),
        ("[1]\n", "is not a write_npy progress log: its first line is a list, not an object"),
    ],
)
def test_a_progress_log_that_cannot_be_read_is_named(tmp_path, content, message):
    # An empty log (sync=False, then a crash of the machine) raised a bare JSONDecodeError naming nothing.
    data = np.arange(30.0).reshape(10, 3)
    lazyseq.write_npy(data, tmp_path, rows_per_shard=5, sync=False)
    os.remove(tmp_path / "manifest.json")
    (tmp_path / "progress.jsonl").write_text(content)
    with pytest.raises(ValueError) as raised:
        lazyseq.write_npy(data, tmp_path, rows_per_shard=5, sync=False)
    assert str(raised.value) == (
        f"write_npy: {tmp_path / 'progress.jsonl'} {message}; pass overwrite=True to write the directory anew"
    )
    written = lazyseq.write_npy(data, tmp_path, rows_per_shard=5, sync=False, overwrite=True)
    np.testing.assert_array_equal(np.stack(list(written)), data)


def test_a_manifest_naming_another_shards_file_is_refused(tmp_path):
    # Two shards' file names swapped: their rows were read in the wrong order, silently.
    data = np.arange(20.0).reshape(10, 2)
    lazyseq.write_npy(data, tmp_path, rows_per_shard=5)

    def swap(manifest):
        first, second = manifest["shards"][0]["files"][0], manifest["shards"][1]["files"][0]
        first["name"], second["name"] = second["name"], first["name"]

    edit_manifest(tmp_path, swap)
    assert open_error(tmp_path) == (
        f"open_npy: {tmp_path / 'manifest.json'} names 'data-00001.npy' as shard 0 of field 'data', whose file is "
        "'data-00000.npy': the manifest was edited or damaged; call write_npy again with overwrite=True to rewrite "
        "the directory"
    )


def unpicklable_at_five(x):
    from loader_helpers import raise_unpicklable

    return raise_unpicklable(x) if x == 5 else float(x)


def test_an_exception_that_cannot_leave_a_worker_process_is_named_once(tmp_path):
    with pytest.raises(lazyseq.EvaluationError) as caught:
        lazyseq.write_npy(
            lazyseq.smap(unpicklable_at_five, range(8)), tmp_path, rows_per_shard=2, nworkers=1, method="process"
        )
    assert str(caught.value) == (  # was "... Unpicklable: Unpicklable: code 3: item 5"
        f"write_npy: shard 2 of {tmp_path} failed at item 5 (smap(unpicklable_at_five)[5]): Unpicklable: code 3: item 5"
    )


@pytest.mark.parametrize("nworkers", [0, 2])
def test_a_call_over_a_complete_intact_directory_writes_nothing(tmp_path, monkeypatch, nworkers):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    before = contents(tmp_path)

    def read_only(*args, **kwargs):
        raise PermissionError(30, "Read-only file system")

    for name in ("replace", "remove", "rename", "unlink"):
        monkeypatch.setattr(os, name, read_only)
    computed = []
    written = lazyseq.write_npy(pipeline(N, computed=computed), tmp_path, rows_per_shard=10, nworkers=nworkers)
    monkeypatch.undo()
    assert computed == [0]  # the first item, which gives the layout to compare with
    assert contents(tmp_path) == before and sorted(os.listdir(tmp_path)) == sorted(before)
    np.testing.assert_array_equal(lazyseq.batch(written, N)[0][1], np.arange(N))


def test_an_interrupt_while_a_complete_directory_is_checked_leaves_it_complete(tmp_path, monkeypatch):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    checked = []

    def interrupted(directory, file):
        checked.append(file.name)
        if len(checked) == 3:
            raise KeyboardInterrupt
        return True

    monkeypatch.setattr(lazyseq.io.shard_directory, "matches", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    monkeypatch.undo()
    assert len(lazyseq.open_npy(tmp_path)) == N


def test_a_manifest_edited_to_name_no_field_or_odd_files_is_named(tmp_path):
    lazyseq.write_npy(np.arange(20.0), tmp_path / "none", rows_per_shard=6)
    edit_manifest(tmp_path / "none", lambda manifest: manifest.update(fields=[]))
    assert open_error(tmp_path / "none") == (
        f"open_npy: {tmp_path / 'none' / 'manifest.json'} is not a write_npy manifest: ValueError: items of kind "
        "'array' cannot have the fields []"
    )
    lazyseq.write_npy([{"x": 1.0}] * 4, tmp_path / "odd", rows_per_shard=2)
    edit_manifest(tmp_path / "odd", lambda manifest: manifest["fields"][0].update(name="../x"))
    assert open_error(tmp_path / "odd") == (
        f"open_npy: {tmp_path / 'odd' / 'manifest.json'} is not a write_npy manifest: ValueError: the fields "
        "['../x'] are not all names of files in the directory"
    )


def test_a_rows_per_shard_beyond_the_length_is_not_reported_as_changed(tmp_path):
    lazyseq.write_npy(np.arange(5), tmp_path, rows_per_shard=100)
    with pytest.raises(FileExistsError) as info:
        lazyseq.write_npy(np.arange(6), tmp_path, rows_per_shard=100)
    assert "(length: 6, was 5): pass overwrite=True" in str(info.value)


def test_a_directory_given_as_bytes(tmp_path):
    written = lazyseq.write_npy(np.arange(3.0), os.fsencode(tmp_path / "out"))
    assert list(written) == [0.0, 1.0, 2.0] and sorted(os.listdir(tmp_path / "out"))[-1] == "manifest.json"


def test_the_files_of_a_complete_directory_are_read_once_when_one_shard_is_redone(tmp_path, monkeypatch):
    lazyseq.write_npy(pipeline(N), tmp_path, rows_per_shard=10)
    before = contents(tmp_path)
    (tmp_path / "f1-00003.npy").write_bytes(b"damaged")
    checked = []
    real = lazyseq.io.shard_files.matches

    def counted(directory, file):
        checked.append(file.name)
        return real(directory, file)

    monkeypatch.setattr(lazyseq.io.shard_directory, "matches", counted)
    monkeypatch.setattr(lazyseq.io.shards, "matches", counted)
    computed = []
    lazyseq.write_npy(pipeline(N, computed=computed), tmp_path, rows_per_shard=10)
    assert sorted(checked) == sorted([f"f{j}-{k:05d}.npy" for j in (0, 1) for k in range(6)])  # each once
    assert sorted(set(computed)) == [0, *range(30, 40)]  # item 0 for the layout, and shard 3 again
    assert contents(tmp_path) == before


def test_a_relative_directory_is_where_the_system_takes_it(tmp_path, monkeypatch):
    # Made absolute by normalizing its text, "link/../out" went to ./out, where the system (and every other program)
    # takes it through the link: <link's target>/../out.
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    monkeypatch.chdir(tmp_path)
    lazyseq.write_npy(np.arange(6.0).reshape(3, 2), "link/../out")
    assert (tmp_path / "real" / "out" / "manifest.json").exists() and not (tmp_path / "out").exists()


def test_tensor_items_are_told_to_become_arrays(tmp_path):
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError) as caught:
        lazyseq.write_npy(lazyseq.view([torch.ones(2)] * 3), tmp_path, sync=False)
    assert str(caught.value) == (
        "write_npy: item 0: items must be arrays or numbers, or tuples or dicts of them, but these collate into a "
        "Tensor; convert torch tensors with .numpy() (on the CPU)"
    )

"""open_npy: memory-mapped files as one view."""

import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import lazyseq


@pytest.fixture
def chunks(tmp_path):
    arrays = [np.arange(k * 10, k * 10 + 6, dtype=np.float32).reshape(3, 2) for k in range(3)]
    for k, a in enumerate(arrays):
        np.save(tmp_path / f"data_{k}.npy", a)
    return tmp_path, np.concatenate(arrays)


def test_glob_opens_sorted_files_memory_mapped(chunks):
    folder, expected = chunks
    data = lazyseq.open_npy(str(folder / "data_*.npy"))
    assert len(data) == 9
    np.testing.assert_array_equal(np.stack(list(data)), expected)
    assert all(isinstance(p.source, np.memmap) for p in data._parents)
    np.testing.assert_array_equal(data.batch(4)[1], expected[4:8])


def test_list_of_paths(chunks):
    folder, expected = chunks
    data = lazyseq.open_npy([folder / "data_2.npy", folder / "data_0.npy"])
    np.testing.assert_array_equal(data[0], expected[6])


def test_mismatched_files_are_named(chunks):
    folder, _ = chunks
    np.save(folder / "data_9.npy", np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(
        ValueError,
        match=r"data_9.npy holds float32 rows of shape \(3,\), but .*data_0.npy holds float32 rows of shape \(2,\)",
    ):
        lazyseq.open_npy(str(folder / "data_*.npy"))
    np.save(folder / "data_9.npy", np.zeros((2, 2), dtype=np.float64))
    with pytest.raises(ValueError, match="data_9.npy holds float64 rows"):
        lazyseq.open_npy(str(folder / "data_*.npy"))


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file matches"):
        lazyseq.open_npy(str(tmp_path / "*.npy"))
    with pytest.raises(ValueError, match="no file given"):
        lazyseq.open_npy([])


def test_a_file_that_is_not_npy_is_named_without_suggesting_pickle(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello world")
    with pytest.raises(ValueError) as info:
        lazyseq.open_npy(str(notes))
    assert str(info.value) == (
        f"open_npy: {notes} is not a .npy file (bad magic: it starts with b'hello ', a .npy file with b'\\x93NUMPY')"
    )
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    with pytest.raises(ValueError) as info:
        lazyseq.open_npy([empty])
    assert str(info.value) == f"open_npy: {empty} is not a .npy file (it is empty)"
    lazyseq.write_npy(np.zeros((3, 2)), tmp_path / "written")
    with pytest.raises(ValueError) as info:  # its manifest, for the directory
        lazyseq.open_npy(tmp_path / "written" / "manifest.json")
    assert str(info.value).endswith(
        f"; to read what write_npy wrote, open its directory: open_npy({str(tmp_path / 'written')!r}))"
    )


def test_an_npz_archive_says_how_to_open_its_arrays(tmp_path):
    archive = tmp_path / "data.npz"
    np.savez(archive, x=np.zeros((3, 2)), y=np.arange(3))
    with pytest.raises(ValueError) as info:
        lazyseq.open_npy(str(archive))
    assert str(info.value) == (
        f"open_npy: {archive} is an .npz archive, which holds several arrays (x, y); open_npy memory-maps .npy "
        "files: extract the archive (it holds one .npy file per array) and open those, or load one array into "
        f"memory with np.load({str(archive)!r})['x'] and view it with lazyseq.view()"
    )


def test_a_file_that_starts_like_a_zip_archive_but_is_none_is_named(tmp_path):
    broken = tmp_path / "broken.npy"
    broken.write_bytes(b"PK\x03\x04" + bytes(26))
    with pytest.raises(ValueError) as info:
        lazyseq.open_npy(str(broken))
    assert str(info.value) == (
        f"open_npy: {broken} is not a .npy file (it starts like a zip archive, an .npz file, but is not a readable "
        "one: File is not a zip file)"
    )


def test_an_existing_file_whose_name_looks_like_a_pattern_is_that_file(tmp_path):
    np.save(tmp_path / "a[1].npy", np.arange(3))
    np.save(tmp_path / "a1.npy", np.arange(5))
    np.testing.assert_array_equal(lazyseq.open_npy(str(tmp_path / "a[1].npy"))[:], np.arange(3))
    assert len(lazyseq.open_npy(str(tmp_path / "a[0-9].npy"))) == 5  # no such file: a pattern


MANY_SHARDS_SCRIPT = """
import gc, os, resource, sys
import numpy as np, lazyseq

folder = sys.argv[1]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 100, hard))
pairs = lazyseq.smap(lambda i: (np.full(2, i, np.float32), np.int64(i)), range(300))
written = lazyseq.write_npy(pairs, folder, rows_per_shard=1)  # 600 files, each kept open by its memory map
print(written[299][0].tolist(), int(written[299][1]), resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= open_now + 600)
del written
gc.collect()
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 100, open_now + 610))  # room for them, if not much more
opened = lazyseq.open_npy(folder)
print(len(opened))
try:
    lazyseq.open_npy(os.fsencode(folder))  # 600 more
except OSError as error:
    print(error)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_many_shards_raise_the_limit_on_open_files_or_say_it_is_too_low(tmp_path):
    # Each mapped file keeps a descriptor: past the soft limit, write_npy failed once done, and so did open_npy.
    folder = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", MANY_SHARDS_SCRIPT, str(folder)], capture_output=True, text=True, timeout=120
    )
    first, second, third = done.stdout.splitlines()
    assert (first, second, done.stderr, done.returncode) == ("[299.0, 299.0] 299 True", "300", "", 0)
    assert re.fullmatch(
        rf"open_npy: {folder}: mapping 600 files keeps 600 files open, and this process may have \d+ open at most "
        r"\(its hard limit; \d+ are open\): raise it \(ulimit -Hn\), or write fewer, larger shards",
        third,
    )


def write_npy_header(path, header, body=b""):
    """A version 1.0 ``.npy`` file of ``header`` (the text of its dict), padded as numpy pads it."""
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + body)


OPEN_IN_A_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a header read whole where it says gigabytes: an error
import lazyseq
try:
    lazyseq.open_npy(sys.argv[1])
except ValueError as error:
    print(error)
"""


def open_error_in_a_child(path):
    """What ``open_npy(path)`` says, in a process of its own (which a damaged file may kill) with 3 GiB of memory."""
    opened = subprocess.run([sys.executable, "-c", OPEN_IN_A_CHILD, path], capture_output=True, text=True, timeout=60)
    assert (opened.returncode, opened.stderr) == (0, "")
    return opened.stdout


@pytest.mark.parametrize(
    ("header", "message"),
    [
        # numpy maps values of no bytes in -1 rows, and the process dies (SIGFPE)
        (
            "{'descr': '|V0', 'fortran_order': False, 'shape': (-1,), }",
            "its header gives a negative length: shape (-1,)",
        ),
        (
            "{'descr': '<c8', 'fortran_order': False, 'shape': (2**64,), }",
            f"its header gives <c8 values of shape ({2**64},), {2**67} bytes, but 16 follow it",
        ),
        # numpy maps values of no bytes in any shape, and a batch read then copies nothing 2**41 times
        (
            "{'descr': '|V0', 'fortran_order': False, 'shape': (3, 2**40), }",
            "its values have no bytes (dtype |V0): there is nothing in them to read",
        ),
        (
            "{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }",
            "its header gives <f8 values of shape (4,), 32 bytes, but 16 follow it",
        ),
        ("{'descr': (), 'fortran_order': False, 'shape': (1,), }", "its header cannot be parsed: IndexError: "),
        ("{'descr': '>i2', 'fortran_order': True, b'shape': (3,), }", "its header cannot be parsed: TypeError: "),
    ],
    ids=["no bytes in -1 rows", "too many rows", "no bytes in many rows", "short of values", "no dtype", "a bytes key"],
)
def test_a_damaged_header_is_a_value_error_naming_the_file(tmp_path, header, message):
    path = tmp_path / "damaged.npy"
    write_npy_header(path, header.replace("2**64", str(2**64)).replace("2**40", str(2**40)), b"x" * 16)
    assert open_error_in_a_child(path).startswith(f"open_npy: cannot memory-map {path}: {message}")


def test_a_file_of_python_objects_is_refused_naming_it(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([1, "a"], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError) as raised:
        lazyseq.open_npy(path)
    assert str(raised.value) == (
        f"open_npy: cannot memory-map {path}: it holds Python objects (dtype object), pickled: they cannot be "
        "memory-mapped"
    )


def test_files_in_fortran_order_of_format_3_or_empty_read_as_numpy_reads_them(tmp_path):
    arrays = {
        "fortran": np.asfortranarray(np.arange(12.0).reshape(4, 3)),
        "format_3": np.zeros(3, dtype=[("\u00e9\u20ac", "<f4")]),  # a field name beyond latin-1: format 3.0
        "empty": np.zeros((0, 2)),
    }
    for name, array in arrays.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # numpy's note that format 3.0 needs numpy 1.17
            np.save(tmp_path / f"{name}.npy", array)
        data = lazyseq.open_npy(tmp_path / f"{name}.npy")
        assert isinstance(data.source, np.memmap)
        assert (data.source.dtype, data.source.shape) == (array.dtype, array.shape)
        np.testing.assert_array_equal(data.source, array)
        assert len(data) == len(array)
        for row, expected in zip(data, array):
            np.testing.assert_array_equal(row, expected)


def test_each_file_is_opened_once(chunks, monkeypatch):
    folder, expected = chunks
    opened = []
    real_open = open
    monkeypatch.setattr(
        "builtins.open", lambda file, *args, **kwargs: opened.append(file) or real_open(file, *args, **kwargs)
    )
    data = lazyseq.open_npy(str(folder / "data_*.npy"))
    monkeypatch.undo()
    assert sorted(map(str, opened)) == [str(folder / f"data_{k}.npy") for k in range(3)]
    np.testing.assert_array_equal(data[:9], expected)


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ((2, 0), "its header says it is 4294933792 bytes long, more than the file holds"),
        ((4, 0), "its format version is 4.0; numpy reads 1.0, 2.0, 3.0"),
    ],
)
def test_a_header_length_beyond_the_file_is_refused_before_it_is_read(tmp_path, version, message):
    path = tmp_path / "damaged.npy"  # 28 bytes saying their header is 4 GiB long: not read, allocated, first
    path.write_bytes(b"\x93NUMPY" + bytes(version) + (0xFFFF7D20).to_bytes(4, "little") + b"{" + b" " * 14 + b"\n")
    assert open_error_in_a_child(path).startswith(f"open_npy: cannot memory-map {path}: {message}")

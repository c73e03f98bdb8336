"""open_npy: memory-mapped files as one view."""

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

"""The examples run, and give the same results whoever computes them."""

import os
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def per_file_work(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import per_file_work

    return per_file_work


def run_into(module, inputs, directory, **loader):
    """The example's metadata and the bytes of every file it wrote, with ``directory`` left out of the paths."""
    os.mkdir(directory)
    metadata = module.run(inputs, str(directory), **loader)
    written = {}
    for meta in metadata:
        meta["outputs"] = [os.path.basename(path) for path in meta["outputs"]]
        written.update({name: (directory / name).read_bytes() for name in meta["outputs"]})
    assert sorted(os.listdir(directory)) == sorted(written)  # no partial file left
    return metadata, written


@pytest.mark.parametrize("method", ["thread", "process"])
def test_per_file_work_gives_the_same_files_and_metadata_in_order(per_file_work, tmp_path, method):
    inputs = per_file_work.make_inputs(str(tmp_path), 6)
    expected = run_into(per_file_work, inputs, tmp_path / "synchronous", nworkers=0)
    assert [meta["input"] for meta in expected[0]] == [f"recording{k:03d}" for k in range(6)]
    assert expected[0][1]["outputs"] == ["recording001.energy.npy", "recording001.frames.npy"]
    assert run_into(per_file_work, inputs, tmp_path / method, nworkers=2, method=method) == expected

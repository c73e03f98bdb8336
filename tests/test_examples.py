"""The examples in examples/ run, with worker threads and with worker processes."""

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("method", ["thread", "process"])
def test_per_file_workflow_collects_metadata_in_order(tmp_path, capsys, method):
    example = load_example("per_file_workflow")
    metadata = example.main(["--method", method, "--files", "6", "--folder", str(tmp_path)])
    assert [row["file"] for row in metadata] == [f"recording_{k:03d}" for k in range(6)]
    for k, row in enumerate(metadata):
        signal = np.load(tmp_path / "inputs" / f"recording_{k:03d}.npy")
        assert row["samples"] == len(signal)
        assert row["loudest_channel"] == int(np.argmax(signal.std(axis=0)))
        np.testing.assert_array_equal(np.load(row["output"]), example.spectrum(signal))
    out = capsys.readouterr().out
    assert f"recording_000: {metadata[0]['samples']} samples" in out
    assert f"6 spectra of {example.BINS * 3} values in {tmp_path / 'spectra'}" in out
    spectra = sorted(os.listdir(tmp_path / "spectra"))
    assert spectra == ["data-00000.npy", "manifest.json"]


def test_per_file_workflow_without_a_folder_does_not_name_the_one_it_removed(capsys):
    example = load_example("per_file_workflow")
    example.main(["--files", "2", "--workers", "0"])
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"2 spectra of {example.BINS * 3} values in a temporary folder (--folder DIR keeps them)"
    )

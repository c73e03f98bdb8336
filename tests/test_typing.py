"""The package type-checks: mypy, with the settings in pyproject.toml, over lazyseq/ and the typed usage examples."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typecheck import api_usage

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(
    np.lib.NumpyVersion(np.__version__) < "2.0.0", reason="the annotations are checked against numpy 2's type stubs"
)
def test_mypy_finds_no_errors():
    pytest.importorskip("mypy")
    # The files and settings come from pyproject.toml; the cache (.mypy_cache, git-ignored) makes later runs fast.
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, f"mypy reported errors:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize(
    "example",
    [
        api_usage.rows_of_an_array,
        api_usage.items_of_a_list,
        api_usage.mapped_items,
        api_usage.views_that_keep_their_items,
        api_usage.batches,
        api_usage.loaders,
        api_usage.shards,
    ],
)
def test_typed_examples_run(example):
    example()  # what the type checker reads is code that works

"""The package type-checks: mypy, with the settings in pyproject.toml, over lazyseq/ and the typed usage examples."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typecheck import api_usage

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(
    # The stubs of numpy 2.0 to 2.3 type np.arange(n) as NDArray[signedinteger[Any]]: that Any makes mypy resolve
    # the overloads of batch, view, gather... to View[Any], where tests/typecheck asserts View[np.ndarray].
    np.lib.NumpyVersion(np.__version__) < "2.4.0",
    reason="the annotations are checked against the type stubs of numpy 2.4 and later",
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
        api_usage.scores,
        api_usage.shards,
    ],
)
def test_typed_examples_run(example):
    example()  # what the type checker reads is code that works

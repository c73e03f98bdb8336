"""Pipelines for the write_npy tests, in a module of their own so that a writer in a child process runs the same."""

import hashlib
import os
import sys
import threading
from pathlib import Path

import numpy as np

import lazyseq

WIDTH = 4


def rows(n):
    """``n`` rows whose first value tells their index: row ``i`` is ``4 * i, ..., 4 * i + 3``."""
    return np.arange(n * WIDTH, dtype=np.float64).reshape(n, WIDTH)


class Transform:
    """Row ``i`` -> ``(2 * row + 1, int32 i)``; records the indexes it computes, fails or blocks at one."""

    def __init__(self, computed=None, fail_at=None, block_at=None):
        self.computed = computed
        self.fail_at = fail_at
        self.block_at = block_at

    def __call__(self, row):
        i = int(row[0]) // WIDTH
        if self.computed is not None:
            self.computed.append(i)
        if i == self.fail_at:
            raise ValueError(f"row {i} is bad")
        if i == self.block_at:  # tell the test where the writer is, then wait to be killed
            sys.stdout.write(f"blocked at {i}\n")
            sys.stdout.flush()
            threading.Event().wait()
        return 2 * row + 1, np.int32(i)


def pipeline(n, **transform):
    return lazyseq.smap(Transform(**transform), rows(n))


def contents(directory):
    """Every file in ``directory`` and the digest of its bytes."""
    return {
        name: hashlib.sha256(Path(directory, name).read_bytes()).hexdigest() for name in sorted(os.listdir(directory))
    }


if __name__ == "__main__":  # a writer to kill: python shard_helpers.py DIRECTORY N BLOCK_AT NWORKERS METHOD SYNC
    directory, n, block_at, nworkers, method, sync = sys.argv[1:]
    lazyseq.write_npy(
        pipeline(int(n), block_at=int(block_at)),
        directory,
        rows_per_shard=10,
        nworkers=int(nworkers),
        method=method,
        sync=sync == "sync",
    )

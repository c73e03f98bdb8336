"""What the benchmark scripts share: timings, summary tables, the hand-written numpy loop, collate functions."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timing:
    """Seconds per unit of work (one call, one item, one batch, one step) over the repeats."""

    best: float
    median: float


@dataclass(frozen=True)
class Result:
    """One line of the summary: how lazyseq compares with a reference measured in the same run."""

    measure: str
    lazyseq: str
    reference: str
    ratio: str


def table(header: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    """Rows aligned in columns; in markdown, a pipe table."""
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]
    if markdown:
        lines = [header, ["-" * w for w in widths], *rows]
        return "\n".join("| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths)) + " |" for line in lines)
    lines = [header, *rows]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def summary(results: list[Result]) -> str:
    """The markdown table the README shows."""
    header = ["measure", "lazyseq", "reference", "ratio"]
    return table(header, [[r.measure, r.lazyseq, r.reference, r.ratio] for r in results], True)


def stack(samples: list) -> np.ndarray:
    return np.stack(samples)


def stack_fields(samples: list) -> tuple[np.ndarray, np.ndarray]:
    """The seqtools example's collate function: one array per field."""
    return np.stack([s[0] for s in samples]), np.stack([s[1] for s in samples])


def numpy_batches(maps: list[np.ndarray], order: np.ndarray, size: int, labels: np.ndarray | None = None) -> Iterator:
    """Batches of the rows at ``order`` of the maps end to end, written by hand (``order`` holds whole batches).

    The reference every lazyseq batch is measured against: per file, the positions that fall in it, then one
    ``take`` into one output array.
    """
    # Plain ndarray views of the maps: indexing an np.memmap wraps every result in a memmap object, which costs µs.
    arrays = [np.asarray(m) for m in maps]
    lengths = np.array([len(a) for a in arrays])
    ends = np.cumsum(lengths)
    starts = ends - lengths
    for first in range(0, len(order), size):
        rows = order[first : first + size]
        part = ends.searchsorted(rows, side="right")
        local = rows - starts[part]
        out = np.empty((len(rows),) + arrays[0].shape[1:], dtype=arrays[0].dtype)
        for p, array in enumerate(arrays):
            # Methods, not np.flatnonzero and friends: at 64 items the Python wrappers cost as much as the work.
            where = (part == p).nonzero()[0]
            if len(where):
                out[where] = array.take(local[where], axis=0)  # take: quicker than array[...] for whole rows
        yield out if labels is None else (out, labels[rows])


def check_same_heads(heads: dict[str, list], equal: Callable = np.array_equal) -> None:
    """Fail loudly if the contenders' first batches differ: their timings would mean nothing.

    A batch is an array or a tuple of arrays; ``heads`` maps each contender to its first batches.
    """
    reference_name, reference = next(iter(heads.items()))
    for name, head in heads.items():
        for got, want in zip(head, reference, strict=True):
            got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
            if not all(equal(g, w) for g, w in zip(got, want, strict=True)):
                raise AssertionError(f"{name} and {reference_name} disagree on the first batches")


# The loader benchmarks' data: the demo's 18,000 x 248 samples in four memory-mapped chunks.
CHUNK_ROWS = (5000, 5000, 5000, 3000)
WIDTH = 248
N_CLASSES = 10


def write_samples(folder: str, dtype: str = "float64") -> tuple[list[str], str]:
    """``CHUNK_ROWS`` x ``WIDTH`` samples of ``dtype`` in ``.npy`` files, one per chunk, and their int64 labels.

    Each sample lies around one random center per class (of ``N_CLASSES``).
    """
    rng = np.random.default_rng(0)
    labels = rng.integers(N_CLASSES, size=sum(CHUNK_ROWS))
    means = rng.standard_normal((N_CLASSES, WIDTH)) * 3
    paths, first = [], 0
    for k, rows in enumerate(CHUNK_ROWS):
        samples = means[labels[first : first + rows]] + rng.standard_normal((rows, WIDTH))
        paths.append(os.path.join(folder, f"{dtype}_{k:02d}.npy"))
        np.save(paths[-1], samples.astype(dtype))
        first += rows
    labels_path = os.path.join(folder, "labels.npy")
    np.save(labels_path, labels)
    return paths, labels_path


# -- a costly per-sample transform --------------------------------------------------------------------


def spin(sample: np.ndarray, loops: int) -> np.ndarray:
    """Pure Python busy work (it holds the GIL): ``loops`` steps of a loop, then the sample plus 0 or 1."""
    total = 0
    for k in range(loops):
        total += k
    return sample + (total & 1)


def text_work(sample: np.ndarray, words: int) -> np.ndarray:
    """Pure Python work on text (it holds the GIL): ``words`` numbers written out, joined, split and counted."""
    text = " ".join(str(k * 7919) for k in range(words)).upper()
    return sample + (sum(len(word) for word in text.split()) & 1)


def calibrate(work: Callable[[int], object], guess: int, seconds: float) -> int:
    """The size that makes ``work(size)`` take about ``seconds`` (best of a few calls)."""
    size = guess
    for _ in range(3):
        best = min(_timed(work, size) for _ in range(5))
        size = max(1, int(size * seconds / best))
    return size


def _timed(work: Callable[[int], object], size: int) -> float:
    start = time.perf_counter()
    work(size)
    return time.perf_counter() - start

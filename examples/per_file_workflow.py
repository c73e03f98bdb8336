"""Per-file work in parallel: each input file gives output files and a row of metadata, collected in order.

    python examples/per_file_workflow.py                      # worker threads
    python examples/per_file_workflow.py --method process     # worker processes
    python examples/per_file_workflow.py --method ray         # Ray tasks, with lazyseq[ray] installed

The work is a function of one input file: read a recording (samples x
channels), write its spectrum next to the other outputs, and return what the
run should remember about it. ``lazyseq.smap`` turns the list of files into a
view of that work, and ``lazyseq.prefetch`` runs it on ``--workers``
background workers, threads or processes, or Ray tasks on the cluster that
``ray.init`` connects to: one argument changes. Results come back in the order
of the files, whichever worker finished first, and an error names the file's
position and the function that failed.

With processes the function travels to the workers (it must be importable or
picklable, as here: a module-level function and ``functools.partial``). With
Ray, every node opens the files by path, so the inputs and the output folder
must be on a filesystem that every node sees.

Then ``lazyseq.write_npy`` gathers every spectrum into ``.npy`` shards that
later runs memory-map, computed by the same workers.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

import lazyseq

BINS = 32


def make_recordings(folder: str, count: int, seed: int = 0) -> list[str]:
    """``count`` recordings of 2,000 to 4,000 samples x 3 channels, one ``.npy`` file each."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(count):
        path = os.path.join(folder, f"recording_{k:03d}.npy")
        np.save(path, rng.standard_normal((int(rng.integers(2000, 4000)), 3)))
        paths.append(path)
    return paths


def spectrum(signal: np.ndarray) -> np.ndarray:
    """Magnitude of the first ``BINS`` frequencies of each channel (``BINS x channels``)."""
    return np.abs(np.fft.rfft(signal, axis=0))[:BINS]


def process_file(path: str, output_folder: str) -> dict[str, Any]:
    """The per-file work: the recording's spectrum written to ``output_folder``, and its metadata."""
    signal = np.load(path)
    features = spectrum(signal)
    name = os.path.splitext(os.path.basename(path))[0]
    output = os.path.join(output_folder, f"{name}.spectrum.npy")
    np.save(output, features)
    return {
        "file": name,
        "samples": len(signal),
        "loudest_channel": int(np.argmax(signal.std(axis=0))),
        "output": output,
    }


def run(paths: Sequence[str], output_folder: str, method: str = "thread", nworkers: int = 2) -> list[dict[str, Any]]:
    """Process every file on ``nworkers`` workers of ``method``; the metadata in the order of ``paths``."""
    os.makedirs(output_folder, exist_ok=True)
    work = lazyseq.smap(functools.partial(process_file, output_folder=output_folder), paths)
    with lazyseq.prefetch(work, nworkers=nworkers, method=method) as results:
        return list(results)


def flat_spectrum(path: str) -> np.ndarray:
    return np.load(path).reshape(-1)


def gather_spectra(metadata: Sequence[dict[str, Any]], folder: str, method: str, nworkers: int) -> lazyseq.View:
    """Every spectrum written above, flattened, in ``.npy`` shards of 8 rows: the dataset of a later run."""
    rows = lazyseq.smap(flat_spectrum, [row["output"] for row in metadata])
    return lazyseq.write_npy(rows, folder, rows_per_shard=8, nworkers=nworkers, method=method)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="thread", choices=["thread", "process", "ray"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--files", type=int, default=20, help="how many recordings to make")
    parser.add_argument("--folder", help="where to put inputs and outputs (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or scratch
        paths = make_recordings(os.path.join(folder, "inputs"), args.files)
        metadata = run(paths, os.path.join(folder, "outputs"), args.method, args.workers)
        for row in metadata:
            print(f"{row['file']}: {row['samples']} samples, loudest channel {row['loudest_channel']}")
        spectra = gather_spectra(metadata, os.path.join(folder, "spectra"), args.method, args.workers)
        where = os.path.join(folder, "spectra") if args.folder else "a temporary folder (--folder DIR keeps them)"
        print(f"{len(spectra)} spectra of {spectra[0].shape[0]} values in {where}")
    return metadata


if __name__ == "__main__":
    main()

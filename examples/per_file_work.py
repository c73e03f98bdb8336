"""Per-file work run by threads, processes or a Ray cluster: one argument says which.

Each input file (a recording of shape ``[time, dim]``) goes through the same
function, which writes its output files and returns metadata about them; the
metadata comes back in the order of the inputs, whoever computed it.

    python examples/per_file_work.py --method thread
    python examples/per_file_work.py --method process
    python examples/per_file_work.py --method ray   # a local Ray, or the cluster that RAY_ADDRESS names

With Ray, every node must see the input and output directories at the same
path (a shared filesystem).
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile

import numpy as np

import lazyseq

FRAME = 16  # rows of a recording summarized by one output row


def process_file(path: str, output_dir: str) -> dict:
    """Frame energies and normalized frames of one recording, written as ``.npy`` files; what was written."""
    recording = np.load(path, mmap_mode="r")
    frames = np.asarray(recording[: len(recording) // FRAME * FRAME]).reshape(-1, FRAME, recording.shape[1])
    energy = (frames**2).mean(axis=(1, 2))
    normalized = (frames - frames.mean(axis=1, keepdims=True)) / (frames.std(axis=1, keepdims=True) + 1e-6)
    stem = os.path.splitext(os.path.basename(path))[0]
    outputs = {"energy": energy, "frames": normalized.astype(np.float32)}
    written = []
    for name, array in outputs.items():
        target = os.path.join(output_dir, f"{stem}.{name}.npy")
        partial = target + ".partial"  # renamed once complete: a crash never leaves a truncated output file
        with open(partial, "wb") as f:
            np.save(f, array)
        os.replace(partial, target)
        written.append(target)
    return {"input": stem, "outputs": written, "frames": len(frames), "peak_energy": float(energy.max())}


def run(inputs: list[str], output_dir: str, nworkers: int = 2, method: str = "thread") -> list[dict]:
    """The metadata of every input, in order, computed by ``nworkers`` workers of the kind ``method`` names."""
    work = lazyseq.smap(functools.partial(process_file, output_dir=output_dir), inputs)
    with lazyseq.prefetch(work, nworkers=nworkers, method=method, max_buffered=4 * max(nworkers, 1)) as results:  # type: ignore[arg-type]
        return list(results)


def make_inputs(directory: str, count: int) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for k in range(count):
        path = os.path.join(directory, f"recording{k:03d}.npy")
        np.save(path, rng.standard_normal((1000 + 37 * k, 40)))
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=["thread", "process", "ray"], default="thread")
    parser.add_argument("--nworkers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        inputs = make_inputs(directory, 12)
        output_dir = os.path.join(directory, "out")
        os.mkdir(output_dir)
        for meta in run(inputs, output_dir, args.nworkers, args.method):
            print(f"{meta['input']}: {meta['frames']} frames, peak energy {meta['peak_energy']:.3f}")


if __name__ == "__main__":
    main()

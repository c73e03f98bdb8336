"""A small MLP trained with lazyseq feeding torch: ``python -m lazyseq.torch.example``.

1. Write 18,000 x 248 samples in 4 memory-mapped ``.npy`` chunks plus labels
   (:func:`lazyseq.demo.write_dataset`), open them as one view, keep the last
   10,000 samples for testing.
2. Each epoch: the training samples shuffled (one permutation per epoch), in
   batches of 64, read by a background worker (``prefetch``) and fed to the
   model as tensors (``to_device``); an MLP 248 -> 64 -> 10 takes an SGD step.
3. Predict the test samples in chunks (``predict``, built on
   ``lazyseq.evaluate``) and report the accuracy.

Torch computes with ``cores - workers`` threads, leaving the loader's worker a
core: with torch's default (one thread per core) competing with a busy worker,
steps of this small model took over ten times longer on a 2-core machine.

Everything is seeded: the same run gives the same accuracy.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence

import numpy as np
import torch

import lazyseq
from lazyseq.demo import N_CLASSES, SAMPLE_SHAPE, write_dataset
from lazyseq.loading.options import available_cores
from lazyseq.torch import predict, to_device

__all__ = ["main", "make_model", "train_and_test"]

WORKERS = 1  # the background worker that reads the next batches


def torch_threads(workers: int = WORKERS) -> int:
    """Threads for torch that leave the loader's workers a core each (at least one thread)."""
    return max(1, available_cores() - workers)


def make_model(hidden: int = 64) -> torch.nn.Module:
    """An MLP ``248 -> hidden -> 10`` in float64, the dtype of the samples."""
    return torch.nn.Sequential(
        torch.nn.Linear(SAMPLE_SHAPE[0], hidden, dtype=torch.float64),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, N_CLASSES, dtype=torch.float64),
    )


def train_and_test(
    folder: str, n_test: int, epochs: int = 2, batch_size: int = 64, device: str = "cpu", seed: int = 0
) -> dict:
    """Train the MLP on the dataset in ``folder`` and test it; accuracy, timings and the training pipeline."""
    torch.manual_seed(seed)
    data = lazyseq.open_npy(os.path.join(folder, "data_*.npy"))
    labels = lazyseq.open_npy(os.path.join(folder, "labels.npy"))
    train = lazyseq.collate([data, labels])[:-n_test]

    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    start = time.perf_counter()
    steps = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads())  # torch's default pool would compete with the worker
    try:
        for epoch in range(epochs):
            batches = train.shuffle(seed=seed, epoch=epoch).batch(batch_size)
            with (
                lazyseq.prefetch(batches, nworkers=WORKERS, max_buffered=4) as ahead,
                to_device(ahead, device) as on_device,
            ):
                for x, y in on_device:
                    optimizer.zero_grad()
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    optimizer.step()
                    steps += 1
    finally:
        torch.set_num_threads(threads)
    train_time = time.perf_counter() - start

    start = time.perf_counter()
    scores = predict(model, data[-n_test:], batch_size=256, device=device)
    accuracy = float(np.mean(scores.argmax(axis=1) == labels[-n_test:].batch(n_test)[0]))
    test_time = time.perf_counter() - start
    return {
        "accuracy": accuracy,
        "loss": float(loss.item()),
        "steps": steps,
        "torch_threads": torch_threads(),
        "train_seconds": train_time,
        "test_seconds": test_time,
        "pipeline": batches,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the example; the command line sets the size of the data and the number of epochs."""
    parser = argparse.ArgumentParser(prog="python -m lazyseq.torch.example", description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=18_000, help="number of samples (default 18000)")
    parser.add_argument("--test", type=int, default=10_000, help="test samples, taken from the end (default 10000)")
    parser.add_argument("--epochs", type=int, default=2, help="passes over the training samples (default 2)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lazyseq-torch-example-") as folder:
        write_dataset(folder, args.samples)
        result = train_and_test(folder, n_test=args.test, epochs=args.epochs, device=args.device)
        print("training pipeline (last epoch):")
        print(result["pipeline"])
        print(
            f"training: {result['steps']} steps of SGD in {result['train_seconds']:.2f}s "
            f"(torch with {result['torch_threads']} threads), last loss {result['loss']:.4f}"
        )
        print(f"test: {args.test} samples predicted in {result['test_seconds']:.2f}s")
        print(f"accuracy: {result['accuracy']:.1%}")
        del result["pipeline"]  # holds memory maps of files about to be deleted
    return result


if __name__ == "__main__":
    main()

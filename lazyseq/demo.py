"""The seed workflow with lazyseq: memory-mapped chunks, views, incremental training, chunked evaluation.

Run it with ``python -m lazyseq.demo`` (needs scikit-learn: ``pip install lazyseq[demo]``).

1. Write ``n_samples x 248`` float samples in 4 ``.npy`` chunks plus ``labels.npy``.
2. Open them memory-mapped, join the chunks and pair samples with labels.
3. Split train/test by slicing, fit ``GaussianNB.partial_fit`` on random
   minibatches of 64, evaluate the test set in chunks of 64.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence

import numpy as np

import lazyseq

N_CLASSES = 10
SAMPLE_SHAPE = (248,)


def write_dataset(folder: str, n_samples: int, n_chunks: int = 4, seed: int = 0) -> None:
    """Write noisy samples around one random center per class, in ``n_chunks`` files, and their labels."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((N_CLASSES, *SAMPLE_SHAPE)) * 3
    labels = rng.integers(N_CLASSES, size=n_samples)
    np.save(os.path.join(folder, "labels.npy"), labels)
    for k, part in enumerate(np.array_split(np.arange(n_samples), n_chunks)):
        samples = centers[labels[part]] + rng.standard_normal((len(part), *SAMPLE_SHAPE)) * 0.1
        np.save(os.path.join(folder, f"data_{k:02d}.npy"), samples)


def run(folder: str, n_test: int, steps: int, batch_size: int = 64, seed: int = 0) -> dict:
    """Train and evaluate on the dataset in ``folder``; return accuracy and timings."""
    from sklearn.naive_bayes import GaussianNB

    data = lazyseq.open_npy(os.path.join(folder, "data_*.npy"))
    labels = lazyseq.open_npy(os.path.join(folder, "labels.npy"))
    dataset = lazyseq.collate([data, labels])
    train, test = dataset[:-n_test], dataset[-n_test:]

    # Random minibatches, drawn with replacement as in the original recipe.
    picks = np.random.default_rng(seed).integers(len(train), size=steps * batch_size)
    minibatches = train.gather(picks).batch(batch_size)

    model = GaussianNB()
    classes = np.arange(N_CLASSES)
    start = time.perf_counter()
    for x, y in minibatches:
        model.partial_fit(x, y, classes=classes)
    train_time = time.perf_counter() - start

    start = time.perf_counter()
    predictions, targets = [], []
    for x, y in test.batch(batch_size):
        predictions.append(model.predict(x))
        targets.append(y)
    eval_time = time.perf_counter() - start
    accuracy = float(np.mean(np.concatenate(predictions) == np.concatenate(targets)))
    return {"accuracy": accuracy, "train_seconds": train_time, "eval_seconds": eval_time, "pipeline": minibatches}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m lazyseq.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=18_000, help="number of samples (default 18000)")
    parser.add_argument(
        "--test",
        type=int,
        default=None,
        help="test samples, taken from the end (default 10000, or half if fewer samples)",
    )
    parser.add_argument("--steps", type=int, default=4_000, help="training minibatches (default 4000)")
    args = parser.parse_args(argv)
    if args.test is not None:
        n_test = args.test
    else:  # the original recipe keeps the last 10,000 samples for testing
        n_test = 10_000 if args.samples > 10_000 else args.samples // 2
    with tempfile.TemporaryDirectory(prefix="lazyseq-demo-") as folder:
        write_dataset(folder, args.samples)
        result = run(folder, n_test=n_test, steps=args.steps)
        print("pipeline:")
        print(result["pipeline"])
        print(f"training: {args.steps} minibatches of 64 in {result['train_seconds']:.2f}s")
        print(f"evaluation: {n_test} samples in chunks of 64 in {result['eval_seconds']:.2f}s")
        print(f"accuracy: {result['accuracy']:.1%}")
        del result["pipeline"]  # holds memory maps of files about to be deleted
    return result


if __name__ == "__main__":
    main()

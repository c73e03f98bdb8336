"""A lazyseq workflow with scikit-learn: memory-mapped chunks, views, a background loader, chunked evaluation.

Run it with ``python -m lazyseq.demo`` (needs scikit-learn: ``pip install lazyseq[demo]``).

1. Write ``n_samples x 248`` float samples in 4 ``.npy`` chunks plus ``labels.npy``.
2. Open them memory-mapped, join the chunks and pair samples with labels.
3. Split train/test by slicing; fit ``GaussianNB.partial_fit`` on random
   minibatches of 64, once drawing each minibatch when it is needed and once
   with ``load_buffers`` drawing them ahead in background workers, and print
   both times.
4. Evaluate the test set in chunks of 64 with ``lazyseq.evaluate``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

import lazyseq
from lazyseq.loading.options import Method

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


class RandomMinibatches:
    """A function for ``load_buffers``: each call returns a new minibatch ``(x, y)`` drawn at random."""

    def __init__(self, samples: lazyseq.View, size: int, seed: int) -> None:
        self.samples, self.size, self.seed = samples, size, seed
        self.generator = np.random.default_rng(seed)

    def start(self, worker_index: int) -> None:
        """Each worker draws from its own generator (forked workers would otherwise draw the same batches)."""
        self.generator = lazyseq.rng(self.seed, worker_index)

    def __call__(self) -> tuple[np.ndarray, np.ndarray]:
        picks = self.generator.integers(len(self.samples), size=self.size)  # with replacement, as in the recipe
        return self.samples.gather(picks).batch(self.size)[0]


def train(minibatches: Iterator[tuple[np.ndarray, np.ndarray]], steps: int) -> tuple[Any, float]:
    """A ``GaussianNB`` fitted on ``steps`` minibatches, and the seconds it took."""
    from sklearn.naive_bayes import GaussianNB

    from lazyseq.sklearn import fit

    start = time.perf_counter()
    model = fit(GaussianNB(), minibatches, classes=np.arange(N_CLASSES), steps=steps, progress=False)
    return model, time.perf_counter() - start


def run(
    folder: str, n_test: int, steps: int, batch_size: int = 64, nworkers: int = 2, method: Method = "process"
) -> dict:
    """Train and evaluate on the dataset in ``folder``; return accuracy and timings."""
    data = lazyseq.open_npy(os.path.join(folder, "data_*.npy"))
    labels = lazyseq.open_npy(os.path.join(folder, "labels.npy"))
    dataset = lazyseq.collate([data, labels])
    train_set, test_set = dataset[:-n_test], dataset[-n_test:]
    sampler = RandomMinibatches(train_set, batch_size, seed=0)

    # Without a loader: each minibatch is read from the memory maps when the model asks for it.
    _, seconds_alone = train(iter(sampler, None), steps)
    # With one: workers draw the next minibatches while the model trains.
    with lazyseq.load_buffers(
        sampler, max_cached=10, nworkers=nworkers, method=method, start_hook=sampler.start
    ) as minibatches:
        model, seconds_loaded = train(minibatches, steps)

    start = time.perf_counter()
    predictions, targets = lazyseq.evaluate(lambda b: (model.predict(b[0]), b[1]), test_set, batch_size=batch_size)
    eval_time = time.perf_counter() - start
    return {
        "accuracy": float(np.mean(predictions == targets)),
        "train_seconds_without_loader": seconds_alone,
        "train_seconds_with_loader": seconds_loaded,
        "eval_seconds": eval_time,
        "pipeline": train_set.gather(np.arange(min(batch_size, len(train_set)))).batch(batch_size),
    }


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
    parser.add_argument("--workers", type=int, default=2, help="background workers (default 2)")
    parser.add_argument("--method", choices=["thread", "process"], default="process", help="(default process)")
    args = parser.parse_args(argv)
    if args.test is not None:
        n_test = args.test
    else:  # the original recipe keeps the last 10,000 samples for testing
        n_test = 10_000 if args.samples > 10_000 else args.samples // 2
    if args.samples < 2 or not 1 <= n_test < args.samples:
        parser.error(f"--samples must be at least 2 and --test from 1 to samples - 1, got {args.samples} and {n_test}")
    if args.steps < 1 or args.workers < 1:
        parser.error(f"--steps and --workers must be at least 1, got {args.steps} and {args.workers}")
    with tempfile.TemporaryDirectory(prefix="lazyseq-demo-") as folder:
        write_dataset(folder, args.samples)
        result = run(folder, n_test=n_test, steps=args.steps, nworkers=args.workers, method=args.method)
        print("one minibatch:")
        print(result.pop("pipeline"))  # holds memory maps of files about to be deleted
    alone, loaded = result["train_seconds_without_loader"], result["train_seconds_with_loader"]
    print(f"training, {args.steps} minibatches of 64, each read when needed: {alone:.2f}s")
    print(
        f"training, {args.steps} minibatches of 64, load_buffers with {args.workers} {args.method} workers: "
        f"{loaded:.2f}s ({alone / loaded:.2f}x)"
    )
    print(f"evaluation: {n_test} samples in chunks of 64 in {result['eval_seconds']:.2f}s")
    print(f"accuracy: {result['accuracy']:.1%}")
    return result


if __name__ == "__main__":
    main()

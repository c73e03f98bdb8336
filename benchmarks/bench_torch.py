"""How fast lazyseq feeds torch, next to torch's own ``DataLoader`` over a per-sample Dataset.

    python benchmarks/bench_torch.py            # a few minutes
    python benchmarks/bench_torch.py --quick    # under a minute: a smoke test, numbers too rough to quote

As in ``bench_loading.py``, every comparison is a ratio of timings taken in the
same run, the contenders taking turns repeat after repeat, and each timing is
of whole runs: from creating the loader to consuming its last batch, the
start-up of its workers included, stopping it not counted (each contender
first runs once untimed, so that files are paged in and modules imported). Both
workloads read samples from four memory-mapped ``.npy`` files (18,000 x 248),
in an order fixed in advance, so that every contender gets the same batches
(checked before timing):

a. feeding a model on the CPU: a training step of an MLP 248 -> 64 -> 10
   (forward, backward, SGD) on minibatches of 64 float32 samples; lazyseq
   (views, ``prefetch``, ``to_device("cpu")``) against ``DataLoader`` with 0,
   1 or 2 workers (the best of them is the reference);
b. loader-bound: batches of 256 x 248 float64 delivered as tensors to a
   consumer that does nothing else; lazyseq with 2 threads or 2 processes and
   10 batches in flight against ``DataLoader`` with 2 workers and
   ``prefetch_factor=5``. ``to_device("cpu")`` is timed with its default
   ``ahead=2`` and with ``ahead=0``: on the CPU there is no copy to overlap,
   and batches held ahead only keep more memory in use.

A third workload holds its data as tensors in memory (the same samples,
loaded): c. shuffled minibatches of 64 float32 samples and their labels,
read in the consumer's thread, lazyseq's ``collate([X, y])`` (or
``from_dataset(TensorDataset(X, y))``) against ``DataLoader(TensorDataset(X,
y))`` with no workers, the usual way to batch tensors held in memory.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import itertools
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass

import numpy as np
import torch
from common import N_CLASSES, WIDTH, Result, Timing, check_same_heads, write_samples
from loader_timing import (
    WHOLE_RUNS,
    Loader,
    first_batches,
    load,
    measure,
    ms,
    plain,
    print_timings,
    report,
)
from torch.utils.data import DataLoader, Dataset, TensorDataset

import lazyseq
from lazyseq.torch import as_dataset, collate, from_dataset, to_device, to_tensors

HIDDEN = 64
WORKERS = 2
IN_FLIGHT = 10  # max_buffered; DataLoader: 2 workers x prefetch_factor 5
STEP_BATCH = 64
LOADER_BATCH = 256


@dataclass(frozen=True)
class Settings:
    repeats: int
    train_steps: int  # workload a, per timed run
    loader_batches: int  # workload b, per timed run


FULL = Settings(repeats=3, train_steps=2_000, loader_batches=20_000)
QUICK = Settings(repeats=1, train_steps=150, loader_batches=300)


# -- data and loaders ---------------------------------------------------------------------------


class Samples(Dataset):
    """The usual torch Dataset over memory-mapped chunks: one sample (and its label) per call."""

    def __init__(self, paths: list[str], labels_path: str | None = None) -> None:
        self.paths, self.labels_path = paths, labels_path
        self.maps = [np.load(p, mmap_mode="r") for p in paths]
        self.ends = np.cumsum([len(m) for m in self.maps]).tolist()
        self.labels = None if labels_path is None else np.load(labels_path, mmap_mode="r")

    def __len__(self) -> int:
        return self.ends[-1]

    def __getitem__(self, i: int):
        part = next(k for k, end in enumerate(self.ends) if i < end)
        start = self.ends[part - 1] if part else 0
        sample = torch.from_numpy(np.array(self.maps[part][i - start]))
        return sample if self.labels is None else (sample, int(self.labels[i]))


def epochs_order(n: int, count: int) -> np.ndarray:
    """``count`` indices: shuffled epochs over ``n`` samples one after the other (lazyseq's permutations)."""
    epochs = -(-count // n)
    perms = [lazyseq.arange(n).shuffle(seed=0, epoch=e).batch(n)[0] for e in range(epochs)]
    return np.concatenate(perms)[:count]


@contextlib.contextmanager
def lazyseq_fed(view, method: str | None, feed: str, ahead: int = 2) -> Iterator[Iterable]:
    """The view's batches as tensors: read by ``prefetch`` workers (``method``) or in this thread (None)."""
    with contextlib.ExitStack() as stack:
        batches = view
        if method is not None:
            batches = stack.enter_context(
                lazyseq.prefetch(view, nworkers=WORKERS, method=method, max_buffered=IN_FLIGHT)
            )
        if feed == "to_device":
            yield stack.enter_context(to_device(batches, "cpu", ahead=ahead))
        else:
            yield map(to_tensors, batches)


@contextlib.contextmanager
def torch_loader(dataset, order: np.ndarray, batch_size: int, workers: int, **options) -> Iterator[Iterable]:
    if workers:
        options.update(num_workers=workers, prefetch_factor=IN_FLIGHT // WORKERS)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=order.tolist(), **options)
    batches = iter(loader)
    try:
        yield batches
    finally:
        if workers:
            batches._shutdown_workers()  # as its __del__ does; here at once, even when not read to the end
        del batches


# -- a. feeding a model on the CPU ---------------------------------------------------------------


def bench_training(settings: Settings) -> list[Result]:
    n = settings.train_steps
    with tempfile.TemporaryDirectory() as folder:
        paths, labels_path = write_samples(folder, "float32")
        samples = lazyseq.collate([lazyseq.open_npy(paths), lazyseq.open_npy(labels_path)])
        order = epochs_order(len(samples), n * STEP_BATCH)
        per_sample = Samples(paths, labels_path)
        model: list = []

        def fresh(loader: Callable[[int], ContextManager[Iterable]]) -> Loader:
            def open_loader(k: int):
                torch.manual_seed(0)
                net = torch.nn.Sequential(
                    torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, N_CLASSES)
                )
                model[:] = [net, torch.optim.SGD(net.parameters(), lr=0.01), torch.nn.CrossEntropyLoss()]
                return loader(k)

            return open_loader

        def step(batch) -> None:
            net, optimizer, loss_fn = model
            x, y = batch
            optimizer.zero_grad()
            loss_fn(net(x), y).backward()
            optimizer.step()

        def view(k: int):
            return samples.gather(order[: k * STEP_BATCH]).batch(STEP_BATCH)

        pool = [to_tensors(b) for b in view(64)]  # in memory, cycled: the model's steps alone

        def rows(k: int) -> np.ndarray:
            return order[: k * STEP_BATCH]

        loaders: dict[str, Loader] = {
            "model alone (batches in memory)": fresh(lambda k: plain(itertools.islice(itertools.cycle(pool), k))),
            "lazyseq synchronous + to_tensors": fresh(lambda k: lazyseq_fed(view(k), None, "to_tensors")),
            "lazyseq prefetch threads + to_device": fresh(lambda k: lazyseq_fed(view(k), "thread", "to_device")),
            "lazyseq prefetch processes + to_device": fresh(lambda k: lazyseq_fed(view(k), "process", "to_device")),
            "DataLoader(as_dataset(view)), 0 workers": fresh(
                lambda k: torch_loader(as_dataset(samples), rows(k), STEP_BATCH, 0, collate_fn=collate)
            ),
        }
        for workers in (0, 1, 2):
            loaders[f"DataLoader per-sample, {workers} workers"] = fresh(
                lambda k, workers=workers: torch_loader(per_sample, rows(k), STEP_BATCH, workers)
            )
        check_same_heads(first_batches({name: ld for name, ld in loaders.items() if "alone" not in name}))
        timings = measure(loaders, n, settings.repeats, consume=step)
    alone = timings["model alone (batches in memory)"]
    print_timings(
        f"a. Training an MLP {WIDTH} -> {HIDDEN} -> {N_CLASSES} on the CPU: {n:,} SGD steps on minibatches of "
        f"{STEP_BATCH} float32 samples drawn from memory maps in shuffled epochs",
        timings,
        "step",
        lambda t: f"{t.best / alone.best:.2f} x model alone",
    )
    lazy_names = [name for name in timings if name.startswith("lazyseq") and "synchronous" not in name]
    torch_names = [name for name in timings if name.startswith("DataLoader per-sample")]
    lazy_name = min(lazy_names, key=lambda name: timings[name].best)
    torch_name = min(torch_names, key=lambda name: timings[name].best)
    lazy, other = timings[lazy_name], timings[torch_name]
    sync = next(timings[name] for name in timings if name.startswith("lazyseq synchronous"))
    return [
        Result(
            f"a. MLP training step, {lazy_name.removeprefix('lazyseq ')} vs best DataLoader",
            ms(lazy.best) + "/step",
            f"{torch_name.removeprefix('DataLoader ')} {ms(other.best)}/step",
            f"{other.best / lazy.best:.2f}",
        ),
        Result(
            "a. MLP training step, best lazyseq loader vs model alone",
            ms(lazy.best) + "/step",
            f"alone {ms(alone.best)}/step",
            f"{lazy.best / alone.best:.2f} x alone",
        ),
        Result(
            "a. MLP training step, lazyseq synchronous vs model alone",
            ms(sync.best) + "/step",
            f"alone {ms(alone.best)}/step",
            f"{sync.best / alone.best:.2f} x alone",
        ),
    ]


# -- b. loader-bound ---------------------------------------------------------------------------------


def bench_loader_bound(settings: Settings) -> list[Result]:
    n = settings.loader_batches
    with tempfile.TemporaryDirectory() as folder:
        paths, _ = write_samples(folder, "float64")
        data = lazyseq.open_npy(paths)
        order = np.random.default_rng(1).integers(len(data), size=n * LOADER_BATCH)
        per_sample = Samples(paths)
        batch_bytes = LOADER_BATCH * WIDTH * 8

        def view(k: int):
            return data.gather(order[: k * LOADER_BATCH]).batch(LOADER_BATCH)

        def rows(k: int) -> np.ndarray:
            return order[: k * LOADER_BATCH]

        loaders: dict[str, Loader] = {
            "lazyseq synchronous + to_tensors": lambda k: lazyseq_fed(view(k), None, "to_tensors"),
            "lazyseq prefetch threads + to_tensors": lambda k: lazyseq_fed(view(k), "thread", "to_tensors"),
            "lazyseq prefetch processes + to_tensors": lambda k: lazyseq_fed(view(k), "process", "to_tensors"),
            "lazyseq prefetch processes + to_device": lambda k: lazyseq_fed(view(k), "process", "to_device"),
            "lazyseq prefetch processes + to_device, ahead=0": lambda k: lazyseq_fed(
                view(k), "process", "to_device", ahead=0
            ),
            "DataLoader(as_dataset(view)), 2 workers": lambda k: torch_loader(
                as_dataset(data), rows(k), LOADER_BATCH, WORKERS, collate_fn=collate
            ),
            "DataLoader per-sample, 2 workers": lambda k: torch_loader(per_sample, rows(k), LOADER_BATCH, WORKERS),
        }
        check_same_heads(first_batches(loaders))
        timings = measure(loaders, n, settings.repeats, consume=lambda batch: None, warm_units=50)

    def speed(t: Timing) -> str:
        return f"{batch_bytes / t.best / 1e9:.2f} GB/s (best)"

    spec = "" if n >= 20_000 else f" ({n:,} rather than 20,000 per run)"
    print_timings(
        f"b. Loader-bound{spec}: random batches of {LOADER_BATCH} x {WIDTH} float64 from memory maps, "
        f"delivered as tensors to a consumer that does nothing; {WORKERS} workers, {IN_FLIGHT} batches in flight",
        timings,
        "batch",
        speed,
    )
    other = timings["DataLoader per-sample, 2 workers"]
    results = []
    for method in ("threads", "processes"):
        lazy = timings[f"lazyseq prefetch {method} + to_tensors"]
        results.append(
            Result(
                f"b. loader-bound, {method} vs DataLoader per-sample",
                f"{batch_bytes / lazy.best / 1e9:.2f} GB/s",
                f"torch {batch_bytes / other.best / 1e9:.2f} GB/s",
                f"{other.best / lazy.best:.2f}",
            )
        )
    fast = timings["DataLoader(as_dataset(view)), 2 workers"]
    results.append(
        Result(
            "b. loader-bound, DataLoader over as_dataset vs per-sample",
            f"{batch_bytes / fast.best / 1e9:.2f} GB/s",
            f"torch {batch_bytes / other.best / 1e9:.2f} GB/s",
            f"{other.best / fast.best:.2f}",
        )
    )
    return results


# -- c. tensors in memory ------------------------------------------------------------------------


def bench_tensors(settings: Settings) -> list[Result]:
    n = settings.train_steps
    with tempfile.TemporaryDirectory() as folder:
        paths, labels_path = write_samples(folder, "float32")
        X = torch.from_numpy(np.concatenate([np.load(p) for p in paths]))
        y = torch.from_numpy(np.load(labels_path))
    order = epochs_order(len(X), n * STEP_BATCH)

    def view(k: int):
        return lazyseq.collate([X, y]).gather(order[: k * STEP_BATCH]).batch(STEP_BATCH)

    def dataset_view(k: int):
        return from_dataset(TensorDataset(X, y)).gather(order[: k * STEP_BATCH]).batch(STEP_BATCH)

    loaders: dict[str, Loader] = {
        "lazyseq collate([X, y]), synchronous": lambda k: plain(view(k)),
        "lazyseq from_dataset(TensorDataset), synchronous": lambda k: plain(dataset_view(k)),
        "DataLoader(TensorDataset), 0 workers": lambda k: torch_loader(
            TensorDataset(X, y), order[: k * STEP_BATCH], STEP_BATCH, 0
        ),
    }
    check_same_heads(first_batches(loaders))
    timings = measure(loaders, n, settings.repeats, consume=lambda batch: None)
    lazy, other = timings["lazyseq collate([X, y]), synchronous"], timings["DataLoader(TensorDataset), 0 workers"]
    print_timings(
        f"c. Tensors in memory: {n:,} shuffled minibatches of {STEP_BATCH} float32 samples ({WIDTH} values) and "
        "their labels, read in the consumer's thread",
        timings,
        "batch",
        lambda t: f"{other.best / t.best:.2f} x DataLoader's speed",
    )
    return [
        Result(
            "c. tensors in memory, lazyseq collate vs DataLoader(TensorDataset)",
            ms(lazy.best) + "/batch",
            f"torch {ms(other.best)}/batch",
            f"{other.best / lazy.best:.2f}",
        )
    ]


# -- main ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run, as a smoke test")
    parser.add_argument("--only", choices=("a", "b", "c"), help="run one workload")
    parser.add_argument("--loader-batches", type=int, help="batches per timed run in workload b (default 20000)")
    parser.add_argument("--repeats", type=int, help="timed runs per contender")
    args = parser.parse_args()
    # One thread for the model: its step is too small to gain from two, and two OpenMP threads on two cores
    # shared with loader workers (and other programs) wait for each other: steps measured 0.3 ms or 70 ms.
    torch.set_num_threads(1)
    settings = QUICK if args.quick else FULL
    if args.loader_batches:
        settings = dataclasses.replace(settings, loader_batches=args.loader_batches)
    if args.repeats:
        settings = dataclasses.replace(settings, repeats=args.repeats)
    print(
        f"lazyseq {lazyseq.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"numpy {np.__version__}, {os.cpu_count()} cores"
    )
    print(f"{settings.repeats} repeats per timing, contenders taking turns; ratios use the best repeat")
    print(f"In every workload, {WHOLE_RUNS}")
    print(f"load average before: {load()}")
    started = time.perf_counter()
    results: list[Result] = []
    workloads = {"a": bench_training, "b": bench_loader_bound, "c": bench_tensors}
    for name, workload in workloads.items():
        if args.only in (None, name):
            results += workload(settings)
            gc.collect()
    report(results, started)


if __name__ == "__main__":
    main()

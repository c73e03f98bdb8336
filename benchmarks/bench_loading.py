"""How fast lazyseq's background loaders are, next to seqtools 1.4.1, torch's DataLoader and plain loops.

    python benchmarks/bench_loading.py            # a few minutes
    python benchmarks/bench_loading.py --quick    # about a minute: a smoke test, numbers too rough to quote
    python benchmarks/bench_loading.py --only 3   # one workload

Every tool gets 2 workers and 10 items in flight, and lazyseq's loaders their
default settings unless a row says otherwise. As in ``bench_views.py``, every
comparison is a ratio of timings taken in the same run, the contenders taking
turns (see :func:`loader_timing.measure`). Every timing is of whole runs as a
user waits for them: from creating the loader to consuming its last batch, the
start-up of its workers included; the time to stop the loader afterwards is
not counted. Each contender first runs once untimed, so that files are paged in
and modules imported, which a program pays for once, not per loader. Five
workloads:

1. loader-bound: random batches of 256 rows from 18,000 x 248 float64 samples
   in four memory-mapped ``.npy`` files, read by a consumer that does nothing;
2. a training loop: ``GaussianNB.partial_fit`` on random batches of 64, where
   a good loader costs the consumer (almost) nothing;
3. a costly per-sample transform, pure Python (holds the GIL: processes; an
   integer loop, and work on text) or numpy (releases it: threads): speedup
   over reading synchronously, next to
   two workers that split the batches with no loader at all, and (processes)
   next to a hand-written loader that does the least a loader can do; and the loader
   placed under ``shuffle().batch()`` (over the samples), against that
   shuffled pipeline read synchronously;
4. overlap: producer and consumer each take 5 ms a batch (both sleep), 300
   batches. The ideal is one producer step plus 300 consumer steps: the first
   batch cannot be consumed before it is made, and from then on two workers,
   each making a batch in 5 ms, keep ahead of a consumer taking 5 ms a batch,
   so it never waits;
5. time from creating a loader to holding its first batch: the start-up itself;
6. cheap items read one by one (1 to 5 us an item), where a loader cannot help;
7. items slow now and then: every fourth item waits 2 ms (the GIL free, as a
   file read would leave it), the others are a numpy addition.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import itertools
import logging
import multiprocessing
import os
import pickle
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from importlib.metadata import version

import numpy as np
import seqtools
from common import (
    N_CLASSES,
    WIDTH,
    Result,
    Timing,
    calibrate,
    check_same_heads,
    numpy_batches,
    spin,
    stack,
    stack_fields,
    text_work,
    write_samples,
)
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

import lazyseq

# torch and scikit-learn are imported where they are used: a spawned worker re-imports this module,
# and should pay only for what a user's script would import.

WORKERS = 2
IN_FLIGHT = 10  # max_buffered, max_cached, 2 workers x prefetch_factor 5
LOADER_BATCH = 256
FIT_BATCH = 64
TRANSFORM_BATCH = 32
SAMPLE_SECONDS = 1e-3  # cost of the per-sample transform in workload 3
STEP_SECONDS = 5e-3  # producer and consumer cost per batch in workload 4
OPT_IN_INLINE = 0.00025  # inline_below that opts processes into computing cheap items in the reader


@dataclass(frozen=True)
class Settings:
    repeats: int
    loader_batches: int  # workload 1, per timed run
    fit_steps: int  # workload 2
    transform_batches: int  # workload 3
    overlap_batches: int  # workload 4
    first_batch_repeats: int  # workload 5
    cheap_items: int  # workload 6, per timed run
    mixed_items: int  # workload 7, per timed run


FULL = Settings(
    repeats=5,
    loader_batches=5_000,
    fit_steps=4_000,
    transform_batches=40,
    overlap_batches=300,
    first_batch_repeats=7,
    cheap_items=20_000,
    mixed_items=400,
)
# A smoke test: every contender runs, on too little work for its numbers to mean much (workload 4's ratio to the
# ideal, over 60 batches, weighs start-up five times as much as over 300).
QUICK = Settings(
    repeats=1,
    loader_batches=300,
    fit_steps=300,
    transform_batches=4,
    overlap_batches=60,
    first_batch_repeats=2,
    cheap_items=2_000,
    mixed_items=80,
)


# -- timing -----------------------------------------------------------------------


def same_batches(loaders: dict[str, Loader], count: int = 2) -> None:
    """Fail loudly if the contenders do not produce the same first batches: their timings would mean nothing."""
    check_same_heads(first_batches(loaders, count), equal=np.allclose)


# -- loaders ----------------------------------------------------------------------------


@contextlib.contextmanager
def lazyseq_prefetch(view, method: str, **options) -> Iterator[Iterable]:
    """lazyseq's prefetch at its defaults (10 items ahead, or up to 32 quick ones with processes), unless given."""
    with lazyseq.prefetch(view, nworkers=WORKERS, method=method, **options) as ahead:
        yield ahead


@contextlib.contextmanager
def seqtools_prefetch(seq, method: str, shm_size: int = 0) -> Iterator[Iterable]:
    # seqtools has no close(): its workers stop when the prefetch object is garbage collected.
    ahead = seqtools.prefetch(seq, nworkers=WORKERS, method=method, max_buffered=IN_FLIGHT, shm_size=shm_size)
    try:
        yield ahead
    finally:
        del ahead


@contextlib.contextmanager
def torch_loader(dataset, **options) -> Iterator[Iterable]:
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, num_workers=WORKERS, prefetch_factor=IN_FLIGHT // WORKERS, **options)
    batches = iter(loader)
    try:
        yield batches
    finally:
        batches._shutdown_workers()  # as its __del__ does; here at once, even when not read to the end
        del batches


def seqtools_shm_size(batch_bytes: int) -> int:
    """Room for every buffered batch (seqtools splits ``shm_size`` into ``max_buffered`` slots), plus 1/8."""
    return IN_FLIGHT * (batch_bytes + batch_bytes // 8 + 4096)


# -- results ----------------------------------------------------------------------


# -- data -------------------------------------------------------------------------


class MapBatches:
    """A map-style torch Dataset whose item ``b`` is batch ``b`` (used with ``batch_size=None``)."""

    def __init__(self, maps: list[np.ndarray], order: np.ndarray, size: int, tensors: bool = False) -> None:
        self.maps, self.order, self.size, self.tensors = maps, order, size, tensors

    def __len__(self) -> int:
        return len(self.order) // self.size

    def __getitem__(self, b: int):
        rows = self.order[b * self.size : (b + 1) * self.size]
        batch = next(numpy_batches(self.maps, rows, self.size))
        if self.tensors:
            import torch

            return torch.from_numpy(batch)
        return batch


# -- 1. loader-bound: random batches from memory maps --------------------------------------

OPT_IN = f"lazyseq prefetch processes, inline_below={OPT_IN_INLINE}"
TEN_AHEAD = f"lazyseq prefetch processes, max_buffered={IN_FLIGHT}"


def bench_loader_bound(paths: list[str], settings: Settings) -> list[Result]:
    n = settings.loader_batches
    maps = [np.load(p, mmap_mode="r") for p in paths]
    data = lazyseq.open_npy(paths)
    order = np.random.default_rng(1).integers(len(data), size=n * LOADER_BATCH)
    batch_bytes = LOADER_BATCH * WIDTH * 8
    concat = seqtools.concatenate(maps)

    def rows(k: int) -> np.ndarray:
        return order[: k * LOADER_BATCH]

    def view(k: int):
        return data.gather(rows(k)).batch(LOADER_BATCH)

    def seqtools_view(k: int):
        return seqtools.batch(seqtools.gather(concat, rows(k)), LOADER_BATCH, collate_fn=stack)

    loaders: dict[str, Loader] = {
        "numpy loop": lambda k: plain(numpy_batches(maps, rows(k), LOADER_BATCH)),
        "lazyseq synchronous": lambda k: plain(view(k)),
        "lazyseq prefetch threads": lambda k: lazyseq_prefetch(view(k), "thread"),
        "lazyseq prefetch processes": lambda k: lazyseq_prefetch(view(k), "process"),
        OPT_IN: lambda k: lazyseq_prefetch(view(k), "process", inline_below=OPT_IN_INLINE),
        TEN_AHEAD: lambda k: lazyseq_prefetch(view(k), "process", max_buffered=IN_FLIGHT),
        "seqtools prefetch threads": lambda k: seqtools_prefetch(seqtools_view(k), "thread"),
        "seqtools prefetch processes": lambda k: seqtools_prefetch(
            seqtools_view(k), "process", seqtools_shm_size(batch_bytes)
        ),
        "torch DataLoader": lambda k: torch_loader(MapBatches(maps, rows(k), LOADER_BATCH), batch_size=None),
        "torch DataLoader, tensors": lambda k: torch_loader(
            MapBatches(maps, rows(k), LOADER_BATCH, tensors=True), batch_size=None
        ),
    }
    same_batches(loaders)
    for method, plural in (("thread", "threads"), ("process", "processes")):  # what two cores give, no hand-over
        loaders[f"two independent {plural}, no loader"] = lambda k, method=method: independent_workers(view(k), method)
    timings = measure(loaders, n, settings.repeats, warm_units=50)

    def speed(t: Timing) -> str:
        return f"{batch_bytes / t.best / 1e9:.2f} GB/s (best)"

    spec = "" if n >= 20_000 else f" ({n:,} rather than 20,000 per run, to keep the whole run short)"
    print_timings(
        f"1. Loader-bound{spec}: {n:,} random batches of {LOADER_BATCH} x {WIDTH} float64 from memory maps, "
        "consumer does nothing; whole runs, start-up included. lazyseq with its defaults: processes compute "
        f"every batch in a worker, threads compute batches under 0.25 ms in the reader; '{OPT_IN}' opts "
        f"processes into that too; with processes lazyseq keeps up to 32 batches this quick ahead, '{TEN_AHEAD}' "
        "10 as the others do",
        timings,
        "batch",
        speed,
    )
    hand, sync = timings["numpy loop"], timings["lazyseq synchronous"]
    results = []
    for method in ("threads", "processes"):
        lazy = timings[f"lazyseq prefetch {method}"]
        other = timings[f"seqtools prefetch {method}"]
        gbs = f"{batch_bytes / lazy.best / 1e9:.2f} GB/s"
        results += [
            Result(
                f"1. loader-bound, {method} vs synchronous",
                gbs,
                f"sync {batch_bytes / sync.best / 1e9:.2f} GB/s",
                f"{sync.best / lazy.best:.2f}",
            ),
            Result(
                f"1. loader-bound, {method} vs numpy loop",
                gbs,
                f"numpy {batch_bytes / hand.best / 1e9:.2f} GB/s",
                f"{hand.best / lazy.best:.2f}",
            ),
            Result(
                f"1. loader-bound, {method} vs seqtools",
                gbs,
                f"seqtools {batch_bytes / other.best / 1e9:.2f} GB/s",
                f"{other.best / lazy.best:.2f}",
            ),
        ]
    torch_best = min(timings["torch DataLoader"].best, timings["torch DataLoader, tensors"].best)
    lazy, opted, ten = timings["lazyseq prefetch processes"], timings[OPT_IN], timings[TEN_AHEAD]
    for method in ("threads", "processes"):
        limit = timings[f"two independent {method}, no loader"]
        results.append(
            Result(
                f"1. loader-bound, two independent {method} (no loader) vs synchronous",
                f"{batch_bytes / limit.best / 1e9:.2f} GB/s",
                f"sync {batch_bytes / sync.best / 1e9:.2f} GB/s",
                f"{sync.best / limit.best:.2f}",
            )
        )
    results += [
        Result(
            "1. loader-bound, processes vs torch DataLoader",
            f"{batch_bytes / lazy.best / 1e9:.2f} GB/s",
            f"torch {batch_bytes / torch_best / 1e9:.2f} GB/s",
            f"{torch_best / lazy.best:.2f}",
        ),
        Result(
            f"1. loader-bound, processes with max_buffered={IN_FLIGHT} vs synchronous",
            f"{batch_bytes / ten.best / 1e9:.2f} GB/s",
            f"sync {batch_bytes / sync.best / 1e9:.2f} GB/s",
            f"{sync.best / ten.best:.2f}",
        ),
        Result(
            f"1. loader-bound, processes with inline_below={OPT_IN_INLINE} vs synchronous",
            f"{batch_bytes / opted.best / 1e9:.2f} GB/s",
            f"sync {batch_bytes / sync.best / 1e9:.2f} GB/s",
            f"{sync.best / opted.best:.2f}",
        ),
    ]
    return results


# -- 2. a training loop: GaussianNB.partial_fit ----------------------------------------------


class RandomBatches:
    """``func`` for load_buffers: a batch of ``size`` samples drawn at random with ``np.random``.

    Worker processes reseed ``np.random`` from the loader's ``seed``, so no two of them draw the same batches.
    """

    def __init__(self, samples, size: int) -> None:
        self.samples, self.size = samples, size

    def __call__(self):
        picks = np.random.randint(len(self.samples), size=self.size)
        return self.samples.gather(picks).batch(self.size)[0]


@contextlib.contextmanager
def lazyseq_buffers(func, method: str, steps: int) -> Iterator[Iterable]:
    with lazyseq.load_buffers(func, max_cached=IN_FLIGHT, nworkers=WORKERS, method=method, seed=0) as batches:
        yield itertools.islice(batches, steps)


def bench_training_loop(paths: list[str], labels_path: str, settings: Settings) -> list[Result]:
    from sklearn.naive_bayes import GaussianNB

    n = settings.fit_steps
    maps = [np.load(p, mmap_mode="r") for p in paths]
    labels = np.load(labels_path)
    data = lazyseq.open_npy(paths)
    train = lazyseq.collate([data, labels])
    order = np.random.default_rng(2).integers(len(data), size=n * FIT_BATCH)
    classes = np.arange(N_CLASSES)
    # In-memory batches for the consumer alone, cycled: a pool as large as the loaders' slots would be
    # unfair to them (it stays in cache), one batch per step would take half a gigabyte.
    pool = [tuple(np.array(a) for a in b) for b in train.gather(order[: 256 * FIT_BATCH]).batch(FIT_BATCH)]
    model: list = []

    def fit(batch) -> None:
        model[0].partial_fit(batch[0], batch[1], classes=classes)

    def fresh(loader: Callable[[int], ContextManager[Iterable]]) -> Loader:
        def open_loader(k: int):
            model[:] = [GaussianNB()]
            return loader(k)

        return open_loader

    def view(k: int):
        return train.gather(order[: k * FIT_BATCH]).batch(FIT_BATCH)

    def seqtools_view(k: int):
        samples = seqtools.collate([seqtools.concatenate(maps), labels])
        return seqtools.batch(seqtools.gather(samples, order[: k * FIT_BATCH]), FIT_BATCH, collate_fn=stack_fields)

    func = RandomBatches(train, FIT_BATCH)
    batch_bytes = FIT_BATCH * (WIDTH * 8 + 8)
    loaders = {
        "consumer alone": fresh(lambda k: plain(itertools.islice(itertools.cycle(pool), k))),
        "lazyseq synchronous": fresh(lambda k: plain(view(k))),
        "lazyseq load_buffers processes": fresh(lambda k: lazyseq_buffers(func, "process", k)),
        "lazyseq load_buffers threads": fresh(lambda k: lazyseq_buffers(func, "thread", k)),
        "lazyseq prefetch threads": fresh(lambda k: lazyseq_prefetch(view(k), "thread")),
        "lazyseq prefetch processes": fresh(lambda k: lazyseq_prefetch(view(k), "process")),
        "seqtools prefetch processes": fresh(
            lambda k: seqtools_prefetch(seqtools_view(k), "process", seqtools_shm_size(batch_bytes))
        ),
    }
    timings = measure(loaders, n, settings.repeats, consume=fit)
    alone = timings["consumer alone"]

    def ratio(t: Timing) -> str:
        return f"{t.best / alone.best:.3f} x consumer alone"

    print_timings(
        f"2. Training loop: {n:,} GaussianNB.partial_fit steps on random batches of {FIT_BATCH} "
        "(seqtools 1.4.1 has no load_buffers: its prefetch reads pre-drawn batches)",
        timings,
        "step",
        ratio,
    )
    background = [name for name in timings if name.startswith("lazyseq") and "synchronous" not in name]
    best = min(background, key=lambda name: timings[name].best)
    lazy, other = timings[best], timings["seqtools prefetch processes"]
    return [
        Result(
            f"2. partial_fit loop, best loader ({best.removeprefix('lazyseq ')})",
            ms(lazy.best) + "/step",
            f"alone {ms(alone.best)}/step",
            f"{lazy.best / alone.best:.3f}",
        ),
        Result(
            "2. partial_fit loop, seqtools prefetch processes",
            ms(lazy.best) + "/step",
            f"seqtools {ms(other.best)}/step",
            f"{other.best / alone.best:.3f} vs alone",
        ),
    ]


# -- 3. a costly per-sample transform ----------------------------------------------------------


def ufunc_work(sample: np.ndarray, values: np.ndarray, every: int) -> np.ndarray:
    """Numpy busy work that releases the GIL: a ufunc over a large array, then a reduction."""
    return sample + np.sin(values + sample[0]).reshape(-1, every).sum(axis=1)[: len(sample)]


class TransformedSamples:
    """A per-sample torch Dataset: ``transform(samples[i])``."""

    def __init__(self, samples: np.ndarray, transform) -> None:
        self.samples, self.transform = samples, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        return self.transform(self.samples[i])


@contextlib.contextmanager
def independent_workers(view, method: str) -> Iterator[Iterable]:
    """No loader at all: two threads or processes each compute half the batches, nothing handed over.

    Timed from starting them to both being done, as a loader is timed from its start to its last batch; it yields
    nothing (the batches stay where they were made).
    """
    halves = [range(k, len(view), WORKERS) for k in range(WORKERS)]
    if method == "thread":
        workers = [threading.Thread(target=compute_all, args=(view, half)) for half in halves]
    else:
        context = multiprocessing.get_context("fork")
        workers = [context.Process(target=compute_all, args=(view, half)) for half in halves]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    yield []


def compute_all(view, positions: range) -> None:
    for i in positions:
        view[i]


@contextlib.contextmanager
def hand_written_loader(view) -> Iterator[Iterable]:
    """The least a process loader does: two forked workers, each computing every other batch and sending it
    pickled through a pipe of its own, read in order. Nothing else: no task messages, no shared memory, no
    checks (a worker that dies hangs the reader)."""
    context = multiprocessing.get_context("fork")
    pipes = [context.Pipe(duplex=False) for _ in range(WORKERS)]
    workers = [
        context.Process(target=send_all, args=(view, range(k, len(view), WORKERS), pipes[k][1]), daemon=True)
        for k in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    for _, sending in pipes:
        sending.close()
    try:
        yield (pickle.loads(pipes[i % WORKERS][0].recv_bytes()) for i in range(len(view)))
    finally:
        for worker in workers:
            worker.kill()
            worker.join()
        for receiving, _ in pipes:
            receiving.close()


def send_all(view, positions: range, pipe) -> None:
    for i in positions:
        pipe.send_bytes(pickle.dumps(view[i], protocol=pickle.HIGHEST_PROTOCOL))


def bench_transforms(settings: Settings) -> list[Result]:
    n = settings.transform_batches
    samples = np.random.default_rng(3).standard_normal((n * TRANSFORM_BATCH, 8))
    loops = calibrate(lambda size: spin(samples[0], size), 20_000, SAMPLE_SECONDS)
    words = calibrate(lambda size: text_work(samples[0], size), 5_000, SAMPLE_SECONDS)
    every = 8
    block = calibrate(lambda size: ufunc_work(samples[0], np.ones(size * every), every), 5_000, SAMPLE_SECONDS)
    values = np.random.default_rng(4).standard_normal(block * every)
    transforms = {
        "pure Python (holds the GIL)": (functools.partial(spin, loops=loops), "process"),
        "pure Python on text": (functools.partial(text_work, words=words), "process"),
        "numpy (releases the GIL)": (functools.partial(ufunc_work, values=values, every=every), "thread"),
    }
    results = []
    for label, (transform, method) in transforms.items():

        def view(k: int, transform=transform):
            return lazyseq.smap(transform, samples[: k * TRANSFORM_BATCH]).batch(TRANSFORM_BATCH)

        def seqtools_view(k: int, transform=transform):
            return seqtools.batch(
                seqtools.smap(transform, samples[: k * TRANSFORM_BATCH]), TRANSFORM_BATCH, collate_fn=stack
            )

        plural = {"thread": "threads", "process": "processes"}[method]
        loaders: dict[str, Loader] = {
            "synchronous": lambda k, view=view: plain(view(k)),
            f"lazyseq prefetch {plural}": lambda k, view=view, method=method: lazyseq_prefetch(view(k), method),
            f"seqtools prefetch {plural}": lambda k, seqtools_view=seqtools_view, method=method: seqtools_prefetch(
                seqtools_view(k), method
            ),
        }
        if method == "process":
            loaders["torch DataLoader"] = lambda k, transform=transform: torch_loader(
                TransformedSamples(samples[: k * TRANSFORM_BATCH], transform), batch_size=TRANSFORM_BATCH
            )
            loaders["hand-written loader"] = lambda k, view=view: hand_written_loader(view(k))
        same_batches(loaders)
        loaders[f"two independent {plural}, no loader"] = lambda k, view=view, method=method: independent_workers(
            view(k), method
        )
        timings = measure(loaders, n, settings.repeats, warm_units=2)
        sync = timings["synchronous"]
        print_timings(
            f"3. Per-sample transform, {label}: ~{SAMPLE_SECONDS * 1e3:.0f} ms a sample, "
            f"{n} batches of {TRANSFORM_BATCH}",
            timings,
            "batch",
            lambda t, sync=sync: f"{sync.best / t.best:.2f}x synchronous",
        )
        below = measure_prefetch_below_a_shuffle(samples, transform, method, n, settings, label)
        lazy = timings[f"lazyseq prefetch {plural}"]
        limit = timings.pop(f"two independent {plural}, no loader")
        hand = timings.pop("hand-written loader", None)
        references = [name for name in timings if name not in ("synchronous", f"lazyseq prefetch {plural}")]
        results += [
            Result(
                f"3. {label}, {plural}: speedup",
                f"{sync.best / lazy.best:.2f}x",
                ", ".join(f"{name.split()[0]} {sync.best / timings[name].best:.2f}x" for name in references),
                f"{sync.best / lazy.best:.2f}",
            ),
            Result(
                f"3. {label}, {plural}: vs two independent workers",
                f"{sync.best / lazy.best:.2f}x",
                f"2 independent {plural} {sync.best / limit.best:.2f}x",
                f"{limit.best / lazy.best:.2f}",
            ),
        ]
        if hand is not None:
            results.append(
                Result(
                    f"3. {label}, {plural}: vs a hand-written loader",
                    f"{sync.best / lazy.best:.2f}x",
                    f"hand-written {sync.best / hand.best:.2f}x",
                    f"{hand.best / lazy.best:.2f}",
                )
            )
        results.append(below)
    return results


@contextlib.contextmanager
def prefetch_below_a_shuffle(samples, method: str) -> Iterator[Iterable]:
    """lazyseq's prefetch over the samples, shuffled and batched above it: each batch's samples go out together."""
    with lazyseq.prefetch(samples, nworkers=WORKERS, method=method) as ahead:
        yield ahead.shuffle(seed=0).batch(TRANSFORM_BATCH)


def measure_prefetch_below_a_shuffle(
    samples: np.ndarray, transform, method: str, n: int, settings: Settings, label: str
) -> Result:
    """The same transform with the loader under ``shuffle().batch()``, against that pipeline without a loader."""

    def view(k: int):
        return lazyseq.smap(transform, samples[: k * TRANSFORM_BATCH])

    plural = {"thread": "threads", "process": "processes"}[method]
    loaders: dict[str, Loader] = {
        "synchronous, shuffled": lambda k: plain(view(k).shuffle(seed=0).batch(TRANSFORM_BATCH)),
        f"lazyseq prefetch {plural} below the shuffle": lambda k: prefetch_below_a_shuffle(view(k), method),
    }
    same_batches(loaders)
    timings = measure(loaders, n, settings.repeats, warm_units=2)
    sync, lazy = timings.values()
    print_timings(
        f"3. Per-sample transform, {label}, the loader below shuffle().batch({TRANSFORM_BATCH})",
        timings,
        "batch",
        lambda t: f"{sync.best / t.best:.2f}x synchronous",
    )
    return Result(
        f"3. {label}, {plural} below a shuffle: speedup",
        f"{sync.best / lazy.best:.2f}x",
        "synchronous shuffled 1.00x",
        f"{sync.best / lazy.best:.2f}",
    )


# -- 4. overlap ----------------------------------------------------------------------------------


def slow_batch(i: int) -> np.ndarray:
    time.sleep(STEP_SECONDS)
    return np.full((LOADER_BATCH, 8), float(i))


class SlowBatches:
    """A torch Dataset whose batch ``b`` takes ``STEP_SECONDS`` to make."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, b: int) -> np.ndarray:
        return slow_batch(b)


def train_step(batch) -> None:
    time.sleep(STEP_SECONDS)  # a step that releases the GIL, as a GPU or BLAS step does


@contextlib.contextmanager
def consumed(loader: ContextManager[Iterable]) -> Iterator[Iterable]:
    """The loader's batches, each handed to ``train_step`` before the next is asked for."""
    with loader as batches:
        yield (train_step(batch) for batch in batches)


def bench_overlap(settings: Settings) -> list[Result]:
    n = settings.overlap_batches

    def view(k: int):
        return lazyseq.smap(slow_batch, range(k))

    loaders: dict[str, Loader] = {
        "producer alone": lambda k: plain(view(k)),
        "consumer alone": lambda k: consumed(plain(itertools.repeat(None, k))),
        "lazyseq prefetch threads": lambda k: consumed(lazyseq_prefetch(view(k), "thread")),
        "lazyseq prefetch processes": lambda k: consumed(lazyseq_prefetch(view(k), "process")),
        "seqtools prefetch threads": lambda k: consumed(
            seqtools_prefetch(seqtools.smap(slow_batch, range(k)), "thread")
        ),
        "seqtools prefetch processes": lambda k: consumed(
            seqtools_prefetch(seqtools.smap(slow_batch, range(k)), "process", seqtools_shm_size(LOADER_BATCH * 8 * 8))
        ),
        "torch DataLoader": lambda k: consumed(torch_loader(SlowBatches(k), batch_size=None)),
    }
    timings = measure(loaders, n, settings.repeats, warm_units=3)
    # The ideal whole run: the first batch cannot be consumed before one producer step has made it; from then
    # on the consumer never waits, as 2 workers make a batch every 2.5 ms. From the costs as measured, since
    # time.sleep overshoots a little.
    producer, consumer = timings["producer alone"].best, timings["consumer alone"].best
    ideal = producer / n + consumer
    print_timings(
        f"4. Overlap: producer {STEP_SECONDS * 1e3:.0f} ms a batch, consumer {STEP_SECONDS * 1e3:.0f} ms "
        f"(both sleep), whole runs of {n} batches, start-up included; ideal = one producer step + {n} consumer "
        f"steps = {ms(ideal * n)} a run, {ms(ideal)} a batch",
        timings,
        "batch",
        lambda t: f"{t.best / ideal:.3f} x ideal",
    )
    results = []
    for method, reference in (("threads", "seqtools prefetch threads"), ("processes", "torch DataLoader")):
        lazy, other = timings[f"lazyseq prefetch {method}"], timings[reference]
        results.append(
            Result(
                f"4. overlap 5 ms + 5 ms, {n} batches, {method}",
                f"{lazy.best / ideal:.3f} x ideal",
                f"{reference.split()[0]} {other.best / ideal:.3f} x ideal",
                f"{lazy.best / ideal:.3f}",
            )
        )
    return results


# -- 5. time to the first batch --------------------------------------------------------------


def time_to_first_batch(open_loader: Loader, repeats: int) -> Timing:
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        with open_loader(IN_FLIGHT * 2) as batches:
            next(iter(batches))
            times.append(time.perf_counter() - start)
        del batches
    gc.collect()
    return Timing(min(times), statistics.median(times))


def bench_first_batch(paths: list[str], settings: Settings) -> list[Result]:
    maps = [np.load(p, mmap_mode="r") for p in paths]
    data = lazyseq.open_npy(paths)
    order = np.random.default_rng(5).integers(len(data), size=IN_FLIGHT * 2 * LOADER_BATCH)
    view = data.gather(order).batch(LOADER_BATCH)
    seqtools_view = seqtools.batch(seqtools.gather(seqtools.concatenate(maps), order), LOADER_BATCH, collate_fn=stack)
    batch_bytes = LOADER_BATCH * WIDTH * 8
    loaders: dict[str, Loader] = {
        # Threads need inline_below=0 for the first batch to come from a worker: by default a batch this cheap
        # is read by the reader itself, and no worker starts at all. Processes compute every batch in a worker.
        "lazyseq prefetch threads, inline_below=0": lambda k: lazyseq_prefetch(view, "thread", inline_below=0),
        "lazyseq prefetch processes": lambda k: lazyseq_prefetch(view, "process"),
        "lazyseq prefetch processes, spawn": lambda k: lazyseq_prefetch(view, "process", start_method="spawn"),
        "seqtools prefetch threads": lambda k: seqtools_prefetch(seqtools_view, "thread"),
        "seqtools prefetch processes": lambda k: seqtools_prefetch(
            seqtools_view, "process", seqtools_shm_size(batch_bytes)
        ),
        "torch DataLoader": lambda k: torch_loader(MapBatches(maps, order, LOADER_BATCH), batch_size=None),
    }
    first_batches(loaders, 1)  # warm up: imports in this process, the maps paged in
    samples: dict[str, list[Timing]] = {name: [] for name in loaders}
    for _ in range(settings.first_batch_repeats):  # contenders take turns, one start each
        for name, open_loader in loaders.items():
            samples[name].append(time_to_first_batch(open_loader, 1))
    timings = {
        name: Timing(min(t.best for t in ts), statistics.median(t.best for t in ts)) for name, ts in samples.items()
    }
    default = multiprocessing.get_start_method()
    print_timings(
        f"5. Time to the first batch of {LOADER_BATCH} rows from memory maps, computed by a worker "
        f"(default start method: {default})",
        timings,
        "start",
    )
    threads, processes = timings["lazyseq prefetch threads, inline_below=0"], timings["lazyseq prefetch processes"]
    spawned = timings["lazyseq prefetch processes, spawn"]
    return [
        Result(
            "5. first batch, threads",
            ms(threads.best),
            f"seqtools {ms(timings['seqtools prefetch threads'].best)}",
            "-",
        ),
        Result(
            f"5. first batch, processes ({default})",
            ms(processes.best),
            f"seqtools {ms(timings['seqtools prefetch processes'].best)}, torch {ms(timings['torch DataLoader'].best)}",
            "-",
        ),
        Result(
            "5. first batch, processes (spawn)",
            ms(spawned.best),
            "-",
            "-",
        ),
    ]


# -- main -------------------------------------------------------------------------------


# -- 6. cheap items, read one by one ------------------------------------------------------------

CHEAP_ITEM_SECONDS = (0.0, 2e-6, 5e-6)  # the pure-Python work of an item, besides a numpy addition


def bench_cheap_items(settings: Settings) -> list[Result]:
    n = settings.cheap_items
    results = []
    for seconds in CHEAP_ITEM_SECONDS:
        loops = calibrate(lambda k: spin(np.zeros(1), k), 10, seconds) if seconds else 0
        item = functools.partial(spin, loops=loops)

        def view(k: int, item=item):
            return lazyseq.smap(item, np.zeros((k, 1)))

        loaders: dict[str, Loader] = {
            "synchronous": lambda k, view=view: plain(view(k)),
            "lazyseq prefetch threads": lambda k, view=view: lazyseq_prefetch(view(k), "thread"),
            "seqtools prefetch threads": lambda k, item=item: seqtools_prefetch(
                seqtools.smap(item, np.zeros((k, 1))), "thread"
            ),
        }
        timings = measure(loaders, n, settings.repeats, warm_units=200)
        sync = timings["synchronous"].best
        label = f"{sync * 1e6:.1f} us items"
        print_timings(
            f"6. Cheap items read one by one ({label}: a numpy addition, then {loops} steps of a Python loop), "
            f"whole runs of {n} items",
            timings,
            "item",
            lambda t, sync=sync: f"{t.best / sync:.2f} x synchronous",
        )
        lazy, other = timings["lazyseq prefetch threads"].best, timings["seqtools prefetch threads"].best
        results.append(
            Result(
                f"6. {label} one by one, threads vs synchronous",
                f"{lazy * 1e6:.2f} us/item",
                f"sync {sync * 1e6:.2f} us/item, seqtools {other / sync:.2f} x",
                f"{lazy / sync:.2f} x",
            )
        )
    return results


# -- 7. items slow now and then ------------------------------------------------------------------

SLOW_ONE_IN = 4  # every fourth item of workload 7 is slow
SLOW_ITEM_SECONDS = 2e-3  # what it waits for


def now_and_then_slow(i: int) -> np.ndarray:
    """A numpy addition; every ``SLOW_ONE_IN``-th item first waits ``SLOW_ITEM_SECONDS`` (the GIL free)."""
    if i % SLOW_ONE_IN == SLOW_ONE_IN - 1:
        time.sleep(SLOW_ITEM_SECONDS)
    return np.ones(256) + i


def bench_mixed_items(settings: Settings) -> list[Result]:
    n = settings.mixed_items
    loaders: dict[str, Loader] = {
        "synchronous": lambda k: plain(lazyseq.smap(now_and_then_slow, range(k))),
        "lazyseq prefetch threads": lambda k: lazyseq_prefetch(lazyseq.smap(now_and_then_slow, range(k)), "thread"),
        "seqtools prefetch threads": lambda k: seqtools_prefetch(seqtools.smap(now_and_then_slow, range(k)), "thread"),
    }
    timings = measure(loaders, n, settings.repeats, warm_units=SLOW_ONE_IN * 4)
    sync = timings["synchronous"].best
    print_timings(
        f"7. Items slow now and then (one in {SLOW_ONE_IN} waits {SLOW_ITEM_SECONDS * 1e3:g} ms, the GIL free), whole "
        f"runs of {n} items",
        timings,
        "item",
        lambda t: f"{sync / t.best:.2f}x synchronous",
    )
    lazy, other = timings["lazyseq prefetch threads"].best, timings["seqtools prefetch threads"].best
    return [
        Result(
            f"7. one item in {SLOW_ONE_IN} waits {SLOW_ITEM_SECONDS * 1e3:g} ms, threads: speedup",
            f"{sync / lazy:.2f}x",
            f"seqtools {sync / other:.2f}x",
            f"{sync / lazy:.2f}",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run, as a smoke test")
    parser.add_argument("--only", type=int, choices=range(1, 8), help="run one workload (1 to 7)")
    parser.add_argument("--loader-batches", type=int, help="batches per timed run in workload 1 (default 5000)")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    if args.loader_batches:
        settings = dataclasses.replace(settings, loader_batches=args.loader_batches)
    logging.getLogger("seqtools").setLevel(logging.ERROR)  # its warnings when every shared slot is taken
    import torch

    print(
        f"lazyseq {lazyseq.__version__}, seqtools {version('seqtools')}, torch {torch.__version__}, "
        f"numpy {np.__version__}, {os.cpu_count()} cores"
    )
    print(
        f"{WORKERS} workers and {IN_FLIGHT} batches in flight for every loader (lazyseq at its defaults: 10, or up to "
        f"32 quick ones with processes); {settings.repeats} repeats per "
        "timing, contenders taking turns; ratios use the best repeat"
    )
    print(f"In workloads 1 to 4, {WHOLE_RUNS}; workload 5 times the start-up alone")
    print(f"load average before: {load()}")
    started = time.perf_counter()
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as folder:
        paths, labels_path = write_samples(folder)
        workloads = {
            1: lambda: bench_loader_bound(paths, settings),
            2: lambda: bench_training_loop(paths, labels_path, settings),
            3: lambda: bench_transforms(settings),
            4: lambda: bench_overlap(settings),
            5: lambda: bench_first_batch(paths, settings),
            6: lambda: bench_cheap_items(settings),
            7: lambda: bench_mixed_items(settings),
        }
        for number, workload in workloads.items():
            if args.only in (None, number):
                results += workload()
                gc.collect()
    report(results, started)


if __name__ == "__main__":
    main()

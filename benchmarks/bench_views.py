"""How fast lazyseq's views are, next to seqtools 1.4.1 and a hand-written numpy loop.

    python benchmarks/bench_views.py          # about 15 seconds
    python benchmarks/bench_views.py --quick  # a few seconds: a smoke test, numbers too rough to quote

Machines are noisy and absolute times differ from run to run, so every
comparison is a ratio of two timings taken in the same run, with the
contenders taking turns (see :func:`measure`). Three things are measured:

1. creating a view: ``smap(f, data)``;
2. reading one item through ``smap(f, gather(concatenate(chunks), idx))``,
   beyond the cost of calling ``f`` on the item directly;
3. seqtools' "fast minibatch sampling" example: random minibatches of 64 rows
   from 18,000 x 248 float64 samples in four memory-mapped ``.npy`` files;
   one view read batch after batch, and (the README's ``sample()``) a new
   view made for each batch.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import version

import numpy as np
import seqtools
from common import Result, Timing, check_same_heads, numpy_batches, stack, stack_fields, summary, table

import lazyseq

CHUNK_ROWS = (5000, 5000, 5000, 3000)  # as in seqtools' example: 18,000 samples in files of 5,000
WIDTH = 248
N_CLASSES = 10
BATCH = 64


@dataclass(frozen=True)
class Settings:
    repeats: int
    creations: int  # lazyseq views created per timed run; seqtools makes 1/50 as many, each taking over 100 µs
    reads: int  # items read per timed run
    batches: int  # random minibatches per timed run


FULL = Settings(repeats=11, creations=20_000, reads=18_000, batches=1_000)
QUICK = Settings(repeats=3, creations=2_000, reads=2_000, batches=100)


# -- timing -----------------------------------------------------------------------


def measure(runs: dict[str, tuple[Callable[[], object], int]], repeats: int) -> dict[str, Timing]:
    """Time each ``run`` (doing ``units`` of work) ``repeats`` times; seconds per unit.

    The contenders take turns, repeat after repeat, so that a slow spell of a
    shared machine slows them all rather than whichever ran during it.
    """
    for run, _ in runs.values():
        run()  # warm up: page the memory maps in, fill caches
    samples: dict[str, list[float]] = {name: [] for name in runs}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: a collection lands on whichever contender runs at the time
    try:
        for _ in range(repeats):
            for name, (run, units) in runs.items():
                start = time.perf_counter()
                run()
                samples[name].append((time.perf_counter() - start) / units)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Timing(min(times), statistics.median(times)) for name, times in samples.items()}


def exhaust(make_batches: Callable[[], Iterable]) -> Callable[[], None]:
    """A run that builds a pipeline and reads all of it."""

    def run() -> None:
        for _ in make_batches():
            pass

    return run


def same_batches(contenders: dict[str, Callable[[], Iterable]], count: int = 3) -> None:
    """Fail loudly if the contenders do not produce the same first batches: their timings would mean nothing."""
    check_same_heads({name: [b for b, _ in zip(make(), range(count))] for name, make in contenders.items()})


# -- results ----------------------------------------------------------------------


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} µs"


def print_timings(title: str, timings: dict[str, Timing], unit: str) -> None:
    print(f"\n{title}")
    rows = [[name, us(t.best), us(t.median)] for name, t in timings.items()]
    print(table(["contender", f"best per {unit}", f"median per {unit}"], rows))


# -- 1. creating a view -----------------------------------------------------------


def identity(x):
    return x


def bench_creation(settings: Settings) -> list[Result]:
    data = list(range(1000))
    make_lazy = functools.partial(lazyseq.smap, identity, data)
    make_seqtools = functools.partial(seqtools.smap, identity, data)
    slow = max(1, settings.creations // 50)

    def calls(make: Callable[[], object], n: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(n):
                make()

        return run

    timings = measure(
        {
            "lazyseq.smap(f, data)": (calls(make_lazy, settings.creations), settings.creations),
            "seqtools.smap(f, data)": (calls(make_seqtools, slow), slow),
        },
        settings.repeats,
    )
    print_timings("1. Creating a view", timings, "call")
    lazy, other = timings["lazyseq.smap(f, data)"], timings["seqtools.smap(f, data)"]
    return [
        Result(
            "create smap(f, data)",
            us(lazy.best),
            f"seqtools {us(other.best)}",
            f"{other.best / lazy.best:.0f}x faster",
        )
    ]


# -- 2. reading one item through three views ----------------------------------------


def bench_item_overhead(settings: Settings) -> list[Result]:
    rng = np.random.default_rng(1)
    chunks = [rng.standard_normal(n).tolist() for n in CHUNK_ROWS]  # Python floats: f sees plain objects
    flat = [x for chunk in chunks for x in chunk]
    idx = rng.integers(0, len(flat), settings.reads)
    raw = [flat[j] for j in idx]
    lazy = lazyseq.smap(identity, lazyseq.gather(lazyseq.concatenate(chunks), idx))
    other = seqtools.smap(identity, seqtools.gather(seqtools.concatenate(chunks), idx))
    n = settings.reads

    def read_each(view) -> Callable[[], None]:
        def run() -> None:
            for i in range(n):
                view[i]

        return run

    def call_directly() -> None:  # what remains when the views cost nothing: fetch the item, call f
        for i in range(n):
            identity(raw[i])

    assert [lazy[i] for i in range(n)] == [other[i] for i in range(n)] == raw
    timings = measure(
        {
            "f(raw[i])": (call_directly, n),
            "lazyseq view[i]": (read_each(lazy), n),
            "seqtools view[i]": (read_each(other), n),
        },
        settings.repeats,
    )
    print_timings("2. Reading one item of smap(f, gather(concatenate(chunks), idx))", timings, "item")
    base = timings["f(raw[i])"]
    lazy_over = timings["lazyseq view[i]"].best - base.best
    other_over = timings["seqtools view[i]"].best - base.best
    print(f"overhead beyond f(raw[i]), best: lazyseq {us(lazy_over)}, seqtools {us(other_over)}")
    return [
        Result(
            "item overhead, 3 views",
            us(lazy_over),
            f"seqtools {us(other_over)}",
            f"{other_over / lazy_over:.1f}x faster",
        )
    ]


# -- 3. random minibatches from memory-mapped .npy files --------------------------------


def write_samples(folder: str) -> tuple[list[str], np.ndarray]:
    """The example's dataset: the ``.npy`` chunk files, and the labels (small enough to keep in memory)."""
    rng = np.random.default_rng(0)
    n_samples = sum(CHUNK_ROWS)
    labels = rng.integers(N_CLASSES, size=n_samples)
    means = rng.standard_normal((N_CLASSES, WIDTH)) * 3
    paths, first = [], 0
    for k, rows in enumerate(CHUNK_ROWS):
        samples = means[labels[first : first + rows]] + rng.standard_normal((rows, WIDTH)) * 0.1
        paths.append(os.path.join(folder, f"data_{k:02d}.npy"))
        np.save(paths[-1], samples)
        first += rows
    return paths, labels


def bench_minibatches(settings: Settings) -> list[Result]:
    with tempfile.TemporaryDirectory() as folder:
        paths, labels = write_samples(folder)
        # The maps live in a function of their own: closed when it returns, before the folder is removed.
        return time_minibatches(paths, labels, settings)


def time_minibatches(paths: list[str], labels: np.ndarray, settings: Settings) -> list[Result]:
    data = lazyseq.open_npy(paths)
    maps = [np.load(p, mmap_mode="r") for p in paths]
    order = np.random.default_rng(2).integers(len(data), size=settings.batches * BATCH)
    shuffled = lazyseq.shuffle(data, seed=3)
    # One epoch of full batches in the shuffle's order, for the contenders that have no shuffle view.
    epoch = shuffled.permutation[: len(data) // BATCH * BATCH].astype(np.intp)
    first = lazyseq.open_npy(paths[0])  # one file: read with take(), no window over several
    order_first = order % len(first)

    workloads: dict[str, tuple[int, dict[str, Callable[[], Iterable]]]] = {
        "gather + batch -> X": (
            settings.batches,
            {
                "lazyseq": lambda: lazyseq.batch(lazyseq.gather(data, order), BATCH),
                "seqtools": lambda: seqtools.batch(
                    seqtools.gather(seqtools.concatenate(maps), order), BATCH, collate_fn=stack
                ),
                "numpy": lambda: numpy_batches(maps, order, BATCH),
            },
        ),
        "gather + batch from one file -> X": (
            settings.batches,
            {
                "lazyseq": lambda: lazyseq.batch(lazyseq.gather(first, order_first), BATCH),
                "seqtools": lambda: seqtools.batch(seqtools.gather(maps[0], order_first), BATCH, collate_fn=stack),
                "numpy": lambda: numpy_batches(maps[:1], order_first, BATCH),
            },
        ),
        "shuffle + batch -> X": (
            len(epoch) // BATCH,
            {
                "lazyseq": lambda: shuffled.batch(BATCH, drop_last=True),
                "seqtools": lambda: seqtools.batch(
                    seqtools.gather(seqtools.concatenate(maps), epoch), BATCH, collate_fn=stack
                ),
                "numpy": lambda: numpy_batches(maps, epoch, BATCH),
            },
        ),
        "a new view per batch -> (X, y)": (  # the README's sample(): gather(...).batch(64)[0] for each batch
            settings.batches,
            {
                "lazyseq": lambda: one_view_per_batch(lazyseq.collate([data, labels]), order),
                "seqtools": lambda: (
                    stack_fields(seqtools.gather(seqtools.collate([seqtools.concatenate(maps), labels]), picks))
                    for picks in batches_of(order)
                ),
                "numpy": lambda: numpy_batches(maps, order, BATCH, labels),
            },
        ),
        "collate + gather + batch -> (X, y)": (
            settings.batches,
            {
                "lazyseq": lambda: lazyseq.batch(lazyseq.gather(lazyseq.collate([data, labels]), order), BATCH),
                "seqtools": lambda: seqtools.batch(
                    seqtools.gather(seqtools.collate([seqtools.concatenate(maps), labels]), order),
                    BATCH,
                    collate_fn=stack_fields,
                ),
                "numpy": lambda: numpy_batches(maps, order, BATCH, labels),
            },
        ),
    }
    results = []
    for name, (batches, contenders) in workloads.items():
        same_batches(contenders)
        timings = measure({c: (exhaust(make), batches) for c, make in contenders.items()}, settings.repeats)
        results += report_minibatches(name, timings)
    return results


def batches_of(order: np.ndarray) -> Iterator[np.ndarray]:
    return (order[first : first + BATCH] for first in range(0, len(order), BATCH))


def one_view_per_batch(pairs: lazyseq.View, order: np.ndarray) -> Iterator:
    """A sampler that makes a view for each batch, ``pairs.gather(picks).batch(BATCH)[0]``, as the README's."""
    return (pairs.gather(picks).batch(BATCH)[0] for picks in batches_of(order))


def report_minibatches(name: str, timings: dict[str, Timing]) -> list[Result]:
    print(f"\n3. Random minibatches of {BATCH} from memory-mapped .npy files: {name}")
    rows = [[c, f"{1 / t.best:,.0f}", f"{1 / t.median:,.0f}", us(t.best)] for c, t in timings.items()]
    print(table(["contender", "batches/s (best)", "batches/s (median)", "best per batch"], rows))
    lazy, other, hand = timings["lazyseq"], timings["seqtools"], timings["numpy"]
    print(
        f"lazyseq / seqtools: {other.best / lazy.best:.2f}x (median {other.median / lazy.median:.2f}x); "
        f"lazyseq / numpy: {hand.best / lazy.best:.2f} (median {hand.median / lazy.median:.2f})"
    )
    speed = f"{1 / lazy.best:,.0f} batches/s"
    return [
        Result(
            f"{name}, vs seqtools",
            speed,
            f"seqtools {1 / other.best:,.0f}/s",
            f"{other.best / lazy.best:.1f}x",
        ),
        Result(
            f"{name}, vs numpy",
            speed,
            f"numpy {1 / hand.best:,.0f}/s",
            f"{hand.best / lazy.best:.2f}",
        ),
    ]


# -- main -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run, as a smoke test")
    settings = QUICK if parser.parse_args().quick else FULL
    print(f"lazyseq {lazyseq.__version__}, seqtools {version('seqtools')}, numpy {np.__version__}")
    print(f"{settings.repeats} repeats per timing, contenders taking turns; ratios use the best repeat")
    started = time.perf_counter()
    results = bench_creation(settings) + bench_item_overhead(settings) + bench_minibatches(settings)
    print(f"\nSummary (markdown), {time.perf_counter() - started:.0f} s in all\n")
    print(summary(results))


if __name__ == "__main__":
    main()

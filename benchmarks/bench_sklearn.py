"""What lazyseq.sklearn.fit costs on top of a hand-written partial_fit loop, and with lazy batches and loaders.

    python benchmarks/bench_sklearn.py          # about 3 minutes
    python benchmarks/bench_sklearn.py --quick  # a few seconds: a smoke test, numbers too rough to quote

The workload is the demo's (``lazyseq.demo``): 18,000 x 248 float64 samples
in four memory-mapped ``.npy`` files plus labels, the last 10,000 held out,
and ``GaussianNB.partial_fit`` on random minibatches of 64 drawn with
replacement from the first 8,000. Every contender is a ratio to the bare loop
timed in the same run:

(a) the bare loop over in-memory batches built beforehand, ``classes`` given
    to the first call only, as ``fit`` does (the reference); the same loop
    with ``classes`` on every call, as the README writes it, for comparison
    (scikit-learn then checks the classes at every step);
(b) ``lazyseq.sklearn.fit`` over those same batches: what the helper costs;
(c) ``lazyseq.sklearn.fit`` over ``train.gather(picks).batch(64)`` read from the
    memory maps, synchronously and through ``lazyseq.prefetch`` with threads
    and processes.

The helper's own bookkeeping per step is also timed alone, with an estimator
whose ``partial_fit`` does nothing: a few microseconds that the noise of a
shared machine hides in the ratios above. As in the other benchmarks, the contenders take turns (here in alternating
order, forwards then backwards) and ratios use the best repeat.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import sklearn
from common import Result, Timing, summary, table
from sklearn.naive_bayes import GaussianNB

import lazyseq
from lazyseq.demo import N_CLASSES, write_dataset
from lazyseq.sklearn import fit

SAMPLES = 18_000
TEST = 10_000
BATCH = 64
POOL = 256  # in-memory batches, cycled: 4,000 distinct ones would take half a gigabyte
CLASSES = np.arange(N_CLASSES)
REFERENCE = "(a) bare partial_fit loop, in-memory batches"
EVERY_CALL = "(a) bare loop, classes on every call"
HELPER = "(b) fit(), in-memory batches"


@dataclass(frozen=True)
class Settings:
    repeats: int
    steps: int  # partial_fit calls per timed run
    warmup_steps: int


FULL = Settings(repeats=5, steps=4_000, warmup_steps=200)
QUICK = Settings(repeats=2, steps=200, warmup_steps=20)

# A run trains a new model for ``steps`` batches and returns it.
Run = Callable[[int], GaussianNB]


# -- contenders -----------------------------------------------------------------------


def contenders(train: lazyseq.View, picks: np.ndarray) -> dict[str, Run]:
    pool = [tuple(np.array(a) for a in b) for b in train.gather(picks[: POOL * BATCH]).batch(BATCH)]

    def in_memory(steps: int) -> list:
        return [pool[k % POOL] for k in range(steps)]

    def lazy(steps: int) -> lazyseq.View:
        return train.gather(picks[: steps * BATCH]).batch(BATCH)

    def bare_loop(steps: int) -> GaussianNB:
        model = GaussianNB()
        batches = iter(in_memory(steps))
        x, y = next(batches)
        model.partial_fit(x, y, classes=CLASSES)
        for x, y in batches:
            model.partial_fit(x, y)
        return model

    def classes_every_call(steps: int) -> GaussianNB:
        model = GaussianNB()
        for x, y in in_memory(steps):
            model.partial_fit(x, y, classes=CLASSES)
        return model

    def helper(steps: int) -> GaussianNB:
        return fit(GaussianNB(), in_memory(steps), classes=CLASSES, progress=False)

    def synchronous(steps: int) -> GaussianNB:
        return fit(GaussianNB(), lazy(steps), classes=CLASSES, progress=False)

    def prefetched(method: str, nworkers: int) -> Run:
        def run(steps: int) -> GaussianNB:
            with lazyseq.prefetch(lazy(steps), nworkers=nworkers, method=method) as batches:
                return fit(GaussianNB(), batches, classes=CLASSES, progress=False)

        return run

    return {
        REFERENCE: bare_loop,
        EVERY_CALL: classes_every_call,
        HELPER: helper,
        "(c) fit(), gather + batch, synchronous": synchronous,
        "(c) fit(), prefetch 1 thread": prefetched("thread", 1),
        "(c) fit(), prefetch 2 threads": prefetched("thread", 2),
        "(c) fit(), prefetch 1 process": prefetched("process", 1),
        "(c) fit(), prefetch 2 processes": prefetched("process", 2),
    }


def check_same_models(runs: dict[str, Run], steps: int) -> None:
    """Fail loudly if the contenders train different models: their timings would mean nothing.

    Up to ``POOL`` steps, the in-memory batches are the lazy ones, so every contender trains the same model.
    """
    assert steps <= POOL
    models = {name: run(steps) for name, run in runs.items()}
    reference = models[REFERENCE]
    for name, model in models.items():
        for attribute in ("theta_", "var_", "class_count_"):
            if not np.array_equal(getattr(model, attribute), getattr(reference, attribute)):
                raise AssertionError(f"{name} and {REFERENCE} trained different models ({attribute})")


# -- timing -----------------------------------------------------------------------------


def measure(runs: dict[str, Run], settings: Settings) -> tuple[dict[str, Timing], dict[str, list[float]]]:
    """Seconds per step of each run (best and median, and every repeat); the runs take turns, forwards then
    backwards, repeat after repeat."""
    for run in runs.values():
        run(settings.warmup_steps)  # page the memory maps in, import what the workers import
    samples: dict[str, list[float]] = {name: [] for name in runs}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: a collection lands on whichever contender runs at the time
    try:
        for repeat in range(settings.repeats):
            order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
            for name in order:
                start = time.perf_counter()
                runs[name](settings.steps)
                samples[name].append((time.perf_counter() - start) / settings.steps)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Timing(min(times), statistics.median(times)) for name, times in samples.items()}, samples


class DoesNothing:
    """An estimator whose partial_fit costs nothing: what remains is the loop's own cost."""

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        return self


def bookkeeping(batches: list, repeats: int) -> float:
    """Seconds per step that ``fit`` spends beyond a bare loop calling the same partial_fit."""
    model = DoesNothing()

    def bare() -> None:
        for x, y in batches:
            model.partial_fit(x, y)

    def helper() -> None:
        fit(model, batches, progress=False)

    best = {bare: float("inf"), helper: float("inf")}
    for _ in range(repeats * 4):  # milliseconds each: many repeats are cheap
        for run in best:
            start = time.perf_counter()
            run()
            best[run] = min(best[run], time.perf_counter() - start)
    return (best[helper] - best[bare]) / len(batches)


# -- results ----------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def report(timings: dict[str, Timing], samples: dict[str, list[float]], settings: Settings) -> list[Result]:
    reference = timings[REFERENCE]
    print(f"\n{settings.steps:,} GaussianNB.partial_fit steps on random batches of {BATCH}, {settings.repeats} repeats")
    rows = []
    for name, t in timings.items():
        spread = (max(samples[name]) - t.best) / t.best
        rows.append([name, ms(t.best), ms(t.median), f"{spread:.0%}", f"{t.best / reference.best:.3f}"])
    print(table(["contender", "best per step", "median per step", "worst vs best", "best / (a)"], rows))
    results = []
    for name, t in timings.items():
        if name == REFERENCE:
            continue
        ratio = t.best / reference.best
        results.append(
            Result(
                f"{name} vs (a)",
                f"{ms(t.best)}/step",
                f"(a) {ms(reference.best)}/step",
                f"{ratio:.3f}",
            )
        )
    return results


def report_bookkeeping(overhead: float, reference: Timing) -> Result:
    print(f"\nfit() bookkeeping beyond a bare loop, partial_fit doing nothing: {overhead * 1e6:.2f} µs/step")
    return Result(
        "fit() bookkeeping per step (no-op partial_fit)",
        f"{overhead * 1e6:.2f} µs/step",
        f"(a) {ms(reference.best)}/step",
        f"{overhead / reference.best:.4f}",
    )


# -- main -------------------------------------------------------------------------------


def bench(settings: Settings) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="lazyseq-bench-sklearn-") as folder:
        write_dataset(folder, SAMPLES)
        # The maps live in a function of their own: closed when it returns, before the folder is removed.
        return bench_on(folder, settings)


def bench_on(folder: str, settings: Settings) -> list[Result]:
    data = lazyseq.open_npy(os.path.join(folder, "data_*.npy"))
    labels = lazyseq.open_npy(os.path.join(folder, "labels.npy"))
    train = lazyseq.collate([data, labels])[:-TEST]
    picks = np.random.default_rng(2).integers(len(train), size=settings.steps * BATCH)
    runs = contenders(train, picks)
    check_same_models(runs, settings.warmup_steps)
    timings, samples = measure(runs, settings)
    pool = [tuple(np.array(a) for a in b) for b in train.gather(picks[: POOL * BATCH]).batch(BATCH)]
    overhead = bookkeeping([pool[k % POOL] for k in range(settings.steps)], settings.repeats)
    return report(timings, samples, settings) + [report_bookkeeping(overhead, timings[REFERENCE])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run, as a smoke test")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats of every contender")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    if args.repeats is not None:
        settings = Settings(args.repeats, settings.steps, settings.warmup_steps)
    print(f"lazyseq {lazyseq.__version__}, scikit-learn {sklearn.__version__}, numpy {np.__version__}")
    started = time.perf_counter()
    results = bench(settings)
    print(f"\nSummary (markdown), {time.perf_counter() - started:.0f} s in all\n")
    print(summary(results))


if __name__ == "__main__":
    main()

"""How the loader benchmarks time their contenders: whole runs from opening a loader to its last batch, in turns."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from typing import Any

import numpy as np
from common import Result, Timing, summary, table

Loader = Callable[[int], ContextManager[Iterable]]  # opens a loader of n batches; closing it stops its workers


WHOLE_RUNS = (
    "every timed run is a whole run, from creating the loader to consuming its last batch (stopping it is not "
    "counted), after one untimed run per contender (files paged in, modules imported: once per program)"
)


def run_through(open_loader: Loader, units: int, consume: Callable[[Any], object] | None = None) -> float:
    """Seconds from creating the loader to having consumed its ``units``-th batch: the run a user waits for.

    Starting the workers is counted; stopping them is not. The clock stops at the last batch rather than when
    the loader runs out, since some loaders (torch's) stop their workers on being read past the end.
    """
    batch = None
    start = time.perf_counter()
    with open_loader(units) as batches:
        for count, batch in enumerate(batches, start=1):
            if consume is not None:
                consume(batch)
            if count == units:
                break
        elapsed = time.perf_counter() - start
        del batch
    del batches
    gc.collect()  # now: a loader left in a reference cycle would be inherited by the next forked worker
    return elapsed


def measure(
    loaders: dict[str, Loader],
    units: int,
    repeats: int,
    consume: Callable[[Any], object] | None = None,
    warm_units: int = 20,
) -> dict[str, Timing]:
    """Time each loader's whole run of ``units`` batches (see :func:`run_through`), ``repeats`` times; seconds per unit.

    Before the timed runs, each contender runs once untimed over ``warm_units`` batches: the files are paged in
    and this process imports what its workers need, costs a program pays once rather than per loader. Every
    timed run then starts its loader afresh, so the start-up of workers is in every timing.

    The contenders take turns, repeat after repeat, so that a slow spell of a
    shared machine slows them all rather than whichever ran during it. Garbage
    collection stays on (loaders and their workers are real programs); a
    collection follows every timed run.
    """
    for open_loader in loaders.values():
        run_through(open_loader, min(units, warm_units), consume)
    samples: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(repeats):
        for name, open_loader in loaders.items():
            samples[name].append(run_through(open_loader, units, consume) / units)
    return {name: Timing(min(times), statistics.median(times)) for name, times in samples.items()}


def first_batches(loaders: dict[str, Loader], count: int = 2) -> dict[str, list]:
    """The first ``count`` batches of each loader, as numpy arrays (tensors converted)."""
    heads = {}
    for name, open_loader in loaders.items():
        with open_loader(count) as batches:
            heads[name] = [as_numpy(b) for b in itertools.islice(batches, count)]
        del batches
        gc.collect()
    return heads


def as_numpy(batch):
    if isinstance(batch, (tuple, list)):
        return tuple(as_numpy(b) for b in batch)
    return np.array(batch)  # a copy (of a CPU tensor too): the batch may live in a slot that its loader reuses


@contextmanager
def plain(batches: Iterable) -> Iterator[Iterable]:
    """No loader at all: the batches as they are."""
    yield batches


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def print_timings(
    title: str, timings: dict[str, Timing], unit: str, extra: Callable[[Timing], str] | None = None
) -> None:
    print(f"\n{title}")
    header = ["contender", f"best per {unit}", f"median per {unit}"]
    rows = [[name, ms(t.best), ms(t.median)] for name, t in timings.items()]
    if extra is not None:
        header.append("")
        for row, t in zip(rows, timings.values()):
            row.append(extra(t))
    print(table(header, rows))


def leftovers() -> str:
    """Worker processes and threads still alive after every loader was closed."""
    children = multiprocessing.active_children()
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    if not children and not threads:
        return "none"
    return f"{len(children)} processes {[c.name for c in children]}, threads {threads}"


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"


def report(results: list[Result], started: float) -> None:
    """What the end of a loader benchmark prints: leftovers, the machine's load, and the summary table."""
    print(f"\nleftover workers after closing every loader: {leftovers()}")
    print(f"load average after: {load()} (on {os.cpu_count()} cores: above that, other programs competed)")
    print(f"\nSummary (markdown), {time.perf_counter() - started:.0f} s in all\n")
    print(summary(results))

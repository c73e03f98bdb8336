"""How fast ``write_npy`` fills a directory of shards, next to the same work done without lazyseq.

    python benchmarks/bench_shards.py          # about a minute
    python benchmarks/bench_shards.py --quick  # a few seconds: a smoke test, numbers too rough to quote
    python benchmarks/bench_shards.py --only-throughput  # workload 2 alone, about 30 s

The data: the 18,000 x 248 float64 samples of the other benchmarks, in four
memory-mapped ``.npy`` files. Contenders take turns, repeat after repeat; each
run writes into an empty directory (emptied between runs, untimed) and is
timed from the call to the last file on disk. Ratios use the best repeat.

1. An expensive transform: pure Python, about 1 ms a row (it holds the GIL),
   over the first rows, ``SHARD_ROWS`` rows to a shard. ``write_npy`` with 2
   worker processes vs two independent processes that each compute every
   other shard and write it with ``np.save`` (flushed and synced, as
   ``write_npy`` does), no lazyseq at all; and ``write_npy`` with no workers.
   Then ``write_npy`` with 2 worker processes and the default shard size: all
   the rows are one shard, which the workers write in pieces. The transform
   is an integer loop, then work on text (how close any worker process gets
   to an independent one depends on the Python it runs).
2. Write throughput of a cheap pipeline: the rows of the memory maps as they
   are (34 MiB), then the same files listed 8 times over (272 MiB, where the
   fixed costs of a call weigh less), in 4 MiB shards, written by ``write_npy`` (no workers, and 2 worker
   threads) vs ``np.save`` of the same arrays (in memory), one file per
   shard, in one process, like for like: ``write_npy(sync=False)`` vs
   ``np.save`` as it is (neither syncs: the page cache takes the writes), and
   ``write_npy`` (``sync=True``, the default) vs ``np.save`` with each file
   synced to disk.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from common import Result, Timing, calibrate, spin, summary, table, text_work, write_samples

import lazyseq

ROW_SECONDS = 1e-3  # the expensive transform's cost per row
SHARD_ROWS = 250  # rows per shard in the expensive workload
CHEAP_SHARD_BYTES = 4 * 2**20
THROUGHPUT_REPEATS = 3  # workload 2 repeats the seed's 34 MiB this many times more (runs of milliseconds vary)
THROUGHPUT_COPIES = (1, 8)  # workload 2 writes the seed's rows once (34 MiB), then 8 times over (272 MiB)


@dataclass(frozen=True)
class Settings:
    transform_rows: int
    repeats: int


FULL = Settings(transform_rows=3000, repeats=3)
QUICK = Settings(transform_rows=300, repeats=1)

Run = Callable[[str], None]  # writes everything into an empty directory


def measure(runs: dict[str, Run], folder: str, repeats: int) -> dict[str, Timing]:
    """Seconds per whole run of each contender, contenders taking turns; the directory is emptied untimed."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            target = os.path.join(folder, "out")
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(target)
            start = time.perf_counter()
            run(target)
            samples[name].append(time.perf_counter() - start)
    shutil.rmtree(os.path.join(folder, "out"), ignore_errors=True)
    return {name: Timing(min(times), statistics.median(times)) for name, times in samples.items()}


def print_timings(title: str, timings: dict[str, Timing], extra: Callable[[Timing], str]) -> None:
    print(f"\n{title}")
    rows = [[name, f"{t.best:.3f} s", f"{t.median:.3f} s", extra(t)] for name, t in timings.items()]
    print(table(["contender", "best run", "median run", ""], rows))


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"


def save_synced(path: str, array: np.ndarray) -> None:
    """``np.save``, then the file flushed and synced to disk."""
    with open(path, "wb") as file:
        np.save(file, array)
        file.flush()
        os.fsync(file.fileno())


# -- 1. an expensive transform --------------------------------------------------------------------


def transform_shards(source: np.ndarray, transform: Callable, shards: range, target: str) -> None:
    """The work of one independent process: every shard in ``shards``, computed row by row and saved."""
    for k in shards:
        rows = source[k * SHARD_ROWS : (k + 1) * SHARD_ROWS]
        save_synced(os.path.join(target, f"data-{k:05d}.npy"), np.stack([transform(row) for row in rows]))


def independent_processes(source: np.ndarray, transform: Callable, target: str) -> None:
    """Two processes, no lazyseq: each computes and writes every other shard."""
    count = -(-len(source) // SHARD_ROWS)
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=transform_shards, args=(source, transform, range(k, count, 2), target)) for k in (0, 1)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise RuntimeError(f"an independent process failed with exit code {worker.exitcode}")


def bench_transform(paths: list[str], settings: Settings, folder: str) -> list[Result]:
    n = settings.transform_rows
    source = np.load(paths[0], mmap_mode="r")[:n]  # the first file holds 5,000 rows
    loops = calibrate(lambda size: spin(source[0], size), 20_000, ROW_SECONDS)
    words = calibrate(lambda size: text_work(source[0], size), 5_000, ROW_SECONDS)
    results = bench_one_transform(paths, settings, folder, "", functools.partial(spin, loops=loops), every_run=True)
    return results + bench_one_transform(
        paths, settings, folder, ", on text", functools.partial(text_work, words=words), every_run=False
    )


def bench_one_transform(
    paths: list[str], settings: Settings, folder: str, label: str, transform: Callable, every_run: bool
) -> list[Result]:
    """``transform`` (an integer loop; or ``label``: on text) written with and without lazyseq."""
    n = settings.transform_rows
    source = np.load(paths[0], mmap_mode="r")[:n]
    data = lazyseq.open_npy(paths)[:n]

    def lazy(nworkers: int, rows_per_shard: int | None = SHARD_ROWS) -> Run:
        return lambda target: lazyseq.write_npy(
            data.smap(transform), target, rows_per_shard=rows_per_shard, nworkers=nworkers, method="process"
        )

    runs: dict[str, Run] = {
        "write_npy, 2 processes": lazy(2),
        "two independent processes, no lazyseq": functools.partial(independent_processes, source, transform),
        "write_npy, no workers": lazy(0),
    }
    if every_run:
        runs["write_npy, 2 processes, one shard"] = lazy(2, None)
    check_same_shards(runs, folder)
    timings = measure(runs, folder, settings.repeats)
    sync = timings["write_npy, no workers"]
    print_timings(
        f"1. Expensive transform (~{ROW_SECONDS * 1e3:.0f} ms a row, pure Python{label}), {n} rows of 248 float64, "
        f"{SHARD_ROWS} rows a shard",
        timings,
        lambda t: f"{sync.best / t.best:.2f}x no workers",
    )
    lazy2, limit = timings["write_npy, 2 processes"], timings["two independent processes, no lazyseq"]
    results = [
        Result(
            f"1. 1 ms/row transform{label}, write_npy 2 processes vs two independent processes",
            f"{n / lazy2.best:,.0f} rows/s",
            f"2 independent {n / limit.best:,.0f} rows/s",
            f"{limit.best / lazy2.best:.2f}",
        )
    ]
    if every_run:
        one = timings["write_npy, 2 processes, one shard"]
        results.append(
            Result(
                "1. 1 ms/row transform, one shard (default size), write_npy 2 processes vs two independent processes",
                f"{n / one.best:,.0f} rows/s",
                f"2 independent {n / limit.best:,.0f} rows/s",
                f"{limit.best / one.best:.2f}",
            )
        )
    results.append(
        Result(
            f"1. 1 ms/row transform{label}, write_npy 2 processes vs no workers",
            f"{n / lazy2.best:,.0f} rows/s",
            f"no workers {n / sync.best:,.0f} rows/s",
            f"{sync.best / lazy2.best:.2f}",
        )
    )
    return results


def check_same_shards(runs: dict[str, Run], folder: str) -> None:
    """Fail loudly if the contenders do not write the same rows: their timings would mean nothing."""
    written = {}
    for name, run in runs.items():
        target = os.path.join(folder, "check")
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        run(target)
        files = sorted(f for f in os.listdir(target) if f.endswith(".npy"))
        written[name] = np.concatenate([np.load(os.path.join(target, f)) for f in files])
    shutil.rmtree(os.path.join(folder, "check"), ignore_errors=True)
    first = next(iter(written.values()))
    for name, rows in written.items():
        if not np.array_equal(rows, first):
            raise AssertionError(f"{name} wrote other rows than {next(iter(written))}")


# -- 2. write throughput ---------------------------------------------------------------------------


def bench_throughput(paths: list[str], settings: Settings, folder: str, copies: int) -> list[Result]:
    data = lazyseq.open_npy(paths * copies)  # the files listed ``copies`` times over: a larger dataset, same rows
    rows_per_shard = CHEAP_SHARD_BYTES // data[0].nbytes  # as write_npy splits them
    in_memory = np.concatenate([np.load(p) for p in paths * copies])
    arrays = [in_memory[k : k + rows_per_shard] for k in range(0, len(in_memory), rows_per_shard)]
    total = sum(a.nbytes for a in arrays)

    def saved(save: Callable[[str, np.ndarray], None]) -> Run:
        def run(target: str) -> None:
            for k, array in enumerate(arrays):
                save(os.path.join(target, f"data-{k:05d}.npy"), array)

        return run

    def lazy(nworkers: int, sync: bool) -> Run:
        return lambda target: lazyseq.write_npy(
            data, target, bytes_per_shard=CHEAP_SHARD_BYTES, nworkers=nworkers, sync=sync
        )

    runs: dict[str, Run] = {
        "write_npy sync=False, no workers": lazy(0, False),
        "write_npy sync=False, 2 threads": lazy(2, False),
        "np.save": saved(np.save),
        "write_npy (sync=True), no workers": lazy(0, True),
        "write_npy (sync=True), 2 threads": lazy(2, True),
        "np.save + fsync": saved(save_synced),
    }
    check_same_shards(runs, folder)
    timings = measure(runs, folder, THROUGHPUT_REPEATS * settings.repeats if copies == 1 else settings.repeats)
    size = f"{total / 2**20:.0f} MiB"
    print_timings(
        f"2. Write throughput: {len(data):,} x 248 float64 from the memory maps ({total / 2**20:.0f} MiB), "
        f"{len(arrays)} shards of {rows_per_shard} rows",
        timings,
        lambda t: f"{total / t.best / 1e9:.2f} GB/s",
    )
    results = []
    references = (("sync=False", "np.save"), ("(sync=True)", "np.save + fsync"))
    for sync, reference in references:
        for workers in ("no workers", "2 threads"):
            name = f"write_npy {sync}, {workers}"
            lazy_t, ref_t = timings[name], timings[reference]
            results.append(
                Result(
                    f"2. cheap pipeline, {size}, {name} vs {reference}",
                    f"{total / lazy_t.best / 1e9:.2f} GB/s",
                    f"{reference} {total / ref_t.best / 1e9:.2f} GB/s",
                    f"{ref_t.best / lazy_t.best:.2f}",
                )
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run, as a smoke test")
    parser.add_argument("--only-throughput", action="store_true", help="workload 2 alone")
    arguments = parser.parse_args()
    settings = QUICK if arguments.quick else FULL
    print(f"lazyseq {lazyseq.__version__}, numpy {np.__version__}, {os.cpu_count()} cores")
    print(
        f"{settings.repeats} repeats per timing (workload 2: {THROUGHPUT_REPEATS * settings.repeats}), "
        "contenders taking turns"
    )
    print(f"load average before: {load()}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        paths, _ = write_samples(folder)
        results = [] if arguments.only_throughput else bench_transform(paths, settings, folder)
        for copies in THROUGHPUT_COPIES if not arguments.quick else (1,):
            results += bench_throughput(paths, settings, folder, copies)
    print(f"\nload average after: {load()} (on {os.cpu_count()} cores: above that, other programs competed)")
    print(f"\nSummary (markdown), {time.perf_counter() - started:.0f} s in all\n")
    print(summary(results))


if __name__ == "__main__":
    main()

"""The same pipeline on a local two-node Ray cluster (method="ray") and in worker processes (method="process").

    python benchmarks/bench_ray.py          # about two minutes
    python benchmarks/bench_ray.py --quick  # a smoke test, numbers too rough to quote

The pipeline: rows of 248 float64 from a memory-mapped ``.npy`` file (it
travels to the Ray nodes by path), each through a pure-Python transform of
about 1 ms that returns three numbers. Two workers either way: the cluster is
a head and a second node with one CPU each (``ray.cluster_utils.Cluster``, two
machines simulated on this one), and ``nworkers=2`` for both methods. The
cluster's start-up and the first run (Ray starts its worker processes then)
are timed apart; after that, the contenders take turns, repeat after repeat,
each timing a whole run from creating the loader to its last item. The
synchronous read (``nworkers=0``) is the work itself. Ray's worker processes
run at nice 10, as lazyseq's worker processes do (Ray's default is 15: on a
machine shared with other work, that alone would decide the comparison).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

import numpy as np
import ray
from common import Result, summary, table
from ray.cluster_utils import Cluster

import lazyseq

WIDTH = 248
ROUNDS = 32  # passes over the row: about 1 ms per row on a small virtual machine


def transform(row: np.ndarray) -> np.ndarray:
    """Pure Python, about 1 ms: a running sum of tanh over the row, ``ROUNDS`` times, and its extremes."""
    values = row.tolist()
    low = high = total = 0.0
    for _ in range(ROUNDS):
        for v in values:
            t = math.tanh(v + total * 1e-3)
            total += t
            if t < low:
                low = t
            elif t > high:
                high = t
    return np.array([total, low, high])


def timed_run(rows: lazyseq.View, **loader: object) -> tuple[float, np.ndarray]:
    """Seconds for a whole run through ``prefetch(rows.smap(transform), **loader)``, and what it gave."""
    began = time.perf_counter()
    with lazyseq.prefetch(rows.smap(transform), **loader) as items:  # type: ignore[arg-type]
        out = np.stack(list(items))
    return time.perf_counter() - began, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run, as a smoke test")
    quick = parser.parse_args().quick
    count, repeats = (200, 1) if quick else (2000, 5)
    contenders = {
        "ray, default max_buffered": {"nworkers": 2, "method": "ray"},  # three runs per worker, sized from the timings
        "process, default max_buffered": {"nworkers": 2, "method": "process"},  # 10
        "ray, max_buffered=256": {"nworkers": 2, "method": "ray", "max_buffered": 256},
        "process, max_buffered=256": {"nworkers": 2, "method": "process", "max_buffered": 256},
        "ray, max_buffered=10": {"nworkers": 2, "method": "ray", "max_buffered": 10},
    }
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "rows.npy")
        np.save(path, np.random.default_rng(0).standard_normal((count, WIDTH)))
        rows = lazyseq.view(np.load(path, mmap_mode="r"))

        os.environ.setdefault("RAY_worker_niceness", "10")  # read by the nodes as they start
        began = time.perf_counter()
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        try:
            cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False)
            startup = time.perf_counter() - began
            first, _ = timed_run(rows, **contenders["ray, default max_buffered"])
            synchronous, expected = timed_run(rows)
            times: dict[str, list[float]] = {name: [] for name in contenders}
            for _ in range(repeats):
                for name, loader in contenders.items():
                    seconds, out = timed_run(rows, **loader)
                    if not np.array_equal(out, expected):
                        raise AssertionError(f"{name} gave other values than a synchronous read")
                    times[name].append(seconds)
        finally:
            ray.shutdown()
            cluster.shutdown()

    rate = {name: count / min(seconds) for name, seconds in times.items()}
    print(f"{count} rows of {WIDTH} float64, a pure-Python transform of {synchronous / count * 1e3:.2f} ms per row")
    extra = first - min(times["ray, default max_buffered"])
    print(
        f"Ray {ray.__version__}; cluster start-up {startup:.1f} s; the first run took {first:.2f} s, {extra:.2f} s more"
    )
    print("than the best later one (Ray starts its worker processes then)")
    print(f"synchronous: {count / synchronous:,.0f} rows/s\n")
    header = ["contender", "best rows/s", "median rows/s", "runs (s)"]
    lines = [
        [
            name,
            f"{rate[name]:,.0f}",
            f"{count / statistics.median(seconds):,.0f}",
            " ".join(f"{s:.2f}" for s in seconds),
        ]
        for name, seconds in times.items()
    ]
    print(table(header, lines), "\n")
    pairs = {  # the process default is 10
        "default max_buffered": ("ray, default max_buffered", "process, default max_buffered"),
        "max_buffered=256": ("ray, max_buffered=256", "process, max_buffered=256"),
        "Ray max_buffered=10, processes default (10)": ("ray, max_buffered=10", "process, default max_buffered"),
    }
    results = [
        Result(
            f"2 Ray tasks vs 2 processes, {setting}",
            f"{rate[ray_name]:,.0f} rows/s",
            f"{rate[process_name]:,.0f} rows/s",
            f"{rate[ray_name] / rate[process_name]:.2f}",
        )
        for setting, (ray_name, process_name) in pairs.items()
    ]
    results.append(Result("start-up: two-node cluster + first run's extra", f"{startup:.1f} s + {extra:.2f} s", "", ""))
    print(summary(results))


if __name__ == "__main__":
    main()

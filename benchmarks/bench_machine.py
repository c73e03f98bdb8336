"""What this machine gives two workers without any loader: one process alone vs two side by side.

    python benchmarks/bench_machine.py          # about 20 seconds
    python benchmarks/bench_machine.py --quick  # a smoke test

A loader with two workers cannot beat two independent processes. On a small
virtual machine a core running alone is sometimes much faster than two running
together (frequency boost, a busy neighbour on the host), so a speedup measured
against a synchronous baseline timed alone is bounded by this ratio, whatever
the loader does. Each try times one process, then two, running the same
pure-Python loop, and reads the steal time the kernel reports meanwhile.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time


def cpu_ticks() -> list[int]:
    """The machine's CPU time so far, per state (user, nice, system, idle, iowait, irq, softirq, steal, ...)."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except OSError:  # not Linux: no steal time to report
        return []


def spin(n: int) -> None:
    total = 0
    for i in range(n):
        total += i


def run_side_by_side(count: int, n: int) -> tuple[float, int, int]:
    """Seconds for ``count`` processes each running ``spin(n)``; steal ticks and all ticks meanwhile."""
    workers = [multiprocessing.Process(target=spin, args=(n,)) for _ in range(count)]
    before, start = cpu_ticks(), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds, after = time.perf_counter() - start, cpu_ticks()
    delta = [b - a for a, b in zip(before, after)]
    return seconds, delta[7] if len(delta) > 7 else 0, sum(delta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run, as a smoke test")
    quick = parser.parse_args().quick
    tries, n = (2, 1_000_000) if quick else (6, 20_000_000)
    print("try  one alone  two side by side  work done by two / one  steal ticks (two)")
    ratios = []
    for k in range(tries):
        one, _, _ = run_side_by_side(1, n)
        two, steal, ticks = run_side_by_side(2, n)
        ratios.append(2 * one / two)
        print(f"{k + 1:>3}  {one:8.2f} s  {two:14.2f} s  {ratios[-1]:22.2f}x  {steal} of {ticks}")
    print(f"\ntwo processes did {min(ratios):.2f}-{max(ratios):.2f}x the work of one")


if __name__ == "__main__":
    main()

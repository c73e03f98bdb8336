"""Distinct random states for worker processes: one base seed, one stream per worker.

A forked worker is a copy of the consumer, random generators included: without
reseeding, two workers calling ``np.random.randint`` draw the same numbers and a
loader delivers the same minibatch twice. So every worker process starts by
seeding Python's :mod:`random`, numpy's global generator and, if it is
imported, torch's, from ``SeedSequence(base_seed, spawn_key=(worker,))``:
distinct for each worker, and the same for the same base seed. The base seed
is the loader's ``seed`` argument, or fresh entropy when it is ``None``; each
time a loader starts its workers again, they get the next seeds, so an epoch
that restarts the workers does not replay the last one.

Worker threads share their process's global generators (one state, drawn from
in turn, so they never repeat each other); nothing is reseeded for them.

Results that must not depend on how many workers ran, or which computed what,
come from :func:`lazyseq.rng` instead: a generator made from the item itself.

>>> states = [worker_states(1234, worker) for worker in (0, 1)]
>>> states[0] == worker_states(1234, 0), states[0] == states[1]
(True, False)
"""

from __future__ import annotations

import os
import random
import signal
import sys
import traceback
from typing import Any

import numpy as np

__all__ = ["base_seed", "seed_this_worker", "seed_torch", "seeding_death", "worker_states"]


def base_seed(seed: int | None, start: int) -> int:
    """The base seed of the ``start``-th start of a loader's workers (fresh entropy for ``seed=None``)."""
    if seed is None:
        return int.from_bytes(os.urandom(16), "big")
    return int(np.random.SeedSequence(seed, spawn_key=(start,)).generate_state(4, np.uint32).view(np.uint64)[0])


def worker_states(base: int, worker: int) -> tuple[int, tuple[int, ...], int]:
    """Seeds for worker ``worker``: Python's ``random``, numpy's global generator, torch."""
    sequence = np.random.SeedSequence(base, spawn_key=(worker,))
    words = [int(word) for word in sequence.generate_state(10, np.uint32)]
    python = words[0] << 96 | words[1] << 64 | words[2] << 32 | words[3]
    torch_seed = words[8] << 32 | words[9]
    return python, tuple(words[4:8]), torch_seed & ((1 << 63) - 1)


def seed_this_worker(base: int, worker: int, forked: bool = False) -> None:
    """Seed the global generators of this process for worker ``worker`` (called first thing in a worker).

    In a worker ``forked`` from the consumer, torch's generator may have been
    locked by another thread of the consumer at the fork (see
    :mod:`.fork_safety`): locked for ever, since that thread is not in the
    worker, and torch waits for that lock holding the GIL, so that no other
    thread of the worker can run either. Rather than hang, such a worker is
    ended by the system: seeding runs under a timer whose signal, SIGALRM,
    kills the process after :data:`TORCH_LOCK_SECONDS` (the signal's default
    action, which needs no Python code to run). The consumer then reports the
    death with :func:`seeding_death`.
    """
    python, numpy_words, torch_seed = worker_states(base, worker)
    random.seed(python)
    np.random.seed(numpy_words)
    torch = sys.modules.get("torch")  # only if the pipeline already uses it: never imported here
    if torch is None or not hasattr(torch, "manual_seed"):
        return
    if not forked:
        seed_torch(torch, torch_seed)
        return
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})  # a forked thread keeps the forker's mask
    signal.setitimer(signal.ITIMER_REAL, TORCH_LOCK_SECONDS)
    try:
        seed_torch(torch, torch_seed)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGALRM, previous)


TORCH_LOCK_SECONDS = 5.0  # seeding takes microseconds: a generator locked this long is locked for ever


def seeding_death(exitcode: int | None) -> str | None:
    """Why a forked worker that ended with ``exitcode`` before it was ready died, if seeding ended it.

    >>> seeding_death(-signal.SIGALRM).split(":")[0]
    "torch's random generator was locked when this worker was forked"
    >>> seeding_death(1) is None
    True
    """
    if exitcode != -signal.SIGALRM:
        return None
    return (
        "torch's random generator was locked when this worker was forked: another thread of the consumer was "
        "drawing from it (torch.randn, ...) at that moment, and its lock stays held in the worker, whose seeding "
        f"of the generator had not returned after {TORCH_LOCK_SECONDS:g} s; start the workers with "
        "start_method='forkserver' or 'spawn', or keep other threads from drawing while they start"
    )


def seed_torch(torch: Any, seed: int) -> None:
    """``torch.manual_seed(seed)``, without the stack torch would format for its accelerators' deferred seeding.

    Until CUDA (or XPU...) starts in a process, torch defers seeding its
    generators there and records where it was asked, formatting the stack
    (``traceback.format_stack``) for the message of a seeding that fails once
    the device starts. Formatting it reads source files: 2-3 ms of a fresh
    worker's first task on a machine without accelerators. The record is left
    empty (the function is swapped for the call, in a worker that runs nothing
    else yet); the seeds are set as ``torch.manual_seed`` sets them.

    >>> class Torch:  # a stand-in, as torch defers a device's seeding
    ...     def manual_seed(self, seed):
    ...         print(seed, traceback.format_stack())
    >>> seed_torch(Torch(), 1234)
    1234 []
    """
    format_stack = traceback.format_stack
    traceback.format_stack = _no_stack
    try:
        torch.manual_seed(seed)
    finally:
        traceback.format_stack = format_stack


def _no_stack(*args: Any, **kwargs: Any) -> list[str]:
    return []

"""How many items a loader keeps computed or in progress ahead of its reader: ``max_buffered``, resolved here.

An explicit ``max_buffered`` (``max_cached`` for ``load_buffers``) is
always obeyed, up to ``MAX_BUFFERED`` (65,536), or beyond the items a view
has (all of them, then): more is refused, as a loader would spend minutes
sending that many tasks before the memory they need is known, and checked. Left out (``None``), it is the loader's default for threads
(10 items for ``prefetch``, 4 batches for ``evaluate``, 2 for
``load_buffers``), and otherwise it follows the items' timings:

- worker processes (``prefetch`` and ``serve``): 10 items, or more for quick
  ones, enough for ``AHEAD_SECONDS`` of the workers' work, at most
  ``MAX_AHEAD`` (:func:`items_ahead`). Every result a worker hands over costs
  the reader a wake-up and some bookkeeping, and the engine sends more tasks
  only once half the room is free (one message for several tasks; see
  :func:`refill_size`): with items
  of 50 us, 10 in flight left each worker idle about a fifth of the time,
  waiting for its next tasks, and 32 kept them busy (see the loading
  benchmark; more helped little, and each slot costs a worker page faults
  the first time it writes there). Their shared-memory slots take at most
  ``SLOT_BUDGET`` bytes (fewer items ahead for large ones, never fewer than
  10).
- Ray: room for three runs per worker: a Ray task costs milliseconds to send
  and collect, so each one computes a run of items of about
  ``TASK_SECONDS`` of work (:func:`run_length`, sized from the items'
  timings), and a worker stays busy, with full runs, only if its next run is
  ready to go when one ends. One run in flight and one waiting would be two,
  but the results that arrived and are not read yet count against the room
  too, and the engine sends more only once half the room is free: with room
  for two runs per worker, runs often went out cut short, and each Ray task's
  cost showed (see the Ray benchmark). Items of 1 ms on 2 Ray workers: 3 x 2
  runs of 50 items, 300 items.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .options import LoaderOptions, positive

__all__ = [
    "AHEAD_SECONDS",
    "BATCHES_AHEAD",
    "BATCHES_CACHED",
    "ITEMS_AHEAD",
    "MAX_AHEAD",
    "MAX_BUFFERED",
    "MAX_RUN",
    "SLOT_BUDGET",
    "TASK_SECONDS",
    "Buffering",
    "items_ahead",
    "refill_size",
    "run_length",
]

ITEMS_AHEAD = 10  # prefetch and serve, with threads; and with processes, at least
AHEAD_SECONDS = 0.002  # prefetch and serve with processes: items for this much of the workers' work ...
MAX_AHEAD = 32  # ... at most
SLOT_BUDGET = 64 * 2**20  # ... and shared-memory slots of at most this many bytes for them (but 10 items, always)
BATCHES_AHEAD = 4  # evaluate, with threads and processes
BATCHES_CACHED = 2  # load_buffers, with threads and processes

TASK_SECONDS = 0.05  # work per Ray task: sending one and collecting it costs 1-5 ms (a lease, a push, a reply)
MAX_BUFFERED = 2**16  # an explicit max_buffered (max_cached) larger than this is refused, not obeyed for minutes
MAX_RUN = 256  # items per Ray task at most, however cheap: what the runs of a worker hold stays bounded
RUNS_PER_WORKER = 3  # one computing, the next one ready to go, and one for the results not read yet


def refill_size(capacity: int, held: int, pending: int, workers: int) -> int:
    """How many more tasks to send now, with ``held`` computed or in progress out of ``capacity``, ``pending`` of
    them in progress or waiting for one of ``workers``.

    0 while every worker has a task and less than half the capacity is
    free: a refill is worth its message (and the wake-up of a worker) once it
    carries several tasks. All the room there is otherwise: a worker without a
    task does not wait for the others to drain the rest.

    >>> refill_size(10, 6, pending=3, workers=2), refill_size(10, 5, pending=3, workers=2)
    (0, 5)
    >>> refill_size(10, 9, pending=0, workers=1), refill_size(10, 8, pending=3, workers=4)
    (1, 2)
    """
    room = capacity - held
    if room < max(1, capacity // 2) and pending >= workers:
        return 0
    return max(room, 0)


def items_ahead(workers: int, seconds: float | None) -> int:
    """How many items worker processes keep ahead when items take ``seconds`` (None: not timed yet).

    >>> items_ahead(2, None), items_ahead(2, 1e-3), items_ahead(2, 2e-4), items_ahead(2, 1e-5)
    (10, 10, 20, 32)
    """
    if seconds is None:
        return ITEMS_AHEAD
    return max(ITEMS_AHEAD, min(MAX_AHEAD, math.ceil(workers * AHEAD_SECONDS / max(seconds, 1e-9))))


def run_length(seconds: float | None) -> int:
    """How many items one Ray task computes: about ``TASK_SECONDS`` of work, at most ``MAX_RUN`` (one until timed).

    >>> run_length(None), run_length(1e-3), run_length(0.2), run_length(1e-6)
    (1, 50, 1, 256)
    """
    if seconds is None:
        return 1
    return max(1, min(MAX_RUN, int(TASK_SECONDS / max(seconds, 1e-9))))


@dataclass(frozen=True)
class Buffering:
    """At most ``size`` items computed or in progress; ``size=None``: sized from the items' timings.

    That is three runs for each of ``ray_workers``, or :func:`items_ahead`
    for ``process_workers``.

    >>> from lazyseq.loading.options import LoaderOptions
    >>> ray = LoaderOptions.check("prefetch", nworkers=2, method="ray")
    >>> auto = Buffering.resolve(None, ray, default=10)
    >>> auto.capacity(None), auto.capacity(1e-3), auto.capacity(1e-6)  # until timed, then from the timings
    (6, 300, 1536)
    >>> Buffering.resolve(None, LoaderOptions.check("prefetch", nworkers=2), default=10).capacity(1e-5)
    10
    >>> processes = LoaderOptions.check("prefetch", nworkers=2, method="process")
    >>> Buffering.resolve(None, processes, default=10, deepen=True).capacity(1e-5), Buffering.resolve(None, processes, default=10).capacity(1e-5)
    (32, 10)
    >>> Buffering.resolve(256, ray, default=10).capacity(1e-3)  # explicit: obeyed
    256
    """

    size: int | None
    ray_workers: int = 0
    process_workers: int = 0

    @classmethod
    def resolve(
        cls,
        given: int | None,
        options: LoaderOptions,
        default: int,
        name: str = "max_buffered",
        deepen: bool = False,
        items: int | None = None,
    ) -> Buffering:
        """``given`` items (checked), else ``default``; sized from the timings for Ray, and if ``deepen`` for processes.

        ``items``: how many items there are, if known (a number above it
        means "all of them", whatever its size).
        """
        if given is not None:
            size = positive(given, name, options.owner)
            if (
                min(size, size if items is None else items) > MAX_BUFFERED
            ):  # each costs a task sent, memory held, a shared-memory slot: no use beyond
                raise ValueError(
                    f"{options.owner}: {name} must be at most {MAX_BUFFERED:,} (items kept ahead of the reader), "
                    f"got {given!r}"
                )
            return cls(size)
        if options.method == "ray" and options.nworkers:
            return cls(None, options.nworkers)
        if deepen and options.method == "process" and options.nworkers:
            return cls(None, process_workers=options.nworkers)
        return cls(default)

    def capacity(self, seconds: float | None) -> int:
        """How many items, now that one takes ``seconds`` (``None``: not timed yet)."""
        if self.size is not None:
            return self.size
        if self.process_workers:
            return items_ahead(self.process_workers, seconds)
        return RUNS_PER_WORKER * self.ray_workers * run_length(seconds)

    @property
    def most(self) -> int:
        """The largest capacity that worker processes may need slots for."""
        return self.size if self.size is not None else MAX_AHEAD if self.process_workers else 0

    def __str__(self) -> str:
        if self.size is not None:
            return str(self.size)
        return f"{ITEMS_AHEAD} to {MAX_AHEAD}" if self.process_workers else "three runs per worker"

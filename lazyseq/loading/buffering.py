"""How many items a loader keeps computed or in progress ahead of its reader: ``max_buffered``, resolved here.

An explicit ``max_buffered`` (``max_cached`` for ``load_buffers``) is
always obeyed. Left out (``None``), it is the loader's default for threads and
processes (10 items for ``prefetch``, 4 batches for ``evaluate``, 2 for
``load_buffers``), and for Ray room for three runs per worker: a Ray task
costs milliseconds to send and collect, so each one computes a run of items
of about ``TASK_SECONDS`` of work (:func:`run_length`, sized from the items'
timings), and a worker stays busy, with full runs, only if its next run is
ready to go when one ends. One run in flight and one waiting would be two,
but the results that arrived and are not read yet count against the room
too, and the engine sends more only once half the room is free: with room
for two runs per worker, runs often went out cut short, and each Ray task's
cost showed (see the Ray benchmark). Items of 1 ms on 2 Ray workers: 3 x 2
runs of 50 items, 300 items.
"""

from __future__ import annotations

from dataclasses import dataclass

from .options import LoaderOptions, positive

__all__ = ["BATCHES_AHEAD", "BATCHES_CACHED", "ITEMS_AHEAD", "MAX_RUN", "TASK_SECONDS", "Buffering", "run_length"]

ITEMS_AHEAD = 10  # prefetch and serve, with threads and processes
BATCHES_AHEAD = 4  # evaluate, with threads and processes
BATCHES_CACHED = 2  # load_buffers, with threads and processes

TASK_SECONDS = 0.05  # work per Ray task: sending one and collecting it costs 1-5 ms (a lease, a push, a reply)
MAX_RUN = 256  # items per Ray task at most, however cheap: what the runs of a worker hold stays bounded
RUNS_PER_WORKER = 3  # one computing, the next one ready to go, and one for the results not read yet


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
    """At most ``size`` items computed or in progress; ``size=None``: three runs for each of ``ray_workers``.

    >>> from lazyseq.loading.options import LoaderOptions
    >>> ray = LoaderOptions.check("prefetch", nworkers=2, method="ray")
    >>> auto = Buffering.resolve(None, ray, default=10)
    >>> auto.capacity(None), auto.capacity(1e-3), auto.capacity(1e-6)  # until timed, then from the timings
    (6, 300, 1536)
    >>> Buffering.resolve(None, LoaderOptions.check("prefetch", nworkers=2), default=10).capacity(1e-3)
    10
    >>> Buffering.resolve(256, ray, default=10).capacity(1e-3)  # explicit: obeyed
    256
    """

    size: int | None
    ray_workers: int = 0

    @classmethod
    def resolve(cls, given: int | None, options: LoaderOptions, default: int, name: str = "max_buffered") -> Buffering:
        """``given`` items (checked), else ``default`` for threads and processes and three runs per Ray worker."""
        if given is not None:
            return cls(positive(given, name, options.owner))
        if options.method == "ray" and options.nworkers:
            return cls(None, options.nworkers)
        return cls(default)

    def capacity(self, seconds: float | None) -> int:
        """How many items, now that one takes ``seconds`` (``None``: not timed yet)."""
        if self.size is not None:
            return self.size
        return RUNS_PER_WORKER * self.ray_workers * run_length(seconds)

    def __str__(self) -> str:
        return str(self.size) if self.size is not None else "three runs per worker"

"""How many items a loader keeps computed or in progress ahead of its reader: ``max_buffered``, resolved here.

An explicit ``max_buffered`` (``max_cached`` for ``load_buffers``) is
always obeyed. Left out (``None``), it is the loader's default for threads and
processes (10 items for ``prefetch``, 4 batches for ``evaluate``, 2 for
``load_buffers``), and for Ray room for two runs per worker: a Ray task costs
milliseconds to send and collect, so each one computes a run of items of
about ``TASK_SECONDS`` of work (:func:`run_length`, sized from the items'
timings), and a worker stays busy only if its next run is ready to go when
one ends. Items of 1 ms on 2 Ray workers: 2 x 2 runs of 50 items, 200 items.
"""

from __future__ import annotations

from dataclasses import dataclass

from .options import LoaderOptions, positive

__all__ = ["BATCHES_AHEAD", "BATCHES_CACHED", "ITEMS_AHEAD", "MAX_RUN", "TASK_SECONDS", "Buffering", "run_length"]

ITEMS_AHEAD = 10  # prefetch and serve, with threads and processes
BATCHES_AHEAD = 4  # evaluate, with threads and processes
BATCHES_CACHED = 2  # load_buffers, with threads and processes

TASK_SECONDS = 0.05  # work per Ray task: sending one and collecting it costs 1-5 ms (a lease, a push, a reply)
MAX_RUN = 256  # items per Ray task at most, however cheap: what two runs per worker hold stays bounded
RUNS_PER_WORKER = 2  # one computing, the next one ready to go


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
    """At most ``size`` items computed or in progress; ``size=None``: two runs for each of ``ray_workers``.

    >>> from lazyseq.loading.options import LoaderOptions
    >>> ray = LoaderOptions.check("prefetch", nworkers=2, method="ray")
    >>> auto = Buffering.resolve(None, ray, default=10)
    >>> auto.capacity(None), auto.capacity(1e-3), auto.capacity(1e-6)  # until timed, then from the timings
    (4, 200, 1024)
    >>> Buffering.resolve(None, LoaderOptions.check("prefetch", nworkers=2), default=10).capacity(1e-3)
    10
    >>> Buffering.resolve(256, ray, default=10).capacity(1e-3)  # explicit: obeyed
    256
    """

    size: int | None
    ray_workers: int = 0

    @classmethod
    def resolve(cls, given: int | None, options: LoaderOptions, default: int, name: str = "max_buffered") -> Buffering:
        """``given`` items (checked), else ``default`` for threads and processes and two runs per Ray worker."""
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
        return str(self.size) if self.size is not None else "two runs per worker"

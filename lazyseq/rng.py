"""Random numbers that depend on what is computed, not on who computes it or when: ``rng``."""

from __future__ import annotations

import numpy as np

from .arguments import integer

__all__ = ["rng"]


def rng(seed: int, *keys: int) -> np.random.Generator:
    """A random generator determined by ``seed`` and integer ``keys`` (an epoch, an item index...).

    A random transform that draws from ``rng(seed, epoch, i)`` for item ``i``
    gives the same item whichever worker computes it, in whatever order, with
    threads or processes or none.

    >>> import lazyseq
    >>> def jitter(i):
    ...     return i + lazyseq.rng(42, 0, i).normal()
    >>> noisy = lazyseq.smap(jitter, range(4))
    >>> list(noisy) == list(lazyseq.prefetch(noisy, nworkers=2))
    True
    """
    values = [integer(seed, "rng: seed", low=0), *(integer(k, "rng: a key", low=0) for k in keys)]
    return np.random.default_rng(values)

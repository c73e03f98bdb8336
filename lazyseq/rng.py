"""Random numbers that depend on what is computed, not on who computes it or when: ``rng``."""

from __future__ import annotations

import numpy as np

from .arguments import integer
from .views.itemtypes import Integer

__all__ = ["rng"]


def rng(seed: Integer, *keys: Integer) -> np.random.Generator:
    """A random generator determined by ``seed`` and integer ``keys`` (an epoch, an item index...).

    A random transform that draws from ``rng(seed, epoch, i)`` for item ``i``
    gives the same item whichever worker computes it, in whatever order, with
    threads or processes or none. Different seeds and keys give independent
    generators (``rng(s, 3)`` and ``rng(s, 3, 0)`` too), and none draws what
    :func:`~lazyseq.shuffle` draws for its order with the same seed.

    >>> import lazyseq
    >>> def jitter(i):
    ...     return i + lazyseq.rng(42, 0, i).normal()
    >>> noisy = lazyseq.smap(jitter, range(4))
    >>> list(noisy) == list(lazyseq.prefetch(noisy, nworkers=2))
    True
    """
    values = [integer(seed, "rng: seed", low=0), *(integer(k, "rng: a key", low=0) for k in keys)]
    return np.random.default_rng(entropy_of(values))


_DOMAIN = 0x6C7A_7267  # "lzrg" in ASCII: no other generator of lazyseq (shuffle's) starts from the same entropy


def entropy_of(values: list[int]) -> list[int]:
    """The 32-bit words that seed ``rng(*values)``: one sequence of values, one list of words, and back.

    Each value is written as its number of words and then its words, after
    how many values there are: ``rng(s, 3)`` and ``rng(s, 3, 0)`` differ, a
    key of 2**32 or more does not spill into the next one, and no call
    draws what ``shuffle(seed=s)`` draws for its order.

    >>> entropy_of([5]), entropy_of([5, 0]), entropy_of([2**32 + 7])
    ([1819964007, 1, 1, 5], [1819964007, 2, 1, 5, 1, 0], [1819964007, 1, 2, 7, 1])
    """
    words = [_DOMAIN, len(values)]
    for value in values:
        parts = []
        while True:
            parts.append(value & 0xFFFF_FFFF)
            value >>= 32
            if not value:
                break
        words += [len(parts), *parts]
    return words

"""The combinators as methods, so that pipelines read left to right.

``view(x).gather(idx).smap(f).batch(64)`` is ``batch(smap(f, gather(x, idx)), 64)``.
Imports happen inside the methods because every combinator module imports the
base class, which inherits from this one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class Fluent:
    """Methods shared by every view; each forwards to the function of the same name."""

    __slots__ = ()

    def smap(self, f: Callable, *others: Sequence):
        """``smap(f, self, *others)``."""
        from .mapping import smap

        return smap(f, self, *others)

    map = smap

    def starmap(self, f: Callable):
        """``starmap(f, self)``."""
        from .mapping import starmap

        return starmap(f, self)

    def gather(self, indexes):
        """``gather(self, indexes)``."""
        from .gather import gather

        return gather(self, indexes)

    take = gather

    def concatenate(self, *others: Sequence):
        """``concatenate([self, *others])``."""
        from .concatenate import concatenate

        return concatenate([self, *others])

    def collate(self, *others: Sequence):
        """``collate([self, *others])``."""
        from .collate import collate

        return collate([self, *others])

    def interleave(self, *others: Sequence):
        """``interleave(self, *others)``."""
        from .interleave import interleave

        return interleave(self, *others)

    def batch(self, k: int, drop_last: bool = False, pad: Any = None, collate_fn: Callable | None = None):
        """``batch(self, k, drop_last, pad, collate_fn)``."""
        from .batching import batch

        return batch(self, k, drop_last=drop_last, pad=pad, collate_fn=collate_fn)

    def unbatch(self, batch_size: int, last_batch_size: int | None = None):
        """``unbatch(self, batch_size, last_batch_size)``."""
        from .batching import unbatch

        return unbatch(self, batch_size, last_batch_size)

    def split(self, edges):
        """``split(self, edges)``."""
        from .split import split

        return split(self, edges)

    def cycle(self, limit: int | None = None):
        """``cycle(self, limit)``."""
        from .repetition import cycle

        return cycle(self, limit)

    def shard(self, rank: int, world_size: int, contiguous: bool = True):
        """``shard(self, rank, world_size, contiguous)``."""
        from .shard import shard

        return shard(self, rank, world_size, contiguous)

    def shuffle(self, seed: int | None = None, epoch: int = 0):
        """``shuffle(self, seed, epoch)``."""
        from .shuffle import shuffle

        return shuffle(self, seed, epoch)

    def add_cache(self, cache_size: int = 1):
        """``add_cache(self, cache_size)``."""
        from .cache import add_cache

        return add_cache(self, cache_size)

    def set_epoch(self, epoch: int) -> None:
        """Give every ``shuffle`` in this pipeline the permutation of ``epoch``."""
        for parent in self._parents:
            parent.set_epoch(epoch)

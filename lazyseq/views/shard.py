"""One worker's or rank's share of a view: ``shard``."""

from __future__ import annotations

from typing import Any, overload

import numpy as np

from ..arguments import flag, integer
from .base import View
from .itemtypes import Integer, SequenceLike, T
from .sources import as_view

__all__ = ["shard"]


@overload
def shard(
    sequence: np.ndarray, rank: Integer, world_size: Integer, contiguous: bool = True, drop_last: bool = False
) -> View[np.ndarray]: ...


@overload
def shard(
    sequence: SequenceLike[T], rank: Integer, world_size: Integer, contiguous: bool = True, drop_last: bool = False
) -> View[T]: ...


def shard(
    sequence: SequenceLike[Any] | np.ndarray,
    rank: Integer,
    world_size: Integer,
    contiguous: bool = True,
    drop_last: bool = False,
) -> View[Any]:
    """The part of ``sequence`` that ``rank`` out of ``world_size`` handles: every item in exactly one shard.

    Contiguous shards are consecutive runs whose lengths differ by at most one
    (the first ``len % world_size`` shards hold one more item); strided shards
    take every ``world_size``-th item from ``rank`` on, and also work on
    infinite views. No item is repeated and none is padded, so evaluating every
    shard covers a test set exactly once. ``drop_last=True`` leaves out the
    last ``len % world_size`` items instead, so that every shard has as many
    items: ranks of a distributed training that step together then take as
    many steps (one with a batch more waits for the others for ever).

    >>> import lazyseq
    >>> [list(lazyseq.shard(range(10), r, 3)) for r in range(3)]
    [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    >>> [list(lazyseq.shard(range(10), r, 3, contiguous=False)) for r in range(3)]
    [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    >>> [list(lazyseq.shard(range(10), r, 3, drop_last=True)) for r in range(3)]
    [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    """
    parent = as_view(sequence)
    world_size = integer(world_size, "shard: world_size", low=1)
    rank = integer(rank, "shard: rank")
    contiguous = flag(contiguous, "shard: contiguous")
    drop_last = flag(drop_last, "shard: drop_last")
    if not 0 <= rank < world_size:
        raise ValueError(f"shard: rank must be between 0 and {world_size - 1}, got {rank}")
    if drop_last:
        size = parent._need_length("shard with drop_last") // world_size
        return parent[rank * size : (rank + 1) * size] if contiguous else parent[rank : size * world_size : world_size]
    if not contiguous:
        return parent[rank::world_size]
    n = parent._need_length("a contiguous shard")
    size, extra = divmod(n, world_size)
    start = rank * size + min(rank, extra)
    return parent[start : start + size + (rank < extra)]

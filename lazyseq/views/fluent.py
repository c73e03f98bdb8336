"""The combinators as methods, so that pipelines read left to right.

``view(x).gather(idx).smap(f).batch(64)`` is ``batch(smap(f, gather(x, idx)), 64)``.
Imports happen inside the methods because every combinator module imports the
base class, which inherits from this one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Never, overload

import numpy as np

from .itemtypes import Indexes, Integer, R, S, SequenceLike, T_co, Ts, U

if TYPE_CHECKING:
    from .base import View
    from .split import Edges


class Fluent(Generic[T_co]):
    """Methods shared by every view; each forwards to the function of the same name."""

    __slots__ = ()
    _parents: tuple[View[Any], ...]

    if TYPE_CHECKING:  # provided by View: a view is a sequence for the functions the methods call

        def __len__(self) -> int: ...

        def __getitem__(self, index: int, /) -> T_co: ...

    @overload
    def smap(self, f: Callable[[T_co], R], /) -> View[R]: ...

    @overload
    def smap(self, f: Callable[[T_co, S], R], other: SequenceLike[S], /) -> View[R]: ...

    @overload
    def smap(self, f: Callable[[T_co, S, U], R], other: SequenceLike[S], another: SequenceLike[U], /) -> View[R]: ...

    @overload
    def smap(  # four sequences or more: what f takes is not checked
        self,
        f: Callable[..., R],
        other: SequenceLike[Any],
        another: SequenceLike[Any],
        third: SequenceLike[Any],
        /,
        *others: SequenceLike[Any],
    ) -> View[R]: ...

    def smap(self, f: Callable[..., R], *others: SequenceLike[Any]) -> View[R]:
        """``smap(f, self, *others)``."""
        from .mapping import smap

        return smap(f, self, *others)

    map = smap

    @overload
    def starmap(self: Fluent[tuple[*Ts]], f: Callable[[*Ts], R]) -> View[R]: ...

    @overload
    def starmap(self: Fluent[list[Any]] | Fluent[np.ndarray], f: Callable[..., R]) -> View[R]: ...

    def starmap(self: Fluent[Any], f: Callable[..., R]) -> View[R]:
        """``starmap(f, self)``."""
        from .mapping import starmap

        return starmap(f, self)

    def gather(self, indexes: Indexes | np.ndarray) -> View[T_co]:
        """``gather(self, indexes)``."""
        from .gather import gather

        return gather(self, indexes)

    take = gather

    def concatenate(self, *others: SequenceLike[S]) -> View[T_co | S]:
        """``concatenate([self, *others])``."""
        from .concatenate import concatenate

        return concatenate([self, *others])

    @overload
    def collate(self) -> View[tuple[T_co]]: ...

    @overload
    def collate(self, other: SequenceLike[S], /) -> View[tuple[T_co, S]]: ...

    @overload
    def collate(self, other: SequenceLike[S], another: SequenceLike[U], /) -> View[tuple[T_co, S, U]]: ...

    @overload
    def collate(self, *others: SequenceLike[Any]) -> View[Any]: ...  # Any rather than tuple[Any, ...]: see collate

    def collate(self, *others: SequenceLike[Any]) -> View[Any]:
        """``collate([self, *others])``."""
        from .collate import collate

        return collate([self, *others])

    def interleave(self, *others: SequenceLike[S]) -> View[T_co | S]:
        """``interleave(self, *others)``."""
        from .interleave import interleave

        return interleave(self, *others)

    @overload
    def batch(
        self, k: Integer, drop_last: bool = ..., pad: Any = ..., *, collate_fn: Callable[[list[T_co]], R]
    ) -> View[R]: ...

    @overload
    def batch(  # items of unknown type (Any) match here first, and their batches stay unknown
        self: Fluent[Never], k: Integer, drop_last: bool = ..., pad: Any = ..., collate_fn: None = None
    ) -> View[Any]: ...

    @overload
    def batch(
        self: Fluent[np.ndarray | np.generic | complex],
        k: Integer,
        drop_last: bool = ...,
        pad: Any = ...,
        collate_fn: None = None,
    ) -> View[np.ndarray]: ...

    @overload
    def batch(
        self, k: Integer, drop_last: bool = ..., pad: Any = ..., collate_fn: Callable[[list[Any]], Any] | None = None
    ) -> View[Any]: ...

    def batch(
        self, k: Integer, drop_last: bool = False, pad: Any = None, collate_fn: Callable[[list[Any]], Any] | None = None
    ) -> View[Any]:
        """``batch(self, k, drop_last, pad, collate_fn)``."""
        from .batching import batch

        return batch(self, k, drop_last=drop_last, pad=pad, collate_fn=collate_fn)

    def unbatch(self: Fluent[SequenceLike[S]], batch_size: Integer, last_batch_size: Integer | None = None) -> View[S]:
        """``unbatch(self, batch_size, last_batch_size)``."""
        from .batching import unbatch

        return unbatch(self, batch_size, last_batch_size)

    def split(self, edges: Edges) -> View[View[T_co]]:
        """``split(self, edges)``."""
        from .split import split

        return split(self, edges)

    def cycle(self, limit: Integer | None = None) -> View[T_co]:
        """``cycle(self, limit)``."""
        from .repetition import cycle

        return cycle(self, limit)

    def shard(self, rank: Integer, world_size: Integer, contiguous: bool = True, drop_last: bool = False) -> View[T_co]:
        """``shard(self, rank, world_size, contiguous, drop_last)``."""
        from .shard import shard

        return shard(self, rank, world_size, contiguous, drop_last)

    def shuffle(self, seed: Integer | None = None, epoch: Integer = 0) -> View[T_co]:
        """``shuffle(self, seed, epoch)``."""
        from .shuffle import shuffle

        return shuffle(self, seed, epoch)

    def add_cache(self, cache_size: Integer = 1) -> View[T_co]:
        """``add_cache(self, cache_size)``."""
        from .cache import add_cache

        return add_cache(self, cache_size)

    def set_epoch(self, epoch: int) -> None:
        """Give every ``shuffle`` in this pipeline the permutation of ``epoch``."""
        for parent in self._parents:
            parent.set_epoch(epoch)

"""What a worker computes for one task: an item of a view, or one call of a function.

A job is called as ``job(arg)``. A worker process that has a shared-memory
slot for the result calls ``job.write_into(arg, slot)`` instead, which may
build the result's arrays directly in ``slot`` (bytes) and saves copying them
there afterwards. Before worker processes are forked, the consumer calls
``job.before_fork()``: what it makes then, every worker inherits rather than
making its own at its first task. Workers without shared slots also take a
plain function, which they only call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from ..views.base import View

__all__ = ["CallFunction", "IntoSlot", "ItemsAt", "Job", "ReadItem", "ReadItemOrChunk"]


@runtime_checkable
class Job(Protocol):
    def __call__(self, arg: Any) -> Any: ...

    def write_into(self, arg: Any, slot: np.ndarray) -> Any: ...

    def before_fork(self) -> None: ...


class ReadItem:
    """``job(i)`` is item ``i`` of ``view`` (the ``prefetch`` job).

    >>> import numpy as np, lazyseq
    >>> job = ReadItem(lazyseq.view(np.arange(12.0).reshape(6, 2)).batch(2))
    >>> slot = np.zeros(1024, np.uint8)
    >>> batch = job.write_into(1, slot)
    >>> batch.tolist(), np.shares_memory(batch, slot)
    ([[4.0, 5.0], [6.0, 7.0]], True)
    """

    def __init__(self, view: View) -> None:
        self.view = view

    def __call__(self, i: int) -> Any:
        return self.view._get(i)

    def write_into(self, i: int, slot: np.ndarray) -> Any:
        return self.view._get_into(i, slot)

    def before_fork(self) -> None:
        for view in self.view._views_below():
            view._before_fork()


class ItemsAt(NamedTuple):
    """The argument of a task that reads several items at once (see :class:`ReadItemOrChunk`), named in messages.

    >>> import numpy as np
    >>> str(ItemsAt(np.arange(3, 67))), str(ItemsAt(np.array([9, 2, 5, 7, 1])))
    ('3 to 66', '9, 2, 5, 7 and 1 more')
    """

    positions: np.ndarray

    def __str__(self) -> str:  # (for every batch a served view reads: what its wait names, should it fail)
        positions = self.positions
        first, last, count = int(positions[0]), int(positions[-1]), len(positions)
        if count > 2 and last - first + 1 == count and bool((np.diff(positions) == 1).all()):
            return f"{first} to {last}"
        shown = ", ".join(map(str, positions[:4].tolist()))
        return shown if count <= 4 else f"{shown} and {count - 4} more"


class IntoSlot(NamedTuple):
    """The argument of a task that computes item ``item`` into ``slot`` (bytes), for a worker thread.

    (A served view's worker threads build a batch in the slot of the consumer's pool that it goes out in.)
    """

    item: int
    slot: np.ndarray

    def __str__(self) -> str:  # named in messages as the item alone
        return str(self.item)


class ReadItemOrChunk(ReadItem):
    """``job(i)`` is item ``i`` of ``view``; ``job(ItemsAt(positions))`` those items as one chunk (a served view's job);
    ``job(IntoSlot(i, slot))`` item ``i``, built in ``slot`` where its view can.

    The chunk is what ``view._get_many`` reads (see :mod:`lazyseq.views.chunks`):
    a consumer that asks for a batch's items at once gets them as the local read
    would have them, with one task and one message.

    >>> import numpy as np, lazyseq
    >>> job = ReadItemOrChunk(lazyseq.view(np.arange(12.0).reshape(6, 2)))
    >>> job(1).tolist(), job(ItemsAt(np.array([4, 0]))).tolist()
    ([2.0, 3.0], [[8.0, 9.0], [0.0, 1.0]])
    """

    def __call__(self, arg: Any) -> Any:
        kind = type(arg)
        if kind is ItemsAt:
            return self.view._get_many(arg.positions)
        if kind is IntoSlot:
            return self.view._get_into(arg.item, arg.slot)
        return self.view._get(arg)

    def write_into(self, arg: Any, slot: np.ndarray) -> Any:
        if type(arg) is ItemsAt:
            return self(arg)  # its arrays are copied into the slot when sent, where they fit
        return self.view._get_into(arg, slot)


class CallFunction:
    """``job(_)`` is ``func()`` (the ``load_buffers`` job)."""

    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func

    def __call__(self, _: Any) -> Any:
        return self.func()

    def write_into(self, _: Any, slot: np.ndarray) -> Any:
        return self.func()  # its arrays are the function's own: copied into the slot when sent

    def before_fork(self) -> None:
        pass  # a function's state is its own business

"""What a worker computes for one task: an item of a view, or one call of a function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["CallFunction", "ReadItem"]


class ReadItem:
    """``job(i)`` is item ``i`` of ``view`` (the ``prefetch`` job).

    ``writes_in_place`` says whether each item is made of nothing but arrays
    that the view's vectorized reads create (batches of rows of arrays), so
    that a worker may let those reads write straight into its output slot.
    """

    def __init__(self, view) -> None:
        self.view = view
        self.writes_in_place = _batches_of_rows(view)

    def __call__(self, i: int) -> Any:
        return self.view._get(i)


class CallFunction:
    """``job(_)`` is ``func()`` (the ``load_buffers`` job)."""

    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func

    def __call__(self, _: Any) -> Any:
        return self.func()


def _batches_of_rows(view) -> bool:
    from ..views.batching import BatchView

    return type(view) is BatchView and view._collate_fn is None and view._pad is None and _rows(view._parent)


def _rows(view) -> bool:
    """Whether reading many items of ``view`` gives new arrays that nothing else keeps (built by ``new_rows`` where it can)."""
    from ..views.collate import CollateView
    from ..views.concatenate import ConcatenateView
    from ..views.gather import GatherView, StridedView
    from ..views.shuffle import ShuffleView
    from ..views.sources import ArraySource

    kind = type(view)
    if kind is ArraySource:
        return True
    if kind is ConcatenateView:
        return view._arrays is not None
    if kind in (GatherView, StridedView, ShuffleView):
        return _rows(view._parent)
    if kind is CollateView:
        return all(_rows(parent) for parent in view._parents)
    return False

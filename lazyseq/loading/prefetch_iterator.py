"""An iterator over a prefetched view, in order, whose position can be saved and restored (``state_dict``)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic

from ..views import errors
from ..views.base import View
from ..views.itemtypes import T_co
from ..views.shuffle import ShuffleView
from .failures import LoaderClosed, WorkerDied, is_an_items_own
from .inline_run import MISSING

if TYPE_CHECKING:
    from .prefetch import PrefetchView

__all__ = ["PrefetchIterator", "shuffles_below"]


class PrefetchIterator(Generic[T_co]):
    """Reads a prefetched view in order; its position can be saved and restored.

    ``state_dict()`` says which item comes next; ``load_state_dict(state)``
    resumes there, so an interrupted run gives the items a run without
    interruption would have given.
    """

    def __init__(self, view: PrefetchView[T_co], position: int = 0, wrapping: bool = True) -> None:
        self._view = view
        self._position = position
        self._wrapping = wrapping  # an item's failure raised as EvaluationError; else as it is, for a view above

    def __iter__(self) -> PrefetchIterator[T_co]:
        return self

    def __repr__(self) -> str:
        view = self._view
        of = "" if view._len is None else f" of {view._len}"
        return f"iterator of {view._describe()}  [next: item {self._position}{of}]"

    def __next__(self) -> T_co:
        i = self._position
        n = self._view._len
        if n is not None and i >= n:
            raise StopIteration
        view = self._view
        try:
            self._position = i + 1  # a failed item is skipped if iteration goes on; an interrupted one is not
            run = view._run  # what view._get(i) looks at first, one call less (an error is raised there)
            if run is not None:
                value = run.take(i, view._engine, raising=False)
                if value is not MISSING:
                    return value
            return view._get(i)
        except errors.EndOfData:  # data of unknown length ended here (uniter)
            self._position = i
            raise StopIteration from None
        except WorkerDied as error:
            if i not in error.suspects:  # not what ended the worker: dropped as the workers stopped, read again next
                self._position = i
            raise
        except LoaderClosed:  # closed while the item was awaited (from another thread): it is read next
            self._position = i
            raise
        except Exception as error:
            if not self._wrapping:
                raise
            errors.reraise(error)
        except KeyboardInterrupt as interrupt:  # while the item was awaited: it was not read, and is read next
            if not is_an_items_own(interrupt):  # raised by the item's code: its failure, as any error's
                self._position = i
            raise

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands: ``{"position": next item, "length": len of the view, "shuffles": ...}``.

        ``shuffles`` lists the ``[seed, epoch]`` of the pipeline's shuffles:
        a state loaded where they differ would resume another order.
        """
        return {"position": self._position, "length": self._view._len, "shuffles": shuffles_below(self._view)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position that ``state_dict`` gave, on a view of the same length."""
        if not isinstance(state, Mapping):
            raise ValueError(f"prefetch: a saved state is a dict from state_dict(), got {type(state).__name__}")
        n = self._view._len
        if state.get("length") != n:
            raise ValueError(
                f"prefetch: the saved state is for a view of length {state.get('length')}, this one has length {n}"
            )
        saved: Any = state.get("position")
        try:  # numpy integers too (a state that went through a checkpoint)
            position = None if isinstance(saved, bool) else operator.index(saved)
        except TypeError:
            position = None
        if position is None or position < 0 or (n is not None and position > n):
            where = "an integer >= 0" if n is None else f"an integer from 0 to {n}"
            raise ValueError(f"prefetch: the saved position must be {where}, got {saved!r}")
        saved_shuffles, shuffles = state.get("shuffles"), shuffles_below(self._view)
        if saved_shuffles is not None and [list(pair) for pair in saved_shuffles] != shuffles:
            raise ValueError(
                f"prefetch: the saved state is of shuffles with [seed, epoch] {saved_shuffles}, this view's are "
                f"{shuffles}: set the epoch it was saved at (set_epoch) and the same seeds before loading it"
            )
        self._position = position


def shuffles_below(view: View) -> list[list[int | None]]:
    """``[seed, epoch]`` of each shuffle that ``view`` reads from: which order its items come in."""
    return [[v.seed, v._epoch] for v in view._views_below() if isinstance(v, ShuffleView)]

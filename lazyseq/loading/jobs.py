"""What a worker computes for one task: an item of a view, or one call of a function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["CallFunction", "ReadItem"]


class ReadItem:
    """``job(i)`` is item ``i`` of ``view`` (the ``prefetch`` job)."""

    def __init__(self, view) -> None:
        self.view = view

    def __call__(self, i: int) -> Any:
        return self.view._get(i)


class CallFunction:
    """``job(_)`` is ``func()`` (the ``load_buffers`` job)."""

    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func

    def __call__(self, _: Any) -> Any:
        return self.func()

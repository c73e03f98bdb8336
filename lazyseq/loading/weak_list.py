"""Objects held weakly, with nothing run as they go: :class:`WeakList`.

``weakref.WeakSet`` and ``WeakValueDictionary`` run a callback of Python's
as each of their objects is collected. A Ctrl-C whose handler runs inside such
a callback cannot be raised there: Python prints "Exception ignored" and drops
it, and the program goes on as if it had never been pressed. A loader's worker
processes and pools go that way as it closes, so the registries of this
process keep plain weak references instead, and drop the dead ones as others
are added.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["WeakList"]

T = TypeVar("T")


class WeakList(Generic[T]):
    """The objects added and still alive, in the order they were added (each once, if added once).

    >>> class Thing:
    ...     pass
    >>> things = WeakList()
    >>> kept, dropped = Thing(), Thing()
    >>> things.add(kept); things.add(dropped)
    >>> del dropped
    >>> list(things) == [kept]
    True
    """

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: list[weakref.ref[T]] = []

    def add(self, item: T) -> None:
        self._refs = [ref for ref in self._refs if ref() is not None]
        self._refs.append(weakref.ref(item))

    def __iter__(self) -> Iterator[T]:
        for ref in list(self._refs):
            item = ref()
            if item is not None:
                yield item

    def clear(self) -> None:
        self._refs.clear()

"""Tasks waiting to be sent to workers, in order; a task cancelled while it waits is skipped, never sent.

Backends that send tasks in their own time (worker processes as their share
of work runs low, Ray as tasks finish) keep them in a :class:`Backlog`; a
backend whose worker threads take tasks from a queue themselves has no need.

>>> backlog = Backlog()
>>> backlog.extend([("a", 1), ("b", 2), ("c", 3)])
>>> backlog.cancel("b")
>>> [backlog.next(), backlog.next(), backlog.next()], backlog.take_skipped()
([('a', 1), ('c', 3), None], [Done(task='b', status='skipped', value=None)])
>>> backlog.extend([("d", 4), ("e", 5), ("f", 6)])
>>> backlog.take(2), len(backlog)
([('d', 4), ('e', 5)], 1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any

from .backends import Done

__all__ = ["Backlog"]


class Backlog:
    """``(task, arg)`` pairs not sent yet; see the module's description.

    ``waiting`` holds them in order (cancelled ones too, until :meth:`next`
    passes them), ``skipped`` the "skipped" results not reported yet: a
    backend reads both at every poll, without a call.
    """

    def __init__(self) -> None:
        self.waiting: deque[tuple[Hashable, Any]] = deque()
        self._queued: set[Hashable] = set()  # the tasks waiting here
        self._dropped: set[Hashable] = set()  # waiting here, no longer wanted
        self.skipped: list[Done] = []  # dropped tasks, to be reported as such

    def __len__(self) -> int:
        return len(self.waiting)

    def extend(self, tasks: Iterable[tuple[Hashable, Any]]) -> None:
        for task, arg in tasks:
            self.waiting.append((task, arg))
            self._queued.add(task)

    def next(self) -> tuple[Hashable, Any] | None:
        """The next task to send, or ``None``; the cancelled ones before it become "skipped" results."""
        waiting, dropped = self.waiting, self._dropped
        while waiting:
            task, arg = waiting.popleft()
            self._queued.discard(task)
            if task not in dropped:
                return task, arg
            dropped.discard(task)
            self.skipped.append(Done(task, "skipped", None))
        return None

    def take(self, count: int) -> list[tuple[Hashable, Any]]:
        """The next ``count`` tasks to send (fewer if fewer wait), as :meth:`next` would give them one by one."""
        waiting = self.waiting
        taken: list[tuple[Hashable, Any]] = []
        if self._dropped:  # cancelled tasks among them: one by one
            while len(taken) < count:
                entry = self.next()
                if entry is None:
                    break
                taken.append(entry)
            return taken
        if count >= len(waiting):
            taken = list(waiting)
            waiting.clear()
            self._queued.clear()
        else:
            taken = [waiting.popleft() for _ in range(count)]
            self._queued.difference_update([task for task, _ in taken])
        return taken

    def cancel(self, task: Hashable) -> None:
        """Skip ``task`` if it is still waiting here; a task already sent runs to the end."""
        if task in self._queued:
            self._dropped.add(task)

    def resume(self, task: Hashable) -> None:
        """Undo ``cancel``, unless the task was already skipped."""
        self._dropped.discard(task)

    def take_skipped(self) -> list[Done]:
        """The "skipped" results not reported yet."""
        skipped, self.skipped = self.skipped, []
        return skipped

    def clear(self) -> None:
        self.waiting.clear()
        self._queued.clear()
        self._dropped.clear()

"""Descriptors of file locks that a forked child must not keep: each lock is its parent's, and goes with it.

An ``flock`` belongs to the open file, which a forked child shares: while
the child keeps the descriptor, the lock outlives the parent that took it.

>>> held = parents_only(set())  # the set to add them to (tests/test_write_npy.py forks with one held)
>>> held in _registered
True
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["parents_only"]

_registered: list[set[int]] = []


def parents_only(descriptors: set[int]) -> set[int]:
    """``descriptors``, a set of the lock descriptors this process holds: closed, and emptied, in a forked child."""
    _registered.append(descriptors)
    return descriptors


def _close_in_child() -> None:
    for descriptors in _registered:
        for fd in list(descriptors):
            with contextlib.suppress(OSError):
                os.close(fd)
        descriptors.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)
